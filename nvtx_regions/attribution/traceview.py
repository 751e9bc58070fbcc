"""A read-only index of one trace: which bound symbols compute, and who produces
and consumes each proxy name.

Everything the planner asks is answered from indexes built once per trace
(no quadratic scans). Selections are Python ints used as bitsets over
*compute positions*: bit ``p`` stands for the ``p``-th compute bound symbol.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterable, Sequence

from ..core.bits import bit_positions
from ..core.calls import common_chain, parts_below
from ..core.markers import MarkerLog, MarkerStack, common_markers
from ..core.naming import Phase
from .module_calls import backward_origins, forward_chains, parameter_only
from ..internals.thunder import (
    cotangent_names,
    parameter_names,
    recorded_chain,
    recorded_classes,
    recorded_marker_log,
    recorded_markers,
)


# Bound symbols that never get a range of their own (they may sit inside a
# region). thunder's NON_COMPUTATION_PRIMS misses some of these.
_NON_COMPUTE_NAMES = frozenset(
    {
        "update_aliases",
        "clear_mutable_collection",
        "unpack_parameter",
        "unpack_buffer",
        "unpack_submodule",
        "unpack_function_obj",
        "unpack_cache_info",
        "python_return",
        "python_del",
        "return",
        "del",
        "comment",
        "print",
        "python_print",
        "nvtx_range_push",
        "nvtx_range_pop",
        "python_vars",
        "construct_tuple",
        "pack_list",
        "pack_setitem",
        "unpack_dict_key",
    }
)
# Push/pop/enter/exit bound symbols inserted by this package or by thunder's own transform.
_OWN_PREFIXES = ("nvtx_regions_", "nvtx_range_")


@dataclass(frozen=True)
class Op:
    """One bound symbol as the planner sees it."""

    index: int  # position in trace.bound_symbols
    name: str  # sym.name: "linear", "TorchCompile0"
    reads: tuple[str, ...]  # names of the proxies it consumes
    writes: tuple[str, ...]  # names of the proxies it produces
    is_fusion: bool = False
    bsym: Any = field(default=None, compare=False, repr=False)  # the thunder bound symbol, if any

    @property
    def text(self) -> str:
        """What `explain` lists for it: the bound symbol's line(s), or its name."""
        return self.name if self.bsym is None else one_line(self.bsym)


def is_compute(bsym: Any, non_computation_ids: frozenset) -> bool:
    """True for a bound symbol that does work at run time and may get a range."""
    sym = bsym.sym
    name = sym.name
    if sym.id in non_computation_ids or name in _NON_COMPUTE_NAMES:
        return False
    return not (name.startswith("unpack_") or name.startswith(_OWN_PREFIXES))


@functools.lru_cache(maxsize=1)
def _non_computation_ids() -> frozenset:
    from thunder.dev_utils.utils import NON_COMPUTATION_PRIMS

    return frozenset(NON_COMPUTATION_PRIMS)


def _names(proxies: Iterable[Any]) -> tuple[str, ...]:
    return tuple(p.name for p in proxies if hasattr(p, "name"))


