"""The user's own markers under ``torch.compile`` (`NvtxInductor`): what Dynamo records of them, and how
they ride through AOTAutograd to the kernels Inductor generates.

Checked on torch 2.11 and 2.14 (CPU), nvtx 0.2.17.

Capture (`install`, by each `NvtxInductor`, once until the last handle's ``remove()`` puts it back:
`installs`). Without it ``torch.cuda.nvtx.range_push``/``range_pop``/``range`` stop a ``fullgraph=True``
compile ("torch.* op returned non-Tensor": Dynamo's ``trace_rules`` list them as in-graph functions),
and the nvtx package's calls (Cython) break the graph.

No marker function is replaced, neither ``torch.cuda.nvtx``'s nor the nvtx package's. Where Dynamo meets
one while it traces for a backend that keeps the user's markers (`keeps_markers`: an `NvtxInductor`),
it traces a stand-in instead, which puts one ``nvtx_regions::marker(action, form, message, domain,
color)`` node into the graph (`dynamo.handle_markers`): for ``torch.cuda.nvtx``'s three functions
`_traced_push`, `_traced_pop`, `_traced_range`; for the nvtx package's ``push_range``, ``pop_range``,
``annotate`` and the two Cython calls of the wrapper that ``annotate`` makes of a function it decorates,
`_nvtx_stand_ins`. For any other backend Dynamo does what it did, with
the same graph breaks and the same graphs: other code's graphs, whose guards check those functions,
stay valid (no recompile), made before our first backend or after it. A reference taken before the
install (``from nvtx import push_range``) is the function itself, and is traced the same.

The op has side effects for FX (``torch.fx.node.has_side_effect``), so no dead-code pass drops it.
Its kernel does what the marker does, at its place among the kernels.

``torch.profiler.record_function``: Dynamo drops it, unless ``torch._dynamo.config.
capture_profiler_record_function`` is on (2.11, 2.14), which records
``profiler._record_function_enter_new(name, args)`` and ``profiler._record_function_exit.
_RecordFunction(handle)`` nodes. `install` sets it to a value that is true only while Dynamo traces
for a backend that keeps the user's markers (Dynamo reads it as ``if config.capture_...:`` while it
traces, 2.11 and 2.14), so other models' graphs stay as they were; on a torch without it,
`record_function_lost` says so, and `record_function_drops` tells where Dynamo meets one as it traces for
such a backend (`dynamo.handle_markers`), whatever the user's logging.

What the backend does with the marker nodes: `marker_nodes`.
"""

from __future__ import annotations

from typing import Any, Callable

from . import installs
from .installs import Undo
from .dynamo import handle_markers

__all__ = ["install", "uninstall", "installed", "marker_op", "record_function_lost", "record_function_drops", "keeps_markers"]

NAMESPACE = "nvtx_regions"

MARKERS = "the marker stand-ins"  # the change's name in `installs`
_library: Any = None


def installed() -> bool:
    """Whether the stand-ins are in place."""
    return installs.made(MARKERS)


def marker_op() -> Any:
    """``torch.ops.nvtx_regions.marker.default``, defined on first use (a ``torch.library`` fragment)."""
    global _library
    import torch

    if _library is None:
        _library = torch.library.Library(NAMESPACE, "FRAGMENT")
        _library.define("marker(str action, str form, str? message, str? domain, str? color) -> ()")
        _library.impl("marker", _run_marker, "CompositeExplicitAutograd")
        torch.fx.node.has_side_effect(torch.ops.nvtx_regions.marker.default)
    return torch.ops.nvtx_regions.marker.default


def _run_marker(action: str, form: str, message: str | None, domain: str | None, color: str | None) -> None:
    """The op's kernel: nothing while a compiler traces (Dynamo's and AOTAutograd's fake runs, under a
    ``TracingContext``); else the marker itself."""
    from torch._guards import TracingContext

    if TracingContext.try_get() is not None:
        return
    if form == "torch.cuda.nvtx":
        import torch.cuda.nvtx as markers

        if action == "push":
            markers.range_push(message)
        else:
            markers.range_pop()
    else:
        import nvtx

        if action == "push":
            nvtx.push_range(message, color_value(color), domain)
        else:
            nvtx.pop_range(domain)


