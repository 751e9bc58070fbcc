"""Every rank in one table, without a run: synthetic profile folders, written with the project's own
writers (`commands.profile_folder.write_manifest`, `capture.chrome.ChromeTraceWriter`), read the
way ``nvtx-regions profile`` reads its own, and merged by ``nvtx-regions report FOLDER...``.

Each node folder holds a capture of its ranks: 3 blocks, forward and backward, steps 0..4; one rank
is slowed by 30 ms inside ``blocks.1``'s forward. The real runs (torchrun, nsys, Inductor) are in
tests/test_profile_ranks.py.
"""

from __future__ import annotations

import csv
import dataclasses
import os
from pathlib import Path

import pytest

from nvtx_regions.capture.chrome import ChromeTraceWriter, ProcessInfo, RangeRecord
from nvtx_regions.commands.main import main
from nvtx_regions.commands.profile_folder import Manifest, rank_files, read_folders, torchrun_ranks, write_manifest
from nvtx_regions.report.ranks_table import CSV_COLUMNS, BackendRanks, compare_ranks, render_ranks
from nvtx_regions.report.summary import RowKinds, Timing, summarize

SPEC = "each module <blocks.*>"
BLOCKS = ("blocks.0", "blocks.1", "blocks.2")
US = 1000


def rank_records(rank: int, *, slow: int | None, steps: int = 5, spike: tuple[str, int] | None = None) -> list[RangeRecord]:
    """One rank's ranges: per step, each block's forward then backward range (100 µs + 10 µs × block,
    + rank µs); 30 ms more in blocks.1's forward on rank `slow`; `spike`: (message, step) lasts 125 ms."""
    pid = 1000 + rank
    at = 0
    out = []
    for step in range(steps):
        start = at
        inner = []
        for name in [*BLOCKS, *(f"{b} (backward)" for b in reversed(BLOCKS))]:
            duration = (100 + 10 * int(name[7]) + rank) * US
            if rank == slow and name == "blocks.1":
                duration += 30_000 * US
            if spike == (name, step):
                duration = 125_000 * US
            at += 10 * US
            inner.append(RangeRecord(pid, pid, "nvtx_regions", name, at, at + duration, 1, category_name=SPEC, rank=rank))
            at += duration
        at += 10 * US
        out.append(RangeRecord(pid, pid, "nvtx_regions", f"step {step}", start, at, 0, category_name="nvtx_regions.steps", rank=rank))
        out += inner
    return out


