"""``nvtx-regions capture``: run any command with the NVTX capture tool attached,
write its ranges as a Chrome trace and print an nvtx_sum-like summary.

    nvtx-regions capture -o timeline.json -- python train.py --steps 3
    nvtx-regions capture -o timeline.json --summary-by label -- torchrun --nproc_per_node=2 train.py
    nvtx-regions capture -o timeline.json --emit nvtx,record_function -- python train.py   # the script's torch.profiler gets them too

The command's stdin, stdout and stderr are its own (nothing is buffered
here). Every process it starts that makes an NVTX call, torchrun workers
included, streams its events to its own file in a capture directory (a
temporary one, or ``--raw-dir``) as they happen, through a shared mapping
of the file (see ``nvtx_capture.c``): memory stays bounded however long the
run, and a crash, even SIGKILL, loses nothing already recorded. When the command ends, those files are read
line by line into the trace and the summary.

Output paths are checked before the command runs: ``-o`` must name a file
that can be created (not ``-``, a directory, or a file the command uses)
and that does not exist, unless ``--force-overwrite`` (Nsight's flag);
``--raw-dir`` must be a folder that can be written. The trace is written
next to ``-o`` and renamed into place, so the file is whole or untouched;
if it still cannot be written at the end, it is kept in the capture
directory and the message says where (exit status 1 if the command succeeded).

Exit status (`commands.status`): the command's own; 128 + N when it was
killed by signal N (as a shell reports it); 2 for an output refused before the
run. A process that did not exit normally (signal,
``os._exit``) makes the capture partial, and the message says so.
While the command runs, this process outlives SIGINT (Ctrl-C reaches the
command itself through the terminal's process group, and the command
decides; a SIGINT sent to this process alone is ignored, so that the trace
of whatever the command recorded is still written) and forwards SIGTERM and
SIGHUP to it, then waits for it. If this process is killed (SIGKILL), the
command gets SIGTERM (Linux), and the next capture removes the temporary
folder left behind.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .child import ended, private_tempdir, run_child
from .emit import add_emit_option, emit_env, require_nvtx
from .status import PROBLEM_FOUND, UsageError, child_status

if TYPE_CHECKING:
    from ..capture.chrome import ProcessInfo
    from ..capture.directory import DirectoryTrace

__all__ = ["HELP", "DESCRIPTION", "USAGE", "EXAMPLE", "CaptureOutcome", "add_arguments", "run", "run_capture"]

HELP = "run a command with NVTX capture; write a Chrome trace; print a summary"
DESCRIPTION = "Run COMMAND with the NVTX capture tool; write a Chrome trace; print an nvtx_sum-like summary."
USAGE = "nvtx-regions capture [-o FILE] [--force-overwrite] [--summary-by {message,label}] [--raw-dir DIR] [--emit SINKS] -- COMMAND..."
EXAMPLE = "nvtx-regions capture -o timeline.json -- python train.py"


@dataclass
class CaptureOutcome:
    """What `run_capture` saw: the command's exit code, what its capture directory held, and where
    the trace went: `trace_path` is the output asked for, or, when that could not be written
    (`not_written` says why), the file the trace was kept in instead."""

    returncode: int
    trace: DirectoryTrace
    trace_path: Path
    not_written: str | None = None

    @property
    def processes(self) -> list[ProcessInfo]:
        return self.trace.processes

    @property
    def partial(self) -> list[ProcessInfo]:
        return [p for p in self.trace.processes if not p.complete]


# ------------------------------------------------------------------ output paths, checked before the run


def _writable_folder(folder: Path, what: str) -> None:
    """Create `folder` if needed and prove a file can be created in it; else `UsageError` naming `what`."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=folder, prefix=".nvtx-regions-probe-")
        probe.close()
    except OSError as error:
        reason = error.strerror or str(error)
        raise UsageError(f"{what}: cannot write in {folder}/ ({reason}); choose a folder you can write to") from None


def check_output(output: str, command: list[str], *, force: bool = False) -> Path:
    """The trace file `output`, checked before the command runs; raises `UsageError` naming the fix.

    Refused: ``-`` (standard output is the command's own), a directory, a
    file the command names (its script), an existing file unless `force`
    (Nsight's ``--force-overwrite``), and a folder where no file can be created.
    """
    if output == "-":
        raise UsageError(
            "-o -: the trace cannot go to standard output, which is the command's own; give a file name, "
            "e.g. -o timeline.json"
        )
    path = Path(output)
    if path.is_dir():
        raise UsageError(f"-o {output}: is a directory; give a file name, e.g. -o {path / 'timeline.json'}")
    for arg in command:
        try:
            if os.path.isfile(arg) and path.exists() and os.path.samefile(arg, path):
                raise UsageError(f"-o {output}: is {arg!r}, a file the command uses; give the trace another name")
        except OSError:
            continue
    if path.exists() or path.is_symlink():
        if not force:
            raise UsageError(f"-o {output}: the file exists; add --force-overwrite to replace it, or give another name")
        if not path.is_file():
            raise UsageError(f"-o {output}: exists and is not a regular file; give another name")
    _writable_folder(path.parent, f"-o {output}")
    return path


def check_raw_dir(raw_dir: str) -> Path:
    """The ``--raw-dir`` folder, created and checked before the command runs; raises `UsageError`."""
    path = Path(raw_dir)
    if path.exists() and not path.is_dir():
        raise UsageError(f"--raw-dir {raw_dir}: is a file, not a folder; give a folder (it is created if missing)")
    _writable_folder(path, f"--raw-dir {raw_dir}")
    return path


