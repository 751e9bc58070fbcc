"""Running the user's command as a child process: the one runner of every command that
runs another (capture, explain, nsys --run, profile). Its environment goes through
``env=``, never through this process's ``os.environ``; its stderr is its own, or read
from a pipe and copied to a file as it is shown (``stderr_copy``). Also: signal
forwarding, the child's death with ours, private temporary folders, and how a child
ended, in words. The command after ``--`` is split off by `commands.main`, and exit
statuses are `commands.status`'s."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

from .status import UsageError

__all__ = ["ended", "private_tempdir", "run_child", "signal_name"]


def signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def ended(program: str, returncode: int) -> str:
    """How a child ended, in the words every command uses: ``X was killed by SIGKILL``, ``X exited with status 3``."""
    if returncode < 0:
        return f"{program} was killed by {signal_name(returncode)}"
    return f"{program} exited with status {returncode}"


# prctl(2) option: the signal a process gets when the thread that forked it exits (Linux only).
_PR_SET_PDEATHSIG = 1


def _die_with_parent():
    """A `preexec_fn` for Linux: the child gets SIGTERM when this process dies, even by SIGKILL.

    SIGTERM, not SIGKILL, so that a launcher such as torchrun still stops its
    own workers; the capture tool's files are written as events happen, so
    nothing recorded is lost either way.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


def _alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] != "Z"


def private_tempdir(prefix: str) -> Path:
    """A new temporary folder ``<prefix><pid>-XXXXXXXX`` owned by this process.

    Folders of the same prefix whose owner process is gone (killed before it
    could clean up, SIGKILL included) are removed first, so they do not
    accumulate. A folder whose pid was reused by a live process is left
    until a later run. Raises `UsageError` when the folder cannot be created.
    """
    pattern = re.compile(rf"{re.escape(prefix)}(\d+)-\w+")
    try:
        base = Path(tempfile.gettempdir())  # the first usable of TMPDIR, /tmp, /var/tmp, ...
        for old in base.glob(f"{prefix}*"):
            match = pattern.fullmatch(old.name)
            owner = int(match[1]) if match else os.getpid()
            if owner != os.getpid() and not _alive(owner) and old.is_dir() and not old.is_symlink():
                shutil.rmtree(old, ignore_errors=True)
        return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-"))
    except OSError as error:
        raise UsageError(f"cannot create a temporary folder ({error}); set TMPDIR to a folder you can write to") from None


def _pump(source: IO[bytes], copy: Path) -> threading.Thread:
    """A thread that shows what `source` gives on this process's stderr and writes it to `copy`, until EOF."""
    terminal = sys.stderr.fileno()

    def pump() -> None:
        with source, open(copy, "wb") as kept:
            while chunk := source.read1(65536):
                os.write(terminal, chunk)
                kept.write(chunk)

    thread = threading.Thread(target=pump, name="nvtx-regions-stderr", daemon=True)
    thread.start()
    return thread


# How long the copy of stderr waits, after the command ended, for the processes it left
# behind (a daemon it started holds the pipe too) to close their end.
_STDERR_GRACE_S = 10


def run_child(command: list[str], env: Mapping[str, str], *, stderr_copy: Path | None = None,
              stdout_to: Callable[[IO[bytes]], threading.Thread] | None = None) -> int:  # fmt: skip
    """Run `command` with environment `env` and return its returncode.

    Its stdin and stdout are this process's; so is its stderr, unless
    `stderr_copy` is given: then its stderr (and that of every process it
    starts) is read from a pipe, shown here as it comes and written to that
    file, which is whole when this returns (or after a grace of 10 s for
    processes the command left behind). `stdout_to`: its stdout is a pipe
    instead, given to this function, whose thread reads it (joined as the
    stderr copy is).

    While it runs, this process outlives SIGINT (Ctrl-C at a terminal reaches
    the command through its process group; the command decides), forwards
    SIGTERM and SIGHUP to it, and, on Linux, takes it down if this process is
    killed (the child gets SIGTERM). Raises `UsageError` when it cannot start.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        proc = subprocess.Popen(
            command, env=dict(env), preexec_fn=_die_with_parent(), stderr=subprocess.PIPE if stderr_copy else None,
            stdout=subprocess.PIPE if stdout_to else None,
        )  # fmt: skip
    except FileNotFoundError:
        raise UsageError(f"cannot run {command[0]!r}: no such program (is it on PATH?)") from None
    except PermissionError:
        raise UsageError(f"cannot run {command[0]!r}: not executable") from None
    pump = _pump(proc.stderr, stderr_copy) if stderr_copy is not None and proc.stderr is not None else None
    reader = stdout_to(proc.stdout) if stdout_to is not None and proc.stdout is not None else None

    def forward(signum, _frame):
        if proc.poll() is None:
            proc.send_signal(signum)

    def outlive(_signum, _frame):
        pass  # the terminal sent Ctrl-C to the command too: wait for it to end

    handlers = {signal.SIGINT: outlive, signal.SIGTERM: forward, signal.SIGHUP: forward}
    previous = {s: signal.signal(s, h) for s, h in handlers.items()}
    try:
        while True:
            try:
                return proc.wait()
            except InterruptedError:
                continue
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for thread in (pump, reader):
            if thread is not None:
                thread.join(timeout=_STDERR_GRACE_S)
