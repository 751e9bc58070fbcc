"""Which job a profile folder came from, and what ``profile`` and ``report`` say where a run gives
them less than they expect.

- ``nvtx-regions report`` merges the folders of one job only: halves of two runs of the same
  two-node command (torchrun's default run id ``none``, one endpoint) are refused, naming both
  folders with their run ids, endpoints and times. Real two-node runs (two ``profile`` commands at
  once, torchrun ``--nnodes=2`` on this machine, twice) in the slow tier; folders written with the
  project's own writers here.
- A spec whose rules match nothing: the table says so, and counts the steps that ran.
- nsys's progress bars stay off the standard output of ``profile`` (in ``BACKEND/nsys.txt``).

A capture cut short and a name that does not exist are in tests/test_report_cli.py.
"""

from __future__ import annotations

import io
import os
import socket
import subprocess
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from support.nsys import NSYS_LOCK, finish_or_fail, nsys_failed_by_itself, require_nsys
from test_profile import PYTHON, TORCHRUN, child_env, profile
from test_ranks import node, report
from nvtx_regions.capture.chrome import RangeRecord
from nvtx_regions.commands.nsys_output import is_nsys_progress, progress_apart
from nvtx_regions.commands.profile_folder import Job, read_manifest, torchrun_job, write_manifest
from nvtx_regions.language.parse import parse
from nvtx_regions.report.backends_table import BackendRun, compare_backends, render_backends
from nvtx_regions.report.reader import RangeFile, Ranges
from nvtx_regions.selection.compile import compile_spec
from nvtx_regions.testing import unavailable_reason

ROOT = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------ one job, and which


@pytest.mark.parametrize(
    ("command", "run_id", "endpoint"),
    [(["python", "train.py"], None, None),
     (["torchrun", "--nnodes=2", "--node_rank=1", "--nproc_per_node=8", "--master_addr=HOST", "train.py"], "none", "HOST:29500"),
     (["torchrun", "--nnodes=2", "--master-addr=HOST", "--master-port=1234", "train.py"], "none", "HOST:1234"),
     (["torchrun", "--rdzv-backend=c10d", "--rdzv-endpoint=HOST:29400", "--rdzv-id=job42", "--nnodes=2", "train.py"], "job42", "HOST:29400"),
     (["python", "-m", "torch.distributed.run", "--rdzv_id=7", "--rdzv_endpoint=h:1", "--rdzv_backend=c10d", "t.py"], "7", "h:1"),
     (["torchrun", "--standalone", "--nproc_per_node=2", "train.py"], None, "localhost:0")],
)  # fmt: skip
def test_a_folder_records_torchruns_run_id_and_endpoint(command, run_id, endpoint):
    job = torchrun_job(command)
    assert (job.run_id, job.endpoint, job.ended) == (run_id, endpoint, None)
    assert job.started.endswith("+00:00")  # UTC, whatever the nodes' time zones


def jobs(folder: Path, job: Job | None) -> Path:
    """`folder`'s profile.json, recording `job`."""
    write_manifest(folder, replace(read_manifest(folder), job=job))
    return folder


FIRST = Job("none", "10.0.0.1:29500", "2026-01-05T10:00:00.000+00:00", "2026-01-05T10:05:00.000+00:00")


@pytest.mark.parametrize(
    ("other", "cause"),
    [(replace(FIRST, started="2026-01-05T10:06:00.000+00:00", ended="2026-01-05T10:11:00.000+00:00"),
      "the same run id and endpoint, but one ran after the other had ended: two runs of the same command"),
     (replace(FIRST, run_id="job42"), "different torchrun run ids"),
     (replace(FIRST, endpoint="10.0.0.2:29500"), "different rendezvous endpoints"),
     (None, "the second records no job (written by hand, or by an older nvtx-regions)")],
)  # fmt: skip
def test_halves_of_two_jobs_are_refused_naming_both(tmp_path, capsys, other, cause):
    a = jobs(node(tmp_path / "node0", range(0, 4), world=8), FIRST)
    b = jobs(node(tmp_path / "node1", range(4, 8), world=8), other)
    code, out, err = report(a, b, "-o", tmp_path / "merged", capsys=capsys)
    assert (code, out) == (2, "")
    assert f"nvtx-regions report: {a} and {b}: reports of different jobs ({cause}):\n" in err
    assert f"  {a / 'profile.json'}: run id 'none', endpoint 10.0.0.1:29500, started 2026-01-05T10:00:00.000+00:00, ended " in err
    second = other.words() if other is not None else "no job recorded"
    assert f"  {b / 'profile.json'}: {second}\n" in err
    assert "merge only the folders that the nodes of one job wrote" in err and "Traceback" not in err
    assert not (tmp_path / "merged").exists()
    # The positive control: the other half of the same job, started later (it waited in the
    # rendezvous) and still running when the first ended, or stopped before its end.
    for later in (replace(FIRST, started="2026-01-05T10:03:00.000+00:00", ended="2026-01-05T10:05:01.000+00:00"),
                  replace(FIRST, started="2026-01-05T10:04:00.000+00:00", ended=None)):  # fmt: skip
        jobs(b, later)
        code, out, err = report(a, b, capsys=capsys)
        assert code == 0, err
        assert "  eager: ranks 0..7, steps 2..4 measured" in out


