"""Every reach into thunder's (and torch.fx's) internals, in one place.

Each entry names the version it was checked on and what breaks without it.
Everything else in nvtx_regions uses thunder's public `Transform` hooks and
trace objects.

Module attribution needs to know which module's ``forward`` was running when
thunder recorded each op. Thunder keeps no such record, but while it
interprets the model it calls ``TraceCtx.set_current_source_location`` once
per recorded torch op, and every bound symbol it then creates copies the
current filename into ``bsym.source_filename``. Later passes (decompositions,
the grad transform's forward part, executors, fusions) copy that attribute
along, so the final forward trace still holds it. `install_module_recorder`
wraps that method so that the filename it stores is an `AttributedFilename`:
a ``str``, equal to the real filename, that also carries the module calls on
the interpreter's frame stack at that moment, and the user's own NVTX markers
open then (see "User markers" at the end).
"""

from __future__ import annotations

import itertools
import re
import sys
import threading
import types
import warnings
import weakref
from typing import Any, Callable, NamedTuple

from ..core.calls import Chain, ModuleCall, common_chain
from ..core.errors import NvtxRegionsWarning
from ..core.markers import RECORD_FUNCTION, Marker, MarkerLog, MarkerStack, UnmatchedPop, common_markers

__all__ = [
    "AttributedFilename", "install_module_recorder", "recorded_chain", "recorded_classes",
    "is_thunderfx_subgraph", "backward_follows", "ignored_jit_keyword",
    "AutogradInternals", "autograd_internals", "full_backward_hook_flag", "restore_full_backward_hook_flag",
    "bind_with_globals", "parameter_names", "cotangent_names",
    "recorded_markers", "recorded_marker_log",
]  # fmt: skip


class AttributedFilename(str):
    """A source filename that remembers the module calls running, and the user's
    markers open, when the op was recorded."""

    calls: Chain | None = None
    classes: dict[str, str] | None = None  # path -> class name, for every module of the root
    # Under ThunderFX: the FX graph's inputs that dynamo marks as a module's
    # parameters or buffers (see `parameter_names`).
    static_inputs: frozenset[str] = frozenset()
    markers: MarkerStack = ()  # the user's markers open, in push order (see "User markers" below)
    marker_log: MarkerLog | None = None  # shared by every op of the traced function
    seq: int = -1  # the op's place in record order (`MarkerLog.recorded` before it)

    def __reduce__(self):  # pickles (thunder's reproducers) as the plain filename
        return (str, (str(self),))


_installed = False
_lock = threading.Lock()
_call_numbers = itertools.count(1)
# Per root module: id(module) -> path, and path -> class name.
_paths: "weakref.WeakKeyDictionary[Any, tuple[dict[int, str], dict[str, str]]]" = weakref.WeakKeyDictionary()


def install_module_recorder() -> None:
    """Wrap ``TraceCtx.set_current_source_location`` once per process.

    Checked on thunder 0.2.6 (``thunder/core/trace.py``: the method;
    ``thunder/core/jit_ext.py`` ``record_source_loc_in_symbol_header``: its
    one caller per torch op; ``thunder/core/symbol.py`` ``Symbol.bind``: the
    copy into ``BoundSymbol.source_filename``). Without it, no op has a module
    and `module`/`class`/`each` rules warn that attribution is missing.
    """
    global _installed
    with _lock:
        if _installed:
            return
        from thunder.core.trace import TraceCtx

        original = TraceCtx.set_current_source_location

        def set_current_source_location(self, filename, positions):
            if filename is not None:
                try:
                    filename = _attributed(filename, self)
                except Exception:  # never break thunder's tracing over a profiling annotation
                    pass
            return original(self, filename, positions)

        set_current_source_location.__wrapped__ = original  # type: ignore[attr-defined]
        TraceCtx.set_current_source_location = set_current_source_location
        _install_marker_recorder()
        _installed = True


