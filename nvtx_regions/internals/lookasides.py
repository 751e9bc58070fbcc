"""The user's NVTX markers while thunder traces: interpreter lookasides for
every marker API, which record into the traced function's `MarkerLog`
instead of calling NVTX.

While thunder interprets the model, each push or pop API below is diverted:
nothing is pushed at trace time; the `MarkerRecorder` (``attribution.marker_logs``)
updates the log kept on the computation trace being recorded, and
`recorder.attributed` stores the markers open on each op. Emitting them at run
time is the transform's business. `patches` puts these lookasides in thunder's
map and takes them out again.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Protocol

from ..core.markers import RECORD_FUNCTION, MarkerLog
from .recorder import log_of

__all__ = ["MarkerRecorder", "marker_lookasides", "library_files"]

class MarkerRecorder(Protocol):
    """What the lookasides call; `attribution.marker_logs` is one (as a module)."""

    def push(self, log: MarkerLog, form: str, domain: str | None, message: Any, color: int | None, where: tuple[str, int] | None) -> int:
        """Record a push at the user's line `where`; the depth NVTX would return."""

    def pop(self, log: MarkerLog, key: tuple[str, str | None], api: str, where: tuple[str, int] | None) -> int:
        """Record a pop of stack `key` by `api`; the depth NVTX would return (-1: nothing open)."""

    def graph_break(self, where: tuple[str, int], api: str) -> None:
        """Tell the user that torch.compile broke its graph at their marker (see `thunderfx.marker_break`)."""


# Files whose frames are never "the user's line": the marker APIs and the machinery around them.
_library_files: tuple[str, ...] = ()


def library_files() -> tuple[str, ...]:
    """Directories and files of torch, thunder, nvtx, contextlib and nvtx_regions (set by `marker_lookasides`)."""
    return _library_files


def marker_lookasides(markers: MarkerRecorder) -> dict[Any, Callable[..., Any]]:
    """Each marker API -> the lookaside that records it with `markers` (for thunder's lookaside map).

    thunder 0.2.6: ``thunder.core.jit_ext._general_jit_lookaside_map`` maps a
    callable to its lookaside; ``general_jit_lookaside`` consults it for every
    call the interpreter makes (bound methods are unbound first, so
    ``record_function.__enter__`` is looked up as the plain function), and
    ``interpreter_needs_wrap`` makes a plain Python function a lookaside that
    takes and returns unwrapped values. Checked with torch 2.11:
    ``torch.cuda.nvtx.range_push``/``range_pop``/``range`` call
    ``torch._C._nvtx.rangePushA``/``rangePop``; nvtx 0.2.17: ``nvtx.annotate``
    (context manager and decorator) and ``nvtx.push_range``/``pop_range``
    call ``nvtx._lib.lib.push_range(attributes, domain_handle)``/
    ``pop_range(domain_handle)``; torch 2.11 ``record_function.__enter__``
    calls ``torch.ops.profiler._record_function_enter_new``, an op thunder
    does not know.
    Without these: the NVTX forms run once, while thunder traces, pushing
    ranges unrelated to the run, and are then gone from every call;
    ``record_function`` makes ``thunder.jit`` fail with
    ``_record_function_enter_new is not registered``; and no op knows its markers.
    """
    global _library_files
    import thunder
    import torch
    from thunder.core.interpreter import interpreter_needs_wrap

    def torch_push(log: MarkerLog, message: Any) -> int:
        return markers.push(log, "torch.cuda.nvtx", None, message, None, _user_line())

    def torch_pop(log: MarkerLog) -> int:
        return markers.pop(log, ("nvtx", None), "torch.cuda.nvtx.range_pop", _user_line())

    def record_function_enter(log: MarkerLog, self: Any) -> Any:
        markers.push(log, RECORD_FUNCTION, None, self.name, None, _user_line())
        return self

    def record_function_exit(log: MarkerLog, self: Any, *exc_info: Any) -> None:
        markers.pop(log, ("record_function", None), "record_function", _user_line())

    libraries = [torch, thunder]
    diverted: dict[Any, Any] = {
        torch._C._nvtx.rangePushA: torch_push,
        torch._C._nvtx.rangePop: torch_pop,
        torch.autograd.profiler.record_function.__enter__: record_function_enter,
        torch.autograd.profiler.record_function.__exit__: record_function_exit,
    }
    try:
        import nvtx
        import nvtx._lib.lib as nvtx_lib
    except ImportError:  # the nvtx package is optional for the torch forms
        pass
    else:
        libraries.append(nvtx)

        def nvtx_push(log: MarkerLog, attributes: Any, handle: Any) -> None:
            # nvtx 0.2.17: EventAttributes.message is a RegisteredString (its text in
            # `.string`) or None; `.color` is what the user gave, pushed as color_to_hex(color).
            message = getattr(attributes.message, "string", attributes.message)
            color = nvtx_lib.color_to_hex(attributes.color)
            markers.push(log, "nvtx", _domain_name(handle), message, color, _user_line())

        def nvtx_pop(log: MarkerLog, handle: Any) -> None:
            markers.pop(log, ("nvtx", _domain_name(handle)), "nvtx.pop_range", _user_line())

        diverted[nvtx_lib.push_range] = nvtx_push
        diverted[nvtx_lib.pop_range] = nvtx_pop
    _library_files = tuple(os.path.dirname(m.__file__) + os.sep for m in libraries)
    _library_files += (contextlib.__file__, os.path.dirname(os.path.dirname(__file__)) + os.sep)
    return {api: interpreter_needs_wrap(_diverted(api, recorder)) for api, recorder in diverted.items()}


def _diverted(api: Any, recorder: Any) -> Any:
    """A lookaside that records into the traced function's log, or calls `api` outside thunder.jit."""

    def lookaside(*args: Any) -> Any:
        log = _marker_log()
        return api(*args) if log is None else recorder(log, *args)

    return lookaside


def _domain_name(handle: Any) -> str | None:
    # nvtx 0.2.17: DomainHandle.name is "" for the default domain (a NULL handle).
    return getattr(handle, "name", None) or None


def _marker_log() -> MarkerLog | None:
    """The log of the function thunder is tracing now; None outside thunder.jit.

    thunder 0.2.6: ``thunder.core.jit_ext.get_jit_ctx()._computation_trace``
    is the trace whose ``set_current_source_location`` `recorder.attributed`
    tags. Without it the pushes and pops could not be matched to the ops
    recorded between them.
    """
    from thunder.core.jit_ext import get_jit_ctx

    try:
        trace = get_jit_ctx()._computation_trace
    except (LookupError, AttributeError):  # the interpreter without thunder.jit: no trace to record into
        return None
    return log_of(trace)


def _user_line() -> tuple[str, int] | None:
    """The innermost (filename, line) on thunder's interpreter frame stack outside torch, nvtx, thunder and contextlib.

    thunder 0.2.6: ``get_interpreterruntimectx().frame_stack`` holds the
    interpreted frames, innermost last, each with ``code`` and ``positions``.
    Without it a marker's warnings and `Marker.where` would name torch's
    ``nvtx.py`` or nvtx's ``nvtx.py`` instead of the user's line.
    """
    from thunder.core.interpreter import get_interpreterruntimectx

    for frame in reversed(get_interpreterruntimectx().frame_stack):
        filename = frame.code.co_filename
        if filename.startswith(_library_files) or filename.startswith("<"):
            continue
        positions = getattr(frame, "positions", None)
        line = getattr(positions, "lineno", None) or frame.code.co_firstlineno
        return filename, line
    return None
