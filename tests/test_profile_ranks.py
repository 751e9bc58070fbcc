"""``nvtx-regions profile`` over torchrun, every rank: docs/how-to/find-the-slow-rank.md runs as written.

Its script trains three blocks on 3 gloo ranks; a custom op inside ``blocks.1`` sleeps 30 ms on
rank 2. Under our capture and under the real nsys, on eager and Inductor, the table's first row
must be ``blocks.1 forward`` with rank 2 named, and ``profile.csv`` must hold every rank for every
row. Then what a run says when a rank crashes (its trace is missing; its own exception, its stderr
file), when a rank aborts at exit after its report was complete (torch's gloo threads at interpreter
exit: the run is whole) or before (a failure), and when there is one rank. Whole-system runs are
``slow``; the reading of torchrun's report and the verdict on an abort at exit are checked fast.
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
from nvtx_regions.commands.rank_ends import TERMINATE, RunEnd, complete_ranks
from nvtx_regions.core.naming import DEFAULT_DOMAIN
from nvtx_regions.internals.torchrun import failed_workers, first_raised, rank_lines
from nvtx_regions.testing import unavailable_reason

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "how-to" / "find-the-slow-rank.md"
BLOCKS = ("blocks.0", "blocks.1", "blocks.2")
PASSES = ("forward", "backward")


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
    assert rows and list(rows[0]) == ["backend", "rank", "range", "pass", "n", "median_us", "min_us", "max_us", "max_step"]
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


# The page's own command under our capture (eager and Inductor: the slow rank, the stall, the steps
# measured, the CSV, the chart, the table 120 columns wide): tests/test_stragglers.py, one run for both.


def profile_holding_the_nsys_lock(argv: list[str], tmp_path: Path, columns: str | None = None) -> subprocess.CompletedProcess:
    """`profile`, the whole command holding the tests' one nsys lock (support.nsys): each rank's nsys
    must start at once, since gloo's rendezvous waits for every rank, so they call the real nsys."""
    argv = [PYTHON, "-m", "nvtx_regions", "profile", *argv]
    if NSYS_LOCK.parent.is_dir():
        argv = ["flock", "-o", str(NSYS_LOCK), *argv]
    env = {**child_env(tmp_path, columns), "NVTX_REGIONS_TESTS_NSYS_LOCKED": "1"}
    process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    stdout, stderr = finish_or_fail(process, 900)
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def ranks_stderr(out: Path) -> str:
    """Each backend's stderr.txt, without torch's CUDA warnings (no GPU here): what a failing rank printed."""
    noise = ("UserWarning: CUDA initialization", "torch._C._cuda_getDeviceCount", "No CUDA runtime is found")
    parts = []
    for path in sorted(out.glob("*/stderr.txt")):
        lines = [line for line in path.read_text(errors="replace").splitlines() if not any(n in line for n in noise)]
        parts.append(f"\n--- {path.parent.name}/stderr.txt, last lines:\n" + "\n".join(lines[-60:]))
    return "".join(parts)


@pytest.mark.slow
def test_nsys_names_the_slow_rank_from_a_report_per_rank(workdir, tmp_path):
    require_nsys()
    out = tmp_path / "slow_rank"
    argv = doc_argv(workdir, out, tool="nsys")
    done = profile_holding_the_nsys_lock(argv, tmp_path)
    if nsys_failed_by_itself(done.returncode, done.stdout + done.stderr):  # three sessions start at once: nsys's own failure
        shutil.rmtree(out)
        done = profile_holding_the_nsys_lock(argv, tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:] + ranks_stderr(out)
    for backend in ("eager", "inductor"):
        assert sorted(p.name for p in (out / backend).glob("*.nsys-rep")) == [f"report.rank{r}.nsys-rep" for r in range(3)]
    row = first_line(done.stdout)
    assert row.split()[:2] == ["blocks.1", "forward"] and row.count("rank 2") == 2, row
    assert csv_keys(out / "profile.csv") == every(("eager", "inductor"), range(3))


