"""What the tests share besides fixtures, one module per concern.

- `support.nsys`: running Nsight Systems under the test run's lock, retrying its own failures,
  ending a run at its timeout, and reading its SQLite export.
- `support.environment`: which optional dependencies are installed, and what a test does without one.
- `support.models`: the small models and inputs the tests use, and real thunder traces of them.

tests/ is on ``sys.path`` (pytest's rootdir import of tests/conftest.py), so tests import
``from support.nsys import ...``.
"""
