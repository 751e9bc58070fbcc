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
the interpreter's frame stack at that moment.
"""

from __future__ import annotations

import itertools
import re
import sys
import threading
import types
import weakref
from typing import Any, Callable, NamedTuple

from ..core.calls import Chain, ModuleCall, common_chain

__all__ = [
    "AttributedFilename", "install_module_recorder", "recorded_chain", "recorded_classes",
    "is_thunderfx_subgraph", "backward_follows", "ignored_jit_keyword",
    "AutogradInternals", "autograd_internals", "full_backward_hook_flag", "restore_full_backward_hook_flag",
    "bind_with_globals", "parameter_names", "cotangent_names",
]  # fmt: skip


class AttributedFilename(str):
    """A source filename that remembers the module calls running when the op was recorded."""

    calls: Chain
    classes: dict[str, str]  # path -> class name, for every module of the root
    # Under ThunderFX: the FX graph's inputs that dynamo marks as a module's
    # parameters or buffers (see `parameter_names`).
    static_inputs: frozenset[str] = frozenset()

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
                    filename = _attributed(filename)
                except Exception:  # never break thunder's tracing over a profiling annotation
                    pass
            return original(self, filename, positions)

        set_current_source_location.__wrapped__ = original  # type: ignore[attr-defined]
        TraceCtx.set_current_source_location = set_current_source_location
        _installed = True


def _attributed(filename: str) -> str:
    calls = _module_calls()
    if calls is None:
        return filename
    chain, classes, *statics = calls
    tagged = AttributedFilename(filename)
    tagged.calls = chain
    tagged.classes = classes
    if statics:
        tagged.static_inputs = statics[0]
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

    filename = getattr(bsym, "source_filename", None)
    if isinstance(filename, AttributedFilename) and not getattr(bsym.sym, "is_fusion", False):
        return filename.calls
    parts = [recorded_chain(sub) for sub in getattr(bsym, "subsymbols", ())]
    if isinstance(filename, AttributedFilename):
        parts.append(filename.calls)
    return common_chain(parts)


def recorded_classes(bsym: Any) -> dict[str, str] | None:
    """The path -> class table recorded with a bound symbol (or one of its parts)."""
    filename = getattr(bsym, "source_filename", None)
    if isinstance(filename, AttributedFilename):
        return filename.classes
    for sub in getattr(bsym, "subsymbols", ()):
        found = recorded_classes(sub)
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
