"""Medians, interleaved timing and bootstrap intervals for noisy machines."""

from __future__ import annotations

import gc
import random
import time
from typing import Callable, Mapping, Sequence


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return float("nan")
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def interleaved(
    calls: Mapping[str, Callable[[], None]], rounds: int, *, warmup: int = 0, manage_gc: bool = True
) -> dict[str, dict[str, list[int]]]:
    """Time each call once per round, in an order that rotates every round.

    Returns ``{"cpu": {name: [ns, ...]}, "wall": {...}}``, one entry per round
    (warm-up rounds dropped). "cpu" is this thread's CPU time
    (`time.thread_time_ns`, user + system), which time-slicing by other
    processes on a shared machine does not inflate; "wall" is
    `time.perf_counter_ns`. The garbage collector is off while timing
    (with `manage_gc=False` the caller sees to it: a full collection with
    thunder loaded takes most of a second).
    """
    names = list(calls)
    cpu: dict[str, list[int]] = {name: [] for name in names}
    wall: dict[str, list[int]] = {name: [] for name in names}
    thread_time, perf_counter = time.thread_time_ns, time.perf_counter_ns
    if manage_gc:
        gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for number in range(warmup + rounds):
            shift = number % len(names)
            for name in names[shift:] + names[:shift]:
                call = calls[name]
                wall_start, cpu_start = perf_counter(), thread_time()
                call()
                cpu_end, wall_end = thread_time(), perf_counter()
                if number >= warmup:
                    cpu[name].append(cpu_end - cpu_start)
                    wall[name].append(wall_end - wall_start)
    finally:
        if was_enabled:
            gc.enable()
    return {"cpu": cpu, "wall": wall}


def paired_ns(times: Mapping[str, Sequence[int]], variant: str, base: str = "none", indexes=None) -> float:
    """Median over rounds of (`variant`'s time - `base`'s time in the same round).

    Both ran within the same few milliseconds, so drift and bursts of load
    that last longer than a round cancel out.
    """
    rounds = range(len(times[base])) if indexes is None else indexes
    a, b = times[variant], times[base]
    return median([a[i] - b[i] for i in rounds])


def median_diff_ns(times: Mapping[str, Sequence[int]], variant: str, base: str = "none", indexes=None) -> float:
    """Median of `variant`'s times - median of `base`'s."""
    rounds = range(len(times[base])) if indexes is None else indexes
    return median([times[variant][i] for i in rounds]) - median([times[base][i] for i in rounds])


def bootstrap(
    statistic: Callable[[list[int]], float], rounds: int, *, samples: int = 400, seed: int = 0, level: float = 0.9
) -> tuple[float, float]:
    """A percentile interval for `statistic(round_indexes)`, resampling whole rounds.

    Resampling rounds (not single timings) keeps each round's variants together,
    so drift common to a round stays paired.
    """
    rng = random.Random(seed)
    values = sorted(statistic([rng.randrange(rounds) for _ in range(rounds)]) for _ in range(samples))
    tail = (1 - level) / 2
    return values[int(tail * (samples - 1))], values[int((1 - tail) * (samples - 1))]


def pick(times: Sequence[int], indexes: Sequence[int]) -> list[int]:
    return [times[i] for i in indexes]


def per_tool_mode(script: str, layers: int, rounds: int) -> dict[str, dict]:
    """Run `script` ``--child MODE`` once with no NVTX tool and once with one
    attached (each in a fresh process, so the tool is there before the first
    NVTX call); its last line of output is the JSON result of that mode."""
    import json
    import subprocess
    import sys

    results = {}
    for mode in ("none", "tool"):
        out = subprocess.run(
            [sys.executable, script, "--child", mode, "--layers", str(layers), "--rounds", str(rounds)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    return results
