"""Explain a spec against what a backend compiled: which ops each rule selects, which
region each region rule spans, which module each selected op belongs to, the
module calls of ``each`` rules, why a rule selects nothing, for selected
backward ops the forward ops they are traced to, and for a rule the backend
cannot express, why not and which backends can.

    import nvtx_regions
    print(nvtx_regions.explain(jitted, "attn: between t3..t9"))       # thunder
    print(nvtx_regions.explain(backend))                              # an NvtxInductor that compiled
    print(nvtx_regions.explain(nvtx_regions.annotate(model)))         # eager

One result type for every backend: `selection.explanation.Explanation`.
"""

from __future__ import annotations

import os
from typing import Any

from ..core.errors import SelectorError
from ..runtime.handle import handle_of
from ..internals.versions import require_thunder
from ..language.parse import spec_from_arguments
from ..selection.explanation import Explanation, Program, RuleInTrace

__all__ = ["explain", "Explanation", "Program", "RuleInTrace"]


def explain(
    target: Any,
    select: str | None = None,
    *,
    spec: str | os.PathLike[str] | None = None,
    max_ops: int = 12,
) -> Explanation:
    """Explain what a spec selects in what `target` compiled.

    `target` is what ``nvtx_regions.compile`` returned on any backend, or its handle
    (`runtime.handle.SpecHandle`: an eager annotation, an `NvtxInductor`, an
    `NvtxProfileTransform`): eager explains the model's module tree, Inductor the graphs it
    placed ranges in (in this process), thunder the last forward and backward traces. A
    ``thunder.jit`` function or module that has run and a list of thunder traces (forward
    first) are taken too. The spec is `select` and/or `spec` (as for
    `NvtxProfileTransform`); with neither, the target's own spec. Raises what
    the backend would raise for the same spec, and `NotRunYetError` for a
    thunder function that has not run (there is no trace yet).
    """
    handle = handle_of(target)
    if handle is not None:
        return handle.explain(select, spec=spec, max_ops=max_ops)
    thunder = require_thunder("explain() of a thunder.jit function")
    from ..emission.transform import NvtxProfileTransform, explain_traces, traces_of

    if isinstance(target, (list, tuple)):
        traces = list(target)
    elif thunder.compile_data(target) is None:
        raise TypeError(
            f"explain() takes what nvtx_regions.compile returned, a thunder.jit-compiled function that has run once, "
            f"a list of traces, an NvtxInductor backend or an eager annotation (nvtx_regions.annotate); got "
            f"{type(target).__name__}"
        )
    else:
        traces = traces_of(target)
    given = spec_from_arguments(select, spec)
    if given is None:
        transforms = () if isinstance(target, (list, tuple)) else getattr(thunder.compile_data(target), "transforms", ())
        found = [t for t in transforms or () if isinstance(t, NvtxProfileTransform)]
        if not found:
            raise SelectorError("explain(): give select= or spec=, or a function jitted with an NvtxProfileTransform")
        given = found[0].spec
    return explain_traces(traces, given, max_ops=max_ops)
