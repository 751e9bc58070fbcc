"""Which rules of a spec mean something under Inductor: the rest is left out, naming the rule and why.

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

from ..language.tree import Spec
from ..selection.compile import CompiledSpec, compile_spec
from ..selection.support import report_unsupported, restrict

__all__ = ["check_spec"]


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
