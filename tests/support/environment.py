"""Which optional dependencies this test run has, and what a test does without one."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import pytest

# lightning-thunder is an optional dependency. Test files that need it all through say so with
# `pytestmark = pytest.mark.thunder` on one line (they import it at the top); other tests that need
# it are marked one by one. Without thunder, run `pytest -m "not thunder"`: the marked files are
# not collected, the marked tests are deselected, and the summary says how many of each.
THUNDER_INSTALLED = importlib.util.find_spec("thunder") is not None
_THUNDER_FILE = re.compile(r"^pytestmark = .*\bpytest\.mark\.thunder\b", re.M)


def needs_thunder(path: Path) -> bool:
    """Whether a test file needs thunder throughout (`pytestmark = pytest.mark.thunder`)."""
    return path.name.startswith("test_") and bool(_THUNDER_FILE.search(path.read_text(encoding="utf-8")))


def require_transformers():
    """transformers, for the Hugging Face models; without it the calling test skips, except under
    ``CI=true``, where it fails (the test extras install it)."""
    try:
        import transformers
    except ImportError as error:
        message = f"transformers is not installed ({error}); pip install -e '.[test-core]' installs it"
        if os.environ.get("CI") == "true":
            pytest.fail(message + ". Under CI=true the Hugging Face tests run; they do not skip")
        pytest.skip(message)
    return transformers
