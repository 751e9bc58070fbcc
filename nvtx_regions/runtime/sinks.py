"""Where ranges go: the sinks a spec's ranges are emitted to, chosen once for every backend.

- ``"nvtx"``: NVTX ranges (`runtime.domain`), for Nsight Systems and any NVTX tool;
- ``"record_function"``: torch.profiler ranges, the kind ``torch.profiler.record_function``
  makes (``user_annotation`` events in the exported trace; on CUDA each also gets a
  ``gpu_user_annotation``, the GPU time of the range).

`chosen_sinks(emit)` reads ``emit=`` or ``$NVTX_REGIONS_EMIT``. `record_function_calls()`
gives the push/pop/start/end of the record_function sink, in the shape of `domain.NvtxCalls`,
so the same generated lines and hooks drive either sink, or both (`domain.calls_of`).

The record_function sink costs ~0.1 µs a range while no profiler runs (it asks torch whether
one does, and records nothing), and otherwise what ``record_function`` itself costs, less its
Python context manager: it calls the same C++ ``RecordFunction`` with the user scope.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any, Callable

from ..core.profiling import ENV_EMIT, emit_sinks
from ..internals.profiler import user_scope_functions

__all__ = ["chosen_sinks", "record_function_calls", "NVTX_ONLY"]

NVTX_ONLY = ("nvtx",)


def chosen_sinks(emit: Any, *, where: str) -> tuple[str, ...]:
    """The sinks of `emit` (``emit=`` of `where`, a function's name); None: ``$NVTX_REGIONS_EMIT``, else NVTX.

    A value given here that differs from ``$NVTX_REGIONS_EMIT`` is a ValueError: ``nvtx-regions
    profile --tool torch`` sets the variable, and a script that chose otherwise would give it
    nothing to read.
    """
    from_env = os.environ.get(ENV_EMIT) or None
    if emit is None:
        return NVTX_ONLY if from_env is None else emit_sinks(from_env, where=f"${ENV_EMIT}=")
    sinks = emit_sinks(emit, where=f"{where}(): emit=")
    if from_env is not None and emit_sinks(from_env, where=f"${ENV_EMIT}=") != sinks:
        raise ValueError(
            f"{where}(): emit={emit!r}, but ${ENV_EMIT} asks for {from_env!r} (nvtx-regions profile sets it "
            "for its tool); leave emit= unset so that the command chooses"
        )
    return sinks


@functools.cache
def record_function_calls() -> tuple[Callable[..., Any], Callable[[], Any], Callable[..., Any], Callable[..., Any]]:
    """(push, pop, start, end) of the record_function sink; each range's "attributes" is its message.

    One for the process (`functools.cache`): push(message, _) and pop() keep each thread's
    stack of entered ranges, one stack for every domain, as record_function has no domains.
    A range pushed while no profiler ran is a None on it, so a profiler started or stopped
    mid-range keeps pushes and pops paired. start(message, _) gives what end(*started) takes.
    """
    enter, leave, profiling = user_scope_functions()
    local = threading.local()

    def push(message: str, _domain: Any = None) -> None:
        stack = local.__dict__.get("stack")
        if stack is None:
            stack = local.stack = []
        stack.append(enter(message) if profiling() else None)

    def pop() -> None:
        stack = local.__dict__.get("stack")
        if stack:
            handle = stack.pop()
            if handle is not None:
                leave(handle)

    def start(message: str, _domain: Any = None) -> tuple[Any, None]:
        return (enter(message) if profiling() else None, None)

    def end(handle: Any, _unused: Any = None) -> None:
        if handle is not None:
            leave(handle)

    return push, pop, start, end
