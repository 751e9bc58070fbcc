"""Shared by the end-to-end tests and the code they run in child processes.

Child side: small models, and `emit`, which prints a JSON line with what the
transforms planned (`reports`). Children import this module because they run
with this directory as their working directory (``capture_subprocess(...,
cwd=WORKERS)``) or as their script's directory (torchrun workers).

Test side: `planned` and `one_call` turn a report into the ``(depth,
message)`` list one call of that trace must emit; `captured` turns one
process's NVTX events into the same form, per thread.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

WORKERS = Path(__file__).resolve().parent
MARK = "nvtx_regions_result: "

Call = list[tuple[int, str]]


# ---------------------------------------------------------------- child side


def mlp():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def small_gpt():
    import torch
    from thunder.tests.nanogpt_model import GPT, GPTConfig

    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32, dropout=0.0))


def open_llama(n_layer: int = 2):
    """litgpt's ``open_llama_3b`` (RMSNorm, LLaMAMLP, rotary, no bias), with 2 layers and small widths for the CPU."""
    import torch
    from thunder.tests.litgpt_model import GPT, Config

    torch.manual_seed(0)
    config = Config.from_name(
        "open_llama_3b", n_layer=n_layer, n_embd=64, n_head=4, intermediate_size=128, vocab_size=64,
        padded_vocab_size=64, block_size=32,
    )  # fmt: skip
    return GPT(config)


def open_llama_inputs():
    import torch

    torch.manual_seed(1)
    return (torch.randint(0, 64, (2, 16)),)


def embed_net(through=None):
    """linear -> gelu, plus an embedding of ``idx`` -> linear.

    An ``idx`` value of 16 or more makes the embedding raise IndexError at run
    time, inside the computation trace (thunder's prologue checks only shapes
    and dtypes), after the first linear has run. through: an op that ``idx``
    goes through first (after the first linear in the trace).
    """
    import torch

    class EmbedNet(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = torch.nn.Linear(8, 8)
            self.emb = torch.nn.Embedding(16, 8)
            self.fc2 = torch.nn.Linear(8, 4)

        def forward(self, x, idx):
            h = torch.nn.functional.gelu(self.fc1(x))
            if through is not None:
                idx = through(idx)
            return self.fc2(h + self.emb(idx))

    torch.manual_seed(0)
    return EmbedNet()


def reports(transform) -> list[dict[str, Any]]:
    """transform.reports as JSON: per trace, its ranges in push order with their plan."""
    return [
        {
            "phase": r.phase,
            "trace": r.trace_name,
            "ranges": r.ranges,
            "emitted": [
                {"depth": d, "message": m, "start": p.start, "end": p.end, "rules": list(p.rules), "kind": p.kind}
                for (d, m), p in zip(r.ranges_emitted, r.plan.ranges, strict=True)
            ],
        }
        for r in transform.reports
    ]


def emit(**result: Any) -> None:
    """Print one result line for the test (the main thread's id is added as ``tid``)."""
    import threading

    result.setdefault("tid", threading.get_native_id())
    print(MARK + json.dumps(result), flush=True)


# ---------------------------------------------------------------- test side


def results(stdout: str) -> list[dict[str, Any]]:
    """Every `emit` line of a child's stdout."""
    return [json.loads(line[len(MARK) :]) for line in stdout.splitlines() if line.startswith(MARK)]


def result(stdout: str) -> dict[str, Any]:
    (only,) = results(stdout)
    return only


def planned(report: dict[str, Any]) -> Call:
    """What one call of the trace emits with no gate closed, as the transform promises."""
    assert len(report["emitted"]) == report["ranges"]
    return [(r["depth"], r["message"]) for r in report["emitted"]]


def one_call(
    report: dict[str, Any],
    rule_open: Callable[[int], bool] = lambda rule: True,
    *,
    until: int | None = None,
) -> Call:
    """What one call emits when only the rules for which `rule_open` is true are on.

    A range is on when any of the rules that asked for it is. Depths are
    recomputed from the plan's extents, counting only ranges that are on.
    until: the index of the bound symbol that raised; the call pushes only
    the ranges that start at or before it.
    """
    out: Call = []
    open_ends: list[int] = []
    for r in report["emitted"]:
        if until is not None and r["start"] > until:
            break
        if not any(rule_open(n) for n in r["rules"]):
            continue
        while open_ends and open_ends[-1] < r["start"]:
            open_ends.pop()
        out.append((len(open_ends), r["message"]))
        open_ends.append(r["end"])
    return out


def shifted(call: Call, by: int) -> Call:
    return [(depth + by, message) for depth, message in call]


def push_domains(process) -> set[str | None]:
    return {e.domain for e in process.events if e.kind == "push"}


def captured(process, domain: str | None) -> dict[int, Call]:
    """One process's ranges of `domain`, per thread, as ``(depth, message)`` depth-first.

    Raises `UnbalancedRanges` first if any thread's stack, in any domain, is unbalanced.
    """
    from nvtx_regions.testing import check_balanced, flatten, range_tree

    check_balanced(process.events)
    tree = range_tree(process.events, domain=domain)
    return {tid: [(depth, message) for depth, _, message in flatten(roots)] for tid, roots in tree.items()}


def start_of(report: dict[str, Any], op: str) -> int:
    """The bound symbol index of the one op range whose message calls `op` (e.g. ``"embedding"``)."""
    (start,) = [r["start"] for r in report["emitted"] if r["kind"] == "op" and f".{op}(" in r["message"]]
    return start


@functools.cache
def torchrun_workers() -> tuple[dict[int, dict[str, Any]], dict[int, Any]]:
    """Run distributed_worker.py in all its modes on 2 CPU ranks, once per test session.

    Returns each rank's results and each rank's `ProcessCapture`, keyed by rank.
    """
    from nvtx_regions.testing import capture_subprocess

    argv = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        str(WORKERS / "distributed_worker.py"), "ddp", "fsdp", "modules", "each", "gates",
    ]  # fmt: skip
    captured = capture_subprocess(argv, cwd=WORKERS, timeout=300).check()
    outs = {out["rank"]: out for out in result(captured.stdout)["ranks"]}
    ranks = captured.by_rank()
    assert sorted(outs) == sorted(ranks) == [0, 1]
    return outs, ranks


def overlapping_pushes(events, tids) -> int:
    """How many pushes of the threads `tids` happened while another of them had a range open:
    0 means their calls never overlapped, and a test of concurrent calls proves nothing."""
    depth, overlaps = dict.fromkeys(tids, 0), 0
    for e in sorted(events, key=lambda e: e.ts_ns):
        if e.tid in depth and e.kind in ("push", "pop"):
            overlaps += e.kind == "push" and any(depth[tid] for tid in depth if tid != e.tid)
            depth[e.tid] += 1 if e.kind == "push" else -1
    return overlaps


def run_captured(code: str, *, timeout: float = 120) -> tuple[dict[str, Any], Any]:
    """Run `code` in a child process (in this folder) under NVTX capture.

    Returns the child's `emit`ted result and its `ProcessCapture`.
    """
    from nvtx_regions.testing import capture_subprocess

    captured_run = capture_subprocess(code, cwd=WORKERS, timeout=timeout).check()
    (process,) = captured_run.processes.values()
    return result(captured_run.stdout), process
