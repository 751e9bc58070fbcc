"""Spec tree to compiled rules: selections over a `TraceView`, computed as bitsets.

Compile once, evaluate many times: every error that depends only on the
spec's text is raised by `compile_spec`. Evaluating a compiled rule on a trace
raises only for what the trace decides (a region whose end comes before its
start).
"""

from __future__ import annotations

import fnmatch
import functools
import re
from dataclasses import dataclass
from typing import Callable

from ..core.errors import SelectorError
from ..attribution.module_calls import anchored_span
from ..attribution.traceview import Phase, TraceView
from ..core.bits import bit_positions
from ..core.calls import ModuleCall, ancestors
from ..core.globs import class_matcher, path_matcher
from ..language.tree import (
    All,
    And,
    Backward,
    BackwardOf,
    Between,
    ClassIn,
    EachClass,
    EachModule,
    Endpoint,
    Expr,
    First,
    Forward,
    ModuleIn,
    Not,
    OpIn,
    Or,
    Proxy,
    RankIn,
    Reads,
    Rule,
    Source,
    Spec,
    Steps,
    render,
    walk,
)

__all__ = ["Gate", "CompiledRule", "CompiledSpec", "compile_spec", "RegionOrderError"]

Selector = Callable[[TraceView], int]


class RegionOrderError(SelectorError):
    """A region's endpoints resolve in a trace, but its end comes before its start."""


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
class FoundEndpoint:
    """A compiled ``first(...)``/``last(...)`` endpoint: the first or last compute op its filter selects."""

    text: str
    first: bool
    select: Selector


CompiledEndpoint = Proxy | FoundEndpoint


def _endpoint_text(point: CompiledEndpoint) -> str:
    return point.name if isinstance(point, Proxy) else point.text


@dataclass(frozen=True)
class RegionSelector:
    """A bare region: one range around [start, end] in each trace where both resolve."""

    start: CompiledEndpoint
    end: CompiledEndpoint
    phase: Phase | None  # None: forward and backward traces alike
    never: bool = False  # `forward and backward`: no trace is both


@dataclass(frozen=True)
class CallSpan:
    """One module call's ops in one trace: its range covers compute positions
    `first`..`last`, which leave out its hoisted ops (`module_calls.anchored_span`)."""

    call: ModuleCall
    depth: int  # in the module tree: 0 is the root
    first: int
    last: int
    positions: int  # bitset of the ops attributed to the call
    message: str


@dataclass(frozen=True)
class EachSelector:
    """``each module <...>`` / ``each class <...>``: one range per matching module call."""

    by: str  # "module" or "class"
    matches: Callable[[str], bool]
    phase: Phase | None
    never: bool = False
    # `and module <...>` / `and class <...>`: only calls at or inside a matching module.
    within: tuple[tuple[str, Callable[[str], bool]], ...] = ()

    def _inside(self, chain: tuple[ModuleCall, ...], depth: int, classes: dict[str, str]) -> bool:
        found = ancestors(chain[: depth + 1], classes)
        return all(any(test(path if by == "module" else cls) for path, cls in found) for by, test in self.within)

    def spans(self, view: TraceView) -> list[CallSpan]:
        """Each matching call with ops in `view`, in order of its first op (outer first)."""
        if self.never or (self.phase is not None and self.phase != view.phase):
            return []
        found: dict[ModuleCall, list[int]] = {}
        for position, chain in enumerate(view.module_chains):
            if not chain:
                continue
            for depth, call in enumerate(chain):
                name = call.path if self.by == "module" else call.cls
                if self.matches(name) and (not self.within or self._inside(chain, depth, view.module_classes)):
                    entry = found.setdefault(call, [depth, position, position, 0])
                    entry[2] = position
                    entry[3] |= 1 << position
        suffix = " (backward)" if view.phase == "backward" else ""
        hoisted = view.parameter_only
        spans = [
            CallSpan(call, d, *anchored_span(mask, hoisted), mask, call.name + suffix)
            for call, (d, _, _, mask) in found.items()
        ]
        spans.sort(key=lambda span: (span.first, -span.last, span.depth))
        return spans