def _attributed(filename: str, trace: Any) -> str:
    calls = _module_calls()
    log = _log_of(trace)
    tagged = AttributedFilename(filename)
    if calls is not None:
        chain, classes, *statics = calls
        tagged.calls, tagged.classes = chain, classes
        if statics:
            tagged.static_inputs = statics[0]
    tagged.markers, tagged.marker_log, tagged.seq = log.open, log, log.recorded
    log.recorded += 1
    return tagged


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
    modules then come from the FX node being run (`_fx_node_calls`).
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
        return _fx_node_calls(modules[-1][0], modules[-1][1])
    root = modules[0][0]
    paths, classes = _paths_of(root)
    chain = []
    for module, frame in modules:
        path = paths.get(id(module))
        if path is None:  # created after the root was indexed, or not a submodule of it
            paths, classes = _paths_of(root, refresh=True)
            path = paths.get(id(module), f"{chain[-1].path + '.' if chain and chain[-1].path else ''}<{type(module).__name__}>")
        chain.append(ModuleCall(path, type(module).__name__, _call_number(frame)))
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
        _paths[root] = ({id(m): p for p, m in named}, {p: type(m).__name__ for p, m in named})
    return _paths[root]


def _fx_node_calls(graph_module: Any, frame: Any) -> tuple[Chain, dict[str, str], frozenset[str]] | None:
    """Module calls of the FX node whose generated line is running, from ``meta["nn_module_stack"]``.

    torch 2.11: ``GraphModule._lineno_map`` maps a line of the generated
    ``forward``, counted from its ``def`` line, to the index of its node in
    ``graph.nodes`` (set by ``recompile()``), and dynamo stores ``nn_module_stack`` as an ordered dict
    of ``key -> (path, class)``, outermost first, where path is written like
    ``L['self'].transformer.h[0]`` or ``transformer.h.0``. thunder's
    ThunderFX splitter (0.2.6) copies node meta into the subgraphs it jits.
    """
    positions = getattr(frame, "positions", None)
    lineno_map = getattr(graph_module, "_lineno_map", None)
    if positions is None or not lineno_map:
        return None
    # Keys count lines from the ``def forward`` line (checked on torch 2.11).
    index = lineno_map.get(positions.lineno - frame.code.co_firstlineno)
    if index is None:
        return None
    nodes = graph_module.__dict__.setdefault("_nvtx_regions_nodes", list(graph_module.graph.nodes))
    if index >= len(nodes):
        return None
    stack = nodes[index].meta.get("nn_module_stack") or {}
    classes = graph_module.__dict__.setdefault("_nvtx_regions_classes", {})
    chain = [ModuleCall("", type(graph_module).__name__, 0)]
    for key, value in stack.items():
        path, cls = value if isinstance(value, tuple) else (value, None)
        path = _fx_path(str(path))
        if not path:  # dynamo's entry for the root module itself
            continue
        name = getattr(cls, "__name__", None) or str(cls).rsplit(".", 1)[-1].strip("'>")
        classes[path] = name
        # FX keeps no call identity; one call number per (graph module, key) is the best there is.
        chain.append(ModuleCall(path, name, hash((id(graph_module), key)) & 0x7FFFFFFF))
    return tuple(chain), classes, _fx_static_inputs(graph_module, nodes)


def _fx_static_inputs(graph_module: Any, nodes: list) -> frozenset[str]:
    """The placeholders that dynamo marks as parameters or buffers of the compiled module.

    torch 2.11: dynamo (``inline_inbuilt_nn_modules``, the default) records a
    tensor's ``__dict__`` in the placeholder's ``meta["tensor_dict"]``, and
    marks every parameter and buffer there with ``_dynamo_static_input_type``;
    thunder's ThunderFX splitter (0.2.6) keeps the placeholder names as the
    trace's argument names. Without it, ThunderFX buffers (litgpt's rope
    ``cos``/``sin``) are not static and ops thunder hoists from them stretch
    ``each`` ranges.
    """
    found = graph_module.__dict__.get("_nvtx_regions_static")
    if found is None:
        found = graph_module.__dict__["_nvtx_regions_static"] = frozenset(
            node.name
            for node in nodes
            if node.op == "placeholder" and "_dynamo_static_input_type" in (node.meta.get("tensor_dict") or {})
        )
    return found


def _fx_path(path: str) -> str:
    """``L['self'].transformer.h[0].attn`` or ``L__self___transformer_h_0`` -> ``transformer.h.0.attn``."""
    path = re.sub(r"^L\['self'\]\.?", "", path)
    path = re.sub(r"^L\['[A-Za-z_0-9]+'\]\.?", "", path)
    path = re.sub(r"\[(\d+)\]", r".\1", path)
    path = re.sub(r"\['([^']*)'\]", r".\1", path)
    path = re.sub(r"_modules\.|\._modules", "", path)
    return path.strip(".")


