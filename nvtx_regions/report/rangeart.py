"""Draw the ranges an `Explanation` plans, as a tree for the terminal (plain text, box-drawing characters).

    print(draw_ranges(nvtx_regions.explain(jitted)))

    forward 'thunder_forward' (45 ranges)
    ├── embed ×2  #0, #1
    ├── block0  #5..#31
    │   └── matmuls ×4  #7..#29
    └── matmuls ×11  #33..#70

A region rule is a node spanning its ops, and so is each module call of an
``each module``/``each class`` rule (named by its path), except a call whose
range is a start/end range (it crosses another range): start/end ranges are
listed under the tree, apart from it, with why, as Nsight shows them in a row
of their own (``start/end: a  #0..#7 (crosses 'b' ...)``). Per-op ranges are leaves inside
the innermost region that holds them. Consecutive leaves of the same rule
under one parent are drawn as one line, ``name ×count`` with their op
positions. An op that several rules select has one range, named after all of
them (``a+b``), as the transform emits it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core.naming import rule_category

__all__ = ["draw_ranges"]


@dataclass
class _Node:
    name: str
    start: int
    end: int
    region: bool
    children: list[_Node] = field(default_factory=list)


def _positions(values: list[int]) -> str:
    if len(values) <= 3:
        return ", ".join(f"#{v}" for v in values)
    return f"#{values[0]}..#{values[-1]}"


def _lines(children: list[_Node], prefix: str) -> list[str]:
    groups: list[list[_Node]] = []
    for child in children:
        if groups and not child.region and not groups[-1][0].region and groups[-1][0].name == child.name:
            groups[-1].append(child)
        else:
            groups.append([child])
    out = []
    for i, group in enumerate(groups):
        last = i == len(groups) - 1
        branch, indent = ("└── ", "    ") if last else ("├── ", "│   ")
        head = group[0]
        if head.region:
            out.append(f"{prefix}{branch}{head.name}  #{head.start}..#{head.end}")
            out += _lines(head.children, prefix + indent)
        else:
            count = f" ×{len(group)}" if len(group) > 1 else ""
            out.append(f"{prefix}{branch}{head.name}{count}  {_positions([n.start for n in group])}")
    return out


def draw_ranges(explanation: Any) -> str:
    """One tree per trace of `explanation` (an `nvtx_regions.Explanation`), joined by blank lines."""
    rules = explanation.rules
    traces = len(explanation.traces[0]) if explanation.traces else 0
    pictures = []
    for t in range(traces):
        found = [per_trace[t] for per_trace in explanation.traces]
        regions: list[_Node] = []
        leaves: dict[int, list[str]] = {}
        apart: list[str] = []  # start/end ranges
        for rule, f in zip(rules, found):
            # One region per module call of an each rule, named by its path.
            whys = f.start_end or (None,) * len(f.calls)
            for (message, first, last, _), why in zip(f.calls, whys):
                if why is None:
                    regions.append(_Node(message, first, last, True))
                else:
                    apart.append(f"start/end: {message}  #{first}..#{last} ({why})")
            if f.region is not None and f.ranges:
                regions.append(_Node(rule_category(rule.rule), f.region[0], f.region[1], True))
            if rule.per_op:
                for position in f.selected:
                    leaves.setdefault(position, []).append(rule_category(rule.rule))
        nodes = regions + [_Node("+".join(names), p, p, False) for p, names in leaves.items()]
        # Outer first: earlier start, then longer span; regions before leaves at the same op.
        nodes.sort(key=lambda n: (n.start, -n.end, not n.region))
        roots: list[_Node] = []
        stack: list[_Node] = []
        for node in nodes:
            while stack and not (stack[-1].start <= node.start and node.end <= stack[-1].end):
                stack.pop()
            (stack[-1].children if stack else roots).append(node)
            if node.region:
                stack.append(node)
        total = len(nodes) + len(apart)
        head = f"{found[0].phase} {found[0].trace_name!r} ({total} range{'s' * (total != 1)})"
        pictures.append("\n".join([head, *(_lines(roots, "") or ["    (no ranges)"]), *apart]))
    return "\n\n".join(pictures)
