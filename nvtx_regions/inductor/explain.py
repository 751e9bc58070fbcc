"""What each rule of an `NvtxInductor` selected, graph by graph, as text.

Per graph placed in this process (a graph served from Inductor's cache was
placed where it was compiled, and is not listed): its kernels in call order
with the module each belongs to ("hoisted": it does not stretch its module's
range, `inductor.kernels`), then per rule how many ranges it made and over
which kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.bits import bit_positions

if TYPE_CHECKING:
    from .backend import NvtxInductor

__all__ = ["explain_graphs"]


def explain_graphs(backend: NvtxInductor) -> str:
    """The explanation of every graph `backend` placed ranges in (see the module doc)."""
    out = [f"{backend!r}: {len(backend.graphs)} graph(s) placed in this process"]
    for placed in backend.graphs:
        view, plan = placed.view, placed.plan
        out.append("")
        out.append(f"{view.name}: {len(view.ops)} kernel calls, {len(plan.ranges)} ranges")
        for op in view.ops:
            module = op.chain[-1].path if op.chain else "-"
            out.append(f"  #{op.index:<3} {op.name:<48} {module}{'  (hoisted)' if op.hoisted else ''}")
        for rule, found in zip(backend.compiled.rules, plan.per_rule):
            kernels = [f"#{p}" for p in bit_positions(found.selected)]
            shown = ", ".join(kernels[:12]) + (", ..." if len(kernels) > 12 else "")
            out.append(f"  {rule.describe()}: {found.ranges} range(s) over {len(kernels)} kernel(s){': ' + shown if kernels else ''}")
            for span in found.spans:
                out.append(f"    {span.label!r}: kernels #{span.first}..#{span.last}")
    return "\n".join(out)
