"""What NvtxInductor's ranges cost: ranges per training step, and host time per range,
against a plain ``torch.compile`` of the same model, side by side in one run.

    python benchmarks/inductor.py [--rounds 200] [--with-tool] [--break-inside N] [--json out.json]

The workload is a training step (forward and backward) of a small two-block
model on CPU, compiled twice: with Inductor alone ("plain") and with
``NvtxInductor(..., model=model)`` ("nvtx", as ``nvtx_regions.compile`` makes it) selecting every block both ways and every kernel
(``op in <*>``), so that ranges are many and kernels short, and the cost of a
range is not lost in the kernels' time. Steps of the two are timed
interleaved (`stats.interleaved`), and the cost per range is the difference
of the medians divided by the ranges per step (from the compiled plans).
With ``--with-tool`` the script runs itself again under the capture tool
(count mode: NVTX calls reach a tool, as under nsys), and prints both runs.
Each run compiles into an Inductor cache of its own: ranges per step are
counted from the graphs it compiles (a graph served from a cache is not
placed in the process), and torch alone, no thunder, is needed.

``--break-inside N`` times N blocks of one class instead, each with a graph
break inside its forward: Dynamo compiles the block's code once for all of
them, and each call of those graphs looks up which block it runs for
(`inductor.instances`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "workers"))

import stats  # noqa: E402

SPEC = "each module <blocks.*>\nop in <*>"


def breaking_blocks(count: int):
    """`count` blocks of one class, each breaking the graph inside its forward, and a head."""
    import torch

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(16, 16)
            self.norm = torch.nn.LayerNorm(16)

        def forward(self, x):
            x = torch.nn.functional.gelu(self.fc(x))
            torch._dynamo.graph_break()
            return self.norm(x)

    class Blocks(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList([Block() for _ in range(count)])
            self.head = torch.nn.Linear(16, 4)

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    torch.manual_seed(0)
    return Blocks()


def measure(rounds: int, break_inside: int = 0) -> dict:
    """Median CPU and wall ns per step of each variant, ranges per step, and ns per range."""
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    import torch
    from inductor_steps import make_blocks

    from nvtx_regions.inductor import NvtxInductor

    x = torch.randn(2, 16)
    steps = {}
    for name in ("plain", "nvtx"):
        model = breaking_blocks(break_inside) if break_inside else make_blocks()
        # As nvtx_regions.compile makes it: with the model, so the hooks for calls outside every graph are on.
        backend = NvtxInductor(SPEC, model=model) if name == "nvtx" else "inductor"
        compiled = torch.compile(model, backend=backend)

        def step(compiled=compiled, model=model) -> None:
            compiled(x).sum().backward()
            model.zero_grad(set_to_none=False)

        step()  # compile forward and backward
        steps[name] = step
    ranges = _ranges_per_step(backend)
    if not ranges:
        raise RuntimeError("no graph was placed in this process (served from a cache?): ranges per step unknown")
    times = stats.interleaved(steps, rounds, warmup=10)
    out = {"rounds": rounds, "ranges_per_step": ranges, "tool": bool(os.environ.get("NVTX_INJECTION64_PATH")),
           "break_inside": break_inside}
    for clock, per in times.items():
        plain, nvtx = stats.median(per["plain"]), stats.median(per["nvtx"])
        out[clock] = {
            "plain_ns_per_step": plain,
            "nvtx_ns_per_step": nvtx,
            "ratio": nvtx / plain,
            "ns_per_range": (nvtx - plain) / ranges if ranges else None,
        }
    return out


def _ranges_per_step(backend) -> int:
    """Every placed graph runs once per step, and the spec has no gate: the ranges of all their plans."""
    return sum(len(graph.plan.ranges) for graph in backend.graphs)


def render(result: dict) -> str:
    lines = [
        f"NvtxInductor vs plain torch.compile ({'capture tool attached' if result['tool'] else 'no NVTX tool'}): "
        f"{result['ranges_per_step']} ranges per step, {result['rounds']} rounds"
        + (f", {result['break_inside']} blocks breaking inside" if result.get("break_inside") else "")
    ]
    for clock in ("cpu", "wall"):
        r = result[clock]
        per_range = "n/a" if r["ns_per_range"] is None else f"{r['ns_per_range']:.0f} ns"
        lines.append(
            f"  {clock:>4}: plain {r['plain_ns_per_step'] / 1e3:.1f} us/step, nvtx {r['nvtx_ns_per_step'] / 1e3:.1f} us/step, "
            f"ratio {r['ratio']:.3f}, {per_range} per range"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--with-tool", action="store_true", help="also run under the capture tool (count mode)")
    parser.add_argument("--break-inside", type=int, default=0, metavar="N", help="N blocks that break the graph inside")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--print-json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="nvtx_regions_bench-") as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache  # before torch is imported (see the module doc)
        results = [measure(args.rounds, args.break_inside)]
    if args.with_tool:
        from nvtx_regions.testing import capture_subprocess

        child = capture_subprocess(
            [sys.executable, __file__, "--rounds", str(args.rounds), "--break-inside", str(args.break_inside), "--print-json"],
            env={"NVTX_REGIONS_CAPTURE_MODE": "count", "PYTHONPATH": str(ROOT)},
            timeout=1800,
        ).check()
        results.append(json.loads(child.stdout.strip().splitlines()[-1]))
    if args.print_json:
        print(json.dumps(results[0]))
        return 0
    for result in results:
        print(render(result))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
