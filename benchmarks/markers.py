"""Per-call cost of the user's own NVTX markers: as eager runs them, and as
``each marker <*>`` re-emits them under ``thunder.jit``, on the CPU.

    .venv/bin/python benchmarks/markers.py            # 16 marked layers, 400 rounds
    .venv/bin/python benchmarks/markers.py --smoke    # a few rounds
    .venv/bin/python benchmarks/markers.py --json out.json

The model is a stack of small linear layers, each inside a marker (half
``torch.cuda.nvtx.range``, half ``nvtx.annotate`` in a domain of its own), run
forward under ``torch.no_grad``. Four variants are timed interleaved, one call
each per round (`stats.interleaved`): eager without and with the markers,
``thunder.jit`` of the marked model without a transform (thunder drops the
markers) and with ``NvtxProfileTransform("each marker <*>")``. The cost of the
markers is the median over rounds of (marked - unmarked) in the same round,
thread CPU time, divided by the ranges per call. Each measurement runs in a
child process, once with the NVTX capture tool attached in count mode (every
range goes through NVTX's C API, as under Nsight) and once with no tool.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SPEC = "each marker <*>"

if __name__ == "__main__" and "--child" in sys.argv and sys.argv[sys.argv.index("--child") + 1] == "tool":
    from nvtx_regions.testing import attach  # before the first NVTX call: NVTX picks its tool then

    attach(mode="count")


def make_model(layers: int, marked: bool):
    import nvtx
    import torch

    class Layer(torch.nn.Module):
        def __init__(self, i: int) -> None:
            super().__init__()
            self.i = i
            self.linear = torch.nn.Linear(16, 16)

        def forward(self, x):
            if not marked:
                return self.linear(x).relu()
            if self.i % 2:
                with nvtx.annotate(f"layer{self.i}", domain="bench", color="green"):
                    return self.linear(x).relu()
            with torch.cuda.nvtx.range(f"layer{self.i}"):
                return self.linear(x).relu()

    torch.manual_seed(0)
    return torch.nn.Sequential(*(Layer(i) for i in range(layers)))


def child(layers: int, rounds: int) -> dict:
    sys.path.insert(0, str(HERE))
    import stats
    import thunder
    import torch

    from nvtx_regions import NvtxProfileTransform

    x = torch.randn(8, 16)
    plain, marked = make_model(layers, False), make_model(layers, True)
    marked.load_state_dict(plain.state_dict())
    thunder_plain = thunder.jit(marked)
    thunder_marked = thunder.jit(make_model(layers, True), transforms=[NvtxProfileTransform(SPEC)])
    calls = {
        "eager": lambda: plain(x),
        "eager_markers": lambda: marked(x),
        "thunder": lambda: thunder_plain(x),
        "thunder_markers": lambda: thunder_marked(x),
    }
    with torch.no_grad():
        for call in calls.values():
            call()  # compile
        times = stats.interleaved(calls, rounds, warmup=20)["cpu"]
    result = {name: stats.median(t) / 1000 for name, t in times.items()}
    result["eager_marker_us"] = stats.paired_ns(times, "eager_markers", "eager") / 1000 / layers
    result["thunder_marker_us"] = stats.paired_ns(times, "thunder_markers", "thunder") / 1000 / layers
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--smoke", action="store_true", help="4 layers, 10 rounds")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", choices=["tool", "none"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.layers, args.rounds = 4, 10
    if args.child:
        print(json.dumps(child(args.layers, args.rounds)))
        return 0
    sys.path.insert(0, str(HERE))
    import stats

    results = stats.per_tool_mode(__file__, args.layers, args.rounds)
    print(f"Per-range cost of the model's own markers, {args.layers} marked layers per call, forward, CPU")
    print()
    print("| NVTX tool | eager call | eager, per marker | thunder call | thunder `each marker <*>`, per marker |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for mode, r in results.items():
        print(
            f"| {'attached (count mode)' if mode == 'tool' else 'none'} | {r['eager']:.0f} µs | "
            f"{r['eager_marker_us']:.2f} µs | {r['thunder']:.0f} µs | {r['thunder_marker_us']:.2f} µs |"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