@pytest.mark.slow
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
    said = r"^eager: \S*torchrun exited with status 1: rank 1 failed first \(it exited with status 7\) and printed no Python error"
    assert re.search(rf"{said} \(no line \[rank1\]: \.\.\. in {re.escape(str(out))}/eager/stderr.txt, every rank's stderr\)$",
                     done.stdout, re.M), done.stdout[-3000:]  # fmt: skip
    row = first_line(done.stdout)
    assert row.split()[:2] == ["blocks.1", "forward"] and "rank 2" in row
    assert {r for _, r, _, _ in csv_keys(out / "profile.csv")} == {0, 2}


@pytest.mark.slow
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


# torchrun's report when rank 1 raised and it then stopped ranks 0 and 2 (torch 2.11), after their stderr.
TORCHRUN_REPORT = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/tmp/crash.py", line 57, in <module>
[rank1]:     raise RuntimeError(f"rank 1 gave up at step {step}: the marker 7c1f")
[rank1]: RuntimeError: rank 1 gave up at step 3: the marker 7c1f
[rank0]: Traceback (most recent call last):
[rank0]: RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:547] Connection closed by peer [127.0.0.1]:9143
W1207 02:42:31.101000 20671 torch/distributed/elastic/multiprocessing/api.py:1012] Sending process 20842 closing signal SIGTERM
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
crash.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-07_02:42:31
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 20842)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 20842
[2]:
  time      : 2026-12-07_02:42:31
  host      : localhost
  rank      : 2 (local_rank: 2)
  exitcode  : -15 (pid: 20844)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 20844
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-07_02:42:31
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 20843)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_torchruns_report_gives_each_failed_rank_and_the_first_and_a_rank_its_own_lines():
    assert failed_workers(TORCHRUN_REPORT) == ({0: -15, 2: -15, 1: 1}, 1)
    assert failed_workers("a plain traceback\nValueError: no report\n") == ({}, None)
    assert rank_lines(TORCHRUN_REPORT, 1)[-1] == "RuntimeError: rank 1 gave up at step 3: the marker 7c1f"
    assert rank_lines(TORCHRUN_REPORT, 3) == []
    words = RunEnd(1, Path("out/eager/stderr.txt"), True, *failed_workers(TORCHRUN_REPORT), TORCHRUN_REPORT).words("torchrun")
    assert words.startswith("torchrun exited with status 1: rank 1 failed first (it exited with status 1); its last lines:\n")
    assert "\n    RuntimeError: rank 1 gave up at step 3: the marker 7c1f\n" in words and "Connection closed" not in words
    assert words.endswith("(the rest, and every rank's stderr: out/eager/stderr.txt)")



def test_the_rank_that_raised_first_is_shown_when_torchrun_names_a_peer_that_failed_in_the_same_second(tmp_path):
    """torchrun's root cause is the lowest rank among those that failed within one second: here rank 0,
    whose error is rank 1's closed connection. The first exception in stderr is rank 1's."""
    swapped = TORCHRUN_REPORT.replace("rank      : 0 (local_rank: 0)\n  exitcode  : -15", "rank      : 1 (local_rank: 1)\n  exitcode  : 1")
    swapped = swapped.replace("rank      : 1 (local_rank: 1)\n  exitcode  : 1 (pid: 20843)", "rank      : 0 (local_rank: 0)\n  exitcode  : 1 (pid: 20843)", 1)
    assert failed_workers(swapped) == ({1: 1, 2: -15, 0: 1}, 0) and first_raised(swapped) == 1
    (tmp_path / "stderr.txt").write_text(swapped)
    words = RunEnd.of(1, tmp_path / "stderr.txt", torchrun=True).words("torchrun")
    assert "rank 1 failed first" in words and "gave up at step 3" in words and "Connection closed" not in words
    assert first_raised("Traceback (most recent call last):\nValueError\n") is None

