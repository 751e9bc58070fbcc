"""Recording the NVTX calls a process makes, without a GPU or Nsight.

`build` compiles the injection library (``nvtx_capture.c``), `inject` attaches
it in-process or to a child, `events` holds the recorded events and range
trees, `chrome` writes them as Chrome Trace Event Format, `directory` turns
a capture directory (one event file per process) into a trace, `summary`
tables them. (Reading files back is a report's job: `report.chrome_trace` and
`report.nsys_report` give the same records.) Independent of thunder and of
the language; imports only `core`. `nvtx_regions.testing` is the small part
of it a test needs; everything is importable from here.

    from nvtx_regions.capture import capture_subprocess, summarize, write_chrome_trace
"""

from .build import CaptureUnavailable, build_tool, unavailable_reason
from .chrome import MarkRecord, ProcessInfo, RangeRecord, iter_items, to_chrome_trace, write_chrome_trace
from .events import (
    KINDS,
    BalanceProblem,
    NvtxEvent,
    Range,
    UnbalancedRanges,
    all_ranges,
    balance_problems,
    check_balanced,
    flatten,
    is_balanced,
    range_tree,
    start_end_ranges,
)
from .inject import (
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
from .summary import Summary, SummaryRow, summarize

__all__ = [
    "KINDS",
    "BalanceProblem",
    "CaptureNotAttached",
    "CaptureResult",
    "CaptureUnavailable",
    "CapturedEvents",
    "CapturedProcessFailed",
    "MarkRecord",
    "NvtxEvent",
    "ProcessCapture",
    "ProcessInfo",
    "Range",
    "RangeRecord",
    "Summary",
    "SummaryRow",
    "UnbalancedRanges",
    "all_ranges",
    "attach",
    "balance_problems",
    "build_tool",
    "capture",
    "capture_subprocess",
    "check_balanced",
    "flatten",
    "is_attached",
    "is_balanced",
    "iter_items",
    "range_tree",
    "start_end_ranges",
    "summarize",
    "to_chrome_trace",
    "unavailable_reason",
    "write_chrome_trace",
]
