"""Every reach into the private parts of thunder, torch and nvtx, in one place.

Each entry says which version it was checked on and what breaks without it.
Everything outside this sub-package uses public APIs only
(tests/test_architecture.py checks it). It imports `core` only.
"""
