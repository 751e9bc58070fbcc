"""Selector primitives over a `View`: filters become functions from a
trace view to a bitset of compute positions, regions become their bounds, and
``each`` selectors become the spans of module calls.

`SelectorBuilder` is the one walk from a filter expression to a selector. It
raises `SelectorError` for what the text alone rules out (a run-time gate or
an ``each`` inside a filter); a built selector raises only for what a trace
decides (`RegionOrderError`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .view import Phase, View
from ..core.bits import anchored_span, bit_positions
from ..core.calls import ModuleCall, ancestors
from ..core.errors import SelectorError
from ..core.globs import name_matcher, path_matcher, source_matcher
from ..core.naming import range_message
from .markers import marker_mask
from ..language.tree import (
    All,
    And,
    Backward,
    BackwardOf,
    Between,
    ClassIn,
    EachClass,
    EachMarker,
    EachModule,
    First,
    Forward,
    Last,
    MarkerIn,
    ModuleIn,
    Not,
    OpIn,
    Or,
    Proxy,
    RankIn,
    Reads,
    Source,
    Steps,
    Visitor,
    render,
)

__all__ = [
    "Selector", "FoundEndpoint", "CompiledEndpoint", "endpoint_text", "RegionOrderError", "RegionSelector",
    "CallSpan", "EachSelector", "SelectorBuilder", "each_alone", "span_mask", "module_selector",
]  # fmt: skip

Selector = Callable[[View], int]


class RegionOrderError(SelectorError):
    """A region's endpoints resolve in a trace, but its end comes before its start."""


@dataclass(frozen=True)
class FoundEndpoint:
    """A compiled ``first(...)``/``last(...)`` endpoint: the first or last compute op its filter selects."""

    text: str
    first: bool
    select: Selector


CompiledEndpoint = Proxy | FoundEndpoint


def endpoint_text(point: CompiledEndpoint) -> str:
    """The endpoint as the spec writes it: a proxy name, or ``first(...)``/``last(...)``."""
    return point.name if isinstance(point, Proxy) else point.text


def _endpoint_position(point: CompiledEndpoint, view: View, *, start: bool) -> int | None:
    if isinstance(point, Proxy):
        return view.region_start(point.name) if start else view.region_end(point.name)
    mask = point.select(view)
    if not mask:
        return None
    if point.first:
        return (mask & -mask).bit_length() - 1
    return mask.bit_length() - 1


def span_mask(first: int, last: int) -> int:
    """The bitset of compute positions `first`..`last`, both included."""
    return ((1 << (last + 1)) - 1) ^ ((1 << first) - 1)


def _bounds(start: CompiledEndpoint, end: CompiledEndpoint, view: View, who: str) -> tuple[int, int] | None:
    first = _endpoint_position(start, view, start=True)
    if first is None:
        return None
    last = _endpoint_position(end, view, start=False)
    if last is None:
        return None
    if last < first:
        raise RegionOrderError(
            f"{who}: in the {view.phase} trace {view.name!r} the region ends at {endpoint_text(end)} "
            f"(op #{last}: {view.ops[last].name}) before it starts at {endpoint_text(start)} "
            f"(op #{first}: {view.ops[first].name}); swap the endpoints"
        )
    return first, last


@dataclass(frozen=True)
class RegionSelector:
    """A bare region: one range around [start, end] in each trace where both resolve."""

    start: CompiledEndpoint
    end: CompiledEndpoint
    phase: Phase | None  # None: forward and backward traces alike
    never: bool = False  # `forward and backward`: no trace is both

    def bounds(self, view: View, who: str) -> tuple[int, int] | None:
        """The (start, end) compute positions of the region in `view`, or None.

        Raises `RegionOrderError` (naming `who`) when the end comes before the start.
        """
        if self.never or (self.phase is not None and self.phase != view.phase):
            return None
        return _bounds(self.start, self.end, view, who)

    def text(self) -> str:
        return f"{endpoint_text(self.start)}..{endpoint_text(self.end)}"