def _color_text(color: Any) -> str | None:
    return None if color is None else str(color)


def color_value(text: str | None) -> Any:
    if text is None:
        return None
    return int(text) if text.lstrip("-").isdigit() else text


def keeps_markers() -> bool:
    """Whether Dynamo is tracing, on this thread, for a backend that keeps the user's markers in its
    graphs (one whose class sets ``keeps_user_markers = True``: `NvtxInductor`). Asked by Dynamo's own
    code as it meets a marker (the handlers above) or reads its config, never traced."""
    from .dynamo import tracing_for

    return bool(getattr(type(tracing_for()), "keeps_user_markers", False))


class _WhileKept(int):
    """``capture_profiler_record_function``'s value while installed: true only while Dynamo traces for
    a backend that keeps the user's markers (see the module doc). An int, 0, for what else reads
    Dynamo's config: its metrics log dumps it as JSON (2.11)."""

    def __bool__(self) -> bool:
        return keeps_markers()

    def __repr__(self) -> str:  # Dynamo hashes its config by repr
        return "nvtx_regions.internals.compiled_markers.WHILE_KEPT"

    def __reduce__(self) -> str:  # and pickles it for its caches: the one instance, by name
        return "WHILE_KEPT"

    def __deepcopy__(self, memo: Any) -> _WhileKept:
        return self


WHILE_KEPT = _WhileKept(0)


def _marker(action: str, form: str, message: Any = None, domain: Any = None, color: Any = None) -> None:
    import torch

    torch.ops.nvtx_regions.marker.default(action, form, message, domain, color)


def install() -> None:
    """Put the stand-ins in place and turn record_function capture on (see the module doc), one change
    of `installs`; once until it is put back."""
    installs.make(MARKERS, _apply)


def _apply(undo: Undo) -> None:
    import torch
    import torch.cuda.nvtx as torch_nvtx

    marker_op()
    torch_markers = {torch_nvtx.range_push: _traced_push, torch_nvtx.range_pop: _traced_pop, torch_nvtx.range: _traced_range}
    met = {torch.autograd.profiler.record_function: _record_function_met}  # torch.profiler's too: the same class
    handle_markers(undo, {**torch_markers, **_nvtx_stand_ins()}, keeps_markers, met)
    undo.then(_drop_listeners.clear)
    config = torch._dynamo.config
    if hasattr(config, "capture_profiler_record_function"):
        undo.setattr(config, "capture_profiler_record_function", WHILE_KEPT)


def _traced_push(msg: str) -> int:
    """What Dynamo traces for ``torch.cuda.nvtx.range_push(msg)`` in code it compiles for a backend that
    keeps markers: the marker op (``range_push``'s result, the depth, is not known there: 0)."""
    _marker("push", "torch.cuda.nvtx", msg)
    return 0


def _traced_pop() -> int:
    _marker("pop", "torch.cuda.nvtx")
    return 0


def _traced_range(msg: str, *args: Any, **kwargs: Any) -> _TracedRange:
    """What Dynamo traces for ``torch.cuda.nvtx.range(msg, *args, **kwargs)`` there (a function: Dynamo
    builds the class from the module's globals, where it has a source)."""
    return _TracedRange("torch.cuda.nvtx", msg.format(*args, **kwargs) if args or kwargs else msg)


class _TracedRange:
    """A context manager (and decorator) around the marker ops: ``torch.cuda.nvtx.range``'s, or an
    ``nvtx.annotate``'s (whose ``with`` gives the object itself, and whose decorator names the range
    after the function where it has no message)."""

    def __init__(self, form: str, message: Any, domain: Any = None, color: Any = None) -> None:
        self.form, self.message, self.domain, self.color = form, message, domain, color

    def __enter__(self) -> Any:
        _marker("push", self.form, self.message, self.domain, self.color)
        return self if self.form == "nvtx" else None

    def __exit__(self, *exc: Any) -> bool:
        _marker("pop", self.form, None, self.domain)
        return False

    def __call__(self, function: Callable[..., Any]) -> Callable[..., Any]:
        import functools

        named = self if self.message is not None else _TracedRange(self.form, function.__name__, self.domain, self.color)

        @functools.wraps(function)
        def inner(*args: Any, **kwargs: Any) -> Any:
            with named:
                return function(*args, **kwargs)

        return inner


