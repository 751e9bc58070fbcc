"""``nvtx-regions profile`` over torchrun, every rank: docs/how-to/find-the-slow-rank.md runs as written.

Its script trains three blocks on 3 gloo ranks; a custom op inside ``blocks.1`` sleeps 30 ms on
rank 2. Under our capture and under the real nsys, on eager and Inductor, the table's first row
must be ``blocks.1 forward`` with rank 2 named, and ``profile.csv`` must hold every rank for every
row. Then what a run says when a rank crashes (its trace is missing) and when there is one rank.
"""

from __future__ import annotations

import csv
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from support.nsys import NSYS_LOCK, finish_or_fail, nsys_failed_by_itself, require_nsys
from test_profile import PYTHON, TORCHRUN, child_env, profile
from nvtx_regions.testing import unavailable_reason

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "how-to" / "find-the-slow-rank.md"
BLOCKS = ("blocks.0", "blocks.1", "blocks.2")
PASSES = ("forward", "backward")
pytestmark = pytest.mark.slow


def doc_block(marker: str) -> str:
    """The code block after ``<!-- slow-rank: marker -->``."""
    match = re.search(rf"<!-- slow-rank: {marker} -->\n```\w*\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert match, f"no {marker} block in {DOC}"
    return match[1]


def first_line(stdout: str) -> str:
    """The table's first row, as printed."""
    lines = stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("module "))
    return lines[at + 2]


def csv_keys(path: Path) -> set[tuple[str, int, str, str]]:
    with open(path, newline="") as stream:
        rows = list(csv.DictReader(stream))
    assert rows and list(rows[0]) == ["backend", "rank", "range", "pass", "n", "median_us"]
    assert all(int(row["n"]) == 3 for row in rows)  # steps 2..4 of 0..4
    return {(row["backend"], int(row["rank"]), row["range"], row["pass"]) for row in rows}


def every(backends: tuple[str, ...], ranks: range) -> set[tuple[str, int, str, str]]:
    return {(b, r, m, p) for b in backends for r in ranks for m in BLOCKS for p in PASSES}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    if unavailable_reason():
        pytest.skip(unavailable_reason())
    where = tmp_path_factory.mktemp("slow_rank")
    (where / "slow_rank.py").write_text(doc_block("script"))
    (where / "blocks.nvtx").write_text(doc_block("spec"))
    return where


def doc_argv(workdir: Path, out: Path, **replace: str) -> list[str]:
    """The page's command, its files in `workdir`, output to `out`; `replace` swaps option values."""
    argv = shlex.split(doc_block("command").strip())
    assert argv[:2] == ["nvtx-regions", "profile"]
    words = {"blocks.nvtx": str(workdir / "blocks.nvtx"), "slow_rank.py": str(workdir / "slow_rank.py"),
             "slow_rank": str(out), "torchrun": TORCHRUN}  # fmt: skip
    argv = [words.get(word, word) for word in argv[2:]]
    for option, value in replace.items():
        argv[argv.index(f"--{option}") + 1] = value
    assert "--standalone" in argv  # a free port: other tests may run torchrun too (--master_port=0 hangs gloo's init)
    return argv


def test_the_pages_command_names_the_slow_rank_under_our_capture(workdir, tmp_path):
    out = tmp_path / "slow_rank"
    done = profile(doc_argv(workdir, out), tmp_path)
    if aborted_at_exit(done, out):  # torch's, once in many runs (see aborted_at_exit): once more
        shutil.rmtree(out)
        done = profile(doc_argv(workdir, out), tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:] + ranks_stderr(out)
    row = first_line(done.stdout)
    assert row.split()[:2] == ["blocks.1", "forward"] and row.count("rank 2") == 2, row  # eager and inductor
    assert "  eager: ranks 0..2, steps 2..4 measured" in done.stdout and "  inductor: ranks 0..2, steps 2..4 measured" in done.stdout
    assert csv_keys(out / "profile.csv") == every(("eager", "inductor"), range(3))
    assert (out / "ranks.svg").is_file() and (out / "table.txt").read_text().strip() in done.stdout
    # The page shows a real run of it (times vary, and the order of the rows after the first with them).
    numbers = re.compile(r"\d+(\.\d+)? (s|ms|us|ns)|\d+\.\d+|\b\d+:|(?<=rank )\d+")

    def masked(text: str) -> list[str]:
        lines = [re.sub(r"\s+", " ", re.sub("-{3,}", "---", numbers.sub("#", line))).rstrip() for line in text.strip().splitlines()]
        return lines[:7] + sorted(lines[7:-2]) + lines[-2:]

    real = done.stdout[done.stdout.index("CPU time per module call, every rank") :].replace(str(out), "slow_rank")
    shown = doc_block("table")
    assert masked(shown) == masked(real)
    assert first_line(shown).split()[:2] == ["blocks.1", "forward"]