@dataclass(frozen=True)
class CallSpan:
    """One module call's ops in one trace: its range covers compute positions
    `first`..`last`, which leave out its hoisted ops (`core.bits.anchored_span`)."""

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

    def spans(self, view: View) -> list[CallSpan]:
        """Each matching call with ops in `view`, in order of its first op (outer first). Where the compiler
        ran another module's work between ops of the call, one span per part (`call_parts`)."""
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
        hoisted = view.parameter_only
        spans = [
            CallSpan(call, d, first, last, positions, range_message(call.name, view.phase, continued=part > 0))
            for call, (d, _, _, mask) in found.items()
            for part, (first, last, positions) in enumerate(call_parts(call, d, mask, hoisted, view))
        ]
        spans.sort(key=lambda span: (span.first, -span.last, span.depth))
        return spans


def call_parts(call: ModuleCall, depth: int, positions: int, hoisted: int, view: View) -> list[tuple[int, int, int]]:
    """The parts of the range of `call` (at `depth`, its ops `positions`) in `view`: (first, last,
    positions) each.

    One part, from the call's first op to its last (`core.bits.anchored_span`), unless the compiler put
    another module's work between them: an op of a module neither the call's own, nor inside it, nor
    around it, or an op of a module around it that fuses the work of modules beside the call and none
    of the call's branch (`View.module_parts`: in a gated MLP's backward, its mul fused with the gate's
    sigmoid backward is no work of `down`; a residual add of block 0 that Inductor recomputes in block
    1's layer norm kernel is also block 1's, and stays inside block 1's range). Then
    the range is cut around each such op, so that each part holds the call's work and no sibling's:
    Inductor runs the weight gradients of the projections that read one input (q, k and v) after all
    their input gradients, and a range from a projection's first kernel to its last would hold its
    siblings'. The first part also stands for the call's hoisted ops outside every part."""
    first, last = anchored_span(positions, hoisted)
    anchored = positions & ~hoisted or positions
    chains = view.module_chains
    mine = (*chains[first][:depth], call)  # the calls around it, then the call

    def cuts(position: int) -> bool:
        chain = chains[position]
        if chain is None or call in chain:
            return False
        if len(chain) <= depth and chain == mine[: len(chain)]:  # a module around the call
            parts = view.module_parts[position]
            return bool(parts) and all(part.path != mine[len(chain)].path for part in parts)
        return True

    # Only the ops in the range that are not the call's own can cut it: a call's range over a long
    # graph (the root's) has few.
    cut = [p for p in bit_positions(span_mask(first, last) & ~anchored & ~hoisted) if cuts(p)]
    if not cut:
        return [(first, last, positions)]
    parts = []
    for after, before in zip([first - 1, *cut], [*cut, last + 1]):
        held = anchored & span_mask(after + 1, before - 1) if before - after > 1 else 0
        if held:
            start, end = anchored_span(held, 0)  # its first and last op
            parts.append((start, end, positions & span_mask(start, end)))
    covered = 0
    for _, _, found in parts:
        covered |= found
    parts[0] = (parts[0][0], parts[0][1], parts[0][2] | positions & ~covered)
    return parts


def _glob_selector(globs: tuple[str, ...], masks: Callable[[View], dict[str, int]]) -> Selector:
    """Select the positions of every name in `masks(view)` (name -> bitset) that a glob matches."""
    matches = name_matcher(globs)

    def select(view: View) -> int:
        mask = 0
        for name, name_mask in masks(view).items():
            if matches(name):
                mask |= name_mask
        return mask

    return select


def module_selector(by: str, globs: tuple[str, ...]) -> Selector:
    """Ops attributed to a module, or a module above it, whose path (or class name) matches."""
    matches = path_matcher(globs) if by == "module" else name_matcher(globs)
    key = (by, globs)

    def select(view: View) -> int:
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
    in_file = source_matcher(source.file)

    def select(view: View) -> int:
        mask = 0
        for position, lines in enumerate(view.source_lines):
            for filename, line in lines:
                if source.first <= line <= source.last and in_file(filename):
                    mask |= 1 << position
                    break
        return mask

    return select


def each_alone(each: EachModule | EachClass | EachMarker) -> str:
    """Why an ``each`` filter cannot stand where it was written, and what to write instead."""
    if isinstance(each, EachMarker):
        unit, what, instead = "marker occurrence", "markers", "'marker <...>'"
    else:
        unit, what, instead = "module call", "modules", "'module <...>' or 'class <...>'"
    return (
        f"{render(each)!r} is a rule of its own (one range per {unit}): join it only with 'and forward', "
        "'and backward', 'and module <...>', 'and class <...>' or run-time gates, at the top of the rule; "
        f"to select the ops inside {what} write {instead} instead"
    )