# Rows: each failed rank's exit status, how many times stderr holds the abort's line, the ranks whose
# reports are complete, and the ranks that abort at exit and nothing else (() : the run failed).
ABORTS = [
    ({1: -6}, 1, {0, 1, 2}, (1,)),
    ({1: 134}, 1, {0, 1, 2}, (1,)),  # through nsys: 128 + SIGABRT
    ({1: -6, 0: -15, 2: -15}, 1, {0, 1, 2}, (1,)),  # torchrun stopped the others, their reports complete
    ({1: -6, 2: -6}, 2, {0, 1, 2}, (1, 2)),
    ({1: -6}, 1, {0, 2}, ()),  # rank 1 aborted before its report was complete: a failure
    ({1: -6, 0: -15}, 1, {1, 2}, ()),  # torchrun stopped rank 0 before its report was complete
    ({1: -6}, 0, {0, 1, 2}, ()),  # another abort than torch's at exit
    ({1: -6, 2: -6}, 1, {0, 1, 2}, ()),
    ({1: -6, 0: 1}, 1, {0, 1, 2}, ()),  # rank 0 failed for real
    ({1: 1}, 1, {0, 1, 2}, ()),
    ({1: -11}, 1, {0, 1, 2}, ()),  # SIGSEGV
]


@pytest.mark.parametrize(("failed", "lines", "complete", "aborted"), ABORTS)
def test_only_an_abort_at_exit_after_every_report_was_complete_leaves_the_run_whole(failed, lines, complete, aborted):
    end = RunEnd(1, Path("stderr.txt"), True, failed, min(failed), f"{TERMINATE}\n" * lines)
    assert end.aborted_at_exit(complete, (0, 1, 2)) == aborted


@pytest.mark.parametrize("rank", [1, 0])
def test_a_rank_that_raised_and_then_aborted_at_exit_failed_though_its_report_looks_complete(rank):
    """As CI saw it: rank 1 raised in step 3, the exception closed its ranges as it unwound, rank 0's
    all_reduce raised, and rank 1 aborted as Python exited. Rank 0 raising alone fails the run too."""
    raised = f"[rank{rank}]: Traceback (most recent call last):\n[rank{rank}]: RuntimeError: rank {rank} gave up\n"
    end = RunEnd(1, Path("stderr.txt"), True, {1: -6, 0: -15, 2: -15}, 1, f"{raised}{TERMINATE}\n")
    assert end.aborted_at_exit({0, 1, 2}, (0, 1, 2)) == ()
    clean = RunEnd(1, Path("stderr.txt"), True, {1: -6, 0: -15, 2: -15}, 1, f"{TERMINATE}\nTraceback (most recent call last):\n")
    assert clean.aborted_at_exit({0, 1, 2}, (0, 1, 2)) == (1,)  # torchrun's own traceback is no rank's


def in_step(script: str, step: int, code: str) -> str:
    """`script` (the page's) with `code` run on rank 1 as its steps loop begins step `step`."""
    loop = re.search(r"^for (\w+) in nvtx_regions\.steps\(.*\):\n", script, re.M)
    assert loop, script
    body = "".join(f"        {line}\n" for line in code.splitlines())
    return f"{script[: loop.end()]}    if RANK == 1 and {loop[1]} == {step}:\n{body}{script[loop.end() :]}"


def abort_script(where: str) -> str:
    """The page's script, rank 1 aborting as torch's gloo threads do at exit (SIGABRT after "terminate called
    without an active exception"), `where`: ``exit`` (after every other exit handler, the reports complete: the
    timing torch's own abort cannot be forced to) or ``step 3`` (inside step 3, before its report was complete)."""
    abort = f'sys.stderr.write("{TERMINATE}\\n")\nsys.stderr.flush()\nos.abort()\n'
    script = doc_block("script")
    if where == "exit":  # the first exit handler registered runs last
        hook = "def abort_at_exit():\n    if os.environ['RANK'] == '1':\n" + "".join(f"        {line}\n" for line in abort.splitlines())
        return f"import atexit\nimport os\nimport sys\n\n\n{hook}\n\natexit.register(abort_at_exit)\n{script}"
    return "import sys\n" + in_step(script, 3, abort)


