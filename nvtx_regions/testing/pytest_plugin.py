"""pytest plugin: attach the NVTX capture tool and provide the ``nvtx_capture`` fixture.

Enable it in the top-level ``conftest.py`` with
``pytest_plugins = ["nvtx_regions.testing.pytest_plugin"]``, or on the command
line with ``-p nvtx_regions.testing.pytest_plugin``. It attaches the tool in
``pytest_configure``, before tests run; that only works if nothing in the
process made an NVTX call earlier (conftest imports included).

    def test_ranges(nvtx_capture):
        with nvtx_capture() as events:
            run_code_under_test()
        assert flatten(range_tree(events)[threading.get_native_id()]) == [...]

The fixture is `nvtx_regions.testing.capture` itself; it skips the test, with
the reason, when the tool cannot be built or attached.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ..capture.inject import CaptureNotAttached, attach, capture
from ..capture.build import CaptureUnavailable

_unavailable: str | None = "the nvtx_regions.testing.pytest_plugin was not configured"
_path: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _unavailable, _path
    try:
        _path = str(attach())
        _unavailable = None
    except (CaptureUnavailable, CaptureNotAttached) as e:
        _unavailable = str(e)


def pytest_report_header(config: pytest.Config) -> str:
    if _unavailable:
        return f"nvtx capture: unavailable ({_unavailable})"
    return f"nvtx capture: attached ({_path})"


@pytest.fixture
def nvtx_capture() -> Callable[[], Any]:
    """`capture`, for ``with nvtx_capture() as events:``; skips when the tool is unavailable."""
    if _unavailable:
        pytest.skip(f"NVTX capture unavailable: {_unavailable}")
    return capture