@dataclass(frozen=True)
class CompiledRule:
    """One rule, ready to evaluate. Exactly one of `region`, `each` and `select` is set."""

    rule: Rule
    number: int  # 0-based position in the spec
    region: RegionSelector | None
    select: Selector | None
    gate: Gate | None
    filename: str
    each: EachSelector | None = None

    def describe(self) -> str:
        return self.rule.describe(self.filename)

    def region_bounds(self, view: TraceView) -> tuple[int, int] | None:
        """The (start, end) compute positions of this rule's region in `view`, or None."""
        region = self.region
        assert region is not None
        if region.never or (region.phase is not None and region.phase != view.phase):
            return None
        return _bounds(region.start, region.end, view, self)


@dataclass(frozen=True)
class CompiledSpec:
    rules: tuple[CompiledRule, ...]
    spec: Spec

    @property
    def has_gates(self) -> bool:
        return any(rule.gate is not None for rule in self.rules)


@functools.lru_cache(maxsize=4096)
def _glob_matcher(globs: tuple[str, ...]) -> Callable[[str], bool]:
    # fnmatchcase semantics (case-sensitive on every OS), one regex per glob
    # list; cached, since big specs repeat their lists.
    pattern = re.compile("|".join(f"(?:{fnmatch.translate(g)})" for g in globs))
    return lambda name: pattern.match(name) is not None


def _glob_selector(globs: tuple[str, ...], masks: Callable[[TraceView], dict[str, int]]) -> Selector:
    """Select the positions of every name in `masks(view)` (name -> bitset) that a glob matches."""
    matches = _glob_matcher(globs)

    def select(view: TraceView) -> int:
        mask = 0
        for name, name_mask in masks(view).items():
            if matches(name):
                mask |= name_mask
        return mask

    return select


def _module_selector(by: str, globs: tuple[str, ...]) -> Selector:
    """Ops attributed to a module, or a module above it, whose path (or class name) matches."""
    matches = path_matcher(globs) if by == "module" else class_matcher(globs)
    key = (by, globs)

    def select(view: TraceView) -> int:
        cache = view.__dict__.setdefault("_module_masks", {})
        if key not in cache:
            classes = view.module_classes
            mask = 0
            for position, chain in enumerate(view.module_chains):
                if chain and any(matches(path if by == "module" else cls) for path, cls in ancestors(chain, classes)):
                    mask |= 1 << position
            cache[key] = mask
        return cache[key]

    return select


def _source_selector(source: Source) -> Selector:
    patterns = (source.file, "*/" + source.file)

    def select(view: TraceView) -> int:
        mask = 0
        for position, lines in enumerate(view.source_lines):
            for filename, line in lines:
                if source.first <= line <= source.last and any(fnmatch.fnmatchcase(filename, p) for p in patterns):
                    mask |= 1 << position
                    break
        return mask

    return select


def _endpoint_position(point: CompiledEndpoint, view: TraceView, *, start: bool) -> int | None:
    if isinstance(point, Proxy):
        return view.region_start(point.name) if start else view.region_end(point.name)
    mask = point.select(view)
    if not mask:
        return None
    if point.first:
        return (mask & -mask).bit_length() - 1
    return mask.bit_length() - 1


def _bounds(
    start: CompiledEndpoint, end: CompiledEndpoint, view: TraceView, rule: CompiledRule | None
) -> tuple[int, int] | None:
    first = _endpoint_position(start, view, start=True)
    if first is None:
        return None
    last = _endpoint_position(end, view, start=False)
    if last is None:
        return None
    if last < first:
        who = rule.describe() if rule is not None else "a region"
        raise RegionOrderError(
            f"{who}: in the {view.phase} trace {view.name!r} the region ends at {_endpoint_text(end)} "
            f"(op #{last}: {view.ops[last].name}) before it starts at {_endpoint_text(start)} "
            f"(op #{first}: {view.ops[first].name}); swap the endpoints"
        )
    return first, last


def _span(first: int, last: int) -> int:
    return ((1 << (last + 1)) - 1) ^ ((1 << first) - 1)


