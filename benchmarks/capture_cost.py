"""What the NVTX capture tool costs per event, and that streaming keeps memory flat.

    .venv/bin/python benchmarks/capture_cost.py            # 100k push/pop pairs, 5 rounds, ~1 min
    .venv/bin/python benchmarks/capture_cost.py --pairs 20000 --rounds 2

A child process runs a loop of push/pop pairs through the nvtx package's C
functions with a domain handle (the path nvtx_regions' transformed traces
use), in three setups, interleaved round by round:

- ``no tool``: the same loop calling two C no-ops (what a gated-off range costs);
- ``count``: the tool attached in ``NVTX_REGIONS_CAPTURE_MODE=count``;
- ``stream``: the tool attached in ``events`` mode with a capture directory,
  as ``nvtx-regions capture`` runs it: one JSON line written per event.

It prints the best round's nanoseconds per pair (two events) for each, the
child's peak RSS for the streaming run at 1x and 10x the pairs (flat: events
go to disk, not to memory), and the time `nvtx-regions capture` then takes
per event to turn the stream into the Chrome trace and summary.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import sys, time
import nvtx
pairs, tool = int(sys.argv[1]), sys.argv[2] == "1"
domain = nvtx.get_domain("bench")
attributes = domain.get_event_attributes(message="r")
if tool:
    from nvtx._lib.lib import pop_range, push_range
    handle = domain.handle
else:
    push_range, pop_range, handle = {}.get, id, None
for _ in range(1000):
    push_range(attributes, handle); pop_range(handle)
start = time.perf_counter_ns()
for _ in range(pairs):
    push_range(attributes, handle); pop_range(handle)
elapsed = time.perf_counter_ns() - start
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent across fork and exec.
hwm_kb = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(elapsed / pairs, hwm_kb)
"""


def run(pairs: int, setup: str, tool: Path, directory: str) -> tuple[float, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVTX_")}
    if setup != "no tool":
        env["NVTX_INJECTION64_PATH"] = str(tool)
        env["NVTX_REGIONS_CAPTURE_MODE"] = "count" if setup == "count" else "events"
        if setup == "stream":
            env["NVTX_REGIONS_CAPTURE_DIR"] = directory
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(pairs), "0" if setup == "no tool" else "1"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    per_pair, rss_kb = out.stdout.split()
    return float(per_pair), int(rss_kb)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    from nvtx_regions.capture.directory import write_directory_trace
    from nvtx_regions.capture import build_tool

    tool = build_tool()
    setups = ("no tool", "count", "stream")
    best = {s: float("inf") for s in setups}
    with tempfile.TemporaryDirectory() as directory:
        for _ in range(args.rounds):
            for setup in setups:
                for stale in Path(directory).glob("*.jsonl"):
                    stale.unlink()
                best[setup] = min(best[setup], run(args.pairs, setup, tool, directory)[0])
        print(f"{args.pairs} push/pop pairs, best of {args.rounds} rounds, ns per pair (2 events):")
        for setup in setups:
            print(f"  {setup:8} {best[setup]:8.0f}")
        print(f"  tool cost per event: count {(best['count'] - best['no tool']) / 2:.0f} ns, "
              f"stream {(best['stream'] - best['no tool']) / 2:.0f} ns")  # fmt: skip

        for stale in Path(directory).glob("*.jsonl"):
            stale.unlink()
        _, rss_small = run(args.pairs, "stream", tool, directory)
        size_small = sum(p.stat().st_size for p in Path(directory).glob("*.jsonl"))
        started = time.perf_counter()
        with open(os.devnull, "w") as sink:
            write_directory_trace(Path(directory), sink)
        convert_ns = (time.perf_counter() - started) * 1e9 / (2 * args.pairs)
        for stale in Path(directory).glob("*.jsonl"):
            stale.unlink()
        _, rss_large = run(10 * args.pairs, "stream", tool, directory)
        size_large = sum(p.stat().st_size for p in Path(directory).glob("*.jsonl"))
    print(f"streaming child peak RSS: {rss_small / 1024:.1f} MiB at {args.pairs} pairs "
          f"({size_small / 2**20:.1f} MiB on disk), {rss_large / 1024:.1f} MiB at {10 * args.pairs} pairs "
          f"({size_large / 2**20:.1f} MiB on disk)")  # fmt: skip
    print(f"capture's conversion to Chrome trace + summary: {convert_ns / 1000:.2f} µs per event")


if __name__ == "__main__":
    main()