def profile_holding_the_nsys_lock(argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    """`profile`, the whole command holding the tests' one nsys lock (support.nsys): each rank's nsys
    must start at once, since gloo's rendezvous waits for every rank, so they call the real nsys."""
    argv = [PYTHON, "-m", "nvtx_regions", "profile", *argv]
    if NSYS_LOCK.parent.is_dir():
        argv = ["flock", "-o", str(NSYS_LOCK), *argv]
    env = {**child_env(tmp_path), "NVTX_REGIONS_TESTS_NSYS_LOCKED": "1"}
    process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    stdout, stderr = finish_or_fail(process, 900)
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def aborted_at_exit(done: subprocess.CompletedProcess, out: Path) -> bool:
    """Whether a rank's program aborted (SIGABRT: torchrun's exitcode -6, or 134 under nsys) and the
    table is complete, every rank's steps in it: torch's "terminate called without an active exception"
    as a rank's process ends. Seen in one run of many, under nsys (torch 2.11) and under our capture
    (torch 2.14.1), in a script that destroys its process group. One rank's status, not the profile's,
    which says it (exit status 1, the rank's stderr)."""
    text = done.stdout + done.stderr
    aborted = re.search(r"exitcode\s*: (-6|134)\b", text) is not None
    complete = all(f"  {backend}: ranks 0..2, steps 2..4 measured" in done.stdout for backend in ("eager", "inductor"))
    return done.returncode != 0 and aborted and complete


def ranks_stderr(out: Path) -> str:
    """Each backend's stderr.txt, without torch's CUDA warnings (no GPU here): what a failing rank printed."""
    noise = ("UserWarning: CUDA initialization", "torch._C._cuda_getDeviceCount", "No CUDA runtime is found")
    parts = []
    for path in sorted(out.glob("*/stderr.txt")):
        lines = [line for line in path.read_text(errors="replace").splitlines() if not any(n in line for n in noise)]
        parts.append(f"\n--- {path.parent.name}/stderr.txt, last lines:\n" + "\n".join(lines[-60:]))
    return "".join(parts)


def test_nsys_names_the_slow_rank_from_a_report_per_rank(workdir, tmp_path):
    require_nsys()
    out = tmp_path / "slow_rank"
    argv = doc_argv(workdir, out, tool="nsys")
    done = profile_holding_the_nsys_lock(argv, tmp_path)
    # Three sessions start at once; once in CI one rank aborted at its exit, its report written.
    if nsys_failed_by_itself(done.returncode, done.stdout + done.stderr) or aborted_at_exit(done, out):
        shutil.rmtree(out)
        done = profile_holding_the_nsys_lock(argv, tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:] + ranks_stderr(out)
    for backend in ("eager", "inductor"):
        assert sorted(p.name for p in (out / backend).glob("*.nsys-rep")) == [f"report.rank{r}.nsys-rep" for r in range(3)]
    row = first_line(done.stdout)
    assert row.split()[:2] == ["blocks.1", "forward"] and row.count("rank 2") == 2, row
    assert csv_keys(out / "profile.csv") == every(("eager", "inductor"), range(3))


def test_a_crashed_rank_is_named_and_the_others_are_shown(workdir, tmp_path):
    """Rank 1 ends with os._exit after the others: no exit handler runs, so torch.profiler writes no trace."""
    script = doc_block("script").replace(
        "dist.destroy_process_group()\n",
        "dist.destroy_process_group()\nif RANK == 1:\n    time.sleep(5)\n    os._exit(7)\n",
    )
    (tmp_path / "crash.py").write_text(script)
    out = tmp_path / "out"
    argv = [str(workdir / "blocks.nvtx"), "--tool", "torch", "--backends", "eager", "-o", str(out), "--",
            TORCHRUN, "--standalone", "--nproc_per_node=3", str(tmp_path / "crash.py")]  # fmt: skip
    done = profile(argv, tmp_path)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stdout
    assert "note: eager: no report of rank 1 (of ranks 0..2): the rank crashed or wrote none; the table shows ranks 0, 2" in done.stdout
    assert re.search(r"^eager: \S*torchrun exited with status 1; its stderr ended with:$", done.stdout, re.M), done.stdout[-3000:]
    row = first_line(done.stdout)
    assert row.split()[:2] == ["blocks.1", "forward"] and "rank 2" in row
    assert {r for _, r, _, _ in csv_keys(out / "profile.csv")} == {0, 2}


def test_one_rank_gets_the_one_rank_table_and_says_so(workdir, tmp_path):
    out = tmp_path / "out"
    argv = [str(workdir / "blocks.nvtx"), "--tool", "capture", "--backends", "eager", "-o", str(out), "--",
            TORCHRUN, "--standalone", "--nproc_per_node=1", str(workdir / "slow_rank.py")]  # fmt: skip
    done = profile(argv, tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "\nCPU time per module call: median over the measured steps" in done.stdout
    assert "note: one rank (world size 1): the table of rank 0" in done.stdout
    assert csv_keys(out / "profile.csv") == every(("eager",), range(1))
    assert (out / "profile.svg").is_file() and not (out / "ranks.svg").exists()
