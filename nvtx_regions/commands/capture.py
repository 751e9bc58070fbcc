"""``nvtx-regions capture``: run any command with the NVTX capture tool attached,
write its ranges as a Chrome trace and print an nvtx_sum-like summary.

    nvtx-regions capture -o timeline.json -- python train.py --steps 3
    nvtx-regions capture -o timeline.json --summary-by label -- torchrun --nproc_per_node=2 train.py

The command's stdin, stdout and stderr are its own (nothing is buffered
here). Every process it starts that makes an NVTX call, torchrun workers
included, streams its events to its own file in a capture directory (a
temporary one, or ``--raw-dir``) as they happen, through a shared mapping
of the file (see ``nvtx_capture.c``): memory stays bounded however long the
run, and a crash, even SIGKILL, loses nothing already recorded. When the command ends, those files are read
line by line into the trace and the summary.

Exit status: the command's own; 128 + N when it was killed by signal N (as a
shell reports it). A process that did not exit normally (signal,
``os._exit``) makes the capture partial, and the message says so.
While the command runs, this process outlives SIGINT (Ctrl-C reaches the
command itself through the terminal's process group) and forwards SIGTERM
and SIGHUP to it, then waits for it, so the partial trace is still written.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..capture.chrome import ProcessInfo
from ..capture.directory import DirectoryTrace, write_directory_trace
from ..capture.inject import ENV_DIR, ENV_INJECTION, ENV_MODE
from .child import CommandError, exit_status, parse_command_line, run_child, signal_name

__all__ = ["CaptureOutcome", "run_capture", "main"]


@dataclass
class CaptureOutcome:
    """What `run_capture` saw: the command's exit code, and what its capture directory held."""

    returncode: int
    trace: DirectoryTrace

    @property
    def processes(self) -> list[ProcessInfo]:
        return self.trace.processes

    @property
    def partial(self) -> list[ProcessInfo]:
        return [p for p in self.trace.processes if not p.complete]


def run_capture(
    command: list[str],
    output: str | os.PathLike[str],
    *,
    by: str = "message",
    raw_dir: str | os.PathLike[str] | None = None,
    mode: str = "events",
) -> CaptureOutcome:
    """Run `command` under the capture tool; write the Chrome trace to `output`; return the outcome.

    raw_dir: keep the per-process event files there (default: a temporary
    directory, removed afterwards). Raises `CommandError` when the command
    cannot start or the tool cannot be built.
    """
    from ..capture.build import CaptureUnavailable, build_tool

    try:
        tool = build_tool()
    except CaptureUnavailable as error:
        raise CommandError(f"the NVTX capture tool cannot be built here: {error}") from None
    if os.environ.get(ENV_INJECTION) and "nvtx_capture-" not in os.environ[ENV_INJECTION]:
        raise CommandError(
            f"{ENV_INJECTION} already names another NVTX tool ({os.environ[ENV_INJECTION]}); "
            "NVTX takes one tool per process: unset it, or do not run capture under Nsight"
        )
    made_dir = raw_dir is None
    directory = Path(tempfile.mkdtemp(prefix="nvtx_capture-") if made_dir else raw_dir)
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("nvtx-*.jsonl"):
        stale.unlink()
    try:
        env = {**os.environ, ENV_INJECTION: str(tool), ENV_DIR: str(directory), ENV_MODE: mode}
        returncode = run_child(command, env)
        output = Path(output)
        if output.parent != Path(""):
            output.parent.mkdir(parents=True, exist_ok=True)
        with open(output, "w", encoding="utf-8") as stream:
            trace = write_directory_trace(directory, stream, by=by)
    finally:
        if made_dir:
            shutil.rmtree(directory, ignore_errors=True)
    return CaptureOutcome(returncode, trace)


def report(outcome: CaptureOutcome, output: str, command: list[str]) -> str:
    """The text printed after the command ends: the summary, where the trace is, and what is partial."""
    trace = outcome.trace
    lines = [str(trace.summary), ""]
    n = len(outcome.processes)
    lines.append(
        f"nvtx-regions capture: {trace.ranges} ranges and {trace.marks} marks from {n} "
        f"process{'es' * (n != 1)} written to {output} (open it in https://ui.perfetto.dev or chrome://tracing)"
    )
    if outcome.returncode < 0:
        lines.append(f"nvtx-regions capture: {command[0]} was killed by {signal_name(outcome.returncode)}")
    elif outcome.returncode:
        lines.append(f"nvtx-regions capture: {command[0]} exited with status {outcome.returncode}")
    if outcome.partial:
        which = ", ".join(f"rank {p.rank} (pid {p.pid})" if p.rank is not None else f"pid {p.pid}" for p in outcome.partial)
        lines.append(
            f"nvtx-regions capture: the capture is partial: {which} did not exit normally; "
            "the trace holds its events up to that point, and ranges it left open are marked unclosed"
        )
    if not outcome.processes:
        lines.append("nvtx-regions capture: no process made an NVTX call")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Entry point of ``nvtx-regions capture`` (argv after the subcommand name)."""
    import argparse

    usage = "nvtx-regions capture -o timeline.json -- python train.py"
    parser = argparse.ArgumentParser(
        prog="nvtx-regions capture",
        usage="nvtx-regions capture [-o FILE] [--summary-by {message,label}] [--raw-dir DIR] -- COMMAND...",
        description="Run COMMAND with the NVTX capture tool; write a Chrome trace; print an nvtx_sum-like summary.",
    )
    parser.add_argument("-o", "--output", default="timeline.json", help="Chrome trace file (default: timeline.json)")
    parser.add_argument("--summary-by", choices=("message", "label"), default="message",
                        help="one row per message (default), or per rule (NVTX category)")  # fmt: skip
    parser.add_argument("--raw-dir", help="keep each process's event stream (nvtx-<pid>.jsonl) in this directory")
    parsed = parse_command_line(parser, argv, usage)
    if parsed is None:
        return 0
    args, command = parsed
    outcome = run_capture(command, args.output, by=args.summary_by, raw_dir=args.raw_dir)
    sys.stdout.flush()
    print(report(outcome, args.output, command), flush=True)
    return exit_status(outcome.returncode)
