"""The user's own markers under ``torch.compile`` (`NvtxInductor`): what Dynamo records of them, and how
they ride through AOTAutograd to the kernels Inductor generates.

Checked on torch 2.11 and 2.14 (CPU), nvtx 0.2.17.

Capture (`install`, by each `NvtxInductor`, once until the last handle's ``remove()`` puts it back:
`installs`). Without it ``torch.cuda.nvtx.range_push``/``range_pop``/``range`` stop a ``fullgraph=True``
compile ("torch.* op returned non-Tensor": Dynamo's ``trace_rules`` list them as in-graph functions),
and the nvtx package's calls (Cython) break the graph.

``torch.cuda.nvtx``'s three functions stay as they are: where Dynamo meets one while it traces for a
backend that keeps the user's markers (`keeps_markers`: an `NvtxInductor`), it traces a stand-in
instead (`dynamo.handle_torch_markers`: `_traced_push`, `_traced_pop`, `_traced_range`), which puts
one ``nvtx_regions::marker(action, form, message, domain, color)`` node into the graph; for any other
backend it does what it did, with the same graph break. Other code's graphs, whose guards check
those functions' code objects, stay valid (no recompile), and a reference taken before the install
(``from torch.cuda.nvtx import range_push``) is kept as well.

The nvtx package's are replaced by substitutes (module attributes, and ``nvtx.annotate``'s methods, so
an ``annotate`` object made or applied as a decorator before the install is covered too). While
Dynamo traces code for a backend that keeps the user's markers (``torch.compiler.is_dynamo_compiling()``,
not ``is_compiling()``, which thunder 0.2.6's lookaside makes true while thunder traces, where the
originals must run for thunder's marker lookasides to record them) each puts the same node into the
graph; otherwise it calls the original (one Python call more), so Dynamo tracing for any other backend
meets the original, as in a process without nvtx_regions: the same graph breaks, the same graphs. (A
graph of other code that Dynamo guarded on them compiles again once, while our handles live.)
The op has side effects for FX (``torch.fx.node.has_side_effect``), so no dead-code pass drops it.
Its kernel does what the marker does, at its place among the kernels.

``torch.profiler.record_function``: Dynamo drops it, unless ``torch._dynamo.config.
capture_profiler_record_function`` is on (2.11, 2.14), which records
``profiler._record_function_enter_new(name, args)`` and ``profiler._record_function_exit.
_RecordFunction(handle)`` nodes. `install` sets it to a value that is true only while Dynamo traces
for a backend that keeps the user's markers (Dynamo reads it as ``if config.capture_...:`` while it
traces, 2.11 and 2.14), so other models' graphs stay as they were; on a torch without it,
`record_function_lost` says so.

A reference to the nvtx package's functions taken before the install (``from nvtx import push_range``)
still names the original: under torch.compile it breaks the graph as before (``fullgraph=True``:
Dynamo's error), and the marker runs as written, outside every graph. `held_before` finds such
references in the modules loaded so far, for a warning.

What the backend does with the marker nodes: `marker_nodes`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from . import installs
from .installs import Undo
from .dynamo import handle_torch_markers

__all__ = ["install", "uninstall", "installed", "marker_op", "record_function_lost", "held_before", "keeps_markers"]

NAMESPACE = "nvtx_regions"

MARKERS = "the marker substitutes"  # the change's name in `installs`
_library: Any = None


def installed() -> bool:
    """Whether the substitutes are in place."""
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
    ``TracingContext``); else the marker itself, with the original functions."""
    from torch._guards import TracingContext

    if TracingContext.try_get() is not None:
        return
    originals = _originals
    if form == "torch.cuda.nvtx":
        if action == "push":
            originals["range_push"](message)
        else:
            originals["range_pop"]()
    else:
        if action == "push":
            originals["nvtx_push"](message, color_value(color), domain)
        else:
            originals["nvtx_pop"](domain)


_originals: dict[str, Any] = {}


def _color_text(color: Any) -> str | None:
    return None if color is None else str(color)


def color_value(text: str | None) -> Any:
    if text is None:
        return None
    return int(text) if text.lstrip("-").isdigit() else text


def keeps_markers() -> bool:
    """Whether Dynamo is tracing, on this thread, for a backend that keeps the user's markers in its
    graphs (one whose class sets ``keeps_user_markers = True``: `NvtxInductor`). Under Dynamo it is
    called for real and its result taken as a constant (``assume_constant_result``, 2.8 to 2.14: no
    graph break, no guard), once per traced call of a substitute."""
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
    """Put the substitutes in place and turn record_function capture on (see the module doc), one change
    of `installs`; once until it is put back."""
    installs.make(MARKERS, _substitute)


def _substitute(undo: Undo) -> None:
    import torch
    import torch.cuda.nvtx as torch_nvtx

    marker_op()
    _originals.update(range_push=torch_nvtx.range_push, range_pop=torch_nvtx.range_pop)  # for the op's kernel
    handle_torch_markers(undo, {torch_nvtx.range_push: _traced_push, torch_nvtx.range_pop: _traced_pop,
                                torch_nvtx.range: _traced_range}, keeps_markers)  # fmt: skip
    _install_nvtx_package(undo, _kept())
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
    return _TracedRange(msg, *args, **kwargs)