def recorded_chain(bsym: Any) -> Chain | None:
    """The module calls recorded for a bound symbol, or, for a fusion or an op
    recorded without one, the deepest call that contains all its parts'."""
    return _recorded_in_common(bsym, lambda filename: filename.calls, common_chain)


def _recorded_in_common(bsym: Any, read: Any, common: Any) -> Any:
    """`read(filename)` of a bound symbol's own record; for a fusion, or an op
    recorded without one, `common` of what its parts (and its own record) give."""
    filename = getattr(bsym, "source_filename", None)
    if isinstance(filename, AttributedFilename) and not getattr(bsym.sym, "is_fusion", False):
        return read(filename)
    parts = [_recorded_in_common(sub, read, common) for sub in getattr(bsym, "subsymbols", ())]
    if isinstance(filename, AttributedFilename):
        parts.append(read(filename))
    return common(parts)


def recorded_classes(bsym: Any) -> dict[str, str] | None:
    """The path -> class table recorded with a bound symbol (or one of its parts)."""
    return _first_record(bsym, lambda filename: filename.classes)


def _first_record(bsym: Any, read: Any) -> Any:
    """`read(filename)` of the first attributed filename of `bsym` or its parts (depth first) where it is not None."""
    filename = getattr(bsym, "source_filename", None)
    if isinstance(filename, AttributedFilename):
        found = read(filename)
        if found is not None:
            return found
    for sub in getattr(bsym, "subsymbols", ()):
        found = _first_record(sub, read)
        if found is not None:
            return found
    return None


# -- compile-time context (moved here from transform.py) ---------------------


def is_thunderfx_subgraph() -> bool:
    """True while thunder compiles a subgraph that ThunderFX split out of a torch.compile graph.

    thunder 0.2.6: the compile data's ``fn`` is then a ``torch.fx.GraphModule``.
    Without it, the "selected nothing" check would run per subgraph.
    """
    from thunder.core.compile_data import get_compile_data

    cd = get_compile_data()
    fx = sys.modules.get("torch.fx")
    return cd is not None and fx is not None and isinstance(getattr(cd, "fn", None), fx.GraphModule)


def backward_follows() -> bool:
    """Whether thunder will hand this transform a backward trace after this forward.

    thunder 0.2.6 calls post-optimization transforms from
    ``apply_transforms_and_build_cache_entry`` with the backward trace in a
    local; a forward tagged AUGMENTED_FORWARD under ``torch.no_grad`` gets
    none. If that frame is not found, assume a backward follows (the check
    then runs at the next compilation instead).
    """
    frame = sys._getframe(1)
    for _ in range(8):
        if frame is None:
            break
        if frame.f_code.co_name == "apply_transforms_and_build_cache_entry" and "backward_trc" in frame.f_locals:
            return frame.f_locals["backward_trc"] is not None
        frame = frame.f_back
    return True


def ignored_jit_keyword(transform: Any) -> tuple[str, str] | None:
    """(function name, keyword) when `transform` sits in a thunder.jit compile option other than transforms=.

    thunder 0.2.6 keeps ``thunder.jit``'s unknown keyword arguments in
    ``CompileData.compile_options`` and never reads them. This looks for the
    transform there (alone or in a list or tuple) through `gc.get_referrers`;
    without this, the exit warning only lacks the function's name.
    """
    import gc

    holders = [transform] + [r for r in gc.get_referrers(transform) if isinstance(r, (list, tuple))]
    for holder in holders:
        for options in gc.get_referrers(holder):
            if not isinstance(options, dict):
                continue
            for owner in gc.get_referrers(options):
                if type(owner).__name__ == "CompileData" and getattr(owner, "compile_options", None) is options:
                    key = next((k for k, v in options.items() if v is holder), None)
                    if key is not None:
                        fn = getattr(owner, "fn", None)
                        return getattr(fn, "__name__", type(fn).__name__), key
    return None


# -- torch autograd internals, for eager hooks (emission/eager.py) ------------


