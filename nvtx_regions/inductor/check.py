"""Which rules of a spec mean something under Inductor: the rest is left out, naming the rule and why;
and the words of the backend's other messages about what gets no range.

What a generated wrapper knows of a kernel is the FX nodes it came from: their
aten ops, the module calls Dynamo recorded around them and the user's own
markers open around them (`internals.compiled_markers`), and whether the
graph is a forward or a backward. So ``op in``, ``marker``/``each marker``,
``module``/``class`` (``each`` too), ``forward``/``backward``, ``between first(...)..last(...)``, the run-time gates
and ``not``/``and``/``or`` of those work. Left out, as the one table of
`selection.support` says for every backend:
- proxy names (``between t3..t9``) and ``reads <...>``: thunder's names for
  values, which an Inductor graph does not have;
- ``source <...>``: Inductor keeps no source line per kernel that survives
  fusion and the backward;
- ``backward of (...)``: the forward graph's kernels and the backward's are
  not tied kernel to kernel.
"""

from __future__ import annotations

from typing import Any

from ..language.tree import Spec
from ..selection.compile import CompiledSpec, compile_spec
from ..selection.support import report_unsupported, restrict

__all__ = ["check_spec", "left_out_message"]


def check_spec(spec: Spec, *, strict: bool = True, stacklevel: int = 1) -> CompiledSpec:
    """`spec` compiled for Inductor. With `strict` (the default), raise `SelectorError` naming every
    rule that Inductor cannot express (see the module doc); without, leave those rules out
    (`support.UnsupportedRule`) and say so in one `NvtxRegionsWarning`.

    Raises `SelectorError` for a spec error, as every backend does. `stacklevel` counts from
    the caller of this function, as for `warnings.warn`.
    """
    compiled = restrict(compile_spec(spec), "inductor")
    report_unsupported(compiled, strict=strict, stacklevel=stacklevel + 1)
    return compiled


def left_out_message(root: str | None, view: Any, why: str) -> str:
    """Why a graph Dynamo compiled on its own after a graph break (of `root`'s code, its kernels in
    `view`) gets no range, and the way out."""
    modules = sorted({call.path for op in view.ops if op.chain for call in op.chain})
    inside = f" (its modules: {', '.join(modules[:4])}{', ...' if len(modules) > 4 else ''})" if modules else ""
    where = f"a graph of {root!r}'s code{inside}" if root else f"a graph{inside}"
    return (
        f"{where} gets no NVTX range: Dynamo compiled it on its own after a graph break, and {why}. "
        "Remove the graph break (TORCH_LOGS=graph_breaks shows where), or use backend='eager', "
        "which names every module call"
    )
