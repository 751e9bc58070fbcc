"""Nsight Systems in the tests: one session at a time, its own failures tried once more, a run
ended at its timeout, and its SQLite export read back (``NVTX_EVENTS`` with ``StringIds``).

Without nsys the tests that need it skip, except under ``CI=true``, where they fail
(``.ci/install-nsys`` installs Nsight Systems 2022.4.2 on Debian bookworm).
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NSYS_LOCK = Path(tempfile.gettempdir()) / f"nvtx_regions_tests_nsys_{os.getuid()}" / "lock"
TIMEOUT = 400  # s per nsys run; the runs of the tests take 10-60 s on 2 busy cores


def one_nsys_session_at_a_time() -> None:
    """Every nsys this test run starts (tests, our commands, their children) goes through a
    wrapper first on PATH that holds one lock, shared by the test workers, for the whole command.

    Nsight Systems 2022.4.2 sessions started at once by the two workers can fail at start
    ("sem_open: No such file or directory" in its ProcessWaiter; once in a CI run). A command
    that nsys itself runs calls the real nsys directly, so nothing waits for its own lock.
    Only flock holds the lock (``-o``): nsys's agent and its target run in sessions of their
    own and can outlive it (a run killed at its timeout leaves both), and had they inherited
    the lock, every later nsys of the test run would wait for it until its own timeout.
    """
    real = shutil.which("nsys")
    folder = NSYS_LOCK.parent
    if real is None or Path(real).parent == folder:
        return
    folder.mkdir(exist_ok=True)
    script = (
        "#!/bin/sh\n"
        f'if [ -n "$NVTX_REGIONS_TESTS_NSYS_LOCKED" ]; then exec "{real}" "$@"; fi\n'
        "export NVTX_REGIONS_TESTS_NSYS_LOCKED=1\n"
        f'exec flock -o "{NSYS_LOCK}" "{real}" "$@"\n'
    )
    wrapper = folder / "nsys"
    if not wrapper.is_file() or wrapper.read_text() != script:
        staged = folder / f"nsys.{os.getpid()}"
        staged.write_text(script)
        staged.chmod(0o755)
        os.replace(staged, wrapper)  # the other worker may be writing the same text
    os.environ["PATH"] = f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"


# Nsight Systems 2022.4.2 failing by itself rather than the command it profiles; each seen under
# load in a CI run of this project. A test that meets one runs its nsys command once more.
NSYS_OWN_FAILURES = (
    "sem_open: No such file or directory",  # two sessions starting at once (its ProcessWaiter)
    "Local Endpoint is not available",  # a process it injected (gcc under Inductor) lost its agent
)


def nsys_failed_by_itself(returncode: int, output: str) -> bool:
    """Whether an nsys run that ended with `returncode` and printed `output` failed by nsys's own fault."""
    return returncode != 0 and any(failure in output for failure in NSYS_OWN_FAILURES)


def finish_or_fail(process: subprocess.Popen, timeout: float) -> tuple[str, str | None]:
    """`process.communicate()` (its stdout and stderr) within `timeout` seconds; past it, SIGINT to its
    process group first, nsys's own way to end a session: it stops its target and its agent, which
    run in sessions of their own and would outlive a kill of the group. SIGKILL follows 60 s later,
    then the test fails with the tail of what the process printed."""
    try:
        return process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGINT)
        try:
            stdout, stderr = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
        pytest.fail(f"did not finish in {timeout} s: {shlex.join(process.args)}\n{(stdout or '')[-3000:]}{(stderr or '')[-3000:]}")


def require_nsys() -> str:
    """The nsys on PATH; without one the calling test skips, except under ``CI=true``, where it fails."""
    nsys = shutil.which("nsys")
    if nsys is None:
        message = "Nsight Systems (nsys) is not installed; .ci/install-nsys installs it (root, Debian bookworm)"
        if os.environ.get("CI") == "true":
            pytest.fail(message + ". Under CI=true the nsys tests run; they do not skip")
        pytest.skip(message)
    return nsys


# ------------------------------------------------------------------ running nsys and reading its export


@dataclass(frozen=True)
class Run:
    returncode: int
    seconds: float
    output: str


