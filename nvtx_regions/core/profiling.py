"""What `nvtx_regions.compile`/`steps` and ``nvtx-regions profile`` share, written once.

The backends, the spec they run when given none, and the environment variables through which the command
chooses a script's backend and spec. `nvtx_regions.steps` pushes one range per training step, named ``step N``
(N from 0), in the spec's NVTX domain and category ``nvtx_regions.steps`` (in torch.profiler, ``ProfilerStep#N``,
torch's own name for a step). ``nvtx-regions profile`` reads them
back from a report to tell warm-up steps from measured ones. The message is
not a module path, so it is never taken for a module range.
"""

from __future__ import annotations

import re

__all__ = [
    "BACKENDS", "DEFAULT_SELECT", "ENV_BACKEND", "ENV_SPEC", "ENV_EMIT", "PROFILER_STEP", "SINKS", "STEP_CATEGORY",
    "emit_sinks", "profiler_step_message", "step_message", "step_number",
]  # fmt: skip

BACKENDS = ("eager", "thunder", "inductor")
# The spec of `compile`, `annotate` and `NvtxInductor` when given none: every module, forward and
# backward, ranges that every backend emits alike. (`NvtxProfileTransform` alone defaults to `all`,
# as thunder's own NVTX transform annotates every op.)
DEFAULT_SELECT = "each module <**>"
# Set by `nvtx-regions profile` for each run of the user's command.
ENV_BACKEND = "NVTX_REGIONS_BACKEND"
ENV_SPEC = "NVTX_REGIONS_SPEC"
# Where ranges go (`emit=`, ``--emit``): NVTX, torch.profiler's record_function, or both.
ENV_EMIT = "NVTX_REGIONS_EMIT"
SINKS = ("nvtx", "record_function")
# The NVTX category of the step ranges: one row in a per-rule summary (rules' categories are their labels).
STEP_CATEGORY = "nvtx_regions.steps"

_STEP = re.compile(r"step (0|[1-9][0-9]*)")
PROFILER_STEP = "ProfilerStep#"


def step_message(number: int) -> str:
    """The message of training step `number`'s range."""
    return f"step {number}"


def profiler_step_message(number: int) -> str:
    """The name of training step `number`'s range in torch.profiler: torch's own (``profile.step()``
    writes ``ProfilerStep#N``), by which HTA and TensorBoard's profiler plugin find iterations."""
    return f"{PROFILER_STEP}{number}"


def step_number(message: str | None) -> int | None:
    """The step number of a step range's message; None for any other message."""
    match = _STEP.fullmatch(message or "")
    return int(match[1]) if match else None


def emit_sinks(emit: object, *, where: str) -> tuple[str, ...]:
    """The sinks `emit` names, in `SINKS` order: ``"nvtx"``, ``"record_function"``, a tuple or list of
    them, or their names joined by commas (``$NVTX_REGIONS_EMIT``, ``--emit``).

    Raises ValueError naming `where` (``emit=``, ``$NVTX_REGIONS_EMIT``, ``--emit``) and the accepted values.
    """
    if isinstance(emit, str):
        names = [name.strip() for name in emit.split(",")]
    elif isinstance(emit, (tuple, list)) and all(isinstance(name, str) for name in emit):
        names = list(emit)
    else:
        names = None
    wrong = None if names else emit
    if names:
        wrong = next((name for name in names if name not in SINKS), None)
    if not names or wrong is not None:
        raise ValueError(
            f"{where}{wrong!r} is not a place for ranges; choose 'nvtx', 'record_function', "
            "or both ('nvtx,record_function'; in Python also ('nvtx', 'record_function'))"
        )
    return tuple(sink for sink in SINKS if sink in names)
