"""``nvtx-regions capture`` end to end: a real jitted model, torchrun with two
ranks, a child that crashes, one killed through the capture, one that exits
non-zero, and usage errors. The Chrome traces are checked with the
independent reader of test_chrome_trace.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest
from test_chrome_trace import read_chrome_trace

from nvtx_regions.capture import ProcessCapture, summarize
from nvtx_regions.report.chrome_trace import load_chrome_trace
from nvtx_regions.testing import unavailable_reason

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(bool(unavailable_reason()), reason=f"capture tool unavailable: {unavailable_reason()}")

ROW = re.compile(
    r"^\s*(?P<pct>[\d.]+)\s+(?P<total>\d+)\s+(?P<instances>\d+)\s+[\d.]+\s+[\d.]+\s+\d+\s+\d+\s+[\d.]+\s+"
    r"(?P<style>PushPop|StartEnd)\s{2}(?P<range>.*)$"
)


def plain_env() -> dict[str, str]:
    """This environment without the NVTX tool the pytest plugin attached."""
    drop = ("NVTX_INJECTION64_PATH", "NVTX_REGIONS_CAPTURE_DIR", "NVTX_REGIONS_CAPTURE_MODE")
    return {k: v for k, v in os.environ.items() if k not in drop}


def cli(*args: str, timeout: float = 300, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nvtx_regions", *args], cwd=cwd, env=plain_env(),
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def script(tmp_path: Path, code: str, name: str = "child.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(code))
    return str(path)


def summary_rows(stdout: str) -> dict[str, int]:
    """Range -> instances, parsed from the printed table."""
    rows = {}
    for line in stdout.splitlines():
        m = ROW.match(line)
        if m:
            rows[m["range"]] = int(m["instances"])
    return rows


def test_subprocesses_import_this_checkout():
    out = subprocess.run(
        [sys.executable, "-c", "import nvtx_regions; print(nvtx_regions.__file__)"],
        env=plain_env(), capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert Path(out.stdout.strip()).resolve().is_relative_to(ROOT)


@pytest.mark.slow
@pytest.mark.thunder
def test_capture_of_a_jitted_model_end_to_end(tmp_path):
    out, raw = tmp_path / "timeline.json", tmp_path / "raw"
    result = cli(
        "capture", "-o", str(out), "--raw-dir", str(raw), "--",
        sys.executable, "examples/train.py", "--steps", "2", "--layers", "1", "--spec", "examples/regions.nvtx", "--backend", "thunder",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 steps, loss" in result.stdout  # the command's own output passes through

    (raw_file,) = raw.glob("nvtx-*.jsonl")
    proc = ProcessCapture.from_file(raw_file)  # what the tool recorded, read by the existing reader
    assert proc.complete
    pushes = sorted((e.domain, e.message, e.ts_ns) for e in proc.events if e.kind == "push")
    assert len(pushes) > 40

    seen = read_chrome_trace(json.loads(out.read_text()))
    ranges = sorted((ev["args"]["domain"], ev["name"], round(ev["ts"] * 1000)) for ev in seen["ranges"])
    assert ranges == pushes  # every range, with its start time, and nothing else
    pops = {e.ts_ns for e in proc.events if e.kind == "pop"}
    assert {round((ev["ts"] + ev["dur"]) * 1000) for ev in seen["ranges"]} <= pops
    assert not any(ev["args"].get("unclosed") for ev in seen["ranges"])
    assert seen["process_names"] == {proc.pid: f"pid {proc.pid}"}

    counted = Counter(f"{d or ''}:{m}" for d, m, _ in pushes)
    assert summary_rows(result.stdout) == dict(counted)
    by_label = summarize(load_chrome_trace(out), by="label").instances()
    # examples/train.py loops over nvtx_regions.steps: one range per step, category nvtx_regions.steps.
    assert set(by_label) == {("nvtx_regions", r) for r in ("embed", "blocks", "attn0", "matmuls", "nvtx_regions.steps")}
    assert by_label[("nvtx_regions", "nvtx_regions.steps")] == 2
    assert by_label[("nvtx_regions", "embed")] == 4 and by_label[("nvtx_regions", "attn0")] == 2
    assert by_label[("nvtx_regions", "blocks")] == 4  # 1 layer, forward and backward, 2 steps
    assert sum(by_label.values()) == len(pushes)
    assert f"{len(pushes)} ranges and 0 marks from 1 process written to {out}" in result.stdout


def test_torchrun_with_two_ranks(tmp_path):
    child = script(
        tmp_path,
        """
        import os, nvtx
        rank = int(os.environ["RANK"])
        for step in range(rank + 2):
            with nvtx.annotate(f"step on rank {rank}", domain="train"):
                nvtx.mark("tick", domain="train")
        """,
    )
    out = tmp_path / "t.json"
    result = cli(
        "capture", "-o", str(out), "--", sys.executable, "-m", "torch.distributed.run",
        "--nproc_per_node=2", "--standalone", child,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    seen = read_chrome_trace(json.loads(out.read_text()))
    names = {name for name in seen["process_names"].values()}
    assert {re.sub(r"\d+\)", "N)", n) for n in names} == {"rank 0 (pid N)", "rank 1 (pid N)"}
    per_rank = Counter((ev["args"]["rank"], ev["name"]) for ev in seen["ranges"])
    assert per_rank == Counter({(0, "step on rank 0"): 2, (1, "step on rank 1"): 3})
    assert len(seen["instants"]) == 5
    assert summary_rows(result.stdout) == {"train:step on rank 1": 3, "train:step on rank 0": 2}
    assert "from 2 processes" in result.stdout


def test_a_crashing_child_still_gives_its_events_and_a_partial_capture(tmp_path):
    child = script(
        tmp_path,
        """
        import os, signal, nvtx
        with nvtx.annotate("done before the crash"):
            pass
        nvtx.push_range("open at the crash")
        os.kill(os.getpid(), signal.SIGSEGV)
        """,
    )
    out = tmp_path / "t.json"
    result = cli("capture", "-o", str(out), "--", sys.executable, child)
    assert result.returncode == 128 + signal.SIGSEGV
    assert "killed by SIGSEGV" in result.stdout
    assert re.search(r"the capture is partial: pid \d+ did not exit normally", result.stdout)
    seen = read_chrome_trace(json.loads(out.read_text()))
    got = {ev["name"]: ev["args"].get("unclosed", False) for ev in seen["ranges"]}
    assert got == {"done before the crash": False, "open at the crash": True}
    (name,) = seen["process_names"].values()
    assert name.endswith("[partial]")
    assert "range never closed" in result.stdout


def test_sigterm_to_capture_reaches_the_child_and_the_trace_is_still_written(tmp_path):
    ready = tmp_path / "ready"
    child = script(
        tmp_path,
        f"""
        import time, nvtx
        nvtx.push_range("waiting")
        open({str(ready)!r}, "w").close()
        time.sleep(60)
        """,
    )
    out = tmp_path / "t.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "nvtx_regions", "capture", "-o", str(out), "--", sys.executable, child],
        cwd=ROOT, env=plain_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists(), proc.communicate(timeout=5)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "killed by SIGTERM" in stdout and "the capture is partial" in stdout
    seen = read_chrome_trace(json.loads(out.read_text()))
    assert [(ev["name"], ev["args"]["unclosed"]) for ev in seen["ranges"]] == [("waiting", True)]


def test_exit_status_is_passed_through(tmp_path):
    child = script(tmp_path, "import nvtx, sys\nnvtx.mark('m')\nsys.exit(7)\n")
    result = cli("capture", "-o", str(tmp_path / "t.json"), "--", sys.executable, child)
    assert result.returncode == 7
    assert "exited with status 7" in result.stdout and "partial" not in result.stdout
    assert "0 ranges and 1 marks from 1 process" in result.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["capture", "-o", "x.json", "python", "t.py"], "nvtx-regions capture: put the command to run after `--`"),
        (["capture", "--"], "nvtx-regions capture: nothing to run after `--`"),
        (["capture", "--", "no-such-program-here"], "nvtx-regions capture: cannot run 'no-such-program-here': no such program"),
        (["nsys", "missing.nvtx", "--", "python", "t.py"], "nvtx-regions nsys: missing.nvtx: no such spec file"),
        (["nsys", "examples/regions.nvtx", "python", "t.py"], "nvtx-regions nsys: put the command to run after `--`"),
        (["explain", "missing.nvtx", "--", "python", "t.py"], "nvtx-regions explain: missing.nvtx: no such spec file"),
        (["explain", "examples/regions.nvtx", "--"], "nvtx-regions explain: nothing to run after `--`"),
    ],
)
def test_usage_errors_name_the_fix_without_a_traceback(args, message, tmp_path):
    result = cli(*args, cwd=ROOT, timeout=120)
    assert result.returncode == 2
    assert result.stderr.startswith(message), result.stderr
    assert "Traceback" not in result.stderr


def test_sigkill_loses_nothing_already_recorded(tmp_path):
    child = script(
        tmp_path,
        """
        import os, signal, nvtx
        for i in range(5000):
            nvtx.push_range(f"r{i}")
            nvtx.pop_range()
        nvtx.push_range("open at the kill")
        os.kill(os.getpid(), signal.SIGKILL)
        """,
    )
    out, raw = tmp_path / "t.json", tmp_path / "raw"
    result = cli("capture", "-o", str(out), "--raw-dir", str(raw), "--", sys.executable, child)
    assert result.returncode == 128 + signal.SIGKILL
    (raw_file,) = raw.glob("nvtx-*.jsonl")
    proc = ProcessCapture.from_file(raw_file)  # the file's padding after the last line is skipped
    assert not proc.complete
    assert sum(e.kind == "push" for e in proc.events) == 5001
    seen = read_chrome_trace(json.loads(out.read_text()))
    assert len(seen["ranges"]) == 5001
    assert [ev["name"] for ev in seen["ranges"] if ev["args"].get("unclosed")] == ["open at the kill"]


def test_a_normal_exit_leaves_only_content_in_the_event_file(tmp_path):
    child = script(tmp_path, "import nvtx\nfor i in range(100):\n    nvtx.mark(str(i))\n")
    raw = tmp_path / "raw"
    result = cli("capture", "-o", str(tmp_path / "t.json"), "--raw-dir", str(raw), "--", sys.executable, child)
    assert result.returncode == 0
    (raw_file,) = raw.glob("nvtx-*.jsonl")
    data = raw_file.read_bytes()
    assert b"\0" not in data and data.endswith(b"}\n")
    lines = [json.loads(line) for line in data.splitlines()]
    assert [r["type"] for r in (lines[0], lines[-1])] == ["process", "end"]
    assert sum(r.get("kind") == "mark" for r in lines) == 100


def test_sigint_to_capture_alone_does_not_cut_the_run_short(tmp_path):
    ready = tmp_path / "ready"
    child = script(
        tmp_path,
        f"""
        import time, nvtx
        open({str(ready)!r}, "w").close()
        with nvtx.annotate("after the interrupt"):
            time.sleep(1)
        """,
    )
    out = tmp_path / "t.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "nvtx_regions", "capture", "-o", str(out), "--", sys.executable, child],
        cwd=ROOT, env=plain_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)  # Ctrl-C would also reach the child; here only capture gets it
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    seen = read_chrome_trace(json.loads(out.read_text()))
    assert [ev["name"] for ev in seen["ranges"]] == ["after the interrupt"]


def test_emit_reaches_the_command_and_must_hold_nvtx(tmp_path):
    child = script(tmp_path, "import os; print('emit:', os.environ.get('NVTX_REGIONS_EMIT'))")
    out = tmp_path / "timeline.json"
    result = cli("capture", "-o", str(out), "--emit", "nvtx,record_function", "--", sys.executable, child)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "emit: nvtx,record_function" in result.stdout
    refused = cli("capture", "-o", str(tmp_path / "never.json"), "--emit", "record_function", "--", sys.executable, child)
    assert refused.returncode == 2 and "--emit record_function: nvtx-regions capture records NVTX ranges only" in refused.stderr
    assert "emit:" not in refused.stdout