class SelectorBuilder(Visitor):
    """A filter expression to its `Selector`; a region endpoint to its `CompiledEndpoint`.

    `who` names the rule in errors: `SelectorError` here for the spec's text,
    `RegionOrderError` from a built selector for what a trace decides.
    """

    def __init__(self, who: str) -> None:
        self.who = who

    def error(self, message: str) -> SelectorError:
        return SelectorError(f"{self.who}: {message}")

    def visit_OpIn(self, expr: OpIn) -> Selector:
        return _glob_selector(expr.globs, lambda view: view.by_name)

    def visit_Reads(self, expr: Reads) -> Selector:
        return _glob_selector(expr.globs, lambda view: view.by_read)

    def visit_Between(self, expr: Between) -> Selector:
        start, end, who = self.visit(expr.start), self.visit(expr.end), self.who

        def between(view: View) -> int:
            bounds = _bounds(start, end, view, who)
            return 0 if bounds is None else span_mask(*bounds)

        return between

    def visit_Forward(self, expr: Forward) -> Selector:
        return lambda view: view.everything if view.phase == "forward" else 0

    def visit_Backward(self, expr: Backward) -> Selector:
        return lambda view: view.everything if view.phase == "backward" else 0

    def visit_BackwardOf(self, expr: BackwardOf) -> Selector:
        inner = self.visit(expr.expr)

        def backward_of(view: View) -> int:
            forward = view.forward
            if view.phase != "backward" or forward is None:
                return 0
            # The backward ops the attribution rule (module_calls.backward_origins) traces to those forward ops.
            chosen = inner(forward)
            mask = 0
            for position, origins in enumerate(view.origins):
                if origins is not None and origins & chosen:
                    mask |= 1 << position
            return mask

        return backward_of

    def visit_All(self, expr: All) -> Selector:
        return lambda view: view.everything

    def visit_ModuleIn(self, expr: ModuleIn) -> Selector:
        return module_selector("module", expr.globs)

    def visit_ClassIn(self, expr: ClassIn) -> Selector:
        return module_selector("class", expr.globs)

    def visit_Source(self, expr: Source) -> Selector:
        return _source_selector(expr)

    def visit_MarkerIn(self, expr: MarkerIn) -> Selector:
        matches = name_matcher(expr.globs)
        return lambda view: marker_mask(view, matches)

    def visit_EachModule(self, expr: EachModule | EachClass | EachMarker) -> Selector:
        raise self.error(each_alone(expr))

    visit_EachClass = visit_EachMarker = visit_EachModule

    def visit_Not(self, expr: Not) -> Selector:
        inner = self.visit(expr.operand)
        return lambda view: view.everything & ~inner(view)

    def visit_And(self, expr: And) -> Selector:
        parts = [self.visit(e) for e in expr.operands]

        def conjunction(view: View) -> int:
            # Every part, even once the mask is empty: a region that ends before it
            # starts must raise wherever it stands, as it does under 'or'.
            mask = view.everything
            for part in parts:
                mask &= part(view)
            return mask

        return conjunction

    def visit_Or(self, expr: Or) -> Selector:
        parts = [self.visit(e) for e in expr.operands]

        def disjunction(view: View) -> int:
            mask = 0
            for part in parts:
                mask |= part(view)
            return mask

        return disjunction

    def visit_RankIn(self, expr: RankIn | Steps) -> Selector:
        raise self.error(
            f"{render(expr)!r} is decided at run time, so it can only be joined with 'and' "
            "at the top of a rule (not under 'not', 'or', 'backward of' or first()/last()); "
            f"write e.g. 'op in <linear> and {render(expr)}'"
        )

    visit_Steps = visit_RankIn

    # Region endpoints.

    def visit_Proxy(self, point: Proxy) -> CompiledEndpoint:
        return point

    def visit_First(self, point: First) -> CompiledEndpoint:
        return FoundEndpoint(f"first({render(point.expr)})", True, self.visit(point.expr))

    def visit_Last(self, point: Last) -> CompiledEndpoint:
        return FoundEndpoint(f"last({render(point.expr)})", False, self.visit(point.expr))
