"""What `nvtx_regions.compile`/`steps` and ``nvtx-regions profile`` share, written once.

The backends, the spec they run when given none, and the environment variables through which the command
chooses a script's backend and spec. `nvtx_regions.steps` pushes one range per training step, named ``step N``
(N from 0), in the spec's NVTX domain and category ``nvtx_regions.steps``. ``nvtx-regions profile`` reads them
back from a report to tell warm-up steps from measured ones. The message is
not a module path, so it is never taken for a module range.
"""

from __future__ import annotations

import re

__all__ = ["BACKENDS", "DEFAULT_SELECT", "ENV_BACKEND", "ENV_SPEC", "STEP_CATEGORY", "step_message", "step_number"]

BACKENDS = ("eager", "thunder", "inductor")
# The spec of `compile`, `annotate` and `NvtxInductor` when given none: every module, forward and
# backward, ranges that every backend emits alike. (`NvtxProfileTransform` alone defaults to `all`,
# as thunder's own NVTX transform annotates every op.)
DEFAULT_SELECT = "each module <**>"
# Set by `nvtx-regions profile` for each run of the user's command.
ENV_BACKEND = "NVTX_REGIONS_BACKEND"
ENV_SPEC = "NVTX_REGIONS_SPEC"
# The NVTX category of the step ranges: one row in a per-rule summary (rules' categories are their labels).
STEP_CATEGORY = "nvtx_regions.steps"

_STEP = re.compile(r"step (0|[1-9][0-9]*)")


def step_message(number: int) -> str:
    """The message of training step `number`'s range."""
    return f"step {number}"


def step_number(message: str | None) -> int | None:
    """The step number of a step range's message; None for any other message."""
    match = _STEP.fullmatch(message or "")
    return int(match[1]) if match else None
