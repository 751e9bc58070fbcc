"""torch.profiler's C++ RecordFunction, as the record_function sink calls it (`runtime.sinks`).

Checked on torch 2.8, 2.11 and 2.14.1.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["user_scope_functions"]


def user_scope_functions() -> tuple[Callable[[str], Any], Callable[[Any], None], Callable[[], bool]]:
    """(enter(name) -> handle, exit(handle), profiling()) of torch's user-scope RecordFunction.

    ``torch.autograd._record_function_with_args_enter`` is what
    ``torch.profiler.profile`` uses for its own ``ProfilerStep#N`` ranges: the
    C++ RecordFunction with USER_SCOPE, a ``user_annotation`` event in the
    exported trace (and, on CUDA, a ``gpu_user_annotation``), without the
    dispatcher call of ``record_function``'s ops. (``_RecordFunctionFast`` is
    cheaper, but its events are ``cpu_op``.) ``_profiler_enabled()`` tells
    whether a profiler records on this thread, so a range costs a C call while
    none does. Without them there is no record_function sink.
    """
    import torch

    return (
        torch.autograd._record_function_with_args_enter,
        torch.autograd._record_function_with_args_exit,
        torch._C._autograd._profiler_enabled,
    )