def _write_trace(directory: Path, output: Path, by: str) -> DirectoryTrace:
    """Write the trace next to `output`, then rename it there: `output` is whole or untouched."""
    from ..capture.directory import write_directory_trace

    partial = output.with_name(f".{output.name}.{os.getpid()}.partial")
    try:
        with open(partial, "w", encoding="utf-8") as stream:
            trace = write_directory_trace(directory, stream, by=by)
        os.replace(partial, output)
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise
    return trace


def run_capture(
    command: list[str],
    output: str | os.PathLike[str],
    *,
    by: str = "message",
    raw_dir: str | os.PathLike[str] | None = None,
    mode: str = "events",
    env: Mapping[str, str] | None = None,
    stderr_copy: Path | None = None,
) -> CaptureOutcome:
    """Run `command` under the capture tool; write the Chrome trace to `output`; return the outcome.

    env: the command's environment, before the capture tool's variables
    (default: this process's). stderr_copy: a file that gets a copy of the
    command's stderr (`child.run_child`). raw_dir: keep the per-process event files there (default: a temporary
    directory, removed afterwards, and removed by a later run if this process
    was killed). When `output` cannot be written once the command has ended,
    the trace is written into the capture directory instead, which is then
    kept (`CaptureOutcome.not_written`). Raises `UsageError` when the
    command cannot start or the tool cannot be built.
    """
    from ..capture.build import CaptureUnavailable, build_tool
    from ..capture.directory import write_directory_trace
    from ..capture.inject import ENV_DIR, ENV_INJECTION, ENV_MODE

    try:
        tool = build_tool()
    except CaptureUnavailable as error:
        raise UsageError(f"the NVTX capture tool cannot be built here: {error}") from None
    env = os.environ if env is None else env
    if env.get(ENV_INJECTION) and "nvtx_capture-" not in env[ENV_INJECTION]:
        raise UsageError(
            f"{ENV_INJECTION} already names another NVTX tool ({env[ENV_INJECTION]}); "
            "NVTX takes one tool per process: unset it, or do not run capture under Nsight"
        )
    remove_dir = raw_dir is None
    directory = private_tempdir("nvtx_capture-") if remove_dir else Path(raw_dir)
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("nvtx-*.jsonl"):
        stale.unlink()
    output = Path(output)
    try:
        attached = {**env, ENV_INJECTION: str(tool), ENV_DIR: str(directory), ENV_MODE: mode}
        returncode = run_child(command, attached, stderr_copy=stderr_copy)
        try:
            return CaptureOutcome(returncode, _write_trace(directory, output, by), output)
        except OSError as error:
            kept = directory / (output.name or "timeline.json")
            with open(kept, "w", encoding="utf-8") as stream:
                trace = write_directory_trace(directory, stream, by=by)
            remove_dir = False
            return CaptureOutcome(returncode, trace, kept, error.strerror or str(error))
    finally:
        if remove_dir:
            shutil.rmtree(directory, ignore_errors=True)


def report(outcome: CaptureOutcome, output: str, command: list[str]) -> str:
    """The text printed after the command ends: the summary, where the trace is, and what is partial."""
    trace = outcome.trace
    lines = [str(trace.summary), ""]
    n = len(outcome.processes)
    lines.append(
        f"nvtx-regions capture: {trace.ranges} ranges and {trace.marks} marks from {n} "
        f"process{'es' * (n != 1)} written to {outcome.trace_path} (open it in https://ui.perfetto.dev or chrome://tracing)"
    )
    if outcome.not_written is not None:
        lines.append(
            f"nvtx-regions capture: could not write {output} ({outcome.not_written}), so the trace is kept at "
            f"{outcome.trace_path}, beside the raw event files; move it where you want it"
        )
    if outcome.returncode:
        lines.append(f"nvtx-regions capture: {ended(command[0], outcome.returncode)}")
    if outcome.partial:
        which = ", ".join(f"rank {p.rank} (pid {p.pid})" if p.rank is not None else f"pid {p.pid}" for p in outcome.partial)
        lines.append(
            f"nvtx-regions capture: the capture is partial: {which} did not exit normally; "
            "the trace holds its events up to that point, and ranges it left open are marked unclosed"
        )
    if not outcome.processes:
        lines.append("nvtx-regions capture: no process made an NVTX call")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", default="timeline.json", help="Chrome trace file (default: timeline.json)")
    parser.add_argument("--summary-by", choices=("message", "label"), default="message",
                        help="one row per message (default), or per rule (NVTX category)")  # fmt: skip
    parser.add_argument("--raw-dir", help="keep each process's event stream (nvtx-<pid>.jsonl) in this directory")
    parser.add_argument("--force-overwrite", action="store_true", help="replace FILE if it exists (as nsys's flag)")
    add_emit_option(parser, "default: the script's own, NVTX unless it says otherwise; capture records nvtx")


def run(args: argparse.Namespace) -> int:
    """``nvtx-regions capture``: `args.command` is the command after ``--``."""
    command = args.command
    require_nvtx(args.emit, "nvtx-regions capture")
    check_output(args.output, command, force=args.force_overwrite)
    if args.raw_dir is not None:
        check_raw_dir(args.raw_dir)
    env = {**os.environ, **emit_env(args.emit)}
    outcome = run_capture(command, args.output, by=args.summary_by, raw_dir=args.raw_dir, env=env)
    sys.stdout.flush()
    print(report(outcome, args.output, command), flush=True)
    if outcome.not_written is not None and not outcome.returncode:
        return PROBLEM_FOUND
    return child_status(outcome.returncode)
