"""Explain a spec against real traces: which ops each rule selects, which
region each region rule spans, which module each selected op belongs to, the
module calls of ``each`` rules, why a rule selects nothing, and, for selected
backward ops, the forward ops they are traced to.

    import nvtx_regions
    print(nvtx_regions.explain(jitted, "attn: between t3..t9"))
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ..selection.unselected import RuleTally
from ..selection.compile import CompiledRule, compile_spec
from ..core.errors import NotRunYetError, SelectorError
from ..language.parse import spec_from_arguments
from ..core.markers import RECORD_FUNCTION
from ..selection.markers import crossing_fusions
from ..selection.plan import Plan, make_plan
from ..attribution.traceview import TraceView, one_line
from ..core.bits import bit_positions
from ..language.tree import Spec
from ..internals.versions import require_thunder

__all__ = ["explain", "Explanation", "RuleInTrace"]


@dataclass(frozen=True)
class RuleInTrace:
    """What one rule selects in one trace."""

    trace_name: str
    phase: str
    ranges: int
    region: tuple[int, int] | None  # compute positions of a region rule's span
    selected: tuple[int, ...]  # compute positions selected (ops of a region)
    lines: tuple[str, ...]  # one line of Python per selected op
    saved_by: tuple[tuple[str, ...], ...]  # per selected backward op: its forward origins (modules.backward_origins)
    modules: tuple[str | None, ...] = ()  # per selected op: the module it is attributed to
    calls: tuple[tuple[str, int, int, int], ...] = ()  # `each` rules: (message, first, last, ops) per module call
    notes: tuple[str, ...] = ()  # per entry of `calls`: for a marker, where it was pushed and fusions crossing it
    # Per call: None for a push/pop range; for a start/end range, why (the range it crosses).
    start_end: tuple[str | None, ...] = ()


@dataclass
class Explanation:
    """Per rule, per trace: what is selected. `str()` gives a readable report."""

    rules: list[CompiledRule]
    traces: list[list[RuleInTrace]]  # [rule number][trace]
    reasons: dict[int, str] = field(default_factory=dict)  # why a rule selected nothing
    max_ops: int = 12

    def __str__(self) -> str:
        out = []
        for rule, per_trace in zip(self.rules, self.traces):
            kind = rule.ranges_text
            gate = f", gated: {rule.gate.text()}" if rule.gate is not None else ""
            out.append(f"{rule.describe()}: {kind}{gate}")
            for found in per_trace:
                head = f"  {found.phase} {found.trace_name!r}: {found.ranges} range{'s' * (found.ranges != 1)}"
                if found.region is not None:
                    head += f", ops #{found.region[0]}..#{found.region[1]} ({len(found.selected)} ops)"
                out.append(head)
                whys = found.start_end or (None,) * len(found.calls)
                for n, ((message, first, last, count), why) in enumerate(list(zip(found.calls, whys))[: self.max_ops]):
                    style = "" if why is None else f"; start/end range: {why}"
                    out.append(f"    {message}: ops #{first}..#{last} ({count} op{'s' * (count != 1)}){style}")
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
            if rule.number in self.reasons:
                out.append(f"  nothing selected: {self.reasons[rule.number]}")
        return "\n".join(out)


def _traces_of(target: Any) -> list[Any]:
    if isinstance(target, (list, tuple)):
        return list(target)
    thunder = require_thunder("explain() of a thunder.jit function")
    if thunder.compile_data(target) is None:
        raise TypeError(
            f"explain() takes a thunder.jit-compiled function that has run once, or a list of traces; "
            f"got {type(target).__name__}"
        )
    try:
        forward = thunder.last_traces(target)
    except TypeError:  # thunder: "doesn't seem to have been called yet"
        forward = None
    if not forward:
        raise NotRunYetError("explain(): the compiled function has not run yet; call it once first")
    traces = [forward[-1]]
    backward = thunder.last_backward_traces(target)
    if backward:
        traces.append(backward[-1])
    return traces


def _spec_of(target: Any, select: str | None, spec: str | os.PathLike[str] | None) -> Spec:
    given = spec_from_arguments(select, spec)
    if given is not None:
        return given
    thunder = require_thunder("explain() of a thunder.jit function")
    from ..emission.transform import NvtxProfileTransform

    for transform in getattr(thunder.compile_data(target), "transforms", ()) or ():
        if isinstance(transform, NvtxProfileTransform):
            return transform.spec
    raise SelectorError("explain(): give select= or spec=, or a function jitted with an NvtxProfileTransform")


def explain(
    target: Any,
    select: str | None = None,
    *,
    spec: str | os.PathLike[str] | None = None,
    max_ops: int = 12,
) -> Explanation:
    """Explain what a spec selects in `target`'s last forward and backward traces.

    `target` is a ``thunder.jit`` function or module that has run, or a list of
    traces (forward first). The spec is `select` and/or `spec` (as for
    `NvtxProfileTransform`); with neither, the spec of the target's own
    `NvtxProfileTransform`. Raises what the transform would raise for the
    same spec and traces, and `NotRunYetError` for a function that has not
    run (there is no trace yet).
    """
    traces = _traces_of(target)
    compiled = compile_spec(_spec_of(target, select, spec))
    views: list[TraceView] = []
    for trace in traces:
        view = TraceView.from_trace(trace)
        if view.phase == "backward":
            view.forward = next((v for v in reversed(views) if v.phase == "forward"), None)
        views.append(view)
    plans = [make_plan(compiled, view) for view in views]
    tally = RuleTally(compiled)
    for view, plan in zip(views, plans):
        tally.add(plan, view)
    per_rule: list[list[RuleInTrace]] = []
    for rule in compiled.rules:
        per_rule.append([_rule_in_trace(rule, view, plan) for view, plan in zip(views, plans)])
    reasons = {r.number: tally.reason(r) or "no op matches it" for r in tally.unselected()}
    return Explanation(list(compiled.rules), per_rule, reasons, max_ops)


def _rule_in_trace(rule: CompiledRule, view: TraceView, plan: Plan) -> RuleInTrace:
    ranges = plan.per_rule[rule.number]
    selected = tuple(bit_positions(ranges.selected))
    region = None if ranges.region is None else (ranges.region.first, ranges.region.last)
    lines = tuple(one_line(view.ops[p].bsym) if view.ops[p].bsym is not None else view.ops[p].name for p in selected)
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
        start_end,
    )


def _marker_note(view: TraceView, marker: Any) -> str:
    """Where `marker` was pushed, in which domain, and the fusions that cross its boundary."""
    if marker.form == RECORD_FUNCTION:
        domain = "the transform's domain"
    else:
        domain = "the default domain" if marker.domain is None else f"domain {marker.domain!r}"
    note = f"{marker.form} marker pushed at {marker.place}, {domain}"
    crossing = crossing_fusions(view, marker) if view.phase == "forward" else []
    if crossing:
        shown = ", ".join(f"#{p} {view.ops[p].name}" for p in crossing[:3])
        note += (
            f"; {len(crossing)} fusion{'s' * (len(crossing) != 1)} ({shown}) hold ops inside and outside it and stay "
            "outside its range, as for module calls"
        )
    return note
