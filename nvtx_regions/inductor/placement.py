"""A plan of ranges over a graph's kernels -> the lines a generated wrapper gains.

Promises:
- A range's push comes before the first line of its first kernel (the
  kernel's allocations and comment), its pop after the last line of its last
  kernel; ranges that end at the same kernel pop inner first. Nothing else
  in the wrapper changes.
- Each line is one call with the range's message in a comment:
  ``nvtx_regions_push(nvtx_regions_attr_0)  # transformer.h.0``.
- The header builds the ranges from literals (`runtime.GraphRanges`), so the
  code runs the same wherever Inductor's cache loads it.
"""

from __future__ import annotations

from ..core.naming import rule_category, rule_color
from ..internals.inductor import Placement
from ..selection.compile import CompiledSpec, Gate
from ..selection.plan import Plan
from .kernels import KernelView
from .runtime import function_names

__all__ = ["placement"]


def _gate_text(gates: frozenset[Gate]) -> tuple:
    return tuple(
        sorted(
            ((None if g.ranks is None else tuple(sorted(g.ranks))), g.first_step, g.last_step) for g in gates
        )
    )


def placement(plan: Plan, view: KernelView, spec: CompiledSpec, domain: str | None) -> Placement | None:
    """The lines that put `plan`'s ranges into the wrapper of `view`'s graph; None for no range."""
    if plan.empty:
        return None
    groups: dict[frozenset[Gate] | None, str] = {}
    for planned in plan.ranges:
        if planned.gate not in groups:
            groups[planned.gate] = "" if planned.gate is None else f"_g{sum(1 for g in groups if g is not None) + 1}"
    ranges = []
    before: dict[int, list[str]] = {}
    ends: dict[int, list[str]] = {}
    for number, planned in enumerate(plan.ranges):
        rule = spec.rules[planned.rules[0]]
        message = planned.label if planned.label is not None else view.ops[planned.start].name
        ranges.append((message, rule_color(rule.number), rule_category(rule.rule)))
        push, pop, start, end = function_names(groups[planned.gate])
        comment = f"  # {message}"
        first, last = view.ops[planned.start].first_line, view.ops[planned.end].last_line
        if planned.style == "StartEnd":
            opened = f"nvtx_regions_started_{number}"
            before.setdefault(first, []).append(f"{opened} = {start}(nvtx_regions_attr_{number}){comment}")
            ends.setdefault(last, []).append(f"{end}({opened}){comment}")
        else:
            before.setdefault(first, []).append(f"{push}(nvtx_regions_attr_{number}){comment}")
            ends.setdefault(last, []).append(f"{pop}(){comment}")
    after = {line: list(reversed(pops)) for line, pops in ends.items()}
    gated = {name: _gate_text(gate) for gate, name in groups.items() if gate is not None}
    if gated:
        # Locals of this call: a gate is decided per call, and no thread sees another's choice.
        names = ", ".join(name for group in gated for name in function_names(group))
        before.setdefault(0, []).insert(0, f"{names} = nvtx_regions_ranges.enter()  # the gated ranges of this call")
    header = [
        "from nvtx_regions.inductor.runtime import GraphRanges",
        "nvtx_regions_ranges = GraphRanges(",
        f"    {domain!r},",
        "    [",
        *(f"        {entry!r}," for entry in ranges),
        "    ],",
        *([f"    gates={gated!r},"] if gated else []),
        ")",
    ]
    if "" in groups.values():
        header.append(f"{', '.join(function_names(''))} = nvtx_regions_ranges.nvtx_functions")
    attributes = [f"nvtx_regions_attr_{n}" for n in range(len(ranges))]
    header.append(f"{', '.join(attributes)}{',' if len(attributes) == 1 else ''} = nvtx_regions_ranges.attributes")
    return Placement(before, after, header)
