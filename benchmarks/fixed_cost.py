"""The fixed cost per call of a transformed trace and one range, against thunder's own cost
per range (one push + one pop).

The workload is a one-op function, ``x * 2`` on 4 floats, compiled three times:
with no transform ("none"), with ours selecting its one op ("ours": the guard
around the trace's callable, which closes the ranges of a call that raises,
then the one range's push and pop lines, so its overhead is the fixed cost and
one range) and with thunder's `NvtxProfileTransform` ("thunder": one range).
The computation functions are called directly (each variant's
``python_callable()``: ours with its guard), without thunder's prologue and
cache lookup, so that a difference of a few hundred nanoseconds is not lost in
tens of microseconds of dispatch. Each timing covers a batch of calls.
"""

from __future__ import annotations

from typing import Callable

import stats


def computations() -> tuple[dict[str, Callable], object]:
    """name -> the compiled computation function of each variant, and its input."""
    import thunder
    import torch
    from thunder.dev_utils.nvtx_profile_transform import NvtxProfileTransform as ThunderNvtxTransform

    from nvtx_regions import NvtxProfileTransform

    def f(x):
        return x * 2

    x = torch.randn(4)
    out = {}
    for name, transforms in (("none", []), ("ours", [NvtxProfileTransform("op in <mul>")]), ("thunder", [ThunderNvtxTransform()])):
        jitted = thunder.jit(f, transforms=transforms)
        jitted(x)
        out[name] = thunder.last_traces(jitted)[-1].python_callable()
    return out, x


def measure(rounds: int, batch: int) -> dict:
    """Per-call CPU ns of each variant, one entry per round (`stats.interleaved` over batches of calls)."""
    functions, x = computations()

    def batched(fn: Callable) -> Callable[[], None]:
        def run() -> None:
            for _ in range(batch):
                fn(x)

        return run

    times = stats.interleaved({name: batched(fn) for name, fn in functions.items()}, rounds, warmup=3)
    return {"batch": batch, "rounds": rounds, "ns": {clock: {v: [t / batch for t in ts] for v, ts in per.items()}
                                                     for clock, per in times.items()}}
