"""Per-step overhead of ``each module <transformer.h.*>`` against thunder's
every-op NVTX transform, on a nanoGPT training step (8 layers by default), CPU.

    .venv/bin/python benchmarks/modules.py            # 8 layers, ~1-2 min on 2 cores
    .venv/bin/python benchmarks/modules.py --smoke    # 1 layer, a few rounds
    .venv/bin/python benchmarks/modules.py --json out.json

Each measurement runs in a child process with the NVTX capture tool attached in
count mode (so every range really goes through NVTX's C API, as under Nsight)
and once with no tool. In a child, the variants replay one compilation's traces
(`workload.build_variant`), and are timed interleaved, one step each per round
(`stats.interleaved`). Overhead = median over rounds of (variant - none) in
the same round, thread CPU time. Prints a Markdown table with the ratio
ours / thunder's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SPEC = "each module <transformer.h.*>"

if __name__ == "__main__" and "--child" in sys.argv and sys.argv[sys.argv.index("--child") + 1] == "tool":
    from nvtx_regions.testing import attach  # before the first NVTX call: NVTX picks its tool then

    attach(mode="count")


def child(layers: int, rounds: int) -> dict:
    sys.path.insert(0, str(HERE))
    import stats
    import workload

    workload.VARIANTS["modules"] = SPEC
    base = workload.compile_base(layers)
    variants = {name: workload.build_variant(base, name) for name in ("none", "thunder", "modules")}
    times = stats.interleaved({name: v.step for name, v in variants.items()}, rounds, warmup=3)["cpu"]
    result = {"ranges": {name: list(v.ranges) for name, v in variants.items()}}
    for name in ("thunder", "modules"):
        result[f"{name}_us"] = stats.paired_ns(times, name) / 1000
    result["step_us"] = stats.median(times["none"]) / 1000
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--smoke", action="store_true", help="1 layer, 5 rounds")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", choices=["tool", "none"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.layers, args.rounds = 1, 5
    if args.child:
        print(json.dumps(child(args.layers, args.rounds)))
        return 0
    sys.path.insert(0, str(HERE))
    import stats

    results = stats.per_tool_mode(__file__, args.layers, args.rounds)
    print(f"Per-step overhead on a {args.layers}-layer nanoGPT training step, `{SPEC}` against thunder's transform")
    print()
    print("| NVTX tool | step, no transform | thunder's (every op) | ranges | ours (`each module`) | ranges | ours / thunder's |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for mode, r in results.items():
        ratio = r["modules_us"] / r["thunder_us"] if r["thunder_us"] > 0 else float("nan")
        print(
            f"| {'attached (count mode)' if mode == 'tool' else 'none'} | {r['step_us']:.0f} µs | {r['thunder_us']:.0f} µs "
            f"| {sum(r['ranges']['thunder'])} | {r['modules_us']:.1f} µs | {sum(r['ranges']['modules'])} | {ratio:.3f} |"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
