"""Compiled spec + trace view -> a plan: the ranges to emit, properly nested.

Promises:
- Every range covers compute bound symbols only at its ends; a region may
  span non-compute ones in between.
- An op selected by several rules gets one range.
- Regions with the same extent nest in rule order (the first rule outermost);
  module calls of one ``each`` rule with the same extent nest as the module tree.
- An ``each`` rule gives one region per matching module call, from its first to
  its last op; where the compiler put another module's ops between the call's
  own, one region per part, each holding the call's ops and no other
  module's, the later ones named ``... (continued)``
  (`selectors.call_parts`).
- NVTX push/pop ranges must nest, within each NVTX domain (NVTX keeps one
  stack per domain: an ``each marker`` range in the user's own domain,
  `PlannedRange.domain`, needs to nest only with the ranges of that domain).
  Where a range of an ``each`` rule (a module call's part, or a user's marker)
  partially overlaps another range (a region, a marker), the overlap is the
  compiler's scheduling, not the user's text: that range becomes a
  start/end range (``style="StartEnd"``, which may overlap; `why` names the
  range it crosses), and so does the other range if it is one of an
  ``each`` rule too. Two regions the user wrote (``between``) that
  partially overlap raise `SelectorError` naming both rules. The push/pop
  ranges left nest.
- `ranges` are in push order: at a given bound symbol, outer before inner.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from .view import Phase, View
from ..core.bits import bit_positions
from ..core.errors import SelectorError
from ..core.markers import RECORD_FUNCTION, Marker
from .compile import CompiledSpec, Gate, RuleRanges

__all__ = ["PlannedRange", "Plan", "make_plan"]

GateKey = frozenset[Gate] | None  # None: always on


@dataclass(frozen=True)
class PlannedRange:
    start: int  # index in trace.bound_symbols of the first bound symbol inside
    end: int  # index of the last bound symbol inside
    kind: Literal["op", "region"]
    rules: tuple[int, ...]  # numbers of the rules that asked for it
    label: str | None  # the region's message; None for an op range
    gate: GateKey
    # For an `each marker` range: the user's marker it re-emits (its domain and colour).
    marker: Marker | None = None
    style: Literal["PushPop", "StartEnd"] = "PushPop"  # as Nsight names NVTX's two kinds of range
    why: str | None = None  # for a start/end range: the range it crosses

    def domain(self, own: Any) -> Any:
        """The NVTX domain this range goes in, when the transform's own is `own`: a
        marker's own domain (``record_function`` has none: `own`), else `own`."""
        if self.marker is None or self.marker.form == RECORD_FUNCTION:
            return own
        return self.marker.domain


@dataclass(frozen=True)
class Plan:
    phase: Phase
    trace_name: str
    ranges: tuple[PlannedRange, ...]
    per_rule: tuple[RuleRanges, ...]  # what each rule selected, by rule number

    @property
    def empty(self) -> bool:
        return not self.ranges

    @property
    def ranges_per_rule(self) -> tuple[int, ...]:
        """Per rule: how many ranges it produced."""
        return tuple(found.ranges for found in self.per_rule)


def _merge_gates(gates: list[Gate | None]) -> GateKey:
    if any(gate is None for gate in gates):
        return None
    return frozenset(gates)  # type: ignore[arg-type]


# The emitting transform's own domain when the caller does not name it: distinct from every user domain.
OWN_DOMAIN: Any = type("OwnDomain", (), {"__repr__": lambda self: "<the transform's domain>"})()


def make_plan(spec: CompiledSpec, view: View, domain: Any = OWN_DOMAIN) -> Plan:
    """Plan the ranges of `spec` in one trace, for a transform whose own NVTX domain is `domain`
    (a name, None for NVTX's default domain).

    Raises `SelectorError` for partially overlapping regions, and
    `RegionOrderError` (a `SelectorError`) for a region that ends before it starts.
    """
    regions: list[tuple[int, int, int, int, PlannedRange]] = []
    op_rules: dict[int, list[int]] = {}
    per_rule = []
    for rule in spec.rules:
        found = rule.plan(view)
        per_rule.append(found)
        gate = _merge_gates([rule.gate])
        for span in found.spans:
            start, end = view.ops[span.first].index, view.ops[span.last].index
            planned = PlannedRange(start, end, "region", (rule.number,), span.label, gate, span.marker)
            regions.append((start, -end, rule.number, span.depth, planned))
        if found.per_op:
            for position in bit_positions(found.selected):
                op_rules.setdefault(position, []).append(rule.number)

    regions.sort(key=lambda item: item[:4])
    stacks: dict[Any, list[PlannedRange]] = {}
    for item in regions:
        stacks.setdefault(item[4].domain(domain), []).append(item[4])
    nested = [planned for ranges in stacks.values() for planned in _start_end_where_calls_cross(ranges, spec, view)]

    gates = {rule.number: rule.gate for rule in spec.rules}
    op_ranges = []
    for position in sorted(op_rules):
        numbers = tuple(op_rules[position])
        index = view.ops[position].index
        op_ranges.append(
            PlannedRange(index, index, "op", numbers, None, _merge_gates([gates[n] for n in numbers]))
        )

    # Push order: by start; at the same start, regions (outer to inner) before the op.
    ordered = sorted(
        nested + op_ranges,
        key=lambda r: (r.start, r.kind == "op", -r.end, r.rules[0]),
    )
    return Plan(view.phase, view.name, tuple(ordered), tuple(per_rule))


def _start_end_where_calls_cross(regions: list[PlannedRange], spec: CompiledSpec, view: View) -> list[PlannedRange]:
    """`regions` (sorted outer first), with the ranges that the compiler placed
    (`CompiledRule.placed_by_compiler`) and that cross another range made
    start/end ranges (see the module doc).

    Raises `SelectorError` where two regions the user wrote cross.
    """
    crossed: dict[int, PlannedRange] = {}  # region's position in `regions` -> a range it crosses
    for i, outer in enumerate(regions):
        for j in range(i + 1, len(regions)):
            inner = regions[j]
            if inner.start > outer.end:
                break
            if inner.end <= outer.end:
                continue
            first, second = spec.rules[outer.rules[0]], spec.rules[inner.rules[0]]
            if not (first.placed_by_compiler or second.placed_by_compiler):
                raise SelectorError(
                    f"{first.describe()} and {second.describe()} overlap without nesting in the "
                    f"{view.phase} {view.program} {view.name!r} ({view.units} {outer.start}..{outer.end} "
                    f"and {inner.start}..{inner.end}); NVTX ranges must nest, so make one region "
                    "contain the other or keep them apart"
                )
            if first.placed_by_compiler:
                crossed.setdefault(i, inner)
            if second.placed_by_compiler:
                crossed.setdefault(j, outer)
    if not crossed:
        return regions
    return [
        replace(
            region,
            style="StartEnd",
            why=f"crosses {crossed[n].label!r} ({view.units} {crossed[n].start}..{crossed[n].end}): "
            "the compiler (thunder, Inductor) interleaved their ops",
        )
        if n in crossed
        else region
        for n, region in enumerate(regions)
    ]
