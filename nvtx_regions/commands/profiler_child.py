"""The child side of ``nvtx-regions profile --tool torch``: each Python process of the command runs
under torch.profiler, and the processes that emitted our ranges write their trace at exit.

``nvtx-regions profile`` puts ``nvtx_regions/commands/_site`` first on the command's
``PYTHONPATH`` (`commands.hooks`) and sets ``NVTX_REGIONS_TORCH_TRACE_DIR``; in every
Python process of the command, `install` then:

- right after ``torch`` is imported (nothing is imported before: a process without
  torch is left alone), starts ``torch.profiler.profile`` with CPU activity, plus CUDA
  where ``torch.cuda.is_available()``;
- at exit (atexit, registered after torch's own handlers, so it runs before them;
  normal exit, ``sys.exit`` or an uncaught exception, not ``os._exit`` or a fatal
  signal), stops it and, in a process where nvtx_regions set up its record_function
  sink (``$NVTX_REGIONS_EMIT``), exports the Chrome trace to
  ``$NVTX_REGIONS_TORCH_TRACE_DIR/rank<RANK>.pt.trace.json`` (RANK 0 without
  ``$RANK``; ``rank<RANK>-<pid>.pt.trace.json`` when a process of the same rank wrote
  that file first), written beside it and renamed, so a trace is whole or absent. A
  torchrun launcher, or any other process without our ranges, writes none.

The script needs no change: its ``nvtx_regions.compile(model)`` and
``nvtx_regions.steps(...)`` emit ``record_function`` ranges, which the profiler keeps.
"""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path
from types import ModuleType

from .hooks import after_import

__all__ = ["ENV_TRACE_DIR", "TRACE_SUFFIX", "install", "rank_traces", "trace_name"]

ENV_TRACE_DIR = "NVTX_REGIONS_TORCH_TRACE_DIR"
TRACE_SUFFIX = ".pt.trace.json"


def trace_name(rank: int, pid: int | None = None) -> str:
    """The file name of rank `rank`'s trace (`pid`: a second process of that rank)."""
    return f"rank{rank}{'' if pid is None else f'-{pid}'}{TRACE_SUFFIX}"


def rank_traces(directory: Path, rank: int) -> list[Path]:
    """The traces the processes of rank `rank` wrote in `directory` (see `trace_name`)."""
    first = directory / trace_name(rank)
    return ([first] if first.is_file() else []) + sorted(directory.glob(f"rank{rank}-*{TRACE_SUFFIX}"))


def _emitted_record_function() -> bool:
    """Whether nvtx_regions set up its record_function sink in this process."""
    sinks = sys.modules.get("nvtx_regions.runtime.sinks")
    return sinks is not None and sinks.record_function_calls.cache_info().currsize > 0


def _start(torch: ModuleType) -> None:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])]
    profiler = profile(activities=activities, acc_events=True)
    profiler.start()
    atexit.register(_finish, profiler, os.environ[ENV_TRACE_DIR])


def _finish(profiler, directory: str) -> None:
    profiler.stop()
    if not _emitted_record_function():
        return
    rank = int(os.environ.get("RANK") or 0)
    path = os.path.join(directory, trace_name(rank))
    if os.path.exists(path):
        path = os.path.join(directory, trace_name(rank, os.getpid()))
    partial = f"{path}.{os.getpid()}.partial"
    profiler.export_chrome_trace(partial)
    os.replace(partial, path)


def install() -> None:
    """Arm the profiler in this process when ``NVTX_REGIONS_TORCH_TRACE_DIR`` is set (see the module docstring)."""
    if os.environ.get(ENV_TRACE_DIR):
        after_import("torch", _start)
