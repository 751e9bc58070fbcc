"""What a test needs to see the NVTX ranges code really emits, without a GPU or Nsight.

    from nvtx_regions.testing import capture_subprocess, range_tree, flatten
    result = capture_subprocess("import nvtx; nvtx.push_range('a'); nvtx.pop_range()").check()
    (tree,) = range_tree(result.events).values()
    assert flatten(tree) == [(0, None, "a")]

Run code under the capture tool: `capture_subprocess` (a fresh process, or a
launcher and its workers), or `attach` before the process's first NVTX call
and then ``with capture() as events:`` (the ``nvtx_capture`` fixture of
`nvtx_regions.testing.pytest_plugin` does both). Assert on what came back:
`NvtxEvent` items, `all_ranges` (every range, push/pop and start/end alike:
what to count), `range_tree`/`start_end_ranges` of `Range` items,
`flatten` for compact comparisons, and `check_balanced`/`balance_problems`
(raising `UnbalancedRanges`). Where a compiler ran other modules' work in
the middle of a module call's, the call's range comes in parts, the later
ones named ``... (continued)`` or ``... (backward, continued)``:
`continues(message)` tells them apart, so that a count of calls, or a
comparison of names with eager's, leaves them out. `unavailable_reason` says why the tool cannot
be built here, for a skip. The default domain is ``domain=None``.

Everything else (result types, Chrome traces, summaries, the tool's build)
is importable from `nvtx_regions.capture`.
"""

from ..capture.build import unavailable_reason
from ..capture.events import (
    NvtxEvent,
    Range,
    UnbalancedRanges,
    all_ranges,
    balance_problems,
    check_balanced,
    flatten,
    range_tree,
    start_end_ranges,
)
from ..capture.inject import attach, capture, capture_subprocess
from ..core.naming import continues

__all__ = [
    "NvtxEvent",
    "Range",
    "UnbalancedRanges",
    "all_ranges",
    "attach",
    "balance_problems",
    "capture",
    "capture_subprocess",
    "check_balanced",
    "continues",
    "flatten",
    "range_tree",
    "start_end_ranges",
    "unavailable_reason",
]
