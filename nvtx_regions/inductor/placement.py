"""A plan of ranges over a graph's kernels -> the lines a generated wrapper gains.

Promises:
- A range's push comes before the first line of its first kernel (the
  kernel's allocations and comment), its pop after the last line of its last
  kernel; ranges that end at the same kernel pop inner first. Nothing else
  in the wrapper changes.
- Each line is one call, the push with the range's message in a comment:
  ``nvtx_regions_push(nvtx_regions_attr_0, nvtx_regions_domain)  # transformer.h.0``.
- The lines sit in a ``try``/``except`` that closes what a failed call left
  open (`runtime.ranges`); a graph with gated ranges decides its gates in the
  call's first line.
- The header builds the ranges from literals (`runtime.graph_ranges`), so the
  code runs the same wherever Inductor's cache loads it. It also carries the
  graph's view (`report`), which it hands to its backend when it loads: what a
  rule selected is then known, and said, alike on a compile and on a cache hit.
  A graph with no range gets that header alone.
- Code run for several module instances (`instances`: per instance, each
  range's message) reads each range's attributes from the call's gates, whose
  first line takes the instance (`runtime.ranges.set_instance`).
"""

from __future__ import annotations

from ..core.naming import rule_category, rule_color
from ..internals.inductor import Placement
from ..selection.compile import CompiledSpec, Gate
from ..runtime.sinks import NVTX_ONLY
from ..selection.plan import Plan, PlannedRange
from .kernels import KernelView
from .runtime import NAMES, gate_text

__all__ = ["placement"]


def _message(planned: PlannedRange, view: KernelView) -> str:
    return planned.label if planned.label is not None else view.ops[planned.start].name


def placement(
    plan: Plan,
    view: KernelView,
    spec: CompiledSpec,
    domain: str | None,
    *,
    report: tuple,
    instances: dict[str, tuple[Plan, KernelView]] | None = None,
    sinks: tuple[str, ...] = NVTX_ONLY,
) -> Placement:
    """The lines that put `plan`'s ranges into the wrapper of `view`'s graph, and the header that
    hands `report` to the backend when the wrapper loads (see the module doc). For code that runs
    for several module instances, `instances` gives each one's plan and view instead: instances whose
    plans differ only in their names share lines; each other set of ranges gets lines of its own.
    `sinks`: where the ranges go (`runtime.sinks`); the header names them unless NVTX alone."""
    sinks_line = [] if sinks == NVTX_ONLY else [f"    sinks={sinks!r},"]
    sets: list[tuple[Plan, KernelView, frozenset[str] | None]] = [(plan, view, None)]
    if instances is not None:
        shapes: dict[tuple, list[str]] = {}
        for name, (its_plan, _) in instances.items():
            shapes.setdefault(_shape(its_plan), []).append(name)
        sets = [(*instances[names[0]], frozenset(names)) for names in shapes.values()]
    if all(its_plan.empty for its_plan, _, _ in sets):
        header = [
            "from nvtx_regions.inductor.runtime import graph_ranges",
            f"{NAMES.ranges} = graph_ranges({domain!r}, [], [], [], graph={report!r})",  # no range: no sink
        ]
        return Placement({}, {}, header, prelude=[], guard=NAMES.ranges, error=NAMES.error)
    by_instance = instances is not None
    groups: dict[tuple[frozenset[Gate] | None, int], int] = {}
    ranges = []
    messages: dict[str, list[str | None]] = {name: [] for name in instances or ()}
    before: dict[int, list[tuple[str, str, int, int]]] = {}  # wrapper line -> (text, kind, range, group)
    ends: dict[int, list[tuple[str, str, int, int]]] = {}
    number = -1
    for set_number, (its_plan, its_view, names) in enumerate(sets):
        for position, planned in enumerate(its_plan.ranges):
            number += 1
            group = groups.setdefault((planned.gate, set_number), len(groups))
            rule = spec.rules[planned.rules[0]]
            message = _message(planned, its_view)
            ranges.append((message, rule_color(rule.number), rule_category(rule.rule)))
            for name, (other_plan, other_view) in (instances or {}).items():
                # The same range of another instance with the same shape: its own name.
                own = other_plan.ranges[position] if name in names else None  # type: ignore[operator]
                messages[name].append(None if own is None else _message(own, other_view))
            gated = planned.gate is not None or by_instance
            attributes = NAMES.attributes(number)
            if by_instance:
                attributes = f"{NAMES.gates}.{attributes}"
            first, last = its_view.ops[planned.start].first_line, its_view.ops[planned.end].last_line
            if planned.style == "StartEnd":
                started = NAMES.started(number)
                start, end = NAMES.called(group, gated, 2), NAMES.called(group, gated, 3)
                before.setdefault(first, []).append((f"{started} = {start}({attributes}, {NAMES.domain})  # {message}", "start", number, group))
                ends.setdefault(last, []).append((f"{end}(*{started})", "end", number, group))
            else:
                push, pop = NAMES.called(group, gated, 0), NAMES.called(group, gated, 1)
                before.setdefault(first, []).append((f"{push}({attributes}, {NAMES.domain})  # {message}", "push", number, group))
                ends.setdefault(last, []).append((f"{pop}()", "pop", number, group))
    after = {line: list(reversed(found)) for line, found in ends.items()}
    lines = []
    for index in sorted({*before, *after}):
        lines += [(kind, number, group) for _, kind, number, group in (*before.get(index, ()), *after.get(index, ()))]
    gates = [gate_text(gate) for gate, _ in groups]
    on_for = [None if sets[n][2] is None else sorted(sets[n][2]) for _, n in groups]
    # A local of the call: a gate is decided per call, and no thread sees another's choice.
    prelude = [f"{NAMES.gates} = {NAMES.ranges}.enter()  # the gates of this call"] if any(gates) or by_instance else []
    header = [
        "from nvtx_regions.inductor.runtime import graph_ranges",
        f"{NAMES.ranges} = graph_ranges(",
        f"    {domain!r},",
        "    [",
        *(f"        {entry!r}," for entry in ranges),
        "    ],",
        f"    {lines!r},",
        f"    {gates!r},",
        f"    graph={report!r},",
        *([f"    instances={messages!r},", f"    on_for={on_for!r},"] if by_instance else []),
        *sinks_line,
        ")",
        f"globals().update({NAMES.ranges}.globals())  # {NAMES.domain}, nvtx_regions_push, nvtx_regions_attr_N, ...",
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
