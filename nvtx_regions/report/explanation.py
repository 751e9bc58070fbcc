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

from ..attribution.traceview import TraceView
from ..core.errors import NotRunYetError, SelectorError
from ..internals.versions import require_thunder
from ..language.parse import spec_from_arguments
from ..language.tree import Spec
from ..selection.compile import compile_spec
from ..selection.support import restrict
from ..selection.explanation import Explanation, Program, RuleInTrace, explain_views

__all__ = ["explain", "Explanation", "Program", "RuleInTrace"]


def _traces_of(target: Any) -> list[Any]:
    if isinstance(target, (list, tuple)):
        return list(target)
    thunder = require_thunder("explain() of a thunder.jit function")
    if thunder.compile_data(target) is None:
        raise TypeError(
            f"explain() takes a thunder.jit-compiled function that has run once, a list of traces, an NvtxInductor "
            f"backend or an eager annotation (nvtx_regions.annotate); got {type(target).__name__}"
        )
    try:
        forward = thunder.last_traces(target)
    except TypeError:  # thunder: "doesn't seem to have been called yet"
        forward = None
    if not forward:
        raise NotRunYetError("explain(): the compiled function has not run yet; call it once first")
    traces = [forward[-1]]
    backward = thunder.last_backward_traces(target)
    if backward:
        traces.append(backward[-1])
    return traces


def _spec_of(target: Any, select: str | None, spec: str | os.PathLike[str] | None) -> Spec:
    given = spec_from_arguments(select, spec)
    if given is not None:
        return given
    thunder = require_thunder("explain() of a thunder.jit function")
    from ..emission.transform import NvtxProfileTransform

    for transform in getattr(thunder.compile_data(target), "transforms", ()) or ():
        if isinstance(transform, NvtxProfileTransform):
            return transform.spec
    raise SelectorError("explain(): give select= or spec=, or a function jitted with an NvtxProfileTransform")


def explain(
    target: Any,
    select: str | None = None,
    *,
    spec: str | os.PathLike[str] | None = None,
    max_ops: int = 12,
) -> Explanation:
    """Explain what a spec selects in what `target` compiled.

    `target` is a ``thunder.jit`` function or module that has run (its last
    forward and backward traces), a list of traces (forward first), an
    `NvtxInductor` backend or what ``nvtx_regions.compile(..., backend="inductor")`` returned (the
    graphs it placed ranges in, in this process),
    or an eager annotation (`nvtx_regions.annotate`'s result: the model's
    module tree). The spec is `select` and/or `spec` (as for
    `NvtxProfileTransform`); with neither, the target's own spec. Raises what
    the backend would raise for the same spec, and `NotRunYetError` for a
    thunder function that has not run (there is no trace yet).
    """
    from ..emission.eager import EagerAnnotation
    from ..inductor.backend import NvtxInductor

    target = getattr(target, "nvtx_regions_backend", target)
    if isinstance(target, (NvtxInductor, EagerAnnotation)):
        return target.explain(select, spec=spec, max_ops=max_ops)
    traces = _traces_of(target)
    compiled = restrict(compile_spec(_spec_of(target, select, spec)), "thunder")
    views: list[TraceView] = []
    for trace in traces:
        view = TraceView.from_trace(trace)
        if view.phase == "backward":
            view.forward = next((v for v in reversed(views) if v.phase == "forward"), None)
        views.append(view)
    return explain_views(compiled, views, max_ops=max_ops)
