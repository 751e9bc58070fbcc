"""The module recorder: which module calls, and which of the user's markers,
were running when thunder recorded each op.

Thunder keeps no such record, but while it interprets the model it calls
``TraceCtx.set_current_source_location`` once per recorded torch op, and every
bound symbol it then creates copies the current filename into
``bsym.source_filename``. Later passes (decompositions, the grad transform's
forward part, executors, fusions) copy that attribute along, so the final
forward trace still holds it. `internals.patches` wraps that method so that the
filename it stores is `attributed`: an `AttributedFilename`, a ``str`` equal to
the real filename that also carries the module calls on the interpreter's frame
stack at that moment and the markers open then (`core.markers.MarkerLog`).
"""

from __future__ import annotations

import itertools
import sys
import types
import weakref
from typing import Any

from ..core.calls import Chain, ModuleCall
from ..core.naming import class_name
from ..core.markers import MarkerLog, MarkerStack

__all__ = ["AttributedFilename", "attributed", "log_of"]


class AttributedFilename(str):
    """A source filename that remembers the module calls running, and the user's
    markers open, when the op was recorded."""

    calls: Chain | None = None
    classes: dict[str, str] | None = None  # path -> class name, for every module of the root
    # Under ThunderFX: the FX graph's inputs that dynamo marks as a module's
    # parameters or buffers (see `internals.thunder.parameter_names`).
    static_inputs: frozenset[str] = frozenset()
    markers: MarkerStack = ()  # the user's markers open, in push order
    marker_log: MarkerLog | None = None  # shared by every op of the traced function
    seq: int = -1  # the op's place in record order (`MarkerLog.recorded` before it)

    def __reduce__(self):  # pickles (thunder's reproducers) as the plain filename
        return (str, (str(self),))


_call_numbers = itertools.count(1)
# Per root module: id(module) -> path, and path -> class name.
_paths: "weakref.WeakKeyDictionary[Any, tuple[dict[int, str], dict[str, str]]]" = weakref.WeakKeyDictionary()
# Where a computation trace keeps its MarkerLog (in its __dict__).
_MARKER_LOG = "_nvtx_regions_markers"


def attributed(filename: str, trace: Any) -> AttributedFilename:
    """`filename` tagged with the module calls running now and the markers open in `trace`'s log."""
    calls = _module_calls()
    log = log_of(trace)
    tagged = AttributedFilename(filename)
    if calls is not None:
        chain, classes, *statics = calls
        tagged.calls, tagged.classes = chain, classes
        if statics:
            tagged.static_inputs = statics[0]
    tagged.markers, tagged.marker_log, tagged.seq = log.open, log, log.recorded
    log.recorded += 1
    return tagged


def log_of(trace: Any) -> MarkerLog:
    """The `MarkerLog` of a computation trace being recorded (made on first use)."""
    log = trace.__dict__.get(_MARKER_LOG)
    if log is None:
        log = trace.__dict__[_MARKER_LOG] = MarkerLog()
    return log


def _module_calls() -> tuple[Chain, dict[str, str]] | tuple[Chain, dict[str, str], frozenset[str]] | None:
    """The module calls on thunder's interpreter frame stack, outermost first.

    thunder 0.2.6: ``thunder.core.interpreter.get_interpreterruntimectx()``
    gives the runtime context; its ``frame_stack`` holds ``InterpreterFrame``s
    whose ``localsplus[0]`` is a method's ``self`` (wrapped in a
    ``WrappedValue`` whose ``.value`` is the object, or a cell holding it when
    a closure captures ``self``), and ``code`` its code.
    A frame of a function named ``forward`` whose ``self`` is an
    ``nn.Module`` is a running module call. The frame object lives as long as
    the call, so a number stored on it identifies the call.
    Under ThunderFX the running module is the FX ``GraphModule``; the user's
    modules then come from the FX node being run (`thunderfx.fx_node_calls`).
    Without it no op has a module.
    """
    from thunder.core.interpreter import get_interpreterruntimectx

    import torch

    frames = get_interpreterruntimectx().frame_stack
    modules: list[tuple[Any, Any]] = []
    for frame in frames:
        if frame.code.co_name != "forward" or not frame.localsplus:
            continue
        this = _unwrap(frame.localsplus[0])
        if isinstance(this, torch.nn.Module) and not (modules and modules[-1][0] is this):
            modules.append((this, frame))
    if not modules:
        return None
    fx = sys.modules.get("torch.fx")
    if fx is not None and isinstance(modules[-1][0], fx.GraphModule):
        from .thunderfx import fx_node_calls

        return fx_node_calls(modules[-1][0], modules[-1][1])
    root = modules[0][0]
    paths, classes = _paths_of(root)
    chain = []
    for module, frame in modules:
        path = paths.get(id(module))
        if path is None:  # created after the root was indexed, or not a submodule of it
            paths, classes = _paths_of(root, refresh=True)
            path = paths.get(id(module), f"{chain[-1].path + '.' if chain and chain[-1].path else ''}<{type(module).__name__}>")
        chain.append(ModuleCall(path, class_name(type(module)), _call_number(frame)))
    return tuple(chain), classes


def _unwrap(value: Any) -> Any:
    # A `self` that a closure (or `super()`) captures lives in a cell; thunder
    # wraps both the cell and its contents in WrappedValue.
    value = getattr(value, "value", value)
    if isinstance(value, types.CellType):
        try:
            value = value.cell_contents
        except ValueError:  # empty cell
            return None
        value = getattr(value, "value", value)
    return value


def _call_number(frame: Any) -> int:
    number = frame.__dict__.get("_nvtx_regions_call")
    if number is None:
        number = frame.__dict__["_nvtx_regions_call"] = next(_call_numbers)
    return number


def _paths_of(root: Any, refresh: bool = False) -> tuple[dict[int, str], dict[str, str]]:
    if refresh or root not in _paths:
        named = list(root.named_modules())
        _paths[root] = ({id(m): p for p, m in named}, {p: class_name(type(m)) for p, m in named})
    return _paths[root]