class AutogradInternals(NamedTuple):
    """Private torch autograd functions the eager hooks call, looked up once.

    Checked on torch 2.11:
    - ``graph_task_id()`` is ``torch._C._current_graph_task_id``: the id of the
      backward (graph task) running on this thread, -1 outside any. Without it
      ranges that a failed backward left open could not be told apart from the
      ranges of a backward in progress, and would stay open.
    - ``autograd_node()`` is ``torch._C._current_autograd_node``: the autograd
      node being run. Without it a module none of whose inputs needs a gradient
      (torch calls its full backward hook right after the pre-hook) would close
      its backward range before its backward ran.
    - ``queue_callback(fn)`` is ``torch.autograd.Variable._execution_engine.queue_callback``:
      runs `fn` when the current backward ends. Without it ranges still open
      when a backward succeeds (deferred ones) would close only at the next forward.
    """

    graph_task_id: Callable[[], int]
    autograd_node: Callable[[], Any]
    queue_callback: Callable[[Callable[[], None]], None]


def autograd_internals() -> AutogradInternals:
    import torch

    return AutogradInternals(
        torch._C._current_graph_task_id,
        torch._C._current_autograd_node,
        torch.autograd.Variable._execution_engine.queue_callback,
    )


def full_backward_hook_flag(module: Any) -> Any:
    """A module's private ``_is_full_backward_hook`` (torch 2.11: None until a backward hook is registered,
    then True for full hooks and False for ``register_backward_hook``).

    `annotate()` saves it before registering its full backward hooks and
    restores it on `remove()`; without that, a module whose only full hooks
    were ours would keep refusing a later ``register_backward_hook``.
    """
    return module._is_full_backward_hook


def restore_full_backward_hook_flag(module: Any, flag: Any) -> None:
    """Put back what `full_backward_hook_flag` read (see there)."""
    module._is_full_backward_hook = flag


# -- building bound symbols -----------------------------------------------------


def bind_with_globals(symbol: Any, args: tuple, call_globals: dict[str, Any]) -> Any:
    """A bound symbol of `symbol` with `args` and no output, whose printed line may call the
    objects in `call_globals` by those names.

    thunder 0.2.6: ``BoundSymbol``'s private ``_call_ctx`` (marked "TODO Remove
    _call_ctx" in ``thunder/core/symbol.py``) is merged into the globals of the
    generated function (``BoundSymbol.gather_ctxs``), and with it set thunder
    adds no import for the symbol. Without it the push and pop lines could not
    reach nvtx's C functions, the prebuilt attributes and the run-time state.
    """
    from thunder.core.symbol import BoundSymbol

    return BoundSymbol(symbol, args=args, kwargs={}, output=None, _call_ctx=call_globals)


def cannot_raise(bsym: Any) -> bool:
    """Whether a final trace's bound symbol prints as a line that cannot raise: ``del`` of its names.

    thunder 0.2.6: the ``del`` statements that free intermediates between ops are
    bound symbols of ``prims.python_del`` (``PrimIDs.DEL``). The rewrite lets the
    push and pop lines around them skip storing their points (see
    `emission.rewrite`); without this, every range would store both.
    """
    from thunder.core.prims import PrimIDs

    return bsym.sym.id == PrimIDs.DEL


# -- parameters and buffers ----------------------------------------------------


def parameter_names(proxies: Any, bsyms: Any) -> frozenset[str]:
    """The names of the proxies among `proxies` (a trace's arguments) that are a
    model's parameters or buffers; `bsyms` are the trace's bound symbols.

    thunder 0.2.6 (``thunder/core/jit_ext.py``) adds ``ProxyTag.STATIC_MEMORY_LOCATION``
    to the proxy of every ``nn.Parameter`` it unpacks (under thunder.jit and
    ThunderFX, and FSDP's parameter shards) and of every buffer of a jitted
    module; under ThunderFX buffers are plain tensors, and dynamo's marks
    (`_fx_static_inputs`, recorded with the ops) name them. Without these, no
    op is parameter-only, and ops that thunder hoists away from their module
    stretch its ``each`` range again.
    """
    from thunder.core.proxies import ProxyTag

    tag = getattr(ProxyTag, "STATIC_MEMORY_LOCATION", None)
    found = {p.name for p in proxies if tag is not None and tag in getattr(p, "tags", ()) and hasattr(p, "name")}
    for bsym in bsyms:
        filename = getattr(bsym, "source_filename", None)
        if isinstance(filename, AttributedFilename) and filename.static_inputs:
            found |= filename.static_inputs & {getattr(p, "name", None) for p in proxies}
            break
    return frozenset(found)