def run_nsys(argv, *, timeout: float = TIMEOUT, again: bool = True) -> Run:
    """Run `argv` in the repository root in its own process group, with this interpreter's folder
    first on PATH (the generated commands name `python`); fail the test if it has not ended by `timeout`.

    nsys 2022.4.2 sometimes fails by itself under load: status 1 and only "End of file" within a
    second (its CLI lost the connection to the agent it had just started; 1 run in about 40 here),
    or one of `NSYS_OWN_FAILURES`. Such a run is tried once more, without the reports it may have
    left (nsys does not overwrite a report). At the timeout: `finish_or_fail`.
    """
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    start = time.monotonic()
    process = subprocess.Popen(
        list(argv), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    output, _ = finish_or_fail(process, timeout)
    seconds = time.monotonic() - start
    print(f"\n[nsys run: {seconds:.1f} s, status {process.returncode}] {shlex.join(argv)}")
    start_failed = process.returncode == 1 and seconds < 10 and output.strip() == "End of file"
    if again and (start_failed or nsys_failed_by_itself(process.returncode, output)):
        print(f"[nsys failed by itself; once more]\n{output[-1000:]}")
        remove_reports(argv)
        return run_nsys(argv, timeout=timeout, again=False)
    return Run(process.returncode, seconds, output)


def run_nsys_collecting(argv, count: int) -> Run:
    """`run_nsys` of a command with ``--capture-range-end=repeat-shutdown:COUNT``: nsys ends its
    target with SIGTERM (status 143) after the `count`-th collection. Once in a CI run, nsys
    2022.4.2 ended it so (it had counted `count` collections) yet wrote one report fewer, under
    load; such a run is tried once more, with what nsys printed. The tests then check every report."""
    done = run_nsys(argv)
    written = numbered_reports(argv)
    if done.returncode == 143 and len(written) < count:
        print(f"[nsys ended the target after {count} collections but wrote {[p.name for p in written]}; once more]\n{done.output[-2000:]}")
        remove_reports(argv)
        done = run_nsys(argv, again=False)
    return done


def numbered_reports(argv) -> list[Path]:
    """The numbered reports ``NAME.N.nsys-rep`` that the nsys command `argv` (``--output=NAME``) wrote, in order of N."""
    (name,) = [ROOT / word.removeprefix("--output=") for word in argv if word.startswith("--output=")]
    found = name.parent.glob(f"{name.name}.*.nsys-rep")
    return sorted(found, key=lambda path: int(path.name.split(".")[-2]))


def remove_reports(argv) -> None:
    """Remove the reports that the nsys command `argv` writes: ``NAME.nsys-rep`` for ``--output=NAME``,
    numbered ``NAME.N.nsys-rep`` for repeated captures, and one per rank for ``NAME%q{RANK}``."""
    for word in argv:
        if word.startswith("--output="):
            name = ROOT / word.removeprefix("--output=")
            if "%" in name.name:
                patterns = [name.name.split("%", 1)[0] + "*.nsys-rep"]
            else:
                patterns = [f"{name.name}.nsys-rep", f"{name.name}.*.nsys-rep"]
            for pattern in patterns:
                for report in name.parent.glob(pattern):
                    report.unlink()


def export(report: Path) -> Path:
    """``nsys export --type=sqlite`` of `report`, beside it; the path of the SQLite file."""
    target = report.with_suffix(".sqlite")
    done = subprocess.run(
        [require_nsys(), "export", "--type=sqlite", "--force-overwrite=true", f"--output={target}", str(report)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return target


@dataclass(frozen=True)
class NsysRange:
    start: int
    end: int
    message: str
    domain: str | None
    category: str | None
    color: int | None
    pid: int
    tid: int
    depth: int


def nsys_ranges(sqlite: Path) -> list[NsysRange]:
    """The push/pop ranges of an nsys SQLite export, in start order, with their nesting depth per thread and domain."""
    db = sqlite3.connect(sqlite)
    try:
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "NVTX_EVENTS" not in tables:  # nsys writes no table for what it did not record
            return []
        kinds = dict(db.execute("SELECT name, id FROM ENUM_NSYS_EVENT_TYPE"))
        text = "COALESCE(s.value, e.text)"
        join = "FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId"
        domains = {0: None} | dict(
            db.execute(f"SELECT e.domainId, {text} {join} WHERE e.eventType = ?", [kinds["NvtxDomainCreate"]])
        )
        categories = {
            (domain, number): name
            for domain, number, name in db.execute(
                f"SELECT e.domainId, e.category, {text} {join} WHERE e.eventType = ?", [kinds["NvtxCategory"]]
            )
        }
        rows = db.execute(
            f"SELECT e.start, e.end, {text}, e.domainId, e.category, e.color, e.globalTid {join} "
            "WHERE e.eventType = ? ORDER BY e.start, e.end DESC",
            [kinds["NvtxPushPopRange"]],
        ).fetchall()
    finally:
        db.close()
    out, stacks = [], {}
    for start, end, message, domain_id, category, color, global_tid in rows:
        stack = stacks.setdefault((global_tid, domain_id), [])
        while stack and stack[-1] <= start:
            stack.pop()
        out.append(
            NsysRange(start, end, message, domains[domain_id or 0], categories.get((domain_id, category)), color,
                      (global_tid >> 24) & 0xFFFFFF, global_tid & 0xFFFFFF, len(stack))
        )  # fmt: skip
        stack.append(end)
    return out