def _conjuncts(expr: Expr) -> list[Expr]:
    """The operands of a top-level `and`, with parenthesized `and`s inside it flattened."""
    if not isinstance(expr, And):
        return [expr]
    return [part for operand in expr.operands for part in _conjuncts(operand)]


class _Compiler:
    def __init__(self, rule: Rule, describe: str) -> None:
        self.rule = rule
        self.describe = describe
        self.compiled: CompiledRule | None = None

    def error(self, message: str) -> SelectorError:
        return SelectorError(f"{self.describe}: {message}")

    def expr(self, expr: Expr) -> Selector:
        if isinstance(expr, OpIn):
            return _glob_selector(expr.globs, lambda view: view.by_name)
        if isinstance(expr, Reads):
            return _glob_selector(expr.globs, lambda view: view.by_read)
        if isinstance(expr, Between):
            start, end = self.endpoint(expr.start), self.endpoint(expr.end)

            def between(view: TraceView) -> int:
                bounds = _bounds(start, end, view, self.compiled)
                return 0 if bounds is None else _span(*bounds)

            return between
        if isinstance(expr, Forward):
            return lambda view: view.everything if view.phase == "forward" else 0
        if isinstance(expr, Backward):
            return lambda view: view.everything if view.phase == "backward" else 0
        if isinstance(expr, BackwardOf):
            inner = self.expr(expr.expr)

            def backward_of(view: TraceView) -> int:
                forward = view.forward
                if view.phase != "backward" or forward is None:
                    return 0
                # The backward ops the attribution rule (modules.backward_origins) traces to those forward ops.
                chosen = inner(forward)
                mask = 0
                for position, origins in enumerate(view.origins):
                    if origins is not None and origins & chosen:
                        mask |= 1 << position
                return mask

            return backward_of
        if isinstance(expr, All):
            return lambda view: view.everything
        if isinstance(expr, ModuleIn):
            return _module_selector("module", expr.globs)
        if isinstance(expr, ClassIn):
            return _module_selector("class", expr.globs)
        if isinstance(expr, Source):
            return _source_selector(expr)
        if isinstance(expr, (EachModule, EachClass)):
            raise self.error(_EACH_ALONE.format(each=render(expr)))
        if isinstance(expr, Not):
            inner = self.expr(expr.operand)
            return lambda view: view.everything & ~inner(view)
        if isinstance(expr, And):
            parts = [self.expr(e) for e in expr.operands]

            def conjunction(view: TraceView) -> int:
                # Every part, even once the mask is empty: a region that ends before it
                # starts must raise wherever it stands, as it does under 'or'.
                mask = view.everything
                for part in parts:
                    mask &= part(view)
                return mask

            return conjunction
        if isinstance(expr, Or):
            parts = [self.expr(e) for e in expr.operands]

            def disjunction(view: TraceView) -> int:
                mask = 0
                for part in parts:
                    mask |= part(view)
                return mask

            return disjunction
        if isinstance(expr, (RankIn, Steps)):
            raise self.error(
                f"{render(expr)!r} is decided at run time, so it can only be joined with 'and' "
                "at the top of a rule (not under 'not', 'or', 'backward of' or first()/last()); "
                f"write e.g. 'op in <linear> and {render(expr)}'"
            )
        raise TypeError(f"not a spec expression: {expr!r}")

    def endpoint(self, point: Endpoint) -> CompiledEndpoint:
        if isinstance(point, Proxy):
            return point
        keyword = "first" if isinstance(point, First) else "last"
        return FoundEndpoint(f"{keyword}({render(point.expr)})", isinstance(point, First), self.expr(point.expr))

    def gate(self, gates: list[Expr]) -> Gate | None:
        if not gates:
            return None
        ranks: frozenset[int] | None = None
        first: int | None = None
        last: int | None = None
        for expr in gates:
            if isinstance(expr, RankIn):
                these = frozenset(expr.ranks)
                ranks = these if ranks is None else ranks & these
            else:
                assert isinstance(expr, Steps)
                first = expr.first if first is None else max(first, expr.first)
                if expr.last is not None:
                    last = expr.last if last is None else min(last, expr.last)
        return Gate(ranks, first, last)