@dataclass
class TraceView:
    """The compute bound symbols of one trace, in order, with their indexes.

    `ops` holds only compute bound symbols; `ops[p].index` is the bound
    symbol's position in the full trace. `args` are the proxy names of the
    traced function's flattened arguments.
    """

    program: ClassVar[str] = "trace"
    units: ClassVar[str] = "bound symbols"

    ops: Sequence[Op]
    phase: Phase
    args: frozenset[str] = frozenset()
    name: str = "computation"
    length: int = 0  # number of bound symbols in the full trace
    # For a backward trace: the forward trace of the same compilation, when known.
    forward: TraceView | None = None
    # The traced function's positional arguments in order (None where not a proxy),
    # and for a backward trace the names its return holds (the gradients,
    # aligned with the forward's `arg_order`).
    arg_order: tuple[str | None, ...] = ()
    returned: tuple[str | None, ...] = ()
    # Where static values start (`module_calls.parameter_only`): a forward's
    # arguments that are parameters or buffers; a backward's cotangents.
    parameters: frozenset[str] = frozenset()
    cotangents: frozenset[str] = frozenset()
    _producer: dict[str, int] = field(default_factory=dict, repr=False)
    _first_consumer: dict[str, int] = field(default_factory=dict, repr=False)
    _last_consumer: dict[str, int] = field(default_factory=dict, repr=False)
    _indexed: bool = field(default=False, repr=False)

    @classmethod
    def from_trace(cls, trace: Any) -> TraceView:
        """Index a thunder trace. Only compute bound symbols become `Op`s."""
        from thunder.core.proxies import CollectionProxy, Proxy
        from thunder.core.trace import TraceTag

        non_compute = _non_computation_ids()
        ops = []
        for index, bsym in enumerate(trace.bound_symbols):
            if not is_compute(bsym, non_compute):
                continue
            ops.append(
                _LazyOp(index, bsym.sym.name, bsym, bool(getattr(bsym.sym, "is_fusion", False)))
            )
        phase: Phase = "backward" if TraceTag.BACKWARD in trace.tags else "forward"
        # Only the function's own proxy arguments: the backward's collections
        # (saved_for_backward, cotangents) are unpacked, and their contents are
        # not arguments there.
        arguments = [*trace.args, *trace.kwargs.values()]
        flat_args = [a for a in arguments if isinstance(a, Proxy) and not isinstance(a, CollectionProxy)]
        fn = getattr(trace, "fn", None)
        name = getattr(fn, "__name__", None) or ("backward_fn" if phase == "backward" else "computation")
        order = tuple(a.name if isinstance(a, Proxy) and not isinstance(a, CollectionProxy) else None for a in trace.args)
        returned: tuple[str | None, ...] = ()
        if phase == "backward" and trace.bound_symbols and trace.bound_symbols[-1].sym.name == "python_return":
            (value,) = trace.bound_symbols[-1].args[:1] or (None,)
            if isinstance(value, (tuple, list)):
                returned = tuple(v.name if isinstance(v, Proxy) else None for v in value)
        return cls(
            ops, phase, frozenset(_names(flat_args)), name, len(trace.bound_symbols), arg_order=order,
            returned=returned,
            parameters=parameter_names(flat_args, trace.bound_symbols) if phase == "forward" else frozenset(),
            cotangents=cotangent_names(trace) if phase == "backward" else frozenset(),
        )  # fmt: skip

    # -- selections -------------------------------------------------------

    @functools.cached_property
    def everything(self) -> int:
        """The bitset with every compute position set."""
        return (1 << len(self.ops)) - 1

    @functools.cached_property
    def by_name(self) -> dict[str, int]:
        """Op name -> bitset of the positions with that name."""
        masks: dict[str, int] = {}
        for position, op in enumerate(self.ops):
            masks[op.name] = masks.get(op.name, 0) | (1 << position)
        return masks

    @functools.cached_property
    def by_read(self) -> dict[str, int]:
        """Proxy name -> bitset of the positions that read it."""
        masks: dict[str, int] = {}
        for position, op in enumerate(self.ops):
            bit = 1 << position
            for name in op.reads:
                masks[name] = masks.get(name, 0) | bit
        return masks

    @functools.cached_property
    def proxy_names(self) -> frozenset[str]:
        """Every proxy name a compute op reads or writes, plus the arguments."""
        self._index()
        return frozenset(self._producer) | frozenset(self._first_consumer) | self.args

    def position_of(self, index: int) -> int:
        """The compute position of the bound symbol at `index` of the full trace."""
        positions = self.__dict__.get("_positions")
        if positions is None:
            positions = self.__dict__["_positions"] = {op.index: p for p, op in enumerate(self.ops)}
        return positions[index]

    # -- modules -----------------------------------------------------------

    @functools.cached_property
    def origins(self) -> list[int | None]:
        """Per op of a backward trace: its forward origins, a bitset over the
        forward's positions (`modules.backward_origins`); empty without a forward."""
        if self.phase != "backward" or self.forward is None:
            return [None] * len(self.ops)
        return backward_origins(self, self.forward, self.returned)

    @functools.cached_property
    def module_chains(self) -> list[Any]:
        """Per op: the module calls it belongs to, outermost first (a `modules.Chain`), or None."""
        if self.phase == "forward":
            return forward_chains(self, [recorded_chain(op.bsym) if op.bsym is not None else None for op in self.ops])
        if self.forward is None:
            return [None] * len(self.ops)
        chains = self.forward.module_chains
        return [
            None if mask is None else common_chain(chains[p] for p in bit_positions(mask)) for mask in self.origins
        ]

    @functools.cached_property
    def module_parts(self) -> list[Any]:
        """Per op of a backward trace: the module calls just below its chain whose gradients it computes
        (`calls.parts_below`); a forward op's are not recorded (none)."""
        if self.phase == "forward" or self.forward is None:
            return [()] * len(self.ops)
        chains = self.forward.module_chains
        return [
            () if mask is None else parts_below(common, [chains[p] for p in bit_positions(mask)])
            for common, mask in zip(self.module_chains, self.origins)
        ]

    @functools.cached_property
    def parameter_only(self) -> int:
        """The ops that read only static values (a bitset; `module_calls.parameter_only`):
        in a forward, parameters, buffers, constants and what ops compute from
        those alone; in a backward, also everything saved from the forward."""
        if self.phase == "forward":
            return parameter_only(self, self.parameters)
        # What the backward reads without computing it was saved by the
        # forward: all of it but the cotangents is static here.
        computed = {name for op in self.ops for name in op.writes}
        saved = {name for op in self.ops for name in op.reads} - computed - self.cotangents
        return parameter_only(self, frozenset(saved))

    @functools.cached_property
    def module_classes(self) -> dict[str, str]:
        """Path -> class name of every module of the traced model, as recorded (empty if none was)."""
        view = self if self.phase == "forward" or self.forward is None else self.forward
        for op in view.ops:
            if op.bsym is not None:
                found = recorded_classes(op.bsym)
                if found is not None:
                    return found
        return {}

    # -- the user's markers ------------------------------------------------

    def markers_in_parts(self, position: int) -> frozenset[Any]:
        """A fusion's: the markers recorded open around any of its parts (a forward fusion's)."""
        op = self.ops[position]
        if not op.is_fusion or op.bsym is None:
            return frozenset()
        return frozenset(m for part in op.bsym.subsymbols for m in (recorded_markers(part) or ()))

    @functools.cached_property
    def marker_stacks(self) -> list[MarkerStack]:
        """Per op: the user's NVTX markers open around it (`core.markers`), in push order; () for none.

        Forward: as recorded (a fusion: the markers open around all its
        parts; an op with no record: none). Backward: the markers open around
        all its forward origins, the rule `module_chains` uses.
        """
        if self.phase == "forward":
            return [(recorded_markers(op.bsym) or ()) if op.bsym is not None else () for op in self.ops]
        if self.forward is None:
            return [()] * len(self.ops)
        stacks = self.forward.marker_stacks
        return [
            () if mask is None else common_markers(stacks[p] for p in bit_positions(mask)) or ()
            for mask in self.origins
        ]

    @functools.cached_property
    def marker_log(self) -> MarkerLog | None:
        """What the traced function did with markers (for a backward trace: its forward's); None if it pushed none."""
        view = self if self.phase == "forward" or self.forward is None else self.forward
        for op in view.ops:
            if op.bsym is not None:
                found = recorded_marker_log(op.bsym)
                if found is not None:
                    return found if found.pushed or found.unmatched else None
        return None

    @functools.cached_property
    def source_lines(self) -> list[tuple[tuple[str, int], ...]]:
        """Per op: the (filename, line)s where thunder recorded it (a fusion: all
        its parts'); empty for backward ops, which have none."""
        return [tuple(dict.fromkeys(_source_lines(op.bsym))) if op.bsym is not None else () for op in self.ops]

    # -- region endpoints --------------------------------------------------

    def _index(self) -> None:
        if self._indexed:
            return
        for position, op in enumerate(self.ops):
            for name in op.writes:
                self._producer.setdefault(name, position)
            for name in op.reads:
                self._first_consumer.setdefault(name, position)
                self._last_consumer[name] = position
        self._indexed = True

    def region_start(self, name: str) -> int | None:
        """Position where a region starting at proxy `name` begins, or None.

        The compute op that produces it; for an argument of the traced
        function, the first compute op that consumes it.
        """
        self._index()
        if name in self._producer:
            return self._producer[name]
        if name in self.args:
            return self._first_consumer.get(name)
        return None

    def region_end(self, name: str) -> int | None:
        """Position where a region ending at proxy `name` ends, or None.

        The compute op that produces it; for an argument, the last compute op
        that consumes it.
        """
        self._index()
        if name in self._producer:
            return self._producer[name]
        if name in self.args:
            return self._last_consumer.get(name)
        return None


