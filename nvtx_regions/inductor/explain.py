"""What each rule of an `NvtxInductor` selected, graph by graph: an `Explanation`, as for every backend.

Per graph placed in this process (compiled here or served by Inductor's cache; a graph
whose code runs for several module instances once per instance, ``graph 0 (forward) as
blocks.1``), after the notes on what got no range and why (graph breaks, the recompile
limit): per rule how many ranges it
made and over which kernels, and, after the rules, the graph's kernels in
call order with the module each belongs to ("hoisted": it does not stretch
its module's range, `inductor.kernels`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..language.tree import Spec
from ..selection.compile import compile_spec
from ..selection.explanation import Explanation, explain_views
from ..selection.support import restrict
from .kernels import KernelView

if TYPE_CHECKING:
    from .backend import NvtxInductor

__all__ = ["explain_graphs"]


def _listing(view: KernelView) -> tuple[str, ...]:
    lines = []
    for op in view.ops:
        module = op.chain[-1].path if op.chain else "-"
        lines.append(f"#{op.index:<3} {op.name:<48} {module}{'  (hoisted)' if op.hoisted else ''}")
    return tuple(lines)


def _hooked(backend: NvtxInductor) -> list[str]:
    """The line on the calls that ran outside every graph and got their ranges from hooks (`outside`)."""
    paths = backend.outside.ranges_from_hooks()
    return [f"ranges from hooks (calls outside every graph): {', '.join(paths)}"] if paths else []


def _from_hooks(backend: NvtxInductor) -> dict[int, str]:
    """Per rule of the backend's spec whose ranges hooks gave (calls outside every graph): that line."""
    paths: dict[int, list[str]] = {}
    for path, rules in backend.outside.ranges_from_hooks().items():
        for rule in rules:
            paths.setdefault(rule, []).append(path)
    return {rule: f"ranges from hooks, for its calls outside every graph: {', '.join(found)}" for rule, found in paths.items()}


def explain_graphs(backend: NvtxInductor, spec: Spec | None = None, *, max_ops: int = 12) -> Explanation:
    """The explanation of `spec` (by default the backend's own) over every graph `backend` placed
    ranges in (see the module doc); a rule whose ranges hooks gave says so, not that it selected
    nothing. Raises `SelectorError` for a spec error."""
    graphs = list(backend.graphs)
    views = [placed.view for placed in graphs]
    explanation = explain_views(
        backend.compiled if spec is None else restrict(compile_spec(spec), "inductor"),
        views,
        unit="kernel",
        plans=[placed.plan for placed in graphs] if spec is None else None,
        listings=[_listing(view) for view in views],
        header="\n".join([
            f"{backend!r}: {len(graphs)} graph(s) placed in this process", *(f"note: {n}" for n in backend.notes),
            *_hooked(backend),
        ]),  # fmt: skip
        max_ops=max_ops,
        domain=backend.domain_name,
    )
    if spec is None:
        explanation.elsewhere = _from_hooks(backend)
    return explanation