_EACH_ALONE = (
    "{each!r} is a rule of its own (one range per module call): join it only with 'and forward', "
    "'and backward', 'and module <...>', 'and class <...>' or run-time gates, at the top of the rule; "
    "to select the ops inside modules write 'module <...>' or 'class <...>' instead"
)


def _each(operands: list[Expr]) -> tuple[EachModule | EachClass, Phase | None, bool] | None:
    """If `operands` (the non-gate conjuncts of a rule) hold an ``each`` rule, describe it."""
    eaches = [e for e in operands if isinstance(e, (EachModule, EachClass))]
    if not eaches:
        return None
    phases = [e for e in operands if isinstance(e, (Forward, Backward))]
    kinds = {"forward" if isinstance(p, Forward) else "backward" for p in phases}
    if len(eaches) > 1:
        return eaches[1], None, False  # reported by the caller
    if len(kinds) > 1:
        return eaches[0], None, True
    return eaches[0], (kinds.pop() if kinds else None), False


def _region(operands: list[Expr]) -> tuple[Between, Phase | None, bool] | None:
    """If `operands` (the non-gate conjuncts of a rule) form a bare region, describe it."""
    betweens = [e for e in operands if isinstance(e, Between)]
    phases = [e for e in operands if isinstance(e, (Forward, Backward))]
    if len(betweens) != 1 or len(betweens) + len(phases) != len(operands):
        return None
    kinds = {"forward" if isinstance(p, Forward) else "backward" for p in phases}
    if len(kinds) > 1:
        return betweens[0], None, True
    return betweens[0], (kinds.pop() if kinds else None), False


def compile_spec(spec: Spec) -> CompiledSpec:
    """Compile every rule of `spec`. Raises `SelectorError` naming the rule for a
    rule that cannot be evaluated (a run-time gate used under `not` or `or`)."""
    compiled_rules = []
    for number, rule in enumerate(spec.rules):
        compiler = _Compiler(rule, rule.describe(spec.filename))
        conjuncts = _conjuncts(rule.expr)
        gates = [e for e in conjuncts if isinstance(e, (RankIn, Steps))]
        rest = [e for e in conjuncts if not isinstance(e, (RankIn, Steps))]
        for expr in rest:
            for inner in walk(expr):
                if isinstance(inner, (RankIn, Steps)) or (isinstance(inner, (EachModule, EachClass)) and inner is not expr):
                    compiler.expr(inner)  # raises the explanatory error
        each = _each(rest)
        region = _region(rest)
        if each is not None:
            found, phase, never = each
            within = [e for e in rest if isinstance(e, (ModuleIn, ClassIn))]
            others = [e for e in rest if not isinstance(e, (Forward, Backward, ModuleIn, ClassIn)) and e is not found]
            if others:
                raise compiler.error(_EACH_ALONE.format(each=render(found)))
            by = "module" if isinstance(found, EachModule) else "class"
            matches = path_matcher(found.globs) if by == "module" else class_matcher(found.globs)
            tests = tuple(
                ("module", path_matcher(e.globs)) if isinstance(e, ModuleIn) else ("class", class_matcher(e.globs))
                for e in within
            )
            selector_each = EachSelector(by, matches, phase, never, tests)
            compiled = CompiledRule(rule, number, None, None, compiler.gate(gates), spec.filename, selector_each)
        elif region is not None:
            between, phase, never = region
            selector = RegionSelector(compiler.endpoint(between.start), compiler.endpoint(between.end), phase, never)
            compiled = CompiledRule(rule, number, selector, None, compiler.gate(gates), spec.filename)
        else:
            body: Expr = All() if not rest else rest[0] if len(rest) == 1 else And(tuple(rest))
            compiled = CompiledRule(rule, number, None, compiler.expr(body), compiler.gate(gates), spec.filename)
        compiler.compiled = compiled
        compiled_rules.append(compiled)
    return CompiledSpec(tuple(compiled_rules), spec)
