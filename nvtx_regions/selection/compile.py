"""Spec tree to compiled rules: each rule sorted into its kind, with its run-time gate.

A rule is one of four kinds, each a class with its own `plan(view)`:
`OpRule` (one range per selected op), `RegionRule` (one range around a bare
region), `EachRule` (one range per matching module call) and
`EachMarkerRule` (one range per occurrence of a matching user's marker). The selector
primitives they evaluate live in `selectors`.

Compile once, evaluate many times: every error that depends only on the
spec's text is raised by `compile_spec`. Evaluating a compiled rule on a trace
raises only for what the trace decides (a region whose end comes before its
start).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .view import Phase, View
from ..core.globs import name_matcher, path_matcher
from ..core.markers import Marker
from ..language.tree import (
    All,
    And,
    EachMarker,
    EachModule,
    Expr,
    ModuleIn,
    RankIn,
    Rule,
    Spec,
    Steps,
    Visitor,
    conjuncts,
    walk,
)
from .markers import EachMarkerSelector
from .selectors import (
    EachSelector,
    RegionOrderError,  # re-exported: what a compiled rule raises on a trace
    RegionSelector,
    Selector,
    SelectorBuilder,
    each_alone,
    module_selector,
    span_mask,
)

__all__ = [
    "Gate", "CompiledRule", "OpRule", "RegionRule", "EachRule", "EachMarkerRule", "RuleRanges", "RangeSpan",
    "CompiledSpec", "compile_spec", "RegionOrderError",
]  # fmt: skip


@dataclass(frozen=True)
class Gate:
    """A run-time condition: on these ranks, during these calls (steps) of a compiled function.

    `None` for either part means "any".
    """

    ranks: frozenset[int] | None = None
    first_step: int | None = None
    last_step: int | None = None

    def is_open(self, rank: int, step: int) -> bool:
        if self.ranks is not None and rank not in self.ranks:
            return False
        if self.first_step is not None and step < self.first_step:
            return False
        return self.last_step is None or step <= self.last_step

    def text(self) -> str:
        parts = []
        if self.ranks is not None:
            parts.append(f"rank in <{', '.join(map(str, sorted(self.ranks)))}>")
        if self.first_step is not None:
            parts.append(f"steps {self.first_step}..{'' if self.last_step is None else self.last_step}")
        return " and ".join(parts)


@dataclass(frozen=True)
class RangeSpan:
    """One range around several ops of a trace: compute positions `first`..`last`."""

    first: int
    last: int
    depth: int  # same extent: lower depth is outer (the module tree of an `each` rule)
    label: str | None  # the range's message (None: a user's marker pushed without one)
    positions: int  # bitset of the ops it stands for
    marker: Marker | None = None  # an `each marker` range: the user's marker it re-emits


@dataclass(frozen=True)
class RuleRanges:
    """What one rule selects in one trace, and the ranges that follow."""

    selected: int  # bitset of compute positions
    per_op: bool = False  # one range per selected op
    region: RangeSpan | None = None  # a region rule's range, where its region resolves
    calls: tuple[RangeSpan, ...] = ()  # an each rule's ranges, one per module call (or marker occurrence)

    @property
    def spans(self) -> tuple[RangeSpan, ...]:
        """Every range of this rule that covers several ops."""
        return self.calls if self.region is None else (self.region, *self.calls)

    @property
    def ranges(self) -> int:
        return len(self.spans) + (bin(self.selected).count("1") if self.per_op else 0)


@dataclass(frozen=True)
class CompiledRule:
    """One rule, ready to evaluate on trace views; one subclass per kind of rule."""

    rule: Rule
    number: int  # 0-based position in the spec
    gate: Gate | None
    filename: str

    ranges_text: ClassVar[str]  # what the rule's ranges are, for reports
    per_op: ClassVar[bool] = False  # one range per selected op
    # Whether the compiler's scheduling (thunder's, Inductor's), not the user's text, decides where each of its
    # ranges lies (one per module call or marker occurrence): such ranges that
    # cross another become start/end ranges (`plan`).
    placed_by_compiler: ClassVar[bool] = False
    # Whether the backend it was compiled for runs it (`support.UnsupportedRule`: no).
    applies: ClassVar[bool] = True

    def describe(self) -> str:
        return self.rule.describe(self.filename)

    def plan(self, view: View) -> RuleRanges:
        """What this rule selects in `view`. Raises `RegionOrderError` for a region that ends before it starts."""
        raise NotImplementedError


@dataclass(frozen=True)
class OpRule(CompiledRule):
    """A filter: one range per op it selects."""

    select: Selector

    ranges_text: ClassVar[str] = "one range per op"
    per_op: ClassVar[bool] = True

    def plan(self, view: View) -> RuleRanges:
        return RuleRanges(self.select(view), per_op=True)


@dataclass(frozen=True)
class RegionRule(CompiledRule):
    """A bare region (``between ...``, optionally ``and forward``/``and backward``): one range around it."""

    region: RegionSelector

    ranges_text: ClassVar[str] = "one range per region"

    def bounds(self, view: View) -> tuple[int, int] | None:
        """The (start, end) compute positions of this rule's region in `view`, or None."""
        return self.region.bounds(view, self.describe())

    def plan(self, view: View) -> RuleRanges:
        bounds = self.bounds(view)
        if bounds is None:
            return RuleRanges(0)
        first, last = bounds
        mask = span_mask(first, last)
        label = self.rule.label if self.rule.label is not None else self.region.text()
        return RuleRanges(mask, region=RangeSpan(first, last, 0, label, mask))