def cotangent_names(trace: Any) -> frozenset[str]:
    """The names of the cotangents a backward trace receives (the gradients flowing in).

    thunder 0.2.6 (``thunder/core/transforms.py``, ``thunder/executors/torch_autograd.py``)
    builds ``backward_fn(saved_for_backward, cotangents)``; the trace's second
    argument holds the cotangent proxies (a list), or is a collection that one
    ``unpack_sequence`` unpacks. Without it, every op of a backward trace
    counts as parameter-only and ``each`` ranges there span all their ops.
    """
    if len(trace.args) != 2:
        return frozenset()
    second = trace.args[1]
    if isinstance(second, (list, tuple)):
        return frozenset(p.name for p in second if hasattr(p, "name"))
    collection = getattr(second, "name", None)
    for bsym in trace.bound_symbols:
        if bsym.sym.name == "unpack_sequence" and bsym.args and getattr(bsym.args[0], "name", None) == collection:
            return frozenset(p.name for p in bsym.flat_proxy_outs if hasattr(p, "name"))
    return frozenset()
# -- User markers (issue 15) --------------------------------------------------
#
# The model's own NVTX calls (`core.markers`). While thunder interprets the
# model, each NVTX push or pop API below is diverted by an interpreter
# lookaside: instead of calling NVTX (nothing is pushed at trace time), it
# updates the traced function's `MarkerLog`, kept on the computation trace
# being recorded. `_attributed` then stores the markers open on each op's
# `AttributedFilename`, next to its module calls, and thunder's passes carry
# them along with the filename. Emitting them at run time is the transform's
# business.

_MARKER_LOG = "_nvtx_regions_markers"
_occurrences = itertools.count(1)
_warned: set[tuple[str, Any]] = set()
# Files whose frames are never "the user's line": the marker APIs and the machinery around them.
_LIBRARY_FILES: tuple[str, ...] = ()


def _install_marker_recorder() -> None:
    """Divert the marker APIs while thunder traces (called once, by `install_module_recorder`).

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
    global _LIBRARY_FILES
    import contextlib
    import os

    import thunder
    import torch
    from thunder.core.interpreter import interpreter_needs_wrap
    from thunder.core.jit_ext import _general_jit_lookaside_map

    libraries = [torch, thunder, contextlib]
    diverted: dict[Any, Any] = {
        torch._C._nvtx.rangePushA: _torch_range_push,
        torch._C._nvtx.rangePop: _torch_range_pop,
        torch.autograd.profiler.record_function.__enter__: _record_function_enter,
        torch.autograd.profiler.record_function.__exit__: _record_function_exit,
    }
    try:
        import nvtx
        import nvtx._lib.lib as nvtx_lib
    except ImportError:  # the nvtx package is optional for the torch forms
        pass
    else:
        libraries.append(nvtx)
        diverted[nvtx_lib.push_range] = _nvtx_push_range
        diverted[nvtx_lib.pop_range] = _nvtx_pop_range
    _LIBRARY_FILES = tuple(os.path.dirname(m.__file__) + os.sep for m in libraries if m is not contextlib)
    _LIBRARY_FILES += (contextlib.__file__, os.path.dirname(os.path.dirname(__file__)) + os.sep)
    for api, recorder in diverted.items():
        _general_jit_lookaside_map[api] = interpreter_needs_wrap(_diverted(api, recorder))
    _install_thunderfx_marker_warning()


def _diverted(api: Any, recorder: Any) -> Any:
    """A lookaside that records into the traced function's log, or calls `api` outside thunder.jit."""

    def lookaside(*args: Any) -> Any:
        log = _marker_log()
        return api(*args) if log is None else recorder(log, *args)

    return lookaside


def _marker_log() -> MarkerLog | None:
    """The log of the function thunder is tracing now; None outside thunder.jit.

    thunder 0.2.6: ``thunder.core.jit_ext.get_jit_ctx()._computation_trace``
    is the trace whose ``set_current_source_location`` `_attributed` wraps.
    Without it the pushes and pops could not be matched to the ops recorded
    between them.
    """
    from thunder.core.jit_ext import get_jit_ctx

    try:
        trace = get_jit_ctx()._computation_trace
    except (LookupError, AttributeError):  # the interpreter without thunder.jit: no trace to record into
        return None
    return _log_of(trace)


