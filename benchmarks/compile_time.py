"""What compiling costs: N models of one class compiled one after another in one process (a sweep,
an evaluation loop), with a plain ``torch.compile`` and with ``nvtx_regions.compile``, side by side.

    python benchmarks/compile_time.py [--models 12] [--rounds 2] [--graph-break] [--json out.json]

Each model runs one training step (forward and backward), which compiles; the time of that step is
its compile time. Each variant runs in a process of its own, with an empty Inductor cache of its
own, and the variants alternate for `--rounds` rounds; the figures are medians over the rounds.
Dynamo's counters say how many graphs each compiled: a plain ``torch.compile`` compiles the code
of the class once for all its models, and so must nvtx_regions. ``--graph-break`` puts a graph
break between the blocks (the calls outside every graph then carry hooks in the first step).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SPEC = "each module <blocks.*>\neach class <Linear>"


def make_class(graph_break: bool):
    """The one class of the models: two blocks (Linear, GELU, residual, LayerNorm) and a head."""
    import torch

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(16, 16)
            self.norm = torch.nn.LayerNorm(16)

        def forward(self, x):
            return self.norm(x + torch.nn.functional.gelu(self.fc(x)))

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList([Block(), Block()])
            self.head = torch.nn.Linear(16, 4)

        def forward(self, x):
            x = self.blocks[0](x)
            if graph_break:
                torch._dynamo.graph_break()
            return self.head(self.blocks[1](x))

    return Model


def child(variant: str, models: int, graph_break: bool) -> dict:
    """In a fresh process: each model's first step (seconds), and Dynamo's graphs and frames."""
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    import warnings

    import torch

    import nvtx_regions

    warnings.simplefilter("ignore")
    model_class = make_class(graph_break)
    x = torch.randn(2, 16)
    seconds, kept = [], []
    for _ in range(models):
        model = model_class()
        start = time.perf_counter()
        if variant == "plain":
            compiled = torch.compile(model)
        else:
            compiled = nvtx_regions.compile(model, SPEC, backend="inductor")
        compiled(x).sum().backward()
        seconds.append(time.perf_counter() - start)
        kept.append(compiled)
    counters = torch._dynamo.utils.counters
    return {"seconds": seconds, "graphs": counters["stats"]["unique_graphs"], "frames": dict(counters["frames"])}


def measure(models: int, rounds: int, graph_break: bool) -> dict:
    runs: dict[str, list[dict]] = {"plain": [], "nvtx_regions": []}
    for _ in range(rounds):
        for variant in runs:
            with tempfile.TemporaryDirectory(prefix="nvtx_regions_compile_time-") as cache:
                env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "PYTHONPATH": str(ROOT)}
                argv = [sys.executable, __file__, "--child", variant, "--models", str(models)]
                argv += ["--graph-break"] if graph_break else []
                done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
                if done.returncode != 0:
                    raise RuntimeError(f"{variant} failed:\n{done.stderr[-3000:]}")
                runs[variant].append(json.loads(done.stdout.strip().splitlines()[-1]))
    out: dict = {"models": models, "rounds": rounds, "graph_break": graph_break}
    for variant, found in runs.items():
        out[variant] = {
            "total_s": statistics.median(sum(r["seconds"]) for r in found),
            "first_s": statistics.median(r["seconds"][0] for r in found),
            "later_s": statistics.median(sum(r["seconds"][1:]) / max(1, models - 1) for r in found),
            "graphs": found[0]["graphs"],
        }
    out["ratio"] = out["nvtx_regions"]["total_s"] / out["plain"]["total_s"]
    return out


def render(result: dict) -> str:
    lines = [
        f"{result['models']} models of one class, one training step each (median of {result['rounds']} rounds)"
        + (", a graph break between the blocks" if result["graph_break"] else "")
    ]
    for variant in ("plain", "nvtx_regions"):
        r = result[variant]
        lines.append(
            f"  {variant:>12}: {r['total_s']:.2f} s in all, the first {r['first_s']:.2f} s, each later one "
            f"{r['later_s'] * 1e3:.0f} ms; {r['graphs']} graphs compiled"
        )
    lines.append(f"  ratio nvtx_regions / plain: {result['ratio']:.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--graph-break", action="store_true")
    parser.add_argument("--json", help="write the result here")
    parser.add_argument("--child", choices=["plain", "nvtx_regions"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.models, args.graph_break)))
        return 0
    result = measure(args.models, args.rounds, args.graph_break)
    print(render(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