@dataclass(frozen=True)
class EachRule(CompiledRule):
    """``each module <...>`` / ``each class <...>``: one range per matching module call."""

    each: EachSelector

    ranges_text: ClassVar[str] = "one range per module call"
    placed_by_compiler: ClassVar[bool] = True

    def plan(self, view: View) -> RuleRanges:
        calls = tuple(
            RangeSpan(span.first, span.last, span.depth, span.message, span.positions) for span in self.each.spans(view)
        )
        selected = 0
        for span in calls:
            selected |= span.positions
        return RuleRanges(selected, calls=calls)


@dataclass(frozen=True)
class EachMarkerRule(CompiledRule):
    """``each marker <...>``: one range per occurrence of a user's marker whose message matches,
    in the marker's own NVTX domain (`RangeSpan.marker`)."""

    each: EachMarkerSelector

    ranges_text: ClassVar[str] = "one range per marker occurrence"
    placed_by_compiler: ClassVar[bool] = True

    def plan(self, view: View) -> RuleRanges:
        calls = tuple(
            RangeSpan(span.first, span.last, span.depth, span.message, span.positions, span.marker)
            for span in self.each.spans(view)
        )
        selected = 0
        for span in calls:
            selected |= span.positions
        return RuleRanges(selected, calls=calls)


@dataclass(frozen=True)
class CompiledSpec:
    rules: tuple[CompiledRule, ...]
    spec: Spec
    backend: str | None = None  # the backend it is compiled for (`support.restrict`); None: none yet


class _Part(Visitor):
    """The part a top-level conjunct plays in its rule: "gate", "forward", "backward",
    "scope" (module/class), "each", "region" (between), or "filter" (anything else)."""

    def _gate(self, node: object) -> str:
        return "gate"

    def _filter(self, node: object) -> str:
        return "filter"

    def _scope(self, node: object) -> str:
        return "scope"

    def _each(self, node: object) -> str:
        return "each"

    visit_RankIn = visit_Steps = _gate
    visit_ModuleIn = visit_ClassIn = _scope
    visit_EachModule = visit_EachClass = visit_EachMarker = _each
    visit_OpIn = visit_Reads = visit_BackwardOf = visit_All = visit_Source = visit_MarkerIn = _filter
    visit_Not = visit_And = visit_Or = _filter
    visit_Proxy = visit_First = visit_Last = _filter  # endpoints: inside a region only

    def visit_Forward(self, node: object) -> str:
        return "forward"

    def visit_Backward(self, node: object) -> str:
        return "backward"

    def visit_Between(self, node: object) -> str:
        return "region"