def _log_of(trace: Any) -> MarkerLog:
    log = trace.__dict__.get(_MARKER_LOG)
    if log is None:
        log = trace.__dict__[_MARKER_LOG] = MarkerLog()
    return log


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
        if filename.startswith(_LIBRARY_FILES) or filename.startswith("<"):
            continue
        positions = getattr(frame, "positions", None)
        line = getattr(positions, "lineno", None) or frame.code.co_firstlineno
        return filename, line
    return None


# thunder 0.2.6 formats a number proxy as its repr, e.g.
# ``[IntegerProxy name=i1, value=3, static=CONSTRAINT.CONSTRAINABLE]``, so an
# f-string message built from a value that is symbolic under
# ``cache="symbolic values"`` holds that text. Without this, the first call's
# value (or the repr) would be frozen into every later call's message.
_NUMBER_PROXY = re.compile(r"\[(?:Integer|Float|Complex|Number)Proxy name=(\w+), value=[^,\]]*, static=CONSTRAINT\.\w+\]")


def _concrete(message: Any) -> tuple[str | None, tuple[str, ...]]:
    """(message, names of symbolic values in it): each symbolic value shown as ``<name>``."""
    if message is None:
        return None, ()
    name = getattr(message, "name", None)
    if not isinstance(message, str) and isinstance(name, str) and type(message).__name__.endswith("Proxy"):
        return f"<{name}>", (name,)
    message = str(message)
    names = tuple(_NUMBER_PROXY.findall(message))
    return (_NUMBER_PROXY.sub(lambda m: f"<{m.group(1)}>", message), names) if names else (message, ())


def _warn_once(kind: str, where: tuple[str, int] | None, text: str) -> None:
    """Warn at the user's line, once per (kind, line) per process."""
    if (kind, where) in _warned:
        return
    _warned.add((kind, where))
    filename, line = where or ("<unknown>", 0)
    warnings.warn_explicit(text, NvtxRegionsWarning, filename, line)


def _push(log: MarkerLog, form: str, domain: str | None, message: Any, color: int | None) -> int:
    """Record a push; the depth NVTX would return (0-based level opened on its stack in this trace)."""
    where = _user_line()
    message, symbolic = _concrete(message)
    marker = Marker(domain, message, color, form, next(_occurrences), where, symbolic)  # type: ignore[arg-type]
    if symbolic:
        _warn_once(
            "symbolic",
            where,
            f"the NVTX message {message!r} is built from {', '.join(symbolic)}, which changes between calls "
            f"under cache='symbolic values'; nvtx_regions shows it as {message!r} rather than freeze the first "
            f"call's value (format a value that is constant per compilation, or use cache='constant values')",
        )
    stack = log.stacks.setdefault(marker.stack_key, [])
    stack.append(marker)
    log.pushed.append(marker)
    return len(stack) - 1


def _pop(log: MarkerLog, key: tuple[str, str | None], api: str) -> int:
    """Record a pop on the stack `key`; the depth NVTX would return (-1: nothing open)."""
    stack = log.stacks.get(key)
    if stack:
        stack.pop()
        return len(stack)
    where = _user_line()
    log.unmatched.append(UnmatchedPop(key, where, log.recorded))
    _warn_once(
        "unmatched",
        where,
        f"{api} closes a range that the compiled function did not open (its caller did, or nothing did); "
        f"thunder does not run this pop, so that range is not closed here",
    )
    return -1


def _torch_range_push(log: MarkerLog, message: Any) -> int:
    return _push(log, "torch.cuda.nvtx", None, message, None)


def _torch_range_pop(log: MarkerLog) -> int:
    return _pop(log, ("nvtx", None), "torch.cuda.nvtx.range_pop")


def _domain_name(handle: Any) -> str | None:
    # nvtx 0.2.17: DomainHandle.name is "" for the default domain (a NULL handle).
    return getattr(handle, "name", None) or None


def _nvtx_push_range(log: MarkerLog, attributes: Any, handle: Any) -> None:
    from nvtx._lib.lib import color_to_hex

    # nvtx 0.2.17: EventAttributes.message is a RegisteredString (its text in
    # `.string`) or None; `.color` is what the user gave, pushed as color_to_hex(color).
    message = getattr(attributes.message, "string", attributes.message)
    _push(log, "nvtx", _domain_name(handle), message, color_to_hex(attributes.color))


def _nvtx_pop_range(log: MarkerLog, handle: Any) -> None:
    _pop(log, ("nvtx", _domain_name(handle)), "nvtx.pop_range")


