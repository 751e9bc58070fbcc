"""What a spec selected, per rule and per program, on any backend: the `Explanation`.

A program is what one backend plans ranges on: a thunder trace, an Inductor
graph's kernel calls, an eager model's module tree (one per pass). Per rule
and program an `Explanation` holds what the rule selected (ops, a region's
span, each module call or marker occurrence with its span, start/end ranges
and what they cross), why a rule selected nothing (with the nearest names
that do exist), and, for a rule the backend cannot express, why not and who
can. ``str()`` gives the report; `nvtx_regions.explain`,
``NvtxInductor.explain()`` and an eager annotation's ``explain()`` return one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from ..core.bits import bit_positions
from ..core.markers import RECORD_FUNCTION
from .compile import CompiledRule, CompiledSpec
from .markers import crossing_fusions
from .plan import OWN_DOMAIN, Plan, make_plan
from .unselected import RuleTally
from .view import View

__all__ = ["Explanation", "Program", "RuleInTrace", "explain_views"]


@dataclass(frozen=True)
class Program:
    """One program the spec was planned on (see the module doc)."""

    name: str  # "computation", "graph 0 (forward)", the root module's class name
    phase: str
    unit: str  # what its ops are: "op", "kernel", "module"
    size: int  # how many ops it has
    listing: tuple[str, ...] = ()  # one line per op, where the backend gives no printed form of its own


@dataclass(frozen=True)
class RuleInTrace:
    """What one rule selects in one program."""

    trace_name: str
    phase: str
    ranges: int
    region: tuple[int, int] | None  # op positions of a region rule's span
    selected: tuple[int, ...]  # op positions selected (ops of a region)
    lines: tuple[str, ...]  # one line per selected op: its Python line in a trace, else its name
    saved_by: tuple[tuple[str, ...], ...]  # per selected backward op: its forward origins (modules.backward_origins)
    modules: tuple[str | None, ...] = ()  # per selected op: the module it is attributed to
    calls: tuple[tuple[str, int, int, int], ...] = ()  # `each` rules: (message, first, last, ops) per module call
    notes: tuple[str, ...] = ()  # per entry of `calls`: for a marker, where it was pushed and fusions crossing it
    # Per call: None for a push/pop range; for a start/end range, why (the range it crosses).
    start_end: tuple[str | None, ...] = ()
    unit: str = "op"  # what the program's ops are (`Program.unit`)


@dataclass
class Explanation:
    """Per rule, per program: what is selected. `str()` gives a readable report."""

    rules: list[CompiledRule]
    traces: list[list[RuleInTrace]]  # [rule number][program]
    reasons: dict[int, str] = field(default_factory=dict)  # why a rule selected nothing
    max_ops: int = 12
    programs: list[Program] = field(default_factory=list)
    header: str = ""  # a first line saying what was explained, where the programs need one
    elsewhere: dict[int, str] = field(default_factory=dict)  # per rule: the ranges it got outside the programs

    @property
    def unsupported(self) -> dict[int, str]:
        """Per rule the backend cannot express: why not, and which backends can (`selection.support`)."""
        return {rule.number: rule.problem() for rule in self.rules if not rule.applies}  # type: ignore[attr-defined]

    def __str__(self) -> str:
        out = [self.header] if self.header else []
        for rule, per_trace in zip(self.rules, self.traces):
            if not rule.applies:
                out.append(self.unsupported[rule.number])
                continue
            gate = f", gated: {rule.gate.text()}" if rule.gate is not None else ""
            out.append(f"{rule.describe()}: {rule.ranges_text}{gate}")
            for found in per_trace:
                out += self._rule_in_trace(found)
            if rule.number in self.elsewhere:
                out.append(f"  {self.elsewhere[rule.number]}")
            elif rule.number in self.reasons:
                out.append(f"  nothing selected: {self.reasons[rule.number]}")
        for program in self.programs:
            if program.listing:
                out.append(f"{program.phase} {program.name!r}: {program.size} {program.unit}s")
                out += [f"  {line}" for line in program.listing]
        return "\n".join(out)

    def _rule_in_trace(self, found: RuleInTrace) -> list[str]:
        unit = found.unit
        out = []
        head = f"  {found.phase} {found.trace_name!r}: {found.ranges} range{'s' * (found.ranges != 1)}"
        if found.region is not None:
            head += f", {unit}s #{found.region[0]}..#{found.region[1]} ({len(found.selected)} {unit}s)"
        out.append(head)
        whys = found.start_end or (None,) * len(found.calls)
        for n, ((message, first, last, count), why) in enumerate(list(zip(found.calls, whys))[: self.max_ops]):
            style = "" if why is None else f"; start/end range: {why}"
            out.append(f"    {message}: {unit}s #{first}..#{last} ({count} {unit}{'s' * (count != 1)}){style}")
            if n < len(found.notes) and found.notes[n]:
                out.append(f"      {found.notes[n]}")
        if len(found.calls) > self.max_ops:
            out.append(f"    ... {len(found.calls) - self.max_ops} more calls")
        rows = list(zip(found.selected, found.lines, found.saved_by, found.modules))
        for position, line, saved, module in rows[: self.max_ops] if not found.calls else ():
            out.append(f"      #{position:<4} [{module if module is not None else '?'}] {line}")
            if saved:
                out.append(f"             <- from forward {', '.join(saved)}")
        if len(found.selected) > self.max_ops and not found.calls:
            out.append(f"      ... {len(found.selected) - self.max_ops} more")
        return out


def explain_views(
    compiled: CompiledSpec,
    views: Sequence[View],
    *,
    unit: str = "op",
    plans: Sequence[Plan] | None = None,
    listings: Sequence[tuple[str, ...]] | None = None,
    header: str = "",
    max_ops: int = 12,
    domain: Any = OWN_DOMAIN,
) -> Explanation:
    """The explanation of `compiled` (restricted to a backend: `support.restrict`) over `views`.

    `plans`: the views' plans where the caller has them (else made here, in
    `domain`); `listings`: per view, lines listing its ops.
    Raises what `make_plan` raises for these views.
    """
    plans = [make_plan(compiled, view, domain) for view in views] if plans is None else list(plans)
    tally = RuleTally(compiled)
    for view, plan in zip(views, plans):
        tally.add(plan, view)
    per_rule = [
        [_rule_in_trace(rule, view, plan, unit) for view, plan in zip(views, plans)] for rule in compiled.rules
    ]
    reasons = {r.number: tally.reason(r) or f"no {unit} matches it" for r in tally.unselected()}
    listings = list(listings) if listings is not None else [()] * len(views)
    programs = [Program(view.name, view.phase, unit, len(view.ops), listing) for view, listing in zip(views, listings)]
    return Explanation(list(compiled.rules), per_rule, reasons, max_ops, programs, header)


def _rule_in_trace(rule: CompiledRule, view: View, plan: Plan, unit: str) -> RuleInTrace:
    ranges = plan.per_rule[rule.number]
    selected = tuple(bit_positions(ranges.selected))
    region = None if ranges.region is None else (ranges.region.first, ranges.region.last)
    lines = tuple(view.ops[p].text for p in selected)
    saved_by: list[tuple[str, ...]] = []
    forward = view.forward
    for position in selected:
        origins = view.origins[position] if view.phase == "backward" else None
        if forward is None or not origins:
            saved_by.append(())
            continue
        found = [f"#{p} {forward.ops[p].name}" for p in bit_positions(origins)]
        saved_by.append(tuple(found[:4]) + ((f"... {len(found) - 4} more",) if len(found) > 4 else ()))
    chains = view.module_chains
    modules = tuple((chains[p][-1].name if chains[p] else None) for p in selected)
    calls = tuple((span.label, span.first, span.last, bin(span.positions).count("1")) for span in ranges.calls)
    notes = tuple("" if span.marker is None else _marker_note(view, span.marker) for span in ranges.calls)
    whys = {(r.label, r.start): r.why for r in plan.ranges if r.style == "StartEnd" and rule.number in r.rules}
    start_end = tuple(whys.get((span.label, view.ops[span.first].index)) for span in ranges.calls)
    return RuleInTrace(
        view.name, view.phase, ranges.ranges, region, selected, lines, tuple(saved_by), modules, calls, notes,
        start_end, unit,
    )  # fmt: skip


def _marker_note(view: View, marker: Any) -> str:
    """Where `marker` was pushed, in which domain, and the fusions that cross its boundary."""
    if marker.form == RECORD_FUNCTION:
        domain = "the transform's domain"
    else:
        domain = "the default domain" if marker.domain is None else f"domain {marker.domain!r}"
    note = f"{marker.form} marker pushed at {marker.place}, {domain}"
    crossing = crossing_fusions(view, marker) if view.phase == "forward" else []  # type: ignore[arg-type]
    if crossing:
        shown = ", ".join(f"#{p} {view.ops[p].name}" for p in crossing[:3])
        note += (
            f"; {len(crossing)} fusion{'s' * (len(crossing) != 1)} ({shown}) hold ops inside and outside it and stay "
            "outside its range, as for module calls"
        )
    return note
