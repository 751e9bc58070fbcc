"""What Dynamo decides on its own that costs a model its ranges, said as `NvtxRegionsWarning`s: a
function past a recompile limit (it runs uncompiled from then on), and a ``record_function`` dropped
from compiled code on a torch that cannot keep it (2.8). Dynamo says either only in its log; both are
heard where Dynamo decides them, whatever the user's log levels and handlers (`internals.dynamo`,
`internals.compiled_markers`). Without these, the ranges would be gone and nothing would say so.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any

from ..core.errors import NvtxRegionsWarning
from ..internals import compiled_markers, dynamo
from ..internals.frames import outside_package
from . import state

__all__ = ["watch", "compiled_for_us"]


def compiled_for_us(backend: Any) -> None:
    """Note the function whose frame Dynamo compiles now for `backend`, an `NvtxInductor` (called by
    the backend): only its recompile limit is ours to speak of, and our own doing where several
    backends compiled it."""
    function = dynamo.traced_function()
    if function is not None:
        state.compiled_for.setdefault(function, weakref.WeakSet()).add(backend)


def watch() -> None:
    """Listen from now on (each `NvtxInductor` calls it; listening once is enough)."""
    dynamo.recompile_limit_hits(_recompile_limit_hit)
    compiled_markers.record_function_drops(_record_function_dropped)


def _record_function_dropped(function: str) -> None:
    """Dynamo dropped a ``record_function`` from code it compiled for an `NvtxInductor`, on a torch that
    cannot keep them (`internals.compiled_markers.record_function_drops`): say so, once per process."""
    if function in state.drops_said:
        return
    state.drops_said.add(function)
    warnings.warn(
        f"{compiled_markers.record_function_lost()}: the ranges of {function} in the code torch.compile "
        "compiles are gone. Use torch.cuda.nvtx.range or nvtx.annotate there (NvtxInductor carries them into "
        "the compiled code), or a torch whose Dynamo has that option (2.11, 2.14)",
        NvtxRegionsWarning,
        stacklevel=outside_package(),
    )


def _recompile_limit_hit(limit: str, value: Any, function: str) -> None:
    """Dynamo stopped compiling `function` (`internals.dynamo.recompile_limit_hits`, watched once an
    `NvtxInductor` exists): where it compiled that function for an `NvtxInductor`, say so once per
    function, since its calls now run uncompiled, without the ranges of its graphs. Other code's
    recompiles are not ours to speak of."""
    if function in state.limits_said or function not in state.compiled_for:
        return
    state.limits_said.add(function)
    said = (
        f"Dynamo hit torch._dynamo.config.{limit} ({value}) for {function}: from now on it runs without "
        "torch.compile, so its calls get no NVTX range from NvtxInductor. "
    )
    backends = len(state.compiled_for[function])
    if backends > 1:  # each new backend object fails Dynamo's BACKEND_MATCH guard: a recompile of ours
        said += (
            f"The recompiles are ours: Dynamo compiled it for {backends} different NvtxInductor objects, and a new "
            "backend object makes it compile again (its BACKEND_MATCH guard). Make one "
            "NvtxInductor(spec, model=model) and pass it to every compile of this code, every layer's "
            "(docs/how-to/layer-by-layer.md); nvtx_regions.compile shares one by itself"
        )
    else:
        said += (
            f"Raise the limit before compiling (torch._dynamo.config.{limit} = N), or make the recompiles stop "
            "(TORCH_LOGS=recompiles says why each happened)"
        )
    warnings.warn(said, NvtxRegionsWarning, stacklevel=outside_package())
