"""Where the per-range cost goes with an NVTX tool attached: the memory each range touches.

    .venv/bin/python benchmarks/footprint.py [--layers 8] [--rounds 200]

Runs with the capture tool attached (count mode) and times, interleaved as
`run.py` does, a nanoGPT step (`workload.py`) with no transform, thunder's
transform, ours (spec `all`), and copies of ours whose generated functions'
globals are changed after they are built, so that the lines stay the same and
only what they touch differs:

- ``no-op calls``: push and pop are C no-ops; each line still loads its own
  `EventAttributes` (176 bytes, one per range, as nvtx requires);
- ``no-op calls, 16/64/176-byte objects``: the same, each line loading a distinct
  object of that size instead, allocated one after the other in trace order;
- ``no-op calls, one shared object``: every line loads the same object.

Prints ns per range against no transform and the ratio to thunder's. On this
project's 2-core AMD EPYC machines, the per-range cost follows the size of the
distinct object each push loads, not the NVTX calls: see BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

if __name__ == "__main__":
    from nvtx_regions.testing import attach

    attach(mode="count")  # before the first NVTX call

import stats  # noqa: E402
import workload  # noqa: E402


def generated_globals(compiled: workload.Compiled) -> list[dict[str, Any]]:
    """The globals of the forward and backward functions the variant runs."""
    import thunder

    (entry,) = thunder.compile_stats(compiled.jitted).interpreter_cache
    out = []
    for fn in (entry.computation_fn, entry.backward_fn):
        while hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__
        out.append(fn.__globals__)
    return out


def attribute_names(g: dict[str, Any]) -> list[str]:
    names = [k for k in g if re.fullmatch(r"nvtx\d*_range_\d+", k)]
    return sorted(names, key=lambda k: int(k.rsplit("_", 1)[1]))


def no_op_calls(g: dict[str, Any]) -> None:
    for k in list(g):
        if re.fullmatch(r"nvtx\d*_push(_\d+)?", k):
            g[k] = {}.get
        elif re.fullmatch(r"nvtx\d*_pop(_\d+)?", k):
            g[k] = [].clear


def with_objects(make: Callable[[int], Any]) -> Callable[[dict[str, Any]], None]:
    def change(g: dict[str, Any]) -> None:
        no_op_calls(g)
        names = attribute_names(g)
        objects = [make(i) for i in range(len(names))]  # allocated back to back, in trace order
        g.update(zip(names, objects))

    return change


def shared(g: dict[str, Any]) -> None:
    no_op_calls(g)
    names = attribute_names(g)
    g.update(dict.fromkeys(names, g[names[0]]))


CHANGES: dict[str, Callable[[dict[str, Any]], None]] = {
    "no-op calls": no_op_calls,
    "no-op calls, 16-byte objects": with_objects(lambda i: object()),
    "no-op calls, 64-byte objects": with_objects(lambda i: bytes([i % 256]) * 31),  # sys.getsizeof: 64
    "no-op calls, 176-byte objects": with_objects(lambda i: bytes([i % 256]) * 143),  # 176, as EventAttributes
    "no-op calls, one shared object": shared,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--depth", type=int, default=10,
                        help="extra Python frames under each step: thunder's cost per range jumps 10-20x at some depths "
                             "on 3.11 (run.py's stack depth sweep), which would swamp the comparison")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    base = workload.compile_base(args.layers)
    variants = {name: workload.build_variant(base, name) for name in ("none", "ours", "thunder")}
    for label, change in CHANGES.items():
        compiled = workload.build_variant(base, "ours")
        for g in generated_globals(compiled):
            change(g)
        variants[label] = compiled
    steps = {k: functools.partial(workload.at_depth, args.depth, v.step) for k, v in variants.items()}
    times = stats.interleaved(steps, args.rounds, warmup=10)["cpu"]
    ranges = sum(variants["ours"].ranges)
    theirs = stats.paired_ns(times, "thunder") / sum(variants["thunder"].ranges)
    print(f"Python {sys.version.split()[0]}, {args.layers} layers, capture tool attached (count mode), "
          f"{args.rounds} rounds at depth {args.depth}; thunder's transform: {theirs:.0f} ns per range\n")
    print("| ours, with | ns per range | / thunder's |")
    print("| --- | ---: | ---: |")
    for label in ("ours", *CHANGES):
        ns = stats.paired_ns(times, label) / ranges
        print(f"| {'the real calls' if label == 'ours' else label} | {ns:.0f} | {ns / theirs:.2f} |")


if __name__ == "__main__":
    main()