class _TracedRange:
    """A context manager (and decorator) around the marker ops."""

    def __init__(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self.msg = msg.format(*args, **kwargs) if args or kwargs else msg

    def __enter__(self) -> None:
        _marker("push", "torch.cuda.nvtx", self.msg)

    def __exit__(self, *exc: Any) -> bool:
        _marker("pop", "torch.cuda.nvtx")
        return False

    def __call__(self, function: Callable[..., Any]) -> Callable[..., Any]:
        import functools

        @functools.wraps(function)
        def inner(*args: Any, **kwargs: Any) -> Any:
            with self:
                return function(*args, **kwargs)

        return inner


def _kept() -> Callable[[], bool]:
    """`keeps_markers`, for the substitutes: Dynamo calls it and takes its result as a constant."""
    from .dynamo import called_while_traced

    return called_while_traced(lambda: keeps_markers())


def _install_nvtx_package(undo: Undo, kept: Callable[[], bool]) -> None:
    """nvtx 0.2.17: ``push_range``/``pop_range`` (module functions of ``nvtx.nvtx``, re-exported by
    ``nvtx``); ``annotate.__init__`` (its ``get_domain`` is an ``lru_cache``, and the attributes
    are built in Cython: Dynamo breaks the graph), ``__enter__``/``__exit__`` (Cython
    ``libnvtx_push_range``/``libnvtx_pop_range``); a decorator's wrapper calls those two module
    globals of ``nvtx.nvtx`` with the annotate's attributes, so they are substituted too, reading
    the message (``EventAttributes.message.string``), colour and domain (``DomainHandle.name``)."""
    try:
        import nvtx
        import nvtx.nvtx as module
    except ImportError:
        return
    import torch

    push, pop = module.push_range, module.pop_range
    lib_push, lib_pop = module.libnvtx_push_range, module.libnvtx_pop_range
    annotate = module.annotate
    init, enter, exit_ = annotate.__init__, annotate.__enter__, annotate.__exit__

    def push_range(message: Any = None, color: Any = "blue", domain: Any = None, category: Any = None, payload: Any = None) -> None:
        if torch.compiler.is_dynamo_compiling() and kept():
            return _marker("push", "nvtx", message, domain, _color_text(color))
        return push(message, color, domain, category, payload)

    def pop_range(domain: Any = None) -> None:
        if torch.compiler.is_dynamo_compiling() and kept():
            return _marker("pop", "nvtx", None, domain)
        return pop(domain)

    _originals.update(nvtx_push=push, nvtx_pop=pop)

    def annotate_init(self: Any, message: Any = None, color: Any = None, domain: Any = None, category: Any = None, payload: Any = None) -> None:
        if torch.compiler.is_dynamo_compiling() and kept():
            self.init_args = message, color, domain, category, payload
            return None
        return init(self, message, color, domain, category, payload)

    def annotate_enter(self: Any) -> Any:
        if torch.compiler.is_dynamo_compiling() and kept():
            message, color, domain = self.init_args[:3]
            _marker("push", "nvtx", message, domain, _color_text(color))
            return self
        return enter(self)

    def annotate_exit(self: Any, *exc: Any) -> bool:
        if torch.compiler.is_dynamo_compiling() and kept():
            _marker("pop", "nvtx", None, self.init_args[2])
            return False
        return exit_(self, *exc)

    def libnvtx_push_range(attributes: Any, handle: Any) -> Any:
        if torch.compiler.is_dynamo_compiling() and kept():
            message = attributes.message
            message = getattr(message, "string", message)
            return _marker("push", "nvtx", message, handle.name or None, _color_text(attributes.color))
        return lib_push(attributes, handle)

    def libnvtx_pop_range(handle: Any) -> Any:
        if torch.compiler.is_dynamo_compiling() and kept():
            return _marker("pop", "nvtx", None, handle.name or None)
        return lib_pop(handle)

    for owner in (nvtx, module):
        undo.setattr(owner, "push_range", push_range)
        undo.setattr(owner, "pop_range", pop_range)
    undo.setattr(module, "libnvtx_push_range", libnvtx_push_range)
    undo.setattr(module, "libnvtx_pop_range", libnvtx_pop_range)
    undo.setattr(annotate, "__init__", annotate_init)
    undo.setattr(annotate, "__enter__", annotate_enter)
    undo.setattr(annotate, "__exit__", annotate_exit)


def uninstall() -> None:
    """Put back what `install` changed."""
    installs.put_back(MARKERS)


# The functions replaced while installed (the nvtx package's; torch.cuda.nvtx's never are: Dynamo's handlers).
_NAMES = {"nvtx_push": "nvtx.push_range", "nvtx_pop": "nvtx.pop_range"}
_LIBRARIES = ("torch", "nvtx", "nvtx_regions", "thunder", "lightning", "transformers", "_")


def held_before() -> list[tuple[str, str, str]]:
    """(module, its global's name, the marker API) of each global of a loaded module, outside
    torch, nvtx and the like, that names an original of a replaced marker function (``from nvtx
    import push_range`` before `install`): Dynamo sees the original there."""
    import sys

    originals = {id(_originals[key]): name for key, name in _NAMES.items() if key in _originals}
    found = []
    for name, module in list(sys.modules.items()):
        if module is None or name.startswith(_LIBRARIES):
            continue
        try:
            values = list(vars(module).items())
        except TypeError:
            continue
        for key, value in values:
            api = originals.get(id(value))
            if api is not None:
                found.append((name, key, api))
    return found


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
