"""Compile time: a graph's kernels -> its view, record and plans -> the lines its wrapper gains.

`Placer.place` is what Inductor's wrapper codegen calls for each graph of a
`NvtxInductor` (`internals.inductor.placing`): it makes the graph's
`kernels.KernelView` (as each module instance that runs it sees it,
`inductor.instances`), its `header.GraphRecord`, a plan per view
(`selection.plan`), and the lines (`placement`).

Promises:
- In a forward graph the user's own markers (``torch.cuda.nvtx``, ``nvtx``,
  ``record_function``, carried through the compiler by
  `internals.compiled_markers`) get a range each, as they pushed it: in its
  own NVTX domain with its message and colour, or a record_function range,
  from its first kernel to its last. An ``each marker`` range goes to the
  spec's sinks but that one (the same range is never emitted twice in one
  sink). Ranges that share a stack (an NVTX domain; record_function's one)
  and cross, where Inductor interleaved their kernels, are start/end ranges.
- A range's push comes before the first line of its first kernel (the
  kernel's allocations and comment), its pop after the last line of its last
  kernel; ranges that end at the same kernel pop inner first. Nothing else
  in the wrapper changes.
- Each line is one call, the push with the range's message in a comment:
  ``nvtx_regions_push(nvtx_regions_attr_0, nvtx_regions_domain)  # transformer.h.0``.
- The lines sit in a ``try``/``except`` that closes what a failed call left
  open (`runtime.ranges`); a graph with gated ranges decides its gates in the
  call's first line.
- The header builds the ranges from literals (`header.graph_ranges`), so the
  code runs the same wherever Inductor's cache loads it. It also carries the
  graph's record, which it hands to its backend's tracker when it loads: what a
  rule selected is then known, and said, alike on a compile and on a cache hit.
  A graph with no range gets that header alone.
- Code run for several module instances (`instances`: per instance, each
  range's message) reads each range's attributes from the call's gates, whose
  first line takes the instance (`runtime.ranges.set_instance`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Any

from ..core.markers import RECORD_FUNCTION
from ..core.naming import rule_category, rule_color
from ..internals.inductor import Placement
from ..selection.compile import CompiledSpec, Gate
from ..selection.markers import marker_spans
from ..runtime.sinks import NVTX_ONLY, marker_sink, sinks_named
from ..selection.plan import Plan, PlannedRange, make_plan
from .header import NAMES, GraphRecord, gate_text
from .instances import FrameRoot, Models, instance_views
from .kernels import KernelView, inside_call, kernel_view, view_literal

__all__ = ["Placer", "placement"]


class Placer:
    """One backend's compile-time half (see the module doc): `spec`, `domain` and `sinks` are the
    backend's, `key` its cache key (the records name it), and `models` the models it was given, whose
    module paths name the ranges (None: paths start at each graph's frame)."""

    def __init__(self, spec: CompiledSpec, domain: str | None, sinks: tuple[str, ...], key: str, models: Models | None) -> None:
        self.spec, self.domain, self.sinks, self.key, self.models = spec, domain, sinks, key, models
        self._calls: dict[tuple[str, str], int] = {}  # (Dynamo's module call key, its path there) -> call number
        self._graphs = itertools.count()

    def number_next(self) -> int:
        """A number for the next graph torch.compile gives the backend (0, 1, ...; thread-safe)."""
        return next(self._graphs)

    def place(
        self, number: int, phase: str, kernels: list[Any], inference: bool, frame: FrameRoot | None, whole: bool
    ) -> Placement:
        """The lines graph `number`'s wrapper gains: its ranges, and a header that hands its record
        to the backend as it loads. `frame`: the module its paths start at (None: the model);
        `whole`: the graph is the whole call of `frame`'s root, whose range it then holds too."""
        paths = None if self.models is None else self.models.paths
        view = kernel_view(kernels, phase, f"graph {number} ({phase})", self._calls, paths)  # type: ignore[arg-type]
        root = None if frame is None or frame.why_not is not None else frame.root
        if whole and frame is not None:
            view = inside_call(view, frame.root, frame.cls)
        left_out = frame.why_not if frame is not None else None
        record = GraphRecord(self.key, number, phase, inference, root, left_out, whole, view_literal(view))
        if left_out is not None:
            return placement(Plan(phase, view.name, (), ()), view, self.spec, self.domain, record=record, sinks=self.sinks)  # type: ignore[arg-type]
        views = [view] if frame is None else instance_views(view, frame)
        plans = [make_plan(self.spec, v, self.domain) for v in views]
        instances = None
        if frame is not None and not frame.fixed:
            instances = {instance: (p, v) for instance, v, p in zip(frame.candidates, views, plans)}
        return placement(plans[0], views[0], self.spec, self.domain, record=record, instances=instances, sinks=self.sinks)


def _message(planned: PlannedRange, view: KernelView) -> str:
    return planned.label if planned.label is not None else view.ops[planned.start].name


Target = tuple[str | None, tuple[str, ...]]  # an NVTX domain and the sinks a range goes to


@dataclass(frozen=True)
class _Range:
    """One range a wrapper gets: a planned range, where it goes, and its colour and category."""

    planned: PlannedRange
    target: Target
    color: int | None
    category: str | None


def _ranges(plan: Plan, view: KernelView, spec: CompiledSpec, domain: str | None, sinks: tuple[str, ...]) -> list[_Range]:
    """The ranges of `plan` and the user's own markers in `view`, each with where it goes, in push order
    (see the module doc)."""
    found = []
    if view.phase == "forward":
        # The user's markers, as they pushed them (the forward only: a marker runs where its code does).
        for span in marker_spans(view, lambda message: True):
            marker = span.marker
            start, end = view.ops[span.first].index, view.ops[span.last].index
            planned = PlannedRange(start, end, "region", (), marker.message or "", None, marker)
            own = marker_sink(marker.form)
            target = (marker.domain if own.has_domains else None, (own.name,))
            found.append((0, _Range(planned, target, marker.color, None)))
    for planned in plan.ranges:
        rule = spec.rules[planned.rules[0]]
        color, category = rule_color(rule.number), rule_category(rule.rule)
        its_sinks = sinks
        marker = planned.marker
        if marker is not None:
            if view.phase == "forward":
                # Its own range is there already in its own sink: not twice in one sink.
                its_sinks = tuple(sink for sink in sinks if sink != marker_sink(marker.form).name)
            if not its_sinks:
                continue
            if marker.form != RECORD_FUNCTION:
                color, category = marker.color, None  # the user's marker as they pushed it
        target_domain = planned.domain(domain) if any(sink.has_domains for sink in sinks_named(its_sinks)) else None
        found.append((1, _Range(planned, (target_domain, its_sinks), color, category)))
    found.sort(key=lambda item: (item[1].planned.start, item[1].planned.kind == "op", -item[1].planned.end, item[0]))
    return _start_end_where_stacks_cross([item[1] for item in found])


def _stacks(target: Target) -> set[Any]:
    """The stacks a range of `target` lives on: NVTX's, one per domain; record_function's one."""
    name, sinks = target
    return {sink.stack(name) for sink in sinks_named(sinks)}


def _start_end_where_stacks_cross(ranges: list[_Range]) -> list[_Range]:
    """`ranges` with each push/pop range that crosses another on a stack they share made a start/end
    range: the user's markers and the spec's ranges may cross where Inductor reordered kernels."""
    crossed: dict[int, _Range] = {}
    for i, outer in enumerate(ranges):
        for j in range(i + 1, len(ranges)):
            inner = ranges[j]
            if inner.planned.start > outer.planned.end:
                break
            if inner.planned.end <= outer.planned.end or not _stacks(outer.target) & _stacks(inner.target):
                continue
            crossed.setdefault(i, inner)
            crossed.setdefault(j, outer)
    return [
        replace(r, planned=replace(r.planned, style="StartEnd", why=f"crosses {crossed[n].planned.label!r}"))
        if n in crossed and r.planned.style != "StartEnd"
        else r
        for n, r in enumerate(ranges)
    ]


def placement(
    plan: Plan,
    view: KernelView,
    spec: CompiledSpec,
    domain: str | None,
    *,
    record: GraphRecord,
    instances: dict[str, tuple[Plan, KernelView]] | None = None,
    sinks: tuple[str, ...] = NVTX_ONLY,
) -> Placement:
    """The lines that put `plan`'s ranges into the wrapper of `view`'s graph, and the header that
    hands `record` to the backend when the wrapper loads (see the module doc). For code that runs
    for several module instances, `instances` gives each one's plan and view instead: instances whose
    plans differ only in their names share lines; each other set of ranges gets lines of its own.
    `sinks`: where the ranges go (`runtime.sinks`); the header names them unless NVTX alone.

    In a forward graph, the user's own markers (`KernelView.marker_stacks`) get their ranges too,
    in their own domain and sink, from their first kernel to their last; an ``each marker`` range
    goes to the spec's sinks but the marker's own there."""
    sinks_line = [] if sinks == NVTX_ONLY else [f"    sinks={sinks!r},"]
    sets: list[tuple[Plan, KernelView, frozenset[str] | None]] = [(plan, view, None)]
    if instances is not None:
        shapes: dict[tuple, list[str]] = {}
        for name, (its_plan, _) in instances.items():
            shapes.setdefault(_shape(its_plan), []).append(name)
        sets = [(*instances[names[0]], frozenset(names)) for names in shapes.values()]
    placed = [_ranges(its_plan, its_view, spec, domain, sinks) for its_plan, its_view, _ in sets]
    if not any(placed):
        header = [
            "from nvtx_regions.inductor.header import GraphRecord, graph_ranges",
            f"{NAMES.ranges} = graph_ranges({domain!r}, [], [], [], graph={record!r})",  # no range: no sink
        ]
        return Placement({}, {}, header, prelude=[], guard=NAMES.ranges, error=NAMES.error)
    by_instance = instances is not None
    own: Target = (domain, sinks)
    targets: dict[Target, int] = {own: 0}
    groups: dict[tuple[frozenset[Gate] | None, int, int], int] = {}
    ranges = []
    messages: dict[str, list[str | None]] = {name: [] for name in instances or ()}
    before: dict[int, list[tuple[str, str, int, int]]] = {}  # wrapper line -> (text, kind, range, group)
    ends: dict[int, list[tuple[str, str, int, int]]] = {}
    number = -1
    for set_number, ((_, its_view, names), its_ranges) in enumerate(zip(sets, placed)):
        others = None if names is None else {name: _ranges(*instances[name], spec, domain, sinks) for name in names if instances}  # type: ignore[misc]
        for position, entry in enumerate(its_ranges):
            planned = entry.planned
            number += 1
            target = targets.setdefault(entry.target, len(targets))
            group = groups.setdefault((planned.gate, set_number, target), len(groups))
            message = _message(planned, its_view)
            ranges.append((message, entry.color, entry.category))
            for name in instances or ():
                # The same range of another instance with the same shape: its own name.
                own_range = others[name][position] if others is not None and name in others else None
                messages[name].append(None if own_range is None else _message(own_range.planned, instances[name][1]))  # type: ignore[index]
            gated = planned.gate is not None or by_instance
            attributes = NAMES.attributes(number)
            if by_instance:
                attributes = f"{NAMES.gates}.{attributes}"
            domain_argument = NAMES.domain_of(target)
            first, last = its_view.ops[planned.start].first_line, its_view.ops[planned.end].last_line
            if planned.style == "StartEnd":
                started = NAMES.started(number)
                start, end = NAMES.called(group, gated, 2, target), NAMES.called(group, gated, 3, target)
                before.setdefault(first, []).append((f"{started} = {start}({attributes}, {domain_argument})  # {message}", "start", number, group))
                ends.setdefault(last, []).append((f"{end}(*{started})", "end", number, group))
            else:
                push, pop = NAMES.called(group, gated, 0, target), NAMES.called(group, gated, 1, target)
                before.setdefault(first, []).append((f"{push}({attributes}, {domain_argument})  # {message}", "push", number, group))
                ends.setdefault(last, []).append((f"{pop}()", "pop", number, group))
    after = {line: list(reversed(found)) for line, found in ends.items()}
    lines = []
    for index in sorted({*before, *after}):
        lines += [(kind, number, group) for _, kind, number, group in (*before.get(index, ()), *after.get(index, ()))]
    gates = [gate_text(gate) for gate, _, _ in groups]
    on_for = [None if sets[n][2] is None else sorted(sets[n][2]) for _, n, _ in groups]
    targets_lines = []
    if len(targets) > 1:
        targets_lines = [
            f"    targets={list(targets)!r},  # per target: its NVTX domain and sinks",
            f"    group_targets={[target for _, _, target in groups]!r},",
        ]
    # A local of the call: a gate is decided per call, and no thread sees another's choice.
    prelude = [f"{NAMES.gates} = {NAMES.ranges}.enter()  # the gates of this call"] if any(gates) or by_instance else []
    header = [
        "from nvtx_regions.inductor.header import GraphRecord, graph_ranges",
        f"{NAMES.ranges} = graph_ranges(",
        f"    {domain!r},",
        "    [",
        *(f"        {entry!r}," for entry in ranges),
        "    ],",
        f"    {lines!r},",
        f"    {gates!r},",
        f"    graph={record!r},",
        *([f"    instances={messages!r},", f"    on_for={on_for!r},"] if by_instance else []),
        *sinks_line,
        *targets_lines,
        ")",
        f"{NAMES.ranges}.install(globals())  # {NAMES.domain}, nvtx_regions_push, nvtx_regions_attr_N, ...",
    ]
    return Placement(
        {index: [text for text, *_ in found] for index, found in before.items()},
        {index: [text for text, *_ in found] for index, found in after.items()},
        header,
        prelude=prelude,
        guard=NAMES.ranges,
        error=NAMES.error,
    )


def _shape(plan: Plan) -> tuple:
    """What two instances' plans must share to share lines: everything but the names."""
    return tuple((r.start, r.end, r.kind, r.rules, r.gate, r.style) for r in plan.ranges)