@pytest.mark.slow
def test_a_rank_that_aborts_at_exit_after_its_report_leaves_the_run_whole_and_one_that_aborts_before_fails(workdir, tmp_path):
    outcomes = {}
    for where in ("exit", "step 3"):
        script = tmp_path / f"abort_{where.replace(' ', '')}.py"
        script.write_text(abort_script(where))
        out = tmp_path / script.stem
        argv = [str(workdir / "blocks.nvtx"), "--tool", "capture", "--backends", "eager", "-o", str(out), "--",
                TORCHRUN, "--standalone", "--nproc_per_node=3", str(script)]  # fmt: skip
        outcomes[where] = out, profile(argv, tmp_path)
    out, done = outcomes["exit"]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"exitcode\s*: -6 ", (out / "eager" / "stderr.txt").read_text())  # it did abort
    assert f'note: eager: rank 1 aborted at exit (SIGABRT, "{TERMINATE}", in {out}/eager/stderr.txt) after its report was complete' in done.stdout
    assert "  eager: ranks 0..2, steps 2..4 measured" in done.stdout
    assert csv_keys(out / "profile.csv") == every(("eager",), range(3))
    assert (out / "table.txt").read_text().rstrip().endswith("before `dist.init_process_group(...)`")
    assert complete_ranks(out / "eager", "capture", DEFAULT_DOMAIN) == {0: True, 1: True, 2: True}
    # The positive control: the same abort inside step 3 fails the run, and says which rank.
    out, done = outcomes["step 3"]
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "aborted at exit" not in done.stdout
    assert complete_ranks(out / "eager", "capture", DEFAULT_DOMAIN)[1] is False  # its step 3 never ended
    assert re.search(r"^eager: \S*torchrun exited with status 1: rank \d failed first", done.stdout, re.M), done.stdout[-3000:]


def raise_script(step: int) -> str:
    """The page's script, rank 1 raising a distinct exception as step `step` begins."""
    return in_step(doc_block("script"), step, f'raise RuntimeError("rank 1 gave up at step {step}: the marker 7c1f")')


@pytest.mark.slow
@pytest.mark.parametrize(("tool", "step"), [("capture", 3), ("torch", 1)])
def test_a_failed_rank_shows_its_own_exception_and_names_the_file_with_the_rest(workdir, tmp_path, tool, step):
    """Under torch, rank 1 fails in step 1, so its trace holds steps 0..1, none measured: said so, not
    that it wrote no report."""
    (tmp_path / "fail.py").write_text(raise_script(step))
    out = tmp_path / "out"
    argv = [str(workdir / "blocks.nvtx"), "--tool", tool, "--backends", "eager", "-o", str(out), "--",
            TORCHRUN, "--standalone", "--nproc_per_node=3", str(tmp_path / "fail.py")]  # fmt: skip
    done = profile(argv, tmp_path)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    said = re.search(r"^eager(?: failed)?: \S*torchrun exited with status 1: rank 1 failed first \(it (?:exited with status 1|was killed by SIGABRT)\); "
                     r"its last lines:\n((?:    .*\n)+?)    \(the rest, and every rank's stderr: (\S+)\)$", done.stdout, re.M)  # fmt: skip
    assert said, done.stdout[-3000:]
    assert said[1].splitlines()[-1] == f"    RuntimeError: rank 1 gave up at step {step}: the marker 7c1f"
    assert "UserWarning" not in said[1] and "Root Cause" not in said[1] and "[rank" not in said[1]
    assert said[2] == f"{out}/eager/stderr.txt"
    if tool == "torch":
        assert (out / "eager" / "rank1.pt.trace.json").is_file()
        assert "no report of rank 1" not in done.stdout
        assert "    rank 1: rank1.pt.trace.json holds no measured call: it ran steps 0, 1 only, and steps 0, 1 (compile and warm-up) are left out" in done.stdout
