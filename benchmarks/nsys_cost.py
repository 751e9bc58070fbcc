"""Cost per NVTX range under the real Nsight Systems: ours against thunder's transform.

    .venv/bin/python benchmarks/nsys_cost.py [--layers 8] [--rounds 150]    # about 1 min

`run.py` attaches nvtx_regions' own capture tool in count mode. This script
runs its child under ``nsys profile --trace=nvtx`` instead, the tool users
attach, and times in it, interleaved as `run.py` does (`stats.interleaved`,
CPU time of the thread, paired differences against no transform), a nanoGPT
step (`workload.py`) with no transform, thunder's transform and ours (spec
`all`), then nsys's own cost per range in a bare loop of push/pop pairs, for
scale. Afterwards it reads the report (`nvtx-regions report`'s reader) and
counts the ranges nsys recorded per domain, which must be what the child
pushed: else the figures would time ranges nsys dropped. Prints ns per range
and ours / thunder's.

Under nsys a range of ours carries a registered string (nsys records its id),
thunder's a message string that nsys copies on every push.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

FLOOR_ROUNDS = 15


def tool_floor_ns(pairs: int, rounds: int = FLOOR_ROUNDS) -> float:
    """What the attached tool itself costs per range, for scale: a loop of push/pop pairs through
    nvtx's C functions (one attributes object) against the same loop calling C no-ops, median
    over interleaved rounds. Not a strict floor: back to back, the events also fill nsys's
    buffers faster than a training step does."""
    import statistics
    import time

    from nvtx_regions.runtime.domain import Domain
    from nvtx_regions.internals.nvtx_calls import c_push_pop

    domain = Domain("nvtx_regions_floor")
    attributes, handle = domain.attributes("floor"), domain.handle.handle
    push, pop = c_push_pop()
    loops = {"tool": (push, pop, handle), "none": ({}.get, lambda _: None, None)}
    per_round: dict[str, list[float]] = {k: [] for k in loops}
    for _ in range(rounds):
        for name, (push_fn, pop_fn, argument) in loops.items():
            started = time.thread_time_ns()
            for _ in range(pairs):
                push_fn(attributes, argument)
                pop_fn(argument)
            per_round[name].append((time.thread_time_ns() - started) / pairs)
    return statistics.median(t - n for t, n in zip(per_round["tool"], per_round["none"]))


def child(args: argparse.Namespace) -> None:
    import stats
    import torch
    import workload

    torch.set_num_threads(1)
    base = workload.compile_base(args.layers)
    variants = {name: workload.build_variant(base, name) for name in ("none", "ours", "thunder")}
    steps = {k: functools.partial(workload.at_depth, args.depth, v.step) for k, v in variants.items()}
    warmup = 10
    times = stats.interleaved(steps, args.rounds, warmup=warmup)["cpu"]
    calls = args.rounds + warmup + 1  # build_variant runs each step once
    print(json.dumps({
        "ranges": {k: sum(v.ranges) for k, v in variants.items()},
        "calls": calls,
        "floor_ns": tool_floor_ns(args.pairs),
        "ns_per_range": {k: stats.paired_ns(times, k) / max(1, sum(variants[k].ranges)) for k in ("ours", "thunder")},
    }))  # fmt: skip


def recorded_ranges(report: Path) -> dict[str, int]:
    """Push/pop ranges nsys recorded, per domain ("" for the default domain), read by `nvtx-regions report`'s reader."""
    from nvtx_regions.report.nsys_report import read_report

    counts: dict[str, int] = {}
    for record in read_report(report).ranges:
        counts[record.domain or ""] = counts.get(record.domain or "", 0) + 1
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--depth", type=int, default=10, help="extra Python frames under each step, as footprint.py")
    parser.add_argument("--pairs", type=int, default=20_000, help="push/pop pairs per round of the loop that measures nsys's own cost")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    from nvtx_regions.commands.nsys import SAMPLING_OFF  # as `nvtx-regions nsys` runs nsys: 2022.4.2 could hang without

    nsys = shutil.which("nsys")
    if nsys is None:
        sys.exit("nsys_cost.py: Nsight Systems (nsys) is not installed; .ci/install-nsys installs it")
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "cost"
        command = [nsys, "profile", "--trace=nvtx", *(f.text for f in SAMPLING_OFF), "-o", str(report), sys.executable, __file__, "--child",
                   "--layers", str(args.layers), "--rounds", str(args.rounds), "--depth", str(args.depth), "--pairs", str(args.pairs)]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not lines:
            sys.exit(f"nsys_cost.py: the run under nsys failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        result = json.loads(lines[-1])
        recorded = recorded_ranges(Path(f"{report}.nsys-rep"))
    floor_pairs = args.pairs * FLOOR_ROUNDS
    expected = {"nvtx_regions": result["ranges"]["ours"] * result["calls"], "": result["ranges"]["thunder"] * result["calls"],
                "nvtx_regions_floor": floor_pairs}  # fmt: skip
    ours, theirs = result["ns_per_range"]["ours"], result["ns_per_range"]["thunder"]
    print(f"Python {sys.version.split()[0]}, {args.layers} layers, under nsys (--trace=nvtx), {args.rounds} rounds "
          f"at depth {args.depth}\n")  # fmt: skip
    print("| variant | ranges per step | ranges nsys recorded / pushed | ns per range |")
    print("| --- | ---: | ---: | ---: |")
    for label, variant, domain in (("ours", "ours", "nvtx_regions"), ("thunder's transform", "thunder", "")):
        print(f"| {label} | {result['ranges'][variant]} | {recorded.get(domain, 0)} / {expected[domain]} | "
              f"{result['ns_per_range'][variant]:.0f} |")  # fmt: skip
    print(f"\nours / thunder's: {ours / theirs:.2f}")
    floor = result["floor_ns"]
    print(f"nsys's own cost per range, for scale (bare push/pop pairs in a loop, against C no-ops): {floor:.0f} ns, "
          f"{floor / theirs:.2f} of thunder's per range")
    if any(recorded.get(d, 0) != n for d, n in expected.items()):
        sys.exit(f"nsys_cost.py: nsys recorded {recorded}, the steps pushed {expected}")


if __name__ == "__main__":
    main()
