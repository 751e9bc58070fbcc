"""See which NVTX ranges code really emits, without a GPU or Nsight.

A small NVTX injection library (``nvtx_capture.c``, compiled with the system C
compiler on first use and cached) records every NVTX call of a process: the
``nvtx`` package, ``torch.cuda.nvtx`` and any other NVTX v3 user.

    from nvtx_regions.testing import capture_subprocess, range_tree, flatten
    result = capture_subprocess("import nvtx; nvtx.push_range('a'); nvtx.pop_range()").check()
    (tree,) = range_tree(result.events).values()
    assert flatten(tree) == [(0, None, "a")]

In-process: `attach` before the first NVTX call, then ``with capture() as events:``
(or the ``nvtx_capture`` fixture of `nvtx_regions.testing.pytest_plugin`).
The default domain is ``domain=None``. ``NVTX_REGIONS_CAPTURE_MODE=count``
(or ``mode="count"``) only counts calls per kind, for benchmarks.

`to_chrome_trace` (and `write_chrome_trace`, `load_chrome_trace`) turn events
into a Chrome Trace Event Format timeline; `summarize` gives a table like
``nsys stats --report nvtx_sum`` from events or a loaded timeline.
"""

from ..capture.events import (
    KINDS,
    BalanceProblem,
    NvtxEvent,
    Range,
    UnbalancedRanges,
    balance_problems,
    check_balanced,
    flatten,
    is_balanced,
    range_tree,
    start_end_ranges,
)
from ..capture.inject import (
    CapturedEvents,
    CapturedProcessFailed,
    CaptureNotAttached,
    CaptureResult,
    ProcessCapture,
    attach,
    capture,
    capture_subprocess,
    is_attached,
)
from ..core.errors import CaptureFileError
from ..capture.chrome import RangeRecord, load_chrome_trace, to_chrome_trace, write_chrome_trace
from ..capture.summary import Summary, SummaryRow, summarize
from ..capture.build import CaptureUnavailable, build_tool, unavailable_reason

__all__ = [
    "KINDS",
    "BalanceProblem",
    "CaptureFileError",
    "CaptureNotAttached",
    "CaptureResult",
    "CaptureUnavailable",
    "CapturedEvents",
    "CapturedProcessFailed",
    "NvtxEvent",
    "ProcessCapture",
    "Range",
    "RangeRecord",
    "Summary",
    "SummaryRow",
    "UnbalancedRanges",
    "attach",
    "balance_problems",
    "build_tool",
    "capture",
    "capture_subprocess",
    "check_balanced",
    "flatten",
    "is_attached",
    "is_balanced",
    "load_chrome_trace",
    "range_tree",
    "start_end_ranges",
    "summarize",
    "to_chrome_trace",
    "unavailable_reason",
    "write_chrome_trace",
]