def _nvtx_stand_ins() -> dict[Callable[..., Any], Callable[..., Any]]:
    """What Dynamo traces for each of the nvtx package's markers where it compiles for a backend that keeps
    them (`dynamo.handle_markers`); empty without the package.

    nvtx 0.2.17: ``push_range``/``pop_range`` (functions of ``nvtx.nvtx``, re-exported by ``nvtx``) and
    the class ``annotate`` read the domain through ``get_domain`` (an ``lru_cache`` around Cython's
    ``Domain``: Dynamo breaks the graph there). The wrapper that ``annotate`` makes of a function it
    decorates (before the compile, at import) calls the Cython ``libnvtx_push_range(attributes,
    handle)``/``libnvtx_pop_range(handle)`` (globals of ``nvtx.nvtx``, which Dynamo does not trace: a
    graph break), so those two are handled too, reading the message (``EventAttributes.message.string``),
    colour and domain (``DomainHandle.name``). An ``annotate`` made outside the compiled code and entered
    inside it is left as it is: Dynamo enters no context manager made outside (its error, or a graph
    break), with or without us."""
    try:
        import nvtx.nvtx as module
    except ImportError:
        return {}
    return {
        module.push_range: _traced_push_range,
        module.pop_range: _traced_pop_range,
        module.annotate: _traced_annotate,
        module.libnvtx_push_range: _traced_libnvtx_push_range,
        module.libnvtx_pop_range: _traced_libnvtx_pop_range,
    }


def _traced_push_range(message: Any = None, color: Any = "blue", domain: Any = None, category: Any = None, payload: Any = None) -> None:
    """What Dynamo traces for ``nvtx.push_range(...)`` in code it compiles for a backend that keeps markers."""
    _marker("push", "nvtx", message, domain, _color_text(color))


def _traced_pop_range(domain: Any = None) -> None:
    _marker("pop", "nvtx", None, domain)


def _traced_annotate(message: Any = None, color: Any = None, domain: Any = None, category: Any = None, payload: Any = None) -> _TracedRange:
    """``nvtx.annotate(...)`` there: a context manager and decorator around the marker ops."""
    return _TracedRange("nvtx", message, domain, _color_text(color))


def _traced_libnvtx_push_range(attributes: Any, handle: Any) -> None:
    message = attributes.message
    message = getattr(message, "string", message)
    _marker("push", "nvtx", message, handle.name or None, _color_text(attributes.color))


def _traced_libnvtx_pop_range(handle: Any) -> None:
    _marker("pop", "nvtx", None, handle.name or None)


def uninstall() -> None:
    """Put back what `install` changed."""
    installs.put_back(MARKERS)


_drop_listeners: list[Callable[[str], None]] = []


def record_function_drops(callback: Callable[[str], None]) -> None:
    """Call ``callback(the function's name)`` each time Dynamo, tracing for a backend that keeps the
    user's markers, meets a ``record_function`` that this torch drops (`record_function_lost`); once per
    callback, however often it is passed, until `install` is put back."""
    if callback not in _drop_listeners:
        _drop_listeners.append(callback)


def _record_function_met() -> None:
    if record_function_lost() is not None:
        for listener in list(_drop_listeners):
            listener("torch.autograd.profiler.record_function")


def record_function_lost() -> str | None:
    """Why this torch's Dynamo drops ``record_function`` inside a compiled graph, or None where
    `install` made it record them."""
    import torch

    if hasattr(torch._dynamo.config, "capture_profiler_record_function"):
        return None
    return (
        f"torch {torch.__version__} has no torch._dynamo.config.capture_profiler_record_function, so Dynamo "
        "drops every torch.profiler.record_function inside a compiled graph"
    )
