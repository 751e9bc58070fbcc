"""Which rules of a spec mean something under Inductor: the rest is refused, naming the rule and why.

What a generated wrapper knows of a kernel is the FX nodes it came from: their
aten ops, the module calls Dynamo recorded around them, and whether the graph
is a forward or a backward. So ``op in``, ``module``/``class`` (``each`` too),
``forward``/``backward``, ``between first(...)..last(...)``, the run-time gates
and ``not``/``and``/``or`` of those work. Refused:
- proxy names (``between t3..t9``) and ``reads <...>``: thunder's names for
  values, which an Inductor graph does not have;
- ``source <...>``: Inductor keeps no source line per kernel that survives
  fusion and the backward;
- ``marker <...>``/``each marker <...>``: a model's own NVTX markers break
  Dynamo's graph, so no kernel is inside one;
- ``backward of (...)``: the forward graph's kernels and the backward's are
  not tied kernel to kernel.
"""

from __future__ import annotations

from ..core.errors import SelectorError
from ..language.tree import Spec, Visitor, render, walk

__all__ = ["check_spec"]


class _Refusal(Visitor):
    """Per node: why it has no meaning under Inductor, or None."""

    def _fine(self, node: object) -> None:
        return None

    visit_OpIn = visit_Forward = visit_Backward = visit_All = visit_RankIn = visit_Steps = _fine
    visit_ModuleIn = visit_ClassIn = visit_EachModule = visit_EachClass = _fine
    visit_Not = visit_And = visit_Or = visit_Between = visit_First = visit_Last = _fine

    def visit_Proxy(self, node: object) -> str:
        return (
            f"{node.name!r} is a thunder proxy name; an Inductor graph has no such names: "  # type: ignore[attr-defined]
            "mark the region's ends with first(...)/last(...), e.g. 'between first(module <h.0>)..last(module <h.1>)'"
        )

    def visit_Reads(self, node: object) -> str:
        return f"{render(node)!r} names thunder proxies; an Inductor graph has none: select by 'op in <...>' or module"  # type: ignore[arg-type]

    def visit_Source(self, node: object) -> str:
        return (
            f"{render(node)!r}: no source line survives per Inductor kernel (fused kernels and backward "  # type: ignore[arg-type]
            "kernels have none); select by 'module <...>' or 'op in <...>'"
        )

    def visit_MarkerIn(self, node: object) -> str:
        return (
            f"{render(node)!r}: under torch.compile a model's own NVTX markers break the graph, so no kernel "  # type: ignore[arg-type]
            "is inside one; select by module instead"
        )

    visit_EachMarker = visit_MarkerIn

    def visit_BackwardOf(self, node: object) -> str:
        return (
            f"{render(node)!r}: Inductor's backward kernels are not tied one by one to forward kernels; "  # type: ignore[arg-type]
            "write 'backward and module <...>' for a module's backward kernels"
        )


_REFUSAL = _Refusal()


def check_spec(spec: Spec) -> None:
    """Raise `SelectorError` for the first rule that uses what Inductor cannot select (see the module doc)."""
    for rule in spec.rules:
        for node in walk(rule.expr):
            why = _REFUSAL.visit(node)
            if why is not None:
                raise SelectorError(f"{rule.describe(spec.filename)}: not supported under Inductor: {why}")
