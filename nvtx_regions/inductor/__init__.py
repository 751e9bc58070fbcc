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

Process-wide state: a backend's own state is in its placer and tracker. What outlives one backend, or
is shared by several, is in these module globals alone (a test keeps this list whole), each held
weakly where it holds a backend, a model or a wrapper, so that none keeps what the user dropped:

- `tracker._backends`: per cache key, the backend a loaded wrapper reports to (weak values);
- `tracker._alive`: every backend alive, for `release` to find another of the same key (weak);
- `tracker._ranges`: per key, the runtimes of its loaded wrappers, silenced by the key's last
  `remove()` (weak);
- `tracker._compiling`: per thread, the backend compiling and its graph's number (while it compiles);
- `outside._shared`: per key, the one `EveryModel` its backends share (weak values);
- `outside._installed`: per model, the hooks on it (weak keys: the model);
- `first_step._whole_in`: per model, the forwards Dynamo compiled whole (weak keys: the model);
- `dynamo_events._ours`: per function Dynamo compiled for a backend, those backends (weak);
- `dynamo_events._limits_said`: the functions whose recompile limit was said (names: once a process).

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