def write_capture(path: Path, ranks: dict[int, list[RangeRecord]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as stream:
        writer = ChromeTraceWriter(stream)
        for records in ranks.values():
            for record in records:
                writer.add(record)
        writer.close([ProcessInfo(1000 + rank, rank) for rank in ranks])


@pytest.fixture(autouse=True)
def no_width(monkeypatch):
    """The table as printed to a file or pipe, every column: pytest-xdist's workers set COLUMNS=80."""
    monkeypatch.delenv("COLUMNS", raising=False)


def node(folder: Path, ranks: range | list[int], *, world: int | None, slow: int | None = None,
         spec: str = SPEC, backends: tuple[str, ...] = ("eager", "inductor")) -> Path:  # fmt: skip
    """A profile folder of one node that ran `ranks` (of `world`), under the capture tool."""
    folder.mkdir(parents=True)
    write_manifest(folder, Manifest(spec, backends, backends[0], "capture", "nvtx_regions", 1, world, tuple(ranks)))
    for backend in backends:
        write_capture(folder / backend / "timeline.json", {r: rank_records(r, slow=slow) for r in ranks})
    return folder


def report(*args, capsys) -> tuple[int, str, str]:
    code = main(["report", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def first_line(out: str) -> str:
    """The table's first row, as printed."""
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("module "))
    return lines[at + 2]


def first_row(out: str) -> list[str]:
    return first_line(out).split()


# ------------------------------------------------------------------ several nodes, one table


def test_two_nodes_merge_into_one_table_that_names_the_slow_rank(tmp_path, capsys):
    a = node(tmp_path / "node0", range(0, 4), world=8)
    b = node(tmp_path / "node1", range(4, 8), world=8, slow=6)
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    code, out, err = report(a, b, "-o", tmp_path / "merged", capsys=capsys)
    assert code == 0, err
    assert "  eager: ranks 0..7, steps 2..4 measured" in out and "  inductor: ranks 0..7, steps 2..4 measured" in out
    assert first_row(out)[:2] == ["blocks.1", "forward"]
    assert first_line(out).count("rank 6") == 2  # the slowest rank, for eager and for inductor
    table = (tmp_path / "merged" / "table.txt").read_text()
    assert table.strip() == out[: out.index("\nnvtx-regions report:")].strip()
    with open(tmp_path / "merged" / "profile.csv", newline="") as stream:
        lines = list(csv.reader(stream))
    assert tuple(lines[0]) == CSV_COLUMNS
    keys = {(b, int(r), m, p) for b, r, m, p, *_ in lines[1:]}
    assert keys == {(b, r, m, p) for b in ("eager", "inductor") for r in range(8) for m in BLOCKS for p in ("forward", "backward")}
    slow = [float(median) for b, r, m, p, n, median, *_ in lines[1:] if (r, m, p) == ("6", "blocks.1", "forward")]
    assert slow == [30_116.0, 30_116.0] and {n for _, _, _, _, n, *_ in lines[1:]} == {"3"}  # steps 2..4 of 0..4
    svg = (tmp_path / "merged" / "ranks.svg").read_text()
    for backend in ("eager", "inductor"):  # the chart names the slowest rank of the row on top, per backend
        group = svg[svg.index(f'id="slowest:blocks.1:forward:{backend}"') :]
        assert group[: group.index("</g>")].count("rank 6, ") == 1
        assert svg.count(f'id="rank:blocks.1:forward:{backend}:') == 8  # a dot per rank
    # Nothing in the nodes' folders changed.
    assert {p: p.stat().st_mtime_ns for p in before} == before


def test_the_table_orders_rows_by_imbalance_and_names_the_slowest_rank():
    rows = RowKinds.of(None)
    summaries = {r: summarize(rank_records(r, slow=2), None, rank=r, rows=rows, warmup=1) for r in range(3)}
    table = compare_ranks([BackendRanks("eager", summaries)], warmup=1)
    top = table.rows[0]
    assert (top.module, top.phase) == ("blocks.1", "forward")
    cell = top.cells[0]
    assert cell.slowest == 2 and cell.fastest == 0
    assert cell.median_ns == 111 * US and cell.imbalance == pytest.approx((30_000 + 112) / 111)
    assert [row.imbalance for row in table.rows] == sorted((row.imbalance for row in table.rows), reverse=True)
    text = render_ranks(table)
    assert "rank 2, 271.28x" in first_line(text) and "110.0 us..30.11 ms" in first_line(text)


def test_one_spike_over_two_calls_does_not_lead_the_table():
    """Two measured calls of 0.25 ms and 125 ms (a compile, a page fault): the row's figure is the
    0.25 ms call, not their mean, and the spike is an outlier, with its step."""
    assert Timing.of([250_000, 125_000_000]) == Timing(2, 250_000, 250_000, 125_000_000, None, 1)
    rows = RowKinds.of(None)
    summaries = {
        r: summarize(rank_records(r, slow=None, steps=4, spike=("blocks.0", 3) if r == 1 else None), None, rank=r, rows=rows, warmup=1)
        for r in range(3)
    }
    table = compare_ranks([BackendRanks("eager", summaries)], warmup=1)
    spiked = table.row("blocks.0", "forward").cells[0]
    assert spiked.timing(1) == Timing(2, 101 * US, 101 * US, 125_000 * US, 3, 1)
    assert table.rows[0].imbalance < 1.1  # no row stands out: the spike is an outlier only
    assert [(row.module, row.phase, rank) for row, _, rank in table.outliers()] == [("blocks.0", "forward", 1)]


# ------------------------------------------------------------------ what the merge refuses, and what it says


def test_a_rank_in_two_folders_is_refused_naming_both(tmp_path, capsys):
    a = node(tmp_path / "node0", range(0, 4), world=8)
    b = node(tmp_path / "node1", range(3, 8), world=8)
    code, out, err = report(a, b, "-o", tmp_path / "merged", capsys=capsys)
    assert code == 2 and out == ""
    assert f"rank 3 of eager appears twice: in {a / 'eager'} and {b / 'eager'}" in err
    assert "run each node with its own --node_rank" in err and "Traceback" not in err
    assert not (tmp_path / "merged").exists()


def test_a_missing_rank_is_named_under_the_table(tmp_path, capsys):
    a = node(tmp_path / "node0", range(0, 4), world=8)
    b = node(tmp_path / "node1", [4, 5, 7], world=8, slow=5)
    code, out, err = report(a, b, capsys=capsys)
    assert code == 1
    assert first_row(out)[:2] == ["blocks.1", "forward"] and "rank 5" in out
    assert "note: eager: no report of rank 6 (of ranks 0..7): the rank crashed or wrote none; the table shows ranks 0, 1, 2, 3, 4, 5, 7" in out
    assert f"nvtx-regions report: no report of rank 6 in {a}, {b}: add the folder of the node that ran it" in err


@pytest.mark.parametrize(
    ("change", "words"),
    [({"spec": "each module <blocks.0>"}, "reports of different specs"),
     ({"backends": ("eager",)}, "reports of different backends"),
     ({"world": 16}, "reports of different world sizes")],
)  # fmt: skip
def test_folders_of_different_runs_are_refused(tmp_path, capsys, change, words):
    a = node(tmp_path / "node0", range(0, 4), world=8)
    b = node(tmp_path / "node1", range(4, 8), **{"world": 8, **change})
    code, out, err = report(a, b, capsys=capsys)
    assert code == 2 and out == ""
    assert f"{a} and {b}: {words}" in err and "merge only the folders of one run" in err


def test_a_folder_that_is_no_profile_output_is_named(tmp_path, capsys):
    a = node(tmp_path / "node0", range(0, 4), world=8)
    (tmp_path / "logs").mkdir()
    code, _, err = report(a, tmp_path / "logs", capsys=capsys)
    assert code == 2
    assert f"{tmp_path / 'logs'}: not an output folder of 'nvtx-regions profile' (no profile.json); give the -o folder" in err
    code, _, err = report(a, tmp_path / "node0" / "profile.json", capsys=capsys)
    assert code == 2 and "give report files or profile folders, not both" in err
    code, _, err = report(a, "-o", a, capsys=capsys)
    assert code == 2 and f"-o {a}: exists; give a new folder (nothing is overwritten)" in err


def test_one_rank_is_the_one_rank_table(tmp_path, capsys):
    a = node(tmp_path / "node0", [0], world=1)
    code, out, _ = report(a, capsys=capsys)
    assert code == 0
    assert out.startswith("CPU time per module call: median over the measured steps")
    assert "note: one rank (world size 1): the table of rank 0" in out


# ------------------------------------------------------------------ how a folder's reports are found


def test_reports_by_rank_from_their_names(tmp_path):
    for name in ["report.rank0.nsys-rep", "report.rank1.nsys-rep", "report.rank1.2.nsys-rep", "report.rank1.sqlite",
                 "rank0.pt.trace.json", "rank3-77.pt.trace.json", "stderr.txt"]:  # fmt: skip
        (tmp_path / name).write_text("")
    assert {r: [p.name for p in ps] for r, ps in rank_files(tmp_path, "nsys").items()} == {
        0: ["report.rank0.nsys-rep"], 1: ["report.rank1.2.nsys-rep", "report.rank1.nsys-rep"]}
    assert {r: [p.name for p in ps] for r, ps in rank_files(tmp_path, "torch").items()} == {
        0: ["rank0.pt.trace.json"], 3: ["rank3-77.pt.trace.json"]}
    assert rank_files(tmp_path, "capture") == {}


def test_torchrun_options_give_the_world_and_this_nodes_ranks():
    assert torchrun_ranks(["python", "train.py"]) == (1, (0,))
    assert torchrun_ranks(["torchrun", "--nproc_per_node=3", "train.py"]) == (3, (0, 1, 2))
    assert torchrun_ranks(["torchrun", "--nnodes=2", "--node_rank=1", "--nproc_per_node=4", "t.py"]) == (8, (4, 5, 6, 7))
    assert torchrun_ranks(["torchrun", "--nnodes=1:4", "--nproc_per_node=4", "t.py"]) == (None, None)
    assert torchrun_ranks(["torchrun", "--nproc_per_node=gpu", "t.py"]) == (None, None)


def test_the_merge_benchmark_runs_and_finds_its_slow_rank():
    """benchmarks/ranks_merge.py, small: it writes node folders, merges them in a child, and the first
    row is the block it slowed on rank 5 (no timing is asserted)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "ranks_merge.py"), "--ranks", "8,16", "--layers", "3", "--steps", "4"],
                          capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| 8 |") or line.startswith("| 16 |")]
    assert len(rows) == 2 and all(row.endswith("| blocks.2 forward: rank 5 |") for row in rows), done.stdout


def test_a_run_that_lost_a_rank_shows_the_others_and_says_how_it_ended():
    """What `profile` prints for a torchrun whose rank 1 left no report: the other ranks' table, the
    missing rank named, and the run's exit under the table."""
    from nvtx_regions.commands.profile import render_runs

    rows = RowKinds.of(None)
    summaries = {r: summarize(rank_records(r, slow=2), None, rank=r, rows=rows, warmup=1) for r in (0, 2)}
    run = BackendRanks("eager", summaries, missing=(1,), problem="torchrun exited with status 1; its stderr ended with: ...")
    table, text = render_runs([run], baseline="eager", warmup=1, spec=None, rank=None, distributed=True)
    assert first_row(text)[:2] == ["blocks.1", "forward"] and "rank 2" in first_line(text)
    assert "note: eager: no report of rank 1 (of ranks 0..2): the rank crashed or wrote none; the table shows ranks 0, 2" in text
    assert text.endswith("\neager: torchrun exited with status 1; its stderr ended with: ...")
    # Rank 2 alone: its rows (it got through its steps), and how the run ended under them.
    one, text = render_runs([run], baseline="eager", warmup=1, spec=None, rank=2, distributed=True)
    assert text.startswith("CPU time per module call:") and "failed" not in text
    assert {row.module for row in one.rows} == {"blocks.0", "blocks.1", "blocks.2"}
    assert text.endswith("\neager: torchrun exited with status 1; its stderr ended with: ...")


def test_a_rank_this_node_does_not_run_is_a_usage_error_before_any_run(tmp_path, capsys):
    (tmp_path / "blocks.nvtx").write_text(SPEC + "\n")
    out = tmp_path / "never"
    argv = ["profile", str(tmp_path / "blocks.nvtx"), "--tool", "capture", "--rank", "3", "-o", str(out), "--",
            "torchrun", "--nproc_per_node=3", "train.py"]  # fmt: skip
    assert main(argv) == 2
    assert "--rank 3: this command runs ranks 0..2; choose one of them, or leave --rank out for every rank" in capsys.readouterr().err
    assert not out.exists()


def test_a_call_in_parts_is_one_call_as_long_as_its_parts(tmp_path):
    """Inductor ran `blocks.1 (backward)`'s weight gradient after blocks.0's backward work: the call's
    range comes in two parts. The summary, the report's module rows and `compare` count one call, the
    parts' time together; the parts' own names are no rows."""
    from nvtx_regions.report.compare import compare
    from nvtx_regions.report.records import module_rows

    pid = 7
    parts = []
    for step, at in ((0, 0), (1, 1_000_000), (2, 2_000_000)):
        parts += [
            RangeRecord(pid, pid, "nvtx_regions", f"step {step}", at, at + 900_000, 0, category_name="nvtx_regions.steps"),
            RangeRecord(pid, pid, "nvtx_regions", "blocks.1 (backward)", at + 100_000, at + 200_000, 1, category_name=SPEC),
            RangeRecord(pid, pid, "nvtx_regions", "blocks.0 (backward)", at + 200_000, at + 500_000, 1, category_name=SPEC),
            RangeRecord(pid, pid, "nvtx_regions", "blocks.1 (backward, continued)", at + 500_000, at + 540_000, 1, category_name=SPEC),
        ]  # fmt: skip
    summary = summarize(parts, None, rank=0, rows=RowKinds.of(None), warmup=0)
    assert summary.cpu == {
        ("blocks.1", "backward"): Timing(2, 140 * US, 140 * US, 140 * US, 1, 0),
        ("blocks.0", "backward"): Timing(2, 300 * US, 300 * US, 300 * US, 1, 0),
    }  # step 0 left out; blocks.1's parts, 100 + 40 µs, one call each step
    rows = {row.module: row.backward for row in module_rows(parts)}
    assert rows == {"blocks.1": (140 * US,) * 3, "blocks.0": (300 * US,) * 3}
    write_capture(tmp_path / "a.json", {0: [dataclasses.replace(r, pid=1000, tid=1000) for r in parts]})
    compared = {row.name: (row.count_a, row.median_a_us) for row in compare(tmp_path / "a.json", tmp_path / "a.json")}
    assert compared["blocks.1 (backward)"] == (3, 140.0) and "blocks.1 (backward, continued)" not in compared
    # The positive control: read as calls of their own, the parts would be a row, or two calls a step.
    whole = [r if "continued" not in (r.message or "") else RangeRecord(pid, pid, "nvtx_regions", "blocks.1 (backward)", r.start_ns, r.end_ns, 1, category_name=SPEC) for r in parts]
    assert summarize(whole, None, rank=0, rows=RowKinds.of(None), warmup=0).cpu[("blocks.1", "backward")].n == 4
