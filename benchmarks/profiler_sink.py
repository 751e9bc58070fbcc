"""The record_function sink against hand-written record_function, side by side in one run.

    python benchmarks/profiler_sink.py

Eager, 12 small blocks, forward only (the ranges' own cost shows best there): per step,
- ``plain``: no range;
- ``hand-written``: a forward pre-hook entering ``torch.profiler.record_function(path)``
  and a forward hook leaving it, on each block: what a user writes today;
- ``ours``: ``nvtx_regions.compile(model, "each module <blocks.*> and forward",
  backend="eager", emit="record_function")``: the same 12 ranges.
Each once with no profiler and once inside ``torch.profiler.profile()``. Then Inductor, per
training step with no profiler: a plain ``torch.compile`` against ``NvtxInductor`` with
``emit="nvtx"`` and ``emit="record_function"``.

Prints µs per range over ``plain`` (eager) and the ratio of step times (Inductor); medians
of interleaved repeats.
"""

from __future__ import annotations

import statistics
import time
import warnings

import torch

import nvtx_regions

warnings.simplefilter("ignore")
BLOCKS, WIDTH, CALLS, REPEATS = 12, 32, 200, 15


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU()) for _ in range(BLOCKS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def hand_written(model: Net) -> Net:
    for path, block in model.named_modules():
        if path.count(".") == 1:
            def enter(module, args, path=path):
                module._profile_range = torch.profiler.record_function(path)
                module._profile_range.__enter__()

            def leave(module, args, output):
                module._profile_range.__exit__(None, None, None)

            block.register_forward_pre_hook(enter)
            block.register_forward_hook(leave)
    return model


def per_call(model, x, profiling: bool) -> float:
    def run() -> float:
        start = time.perf_counter()
        for _ in range(CALLS):
            model(x)
        return (time.perf_counter() - start) / CALLS

    if not profiling:
        return run()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        return run()


def eager() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, WIDTH)
    models = {
        "plain": Net(),
        "hand-written": hand_written(Net()),
        "ours": nvtx_regions.compile(Net(), "each module <blocks.*> and forward", backend="eager", emit="record_function"),
    }
    for profiling in (False, True):
        times: dict[str, list[float]] = {name: [] for name in models}
        with torch.no_grad():
            for _ in range(REPEATS):
                for name, model in models.items():
                    times[name].append(per_call(model, x, profiling))
        plain = statistics.median(times["plain"])
        label = "profiler running" if profiling else "no profiler"
        costs = {name: (statistics.median(t) - plain) / BLOCKS * 1e6 for name, t in times.items() if name != "plain"}
        print(f"eager, {label}: plain {plain * 1e6:.1f} µs/call; per range over plain: "
              + ", ".join(f"{name} {cost:.2f} µs" for name, cost in costs.items())
              + f"; ours/hand-written {costs['ours'] / costs['hand-written']:.2f}")


def inductor() -> None:
    torch.manual_seed(0)
    x = torch.randn(64, WIDTH)
    models = {
        "plain torch.compile": torch.compile(Net()),
        "emit=nvtx": nvtx_regions.compile(Net(), "each module <blocks.*>", backend="inductor", emit="nvtx"),
        "emit=record_function": nvtx_regions.compile(Net(), "each module <blocks.*>", backend="inductor", emit="record_function"),
    }
    times: dict[str, list[float]] = {name: [] for name in models}
    for model in models.values():
        for _ in range(3):
            model(x).sum().backward()
    for _ in range(REPEATS):
        for name, model in models.items():
            start = time.perf_counter()
            for _ in range(CALLS // 4):
                model(x).sum().backward()
            times[name].append((time.perf_counter() - start) / (CALLS // 4))
    plain = statistics.median(times["plain torch.compile"])
    print(f"inductor, no profiler: plain {plain * 1e6:.1f} µs/step; "
          + ", ".join(f"{name} {statistics.median(t) / plain:.3f}" for name, t in times.items() if not name.startswith("plain")))


if __name__ == "__main__":
    print(f"torch {torch.__version__}, {BLOCKS} blocks")
    eager()
    inductor()
