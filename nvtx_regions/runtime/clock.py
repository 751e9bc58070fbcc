"""The step clock that every ``steps a..b`` gate reads, and this process's rank.

Step N means the same on every backend:

- Inside a `nvtx_regions.steps` loop, the step is that loop's iteration
  number, from 0 (the innermost loop's, when loops nest).
- Outside every such loop, the step is the number of ``optimizer.step()``
  calls (of any ``torch.optim`` optimizer) made in this process since
  nvtx_regions started counting: when the first model was compiled or
  annotated, the first transform or backend made, or the first `steps` loop
  started, whichever came first.

Nothing else moves it: a recompile, a graph break, an evaluation or
inference call, a micro-batch or a backward pass leaves the step where it is.
A process whose clock never left step 0 (no `steps` loop, no optimizer step)
while a rule waited for a later step gets one warning at exit naming it.
A gate is decided when a call starts (a trace's or a wrapper's call, a root
module's forward), so one call's ranges are all in or all out.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import warnings
from typing import Any

from ..core.errors import NvtxRegionsWarning
from ..internals import installs

__all__ = ["current_step", "current_rank", "start_counting", "StepLoop", "watch_step_gates"]

_lock = threading.Lock()
_loops: list[StepLoop] = []  # the `steps` loops running, outermost first
_optimizer_steps = 0
_moved = False  # whether the clock ever left step 0
_COUNTING = "torch.optim's global step hook"  # the change's name in `installs`


class StepLoop:
    """One `nvtx_regions.steps` loop's place on the clock: `at(n)` as it hands out item n, `close()` when it ends."""

    def __init__(self) -> None:
        self.step = 0
        start_counting()
        with _lock:
            _loops.append(self)

    def at(self, step: int) -> None:
        global _moved
        self.step = step
        if step:
            _moved = True

    def close(self) -> None:
        with _lock:
            if self in _loops:
                _loops.remove(self)


def current_step() -> int:
    """The step the clock is at (see the module doc)."""
    return _loops[-1].step if _loops else _optimizer_steps


def _optimizer_stepped(optimizer: Any, args: Any, kwargs: Any) -> None:
    global _optimizer_steps, _moved
    _optimizer_steps += 1
    _moved = True


def start_counting() -> None:
    """Count optimizer steps from now on: torch's global optimizer step hook, one change of
    `internals.installs` (once until the last handle's ``remove()`` takes it off)."""
    installs.make(_COUNTING, _hook_optimizers)


def _hook_optimizers(undo: installs.Undo) -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from ..internals.dynamo import run_outside_dynamo

    undo.then(register_optimizer_step_post_hook(run_outside_dynamo(_optimizer_stepped)).remove)


def current_rank() -> int:
    """This process's distributed rank: torch.distributed's if initialized, else $RANK, else 0."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0") or 0)


_watched: dict[str, None] = {}  # rules that wait for a step after 0, as described to the user


def watch_step_gates(rules: Any) -> None:
    """What every backend does with its compiled `rules`: start counting optimizer steps (for
    ``steps a..b`` outside a `steps` loop), and remember the rules whose gate opens only after
    step 0, for the exit check."""
    start_counting()
    for rule in rules:
        gate = getattr(rule, "gate", None)
        if gate is not None and gate.first_step:
            _watched.setdefault(rule.describe(), None)


def _never_moved() -> None:
    if _watched and not _moved:
        rules = "; ".join(list(_watched)[:5]) + (f" and {len(_watched) - 5} more" if len(_watched) > 5 else "")
        warnings.warn(
            f"the step clock stayed at step 0 in this process (no nvtx_regions.steps loop, no optimizer.step()), "
            f"so these rules' steps never came: {rules}. Loop over nvtx_regions.steps(...) to count steps",
            NvtxRegionsWarning,
            stacklevel=1,
        )


atexit.register(_never_moved)