def _record_function_enter(log: MarkerLog, self: Any) -> Any:
    _push(log, RECORD_FUNCTION, None, self.name, None)
    return self


def _record_function_exit(log: MarkerLog, self: Any, *exc_info: Any) -> None:
    _pop(log, ("record_function", None), "record_function")


def recorded_markers(bsym: Any) -> MarkerStack | None:
    """The user's markers open when a bound symbol was recorded, in push order
    (for a fusion: those open around all its parts); None if it has no record."""
    return _recorded_in_common(bsym, lambda filename: filename.markers, common_markers)


def recorded_marker_log(bsym: Any) -> MarkerLog | None:
    """The `MarkerLog` of the function a bound symbol (or one of its parts) was recorded in; None if it has no record."""
    return _first_record(bsym, lambda filename: filename.marker_log)


def _install_thunderfx_marker_warning() -> None:
    """Warn once per marker when torch.compile breaks its graph at a user's NVTX marker.

    Checked on torch 2.11 and thunder 0.2.6. Dynamo cannot put a marker in
    its graph: ``range_push``/``range_pop`` return an int ("torch.* op
    returned non-Tensor"), and nvtx's ``push_range``/``pop_range`` are Cython
    functions it cannot trace. It breaks the graph there and runs the marker
    eagerly; a ``with`` block whose ``__enter__`` breaks runs, with the rest of
    the function, without any compiler. Dynamo sets
    ``GraphModule.compile_subgraph_reason`` (``graph_break``, ``reason``,
    ``user_stack``) on each graph it hands a backend, and ThunderFX's backend
    is ``thunder.dynamo.compiler.ThunderCompiler.__call__(gm, sample_args)``.
    Without this, the only sign is a model that thunder compiles in pieces,
    or not at all.
    """
    try:
        from thunder.dynamo.compiler import ThunderCompiler
    except ImportError:  # a thunder without ThunderFX
        return
    original = ThunderCompiler.__call__

    def __call__(self, gm, sample_args):
        try:
            _warn_marker_break(getattr(gm, "compile_subgraph_reason", None))
        except Exception:  # never break compilation over a profiling hint
            pass
        return original(self, gm, sample_args)

    __call__.__wrapped__ = original  # type: ignore[attr-defined]
    ThunderCompiler.__call__ = __call__


# torch 2.11 dynamo's reason for a torch.cuda.nvtx call (it names the function, not its module).
_TORCH_NVTX_BREAK = re.compile(r"torch\.\* op returned non-Tensor[\s\S]*target: <function (range_push|range_pop|range|mark|range_start|range_end) at")


def _warn_marker_break(reason: Any) -> None:
    import linecache
    import os

    if reason is None or not getattr(reason, "graph_break", False):
        return
    stack = list(getattr(reason, "user_stack", None) or ())
    text = str(getattr(reason, "reason", ""))
    nvtx_dir = next((d for d in _LIBRARY_FILES if d.rstrip(os.sep).endswith(os.sep + "nvtx")), None)
    in_nvtx = nvtx_dir is not None and any(frame.filename.startswith(nvtx_dir) for frame in stack)
    in_torch_nvtx = bool(_TORCH_NVTX_BREAK.search(text)) or any(
        frame.filename.endswith(os.path.join("torch", "cuda", "nvtx.py")) for frame in stack
    )
    user = next((f for f in reversed(stack) if not f.filename.startswith(_LIBRARY_FILES)), None)
    if not (in_nvtx or in_torch_nvtx) or user is None:  # no user's line: the break inside nvtx's own wrapper
        return
    # The pop's own break: the push's warning has said it all, once per marker.
    if "<function range_pop at" in text or any(f.name in ("pop_range", "__exit__") for f in stack if f is not user):
        return
    where = (user.filename, user.lineno)
    code = linecache.getline(*where).strip() or "an NVTX marker"
    api = "nvtx" if in_nvtx else "torch.cuda.nvtx"
    _warn_once(
        "thunderfx",
        where,
        f"torch.compile breaks the graph at the NVTX marker `{code}` ({api}): under ThunderFX it runs eagerly "
        f"between thunder's subgraphs, and a `with` block it opens runs, with the rest of the function, without "
        f"thunder; nvtx_regions cannot see or re-emit it (see the README, 'Your own NVTX markers'). "
        f"Use thunder.jit to keep the model in one thunder trace.",
    )