def free_port() -> int:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        return listening.getsockname()[1]


TINY = """
import torch
import nvtx_regions


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))

    def forward(self, x):
        return self.blocks(x)


model = nvtx_regions.compile(Net())
x = torch.randn(2, 4, requires_grad=True)
for _ in nvtx_regions.steps(range(4)):
    model(x).sum().backward()
"""


def two_nodes(tmp_path: Path, names: tuple[str, str], port: int) -> list[subprocess.CompletedProcess]:
    """One real two-node job on this machine: `profile` on node 0 and on node 1 at once (torchrun's static
    rendezvous at 127.0.0.1:`port`, one rank a node, the default run id), into folders `names`."""
    processes = []
    for rank, name in enumerate(names):
        argv = [PYTHON, "-m", "nvtx_regions", "profile", str(tmp_path / "modules.nvtx"), "--tool", "capture", "--backends", "eager",
                "-o", str(tmp_path / name), "--", TORCHRUN, "--nnodes=2", f"--node_rank={rank}", "--nproc_per_node=1",
                "--master_addr=127.0.0.1", f"--master_port={port}", str(tmp_path / "tiny.py")]  # fmt: skip
        processes.append(subprocess.Popen(argv, cwd=ROOT, env=child_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True, start_new_session=True))  # fmt: skip
    done = []
    for process in processes:
        stdout, stderr = finish_or_fail(process, 600)
        done.append(subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr))
    for result in done:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return done


@pytest.mark.slow
def test_real_halves_of_two_runs_of_one_command_are_refused(tmp_path, capsys):
    """The same two-node command run twice, as a user reruns it: the halves of one run merge; node 0
    of the first run with node 1 of the rerun is refused, naming both."""
    if unavailable_reason():
        pytest.skip(unavailable_reason())
    (tmp_path / "tiny.py").write_text(TINY)
    (tmp_path / "modules.nvtx").write_text("each module <blocks.*>\n")
    port = free_port()
    two_nodes(tmp_path, ("node0", "node1"), port)
    two_nodes(tmp_path, ("rerun0", "rerun1"), port)
    first, rerun = read_manifest(tmp_path / "node0").job, read_manifest(tmp_path / "rerun1").job
    assert (first.run_id, first.endpoint) == (rerun.run_id, rerun.endpoint) == ("none", f"127.0.0.1:{port}")
    code, out, err = report(tmp_path / "node0", tmp_path / "node1", capsys=capsys)
    assert code == 0, err
    assert "  eager: ranks 0, 1, steps 2..3 measured" in out
    code, out, err = report(tmp_path / "node0", tmp_path / "rerun1", capsys=capsys)
    assert (code, out) == (2, "")
    assert f"{tmp_path / 'node0'} and {tmp_path / 'rerun1'}: reports of different jobs (the same run id and endpoint, but one ran" in err
    for name, job in (("node0", first), ("rerun1", rerun)):
        assert f"  {tmp_path / name / 'profile.json'}: run id 'none', endpoint 127.0.0.1:{port}, started {job.started}, ended {job.ended}" in err


# ------------------------------------------------------------------ a spec that matches nothing


def test_a_spec_that_matched_nothing_is_said_and_the_steps_that_ran_are_counted():
    steps = tuple(RangeRecord(0, 0, "nvtx_regions", f"step {n}", 1000 * n, 1000 * n + 900, 0, category_name="nvtx_regions.steps")
                  for n in range(4))  # fmt: skip
    run = BackendRun("eager", Ranges((RangeFile("x", False, steps),)))
    text = render_backends(compare_backends([run], warmup=1, spec=compile_spec(parse("each module <transformer.hh.*>"))))
    assert "  eager: steps none measured (4 ran: 0..3)\n" in text
    assert ("(no module or region ranges in any run: the spec's rules each module <transformer.hh.*> left none; they matched "
            "no module call, or their gates (steps, rank in) never opened") in text  # fmt: skip
    assert "needs an `each module`" not in text
    # The positive control: a spec without a rule that gives rows still needs one.
    text = render_backends(compare_backends([run], warmup=1, spec=compile_spec(parse("op in <linear>"))))
    assert "the spec needs an `each module`, `each class` or `between` rule" in text


