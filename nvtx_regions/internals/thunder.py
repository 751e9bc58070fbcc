"""Thunder's trace objects: what its bound symbols carry and how ours are built.

Reads what the module recorder (`recorder`) left on each bound symbol's
``source_filename``, and the tags and argument layout thunder gives a trace;
builds the bound symbols the transform inserts.

The records: thunder 0.2.6 copies ``source_filename`` along through its
passes (decompositions, the grad transform, executors), and keeps a fusion's
parts in ``subsymbols`` (``bsym.sym.is_fusion``). Without that, only ops
recorded as they are keep a module, and fusions have none.
"""

from __future__ import annotations

import weakref
from typing import Any

from ..core.calls import Chain, common_chain
from ..core.markers import MarkerLog, MarkerStack, common_markers
from .recorder import AttributedFilename

__all__ = [
    "recorded_chain", "recorded_classes", "recorded_markers", "recorded_marker_log",
    "bind_with_globals", "parameter_names", "cotangent_names",
    "note_ignored_options", "ignored_jit_keyword",
]  # fmt: skip


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


def recorded_markers(bsym: Any) -> MarkerStack | None:
    """The user's markers open when a bound symbol was recorded, in push order
    (for a fusion: those open around all its parts); None if it has no record."""
    return _recorded_in_common(bsym, lambda filename: filename.markers, common_markers)


def recorded_marker_log(bsym: Any) -> MarkerLog | None:
    """The `MarkerLog` of the function a bound symbol (or one of its parts) was recorded in; None if it has no record."""
    return _first_record(bsym, lambda filename: filename.marker_log)


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


def parameter_names(proxies: Any, bsyms: Any) -> frozenset[str]:
    """The names of the proxies among `proxies` (a trace's arguments) that are a
    model's parameters or buffers; `bsyms` are the trace's bound symbols.

    thunder 0.2.6 (``thunder/core/jit_ext.py``) adds ``ProxyTag.STATIC_MEMORY_LOCATION``
    to the proxy of every ``nn.Parameter`` it unpacks (under thunder.jit and
    ThunderFX, and FSDP's parameter shards) and of every buffer of a jitted
    module; under ThunderFX buffers are plain tensors, and dynamo's marks
    (`thunderfx.fx_node_calls`, recorded with the ops) name them. Without these, no
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


class CallGuard:
    """What a transform adds around the callable thunder builds from its trace: `wrap(function)`
    gives the callable thunder runs. Bound as a global of one of the transform's bound symbols
    (`bind_with_globals`), where `call_guards` finds it."""

    def __init__(self, wrap: Any) -> None:
        self.wrap = wrap


def call_guards(trace: Any) -> list[CallGuard]:
    """The `CallGuard`s bound to `trace`'s bound symbols (each once), in trace order.

    thunder 0.2.6: a bound symbol's globals are its ``_call_ctx``. Without it a
    trace's callable runs unguarded: a call that raises leaves its ranges open.
    """
    found: dict[int, CallGuard] = {}
    for bsym in trace.bound_symbols:
        for value in (getattr(bsym, "_call_ctx", None) or {}).values():
            if isinstance(value, CallGuard):
                found.setdefault(id(value), value)
    return list(found.values())


# Each transform that thunder.jit was given under a keyword it ignores: [(its CompileData, by weak
# reference, the keyword)], filled as each CompileData is made (`patches`).
_ignored: "weakref.WeakKeyDictionary[Any, list[tuple[weakref.ref[Any], str]]]" = weakref.WeakKeyDictionary()


def note_ignored_options(compile_data: Any) -> None:
    """Record the transforms in `compile_data`'s compile options, alone or in a list or tuple, for
    `ignored_jit_keyword`.

    thunder 0.2.6 keeps ``thunder.jit``'s unknown keyword arguments in
    ``CompileData.compile_options`` (thunder/common.py) and never reads them.
    """
    from thunder.core.transform_common import Transform

    for key, value in compile_data.compile_options.items():
        for item in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(item, Transform):
                try:
                    _ignored.setdefault(item, []).append((weakref.ref(compile_data), key))
                except TypeError:  # unhashable or not weakly referable: not one of ours
                    continue


def ignored_jit_keyword(transform: Any) -> tuple[str, str] | None:
    """(function name, keyword) when `transform` sits in a compile option other than transforms= of
    a ``thunder.jit`` compilation still alive (see `note_ignored_options`); None otherwise.

    Without this, the exit warning about a transform thunder never called only lacks the
    function's name and the keyword.
    """
    for compile_data, key in _ignored.get(transform, ()):
        owner = compile_data()
        if owner is not None:
            fn = getattr(owner, "fn", None)
            return getattr(fn, "__name__", type(fn).__name__), key
    return None
