"""torch.profiler's exported Chrome traces read back: the ranges of ``record_function``, with their GPU time.

    records, gpu_ns, kernels = read_torch_trace("out/eager/rank0.pt.trace.json")

A trace of ``torch.profiler.profile(...).export_chrome_trace(FILE)`` (the
files of ``nvtx-regions profile --tool torch``, named ``*.pt.trace.json``;
`report.reader` reads them by that name) holds, among the ops and kernels,
one ``user_annotation`` complete event per ``record_function`` range (the
ranges of nvtx_regions' record_function sink), with ``ts`` and ``dur`` in µs
on the CPU, and on CUDA one ``gpu_user_annotation`` event per range that
launched GPU work, from its first kernel's start to its last one's end, tied
to its CPU range by ``args["External id"]``. A step's range is named
``ProfilerStep#N``, as torch.profiler's own ``profile.step()`` names it, and
as `nvtx_regions.steps` names its steps there (for HTA and TensorBoard): it is
read as the record of step N, ``step N`` in the category
``nvtx_regions.steps``, as an nsys report or a capture gives it.

The records have no NVTX domain (record_function has none: domain None) and no
category; their rank is the trace's ``distributedInfo.rank`` where the process
had started torch.distributed, else None (rank 0). The GPU time of a range is
its ``gpu_user_annotation``'s duration; where the trace holds no GPU event
(a CPU run), there are no GPU times (``gpu_ns`` None).

Nothing here imports torch or thunder.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from ..capture.chrome import RangeRecord
from ..capture.events import int_or_none
from ..core.errors import CaptureFileError
from ..core.profiling import PROFILER_STEP, STEP_CATEGORY, step_message
from .chrome_trace import complete_events, load_trace

__all__ = ["CPU_CATEGORY", "GPU_CATEGORY", "KERNEL_CATEGORY", "TORCH_SUFFIX", "read_torch_trace"]

TORCH_SUFFIX = ".pt.trace.json"
CPU_CATEGORY = "user_annotation"
GPU_CATEGORY = "gpu_user_annotation"
KERNEL_CATEGORY = "kernel"
_EXTERNAL_ID = "External id"
_STEP = re.compile(re.escape(PROFILER_STEP) + r"(\d+)")


def read_torch_trace(path: str | os.PathLike[str]) -> tuple[list[RangeRecord], tuple[int | None, ...] | None, int]:
    """(the ``record_function`` ranges of a torch.profiler trace, in time order; per range its GPU time
    in ns, None where it launched no GPU work, or None for a trace without GPU events; how many kernels).

    Raises `CaptureFileError` for a file that is not a Chrome trace, or whose ranges are malformed.
    """
    where, data = load_trace(path)
    gpu: dict[object, int] = {}
    kernels = 0
    ranges = []
    for event in complete_events(data, where=where):
        category = event.event.get("cat")
        if category == GPU_CATEGORY and _EXTERNAL_ID in event.args:
            gpu[event.args[_EXTERNAL_ID]] = round(event.dur_us * 1000)
        elif category == KERNEL_CATEGORY:
            kernels += 1
        elif category == CPU_CATEGORY:
            if event.ts_us is None:
                raise CaptureFileError(f"{where}: event {event.index}: range {event.name!r} has no 'ts'")
            ranges.append(event)
    info = data.get("distributedInfo") if isinstance(data, Mapping) else None
    rank = int_or_none(info.get("rank")) if isinstance(info, Mapping) else None
    ranges.sort(key=lambda e: (e.ts_us, -e.dur_us))
    records = []
    open_ends: dict[tuple[int, int], list[int]] = {}  # per thread, the ends of the ranges enclosing the next one
    for event in ranges:
        start = round(event.ts_us * 1000)
        end = start + round(event.dur_us * 1000)
        pid, tid = event.event.get("pid"), event.event.get("tid")
        thread = (pid if isinstance(pid, int) else -1, tid if isinstance(tid, int) else -1)
        enclosing = open_ends.setdefault(thread, [])
        while enclosing and enclosing[-1] < end:
            enclosing.pop()
        step = _STEP.fullmatch(event.name)
        name, category_name = (step_message(int(step[1])), STEP_CATEGORY) if step else (event.name, None)
        records.append(RangeRecord(*thread, None, name, start, end, depth=len(enclosing), category_name=category_name, rank=rank))
        enclosing.append(end)
    gpu_ns = tuple(gpu.get(event.args.get(_EXTERNAL_ID)) for event in ranges) if gpu or kernels else None
    return records, gpu_ns, kernels
