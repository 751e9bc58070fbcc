"""Every rank in one table, at scale: the time and memory of reading and merging 8 and 64 ranks.

    .venv/bin/python benchmarks/ranks_merge.py                 # 8 and 64 ranks
    .venv/bin/python benchmarks/ranks_merge.py --ranks 8,16 --layers 4 --steps 3   # smaller

Synthetic profile folders, one per node of 8 ranks, as ``nvtx-regions profile --tool capture``
leaves them: ``profile.json`` (`commands.profile_folder.write_manifest`) and, per backend (eager and
inductor), a capture of the node's ranks written with `capture.chrome.ChromeTraceWriter`. Each rank
runs `--layers` blocks for `--steps` steps: per step, each block's forward and backward range, the
ranges of its ``attn`` and ``mlp`` modules, and 8 per-op ranges (an ``op in`` rule's), about 12 per
block and pass: a 32-layer model over 20 steps gives 15,000 ranges per rank.

Each merge runs in a fresh process, as ``nvtx-regions report NODE0 NODE1 ...`` does
(`read_folders`, `compare_ranks`, `render_ranks`), and reports its wall time and its peak
resident memory. Each rank is summarized as it is read, so memory follows one node's file and
the ranks × rows summaries, not every event of every node. The Markdown table goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nvtx_regions.capture.chrome import ChromeTraceWriter, ProcessInfo, RangeRecord  # noqa: E402
from nvtx_regions.commands.profile_folder import Manifest, write_manifest  # noqa: E402

PER_NODE = 8
BACKENDS = ("eager", "inductor")
SPEC = "blocks: each module <blocks.**>\nmatmuls: op in <linear, matmul>"


def rank_ranges(writer: ChromeTraceWriter, rank: int, layers: int, steps: int) -> int:
    """Write one rank's ranges; how many."""
    pid, at, count = 1000 + rank, 0, 0

    def add(message: str, category: str, start: int, end: int, depth: int) -> None:
        nonlocal count
        writer.add(RangeRecord(pid, pid, "nvtx_regions", message, start, end, depth, category_name=category, rank=rank))
        count += 1

    for step in range(steps):
        start = at
        for phase in ("", " (backward)"):
            for layer in range(layers):
                block = at
                for part in ("attn", "mlp"):
                    inner = at
                    for op in range(4):
                        add(f"t{op} = ltorch.linear(x, w{op})", "matmuls", at, at + 20_000, 3)
                        at += 25_000
                    add(f"blocks.{layer}.{part}{phase}", "blocks", inner, at, 2)
                    at += 5_000
                slow = 2_000_000 if (rank == 5 and layer == min(7, layers - 1) and not phase) else 0  # rank 5, slowed in one block
                at += slow
                add(f"blocks.{layer}{phase}", "blocks", block, at, 1)
                at += 5_000
        add(f"step {step}", "nvtx_regions.steps", start, at, 0)
        at += 10_000
    return count


def write_node(folder: Path, ranks: range, world: int, layers: int, steps: int) -> int:
    """One node's profile folder; the ranges it holds per backend."""
    folder.mkdir(parents=True)
    write_manifest(folder, Manifest(SPEC, BACKENDS, BACKENDS[0], "capture", "nvtx_regions", 1, world, tuple(ranks)))
    count = 0
    for backend in BACKENDS:
        (folder / backend).mkdir()
        with open(folder / backend / "timeline.json", "w", encoding="utf-8") as stream:
            writer = ChromeTraceWriter(stream)
            count = sum(rank_ranges(writer, rank, layers, steps) for rank in ranks)
            writer.close([ProcessInfo(1000 + rank, rank) for rank in ranks])
    return count


def merge(folders: list[str]) -> None:
    """The child: merge `folders` as ``nvtx-regions report`` does; print its time, memory and first row."""
    from nvtx_regions.commands.profile_folder import read_folders
    from nvtx_regions.report.ranks_table import compare_ranks, render_ranks

    started = time.perf_counter()
    manifest, runs = read_folders([Path(f) for f in folders])
    table = compare_ranks(runs, baseline=manifest.baseline, warmup=manifest.warmup)
    render_ranks(table)
    seconds = time.perf_counter() - started
    top = table.rows[0]
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "peak_mb": peak_mb, "rows": len(table.rows),
                      "first": f"{top.module} {top.phase}: rank {top.cells[0].slowest}"}))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="8,64", help="world sizes, comma-separated, multiples of 8 (default 8,64)")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--merge", nargs="+", help=argparse.SUPPRESS)  # the child
    args = parser.parse_args()
    if args.merge:
        merge(args.merge)
        return
    lines = ["| ranks | nodes | ranges per rank | ranges read | files (MB) | merge (s) | peak memory (MB) | first row |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]  # fmt: skip
    baseline = subprocess.run([sys.executable, "-c", "import resource, nvtx_regions.commands.profile_folder, nvtx_regions.report.ranks_table;"
                               "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"],
                              capture_output=True, text=True, check=True, cwd=ROOT)  # fmt: skip
    for world in (int(w) for w in args.ranks.split(",")):
        with tempfile.TemporaryDirectory(prefix="ranks_merge-") as tmp:
            print(f"writing {world} ranks ...", file=sys.stderr, flush=True)
            folders, per_node = [], 0
            for node in range(world // PER_NODE):
                folder = Path(tmp) / f"node{node}"
                per_node = write_node(folder, range(node * PER_NODE, (node + 1) * PER_NODE), world, args.layers, args.steps)
                folders.append(str(folder))
            size = sum(f.stat().st_size for f in Path(tmp).rglob("*.json")) / 1e6
            print(f"merging {world} ranks ...", file=sys.stderr, flush=True)
            child = subprocess.run([sys.executable, __file__, "--merge", *folders], capture_output=True, text=True, cwd=ROOT)
            if child.returncode != 0:
                sys.exit(child.stderr[-3000:])
            found = json.loads(child.stdout.strip().splitlines()[-1])
            per_rank = per_node // PER_NODE
            lines.append(
                f"| {world} | {len(folders)} | {per_rank:,} | {per_rank * world * len(BACKENDS):,} | {size:.0f} | "
                f"{found['seconds']:.1f} | {found['peak_mb']:.0f} | {found['first']} |"
            )
    print("\n".join(lines))
    print(f"\nPeak memory includes the interpreter and the imports: {float(baseline.stdout):.0f} MB before any file is read.")


if __name__ == "__main__":
    main()