@pytest.mark.slow
def test_a_real_run_of_a_spec_that_matches_nothing(tmp_path):
    if unavailable_reason():
        pytest.skip(unavailable_reason())
    (tmp_path / "tiny.py").write_text(TINY)
    (tmp_path / "typo.nvtx").write_text("each module <block.*>\n")  # the model's are blocks, blocks.0, blocks.1
    argv = [str(tmp_path / "typo.nvtx"), "--tool", "capture", "--backends", "eager", "-o", str(tmp_path / "out"), "--",
            PYTHON, str(tmp_path / "tiny.py")]  # fmt: skip
    done = profile(argv, tmp_path)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "  eager: steps none measured (4 ran: 0..3)" in done.stdout
    assert "the spec's rules each module <block.*> left none; they matched no module call" in done.stdout
    assert "needs an `each module`" not in done.stdout
    # The nearest names the table points at: the run's warning, on its stderr (kept in stderr.txt).
    warning = "rule 'each module <block.*>'"
    assert warning in done.stderr and "selected nothing" in done.stderr and "(nearest: blocks" in done.stderr
    assert warning in (tmp_path / "out" / "eager" / "stderr.txt").read_text()


# ------------------------------------------------------------------ nsys's progress, off stdout

# What nsys 2022.4.2 printed on its stdout for `nsys profile -o /tmp/nsx python3 -c "print('hello from app')"`.
NSYS_STDOUT = (
    b"hello from app\n"
    b"Generating '/tmp/nsys-report-6bc6.qdstrm'\n"
    + b"".join(b"\r[1/1] [" + bar + b"] nsx.nsys-rep" for bar in (b"0%                          ", b"====27%                     ",
                                                                 b"========================100%"))  # fmt: skip
    + b"\nGenerated:\n    /tmp/nsx.nsys-rep\n"
)


def test_nsys_lines_go_to_the_log_and_the_programs_to_stdout(tmp_path, capfdbinary):
    lines = io.BytesIO(NSYS_STDOUT).readlines()  # as the pipe gives them: "\r" ends no line
    assert [is_nsys_progress(line) for line in lines] == [False, True, True, True, True]
    for line in (b"loss 3.2\n", b"[1/1] done\n", b"[1/3] [ok] loading\n", b"Generated: 3 tokens\n", b"  saved to out.sqlite\n", b"\n"):
        assert not is_nsys_progress(line), line
    read, write = os.pipe()
    log = tmp_path / "nsys.txt"
    with open(read, "rb") as source:
        thread = progress_apart(log)(source)
        writer = threading.Thread(target=lambda: (os.write(write, NSYS_STDOUT), os.close(write)))
        writer.start()
        writer.join()
        thread.join(timeout=10)
    assert capfdbinary.readouterr().out == b"hello from app\n"
    assert log.read_bytes() == NSYS_STDOUT[len(b"hello from app\n") :]


@pytest.mark.slow
def test_a_real_nsys_run_keeps_its_progress_off_stdout(tmp_path):
    require_nsys()
    if unavailable_reason():
        pytest.skip(unavailable_reason())
    (tmp_path / "tiny.py").write_text(TINY + "print('the script says hello')\n")
    (tmp_path / "modules.nvtx").write_text("each module <blocks.*>\n")
    out = tmp_path / "out"
    argv = [PYTHON, "-m", "nvtx_regions", "profile", str(tmp_path / "modules.nvtx"), "--tool", "nsys", "--backends", "eager",
            "-o", str(out), "--", PYTHON, str(tmp_path / "tiny.py")]  # fmt: skip
    if NSYS_LOCK.parent.is_dir():
        argv = ["flock", "-o", str(NSYS_LOCK), *argv]
    env = {**child_env(tmp_path), "NVTX_REGIONS_TESTS_NSYS_LOCKED": "1"}
    for attempt in (1, 2):
        process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        stdout, stderr = finish_or_fail(process, 600)
        if attempt == 2 or not nsys_failed_by_itself(process.returncode, stdout + stderr):
            break
        subprocess.run(["rm", "-rf", str(out)], check=True)
    assert process.returncode == 0, stdout[-3000:] + stderr[-3000:]
    assert "the script says hello\n" in stdout  # the program's own output is shown
    assert "Generating '" not in stdout and "[1/1]" not in stdout and "Generated:" not in stdout
    assert stdout.index("the script says hello") < stdout.index("CPU time per module call")
    log = (out / "eager" / "nsys.txt").read_text()
    assert "Generating '" in log and "[1/1] [" in log and "100%] report.nsys-rep" in log  # what nsys printed, kept
    assert f"Generated:\n    {out / 'eager' / 'report.nsys-rep'}\n" in log