def _source_lines(bsym: Any) -> Iterable[tuple[str, int]]:
    filename = getattr(bsym, "source_filename", None)
    positions = getattr(bsym, "source_positions", None)
    if filename and positions is not None and not getattr(bsym.sym, "is_fusion", False):
        yield str(filename), positions.lineno
        return
    for sub in getattr(bsym, "subsymbols", ()):
        yield from _source_lines(sub)


class _LazyOp:
    """An `Op` whose reads/writes are flattened from the bound symbol on first use.

    Flattening every bound symbol's arguments is most of the cost of indexing
    a trace, and many specs (``op in <...>``) never need it.
    """

    __slots__ = ("index", "name", "is_fusion", "bsym", "_reads", "_writes")

    def __init__(self, index: int, name: str, bsym: Any, is_fusion: bool) -> None:
        self.index, self.name, self.is_fusion, self.bsym = index, name, is_fusion, bsym
        self._reads = self._writes = None

    @property
    def text(self) -> str:
        """What `explain` lists for it: the bound symbol's line(s)."""
        return one_line(self.bsym)

    @property
    def reads(self) -> tuple[str, ...]:
        if self._reads is None:
            self._reads = _names(self.bsym.flat_proxy_args)
        return self._reads

    @property
    def writes(self) -> tuple[str, ...]:
        if self._writes is None:
            self._writes = _names(self.bsym.flat_proxy_outs)
        return self._writes


def one_line(bsym: Any) -> str:
    """The bound symbol's own Python line(s), without its header or subsymbols."""
    lines = [line for line in bsym.python(indent=0, print_depth=1) if not line.lstrip().startswith("#")]
    return " ".join(line.strip() for line in lines)
