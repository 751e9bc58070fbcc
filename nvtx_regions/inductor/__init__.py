"""The spec's ranges under ``torch.compile``: ``from nvtx_regions.inductor import NvtxInductor``.

The modules, in the order a range travels from the spec to a push in the generated wrapper:

1. `backend`: ``NvtxInductor``, the ``torch.compile`` backend. It holds the spec (`check` leaves
   out the rules that have no meaning here), compiles each Dynamo graph with Inductor, and owns a
   placer and a tracker, which share one `header.GraphRecord` per graph.
2. `instances`: which module a graph's paths start at, and the module instances that may run it.
3. `kernels`: the graph's kernel calls as a view that selection works on (module calls, markers).
4. `placer`: compile time. Kernels -> view -> `GraphRecord` and a plan per instance -> the lines
   the wrapper gains.
5. `header`: what a wrapper's header holds (the ranges as literals, the `GraphRecord`) and what its
   lines call (`runtime.ranges`), alike in this process and where Inductor's cache serves it.
6. `tracker`: call time. The record comes back as the wrapper loads; which instance each call runs
   for; when a step went by, what each rule selected is said.
7. `outside` and `first_step`: the module calls that run outside every graph (graph breaks) get
   their ranges from hooks.
8. `dynamo_events`: what Dynamo decides that costs ranges (the recompile limit), said.
9. `explain`: what each rule selected, graph by graph.
10. `state`: the wing's process-wide state, all of it (what outlives one backend or is shared by
    several; a backend's own state is in its placer and tracker), each entry held weakly where it
    holds a backend, a model or a wrapper.

What the wing changes outside its own objects (Inductor's code generation, Dynamo's config) is
`internals.installs`'s, put back by the last live handle's ``remove()``.

Imports `core`, `internals`, `language`, `selection` and `emission`; torch's Inductor is imported
when a backend is made, which checks that it has what placing ranges reaches into
(`UnsupportedTorchError` if not; `TESTED_TORCH`: the releases checked).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .backend import NvtxInductor

__all__ = ["NvtxInductor", "UnsupportedTorchError", "TESTED_TORCH"]


def __getattr__(name: str) -> Any:
    if name == "NvtxInductor":
        from .backend import NvtxInductor

        return NvtxInductor
    if name in ("UnsupportedTorchError", "TESTED_TORCH"):
        from ..internals import inductor

        return getattr(inductor, name)
    raise AttributeError(f"module 'nvtx_regions.inductor' has no attribute {name!r}")