_PART = _Part()


def _phase(parts: list[str]) -> tuple[Phase | None, bool]:
    """(phase, never) from the "forward"/"backward" conjuncts of a rule."""
    phases = {p for p in parts if p in ("forward", "backward")}
    if len(phases) > 1:
        return None, True
    return (phases.pop() if phases else None), False


def _gate(gates: list[Expr]) -> Gate | None:
    if not gates:
        return None
    ranks: frozenset[int] | None = None
    first: int | None = None
    last: int | None = None
    for expr in gates:
        if isinstance(expr, RankIn):
            these = frozenset(expr.ranks)
            ranks = these if ranks is None else ranks & these
        elif isinstance(expr, Steps):
            first = expr.first if first is None else max(first, expr.first)
            if expr.last is not None:
                last = expr.last if last is None else min(last, expr.last)
        else:
            raise TypeError(f"not a run-time gate: {expr!r}")
    return Gate(ranks, first, last)


def _compile_rule(rule: Rule, number: int, filename: str) -> CompiledRule:
    describe = rule.describe(filename)
    builder = SelectorBuilder(describe)
    found = conjuncts(rule.expr)
    gate = _gate([e for e in found if _PART.visit(e) == "gate"])
    rest = [e for e in found if _PART.visit(e) != "gate"]
    for expr in rest:
        for inner in walk(expr):
            part = _PART.visit(inner)
            if part == "gate" or (part == "each" and inner is not expr):
                builder.visit(inner)  # raises the explanatory error
    parts = [_PART.visit(e) for e in rest]
    eaches = [e for e, part in zip(rest, parts) if part == "each"]
    if eaches:
        phase, never = _phase(parts)
        if len(eaches) > 1 or any(part in ("region", "filter") for part in parts):
            culprit = eaches[1] if len(eaches) > 1 else eaches[0]
            raise builder.error(each_alone(culprit))
        (each,) = eaches
        if isinstance(each, EachMarker):
            scopes = tuple(
                module_selector("module" if isinstance(e, ModuleIn) else "class", e.globs)
                for e, part in zip(rest, parts)
                if part == "scope"
            )
            selector = EachMarkerSelector(name_matcher(each.globs), phase, never, scopes)
            return EachMarkerRule(rule, number, gate, filename, selector)
        by = "module" if isinstance(each, EachModule) else "class"
        matches = path_matcher(each.globs) if by == "module" else name_matcher(each.globs)
        within = tuple(
            ("module", path_matcher(e.globs)) if isinstance(e, ModuleIn) else ("class", name_matcher(e.globs))
            for e, part in zip(rest, parts)
            if part == "scope"
        )
        return EachRule(rule, number, gate, filename, EachSelector(by, matches, phase, never, within))
    regions = [e for e, part in zip(rest, parts) if part == "region"]
    if len(regions) == 1 and all(part in ("region", "forward", "backward") for part in parts):
        (between,) = regions
        phase, never = _phase(parts)
        selector = RegionSelector(builder.visit(between.start), builder.visit(between.end), phase, never)
        return RegionRule(rule, number, gate, filename, selector)
    body: Expr = All() if not rest else rest[0] if len(rest) == 1 else And(tuple(rest))
    return OpRule(rule, number, gate, filename, builder.visit(body))


def compile_spec(spec: Spec) -> CompiledSpec:
    """Compile every rule of `spec`. Raises `SelectorError` naming the rule for a
    rule that cannot be evaluated (a run-time gate used under `not` or `or`)."""
    return CompiledSpec(tuple(_compile_rule(rule, n, spec.filename) for n, rule in enumerate(spec.rules)), spec)

