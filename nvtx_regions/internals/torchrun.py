"""torchrun's command line, as torch's own parser reads it: which part is the launcher, which the worker program.

    split_torchrun(["torchrun", "--nproc_per_node=2", "train.py", "--steps", "3"])
    # (["torchrun", "--nproc_per_node=2"], ["/venv/bin/python3", "-u", "train.py", "--steps", "3"])

What this knows of torch: ``torch.distributed.run.get_args_parser()`` parses
torchrun's arguments (``training_script``, ``training_script_args``,
``no_python``, ``module``); torchrun starts a worker as ``PYTHON -u SCRIPT``
(``-m MODULE`` with ``--module``; the program itself with ``--no-python``),
where PYTHON is ``$PYTHON_EXEC``, else torchrun's own ``sys.executable``.
Checked on torch 2.11 and 2.14. Without it, ``nvtx-regions nsys`` could not
put nsys inside each worker (one report per rank).

What torchrun and torch.distributed print when a worker fails (`failed_workers`,
`rank_lines`): torchrun's report of failed workers (torch.distributed.elastic's
``ChildFailedError.format_msg``: per worker a block with ``rank : R (local_rank: L)``
and ``exitcode : C (pid: P)``, the first to fail under ``Root Cause``), and the
``[rankR]: `` that ``init_process_group`` puts before each line of an uncaught
exception (``_distributed_excepthook``). Checked on torch 2.11. Without it,
``nvtx-regions profile`` could tell neither which rank failed nor why.

Errors are ValueErrors; the command that calls this says them in its words.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections.abc import Sequence

__all__ = ["TorchrunError", "failed_workers", "first_raised", "rank_lines", "script_interpreter", "split_torchrun", "torchrun_start",
           "worker_python"]  # fmt: skip

# The options that choose the worker program: left out of the launcher part, which then takes --no-python.
_CHOOSERS = frozenset({"--no-python", "--no_python", "-m", "--module", "--run-path", "--run_path"})


class TorchrunError(ValueError):
    """A torchrun command this cannot split: its arguments do not parse, or its interpreter cannot be found."""


def torchrun_start(command: Sequence[str]) -> int | None:
    """Where torchrun's own arguments start in `command` (``torchrun ...`` or
    ``PYTHON [options] -m torch.distributed.run ...``), or None when it is not a torchrun command."""
    if not command:
        return None
    if os.path.basename(command[0]) == "torchrun":
        return 1
    for i in range(1, len(command) - 1):
        if list(command[i : i + 2]) == ["-m", "torch.distributed.run"]:
            return i + 2
        if not command[i].startswith("-"):  # the interpreter's options end here
            return None
    return None


# pip writes `#!/bin/sh` and this second line when the interpreter's path is too long for `#!`.
_SH_EXEC = re.compile(r"""^'''exec' "?(?P<python>[^"]+?)"? "\$0" "\$@"$""")


def script_interpreter(script: str) -> str | None:
    """The interpreter a console script such as ``torchrun`` runs under, from its first lines; None when it has no ``#!``."""
    try:
        with open(script, "rb") as f:
            head = f.read(1024).decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    if not head or not head[0].startswith("#!"):
        return None
    words = head[0][2:].split()
    if not words:
        return None
    if os.path.basename(words[0]) == "env" and len(words) > 1:
        return words[1]  # `#!/usr/bin/env python3`: the same name, found on PATH as the script's is
    if os.path.basename(words[0]) == "sh":
        match = next(filter(None, (_SH_EXEC.match(line) for line in head[1:3])), None)
        return match["python"] if match else None
    return words[0]


def worker_python(command: Sequence[str], start: int) -> str:
    """The interpreter torchrun runs each worker with: ``$PYTHON_EXEC``, else its own ``sys.executable``
    (the one before ``-m torch.distributed.run``, or the one in the ``#!`` line of the ``torchrun`` script).
    Raises `TorchrunError` when that script cannot be found or read."""
    if os.environ.get("PYTHON_EXEC"):
        return os.environ["PYTHON_EXEC"]
    if start > 1:
        return command[0]
    script = command[0] if os.sep in command[0] else shutil.which(command[0])
    interpreter = script_interpreter(script) if script else None
    if interpreter is None:
        raise TorchrunError(
            f"cannot tell which Python {command[0]!r} runs its workers with (not found, or no #! line); "
            "give its path (e.g. .venv/bin/torchrun), or use PYTHON -m torch.distributed.run"
        )
    return interpreter


def split_torchrun(command: Sequence[str]) -> tuple[list[str], list[str]] | None:
    """For a torchrun command: (launcher part, the program each worker runs); else None.

    Uses torchrun's own argument parser, so every torchrun option form works;
    its errors are printed by that parser on stderr, then raised as
    `TorchrunError`. The launcher part is torchrun's options less those that
    choose the worker program; the worker program is what torchrun would run
    (see the module doc).
    """
    command = list(command)
    start = torchrun_start(command)
    if start is None:
        return None
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    parser.prog = os.path.basename(command[0]) if start == 1 else shlex.join(command[:start])
    try:
        args = parser.parse_args(command[start:])
    except SystemExit:
        raise TorchrunError(
            f"{parser.prog} cannot parse its arguments (its message is above); fix them, then run this again"
        ) from None
    tail = 1 + len(args.training_script_args)
    options = command[start : len(command) - tail]
    if args.no_python:
        worker = [args.training_script, *args.training_script_args]
    elif args.module:
        worker = [worker_python(command, start), "-u", "-m", args.training_script, *args.training_script_args]
    else:
        worker = [worker_python(command, start), "-u", args.training_script, *args.training_script_args]
    return [*command[:start], *(w for w in options if w not in _CHOOSERS)], worker


# torchrun's report of failed workers: a title line "<script> FAILED", then a block per worker.
_REPORT_TITLE = re.compile(r"^\S.* FAILED$", re.M)
_WORKER = re.compile(r"^\s*rank\s*: (\d+) \(local_rank: \d+\)\n\s*exitcode\s*: (-?\d+) \(pid: \d+\)", re.M)
_ROOT_CAUSE = "Root Cause (first observed failure):"
_RANK_PREFIX = re.compile(r"^\[rank(\d+)\]: ?(.*)$")


def failed_workers(stderr: str) -> tuple[dict[int, int], int | None]:
    """From torchrun's `stderr`, its last report of failed workers: each failed worker's exit status by
    rank (-N: killed by signal N), and the rank that failed first (its ``Root Cause``); ({}, None)
    without a report."""
    titles = list(_REPORT_TITLE.finditer(stderr))
    if not titles:
        return {}, None
    report = stderr[titles[-1].end() :]
    failed = {int(rank): int(code) for rank, code in _WORKER.findall(report)}
    root = _WORKER.search(report, report.find(_ROOT_CAUSE)) if _ROOT_CAUSE in report else None
    return failed, int(root[1]) if root else None


def rank_lines(stderr: str, rank: int) -> list[str]:
    """The lines of `stderr` that rank `rank` printed with torch.distributed's ``[rankR]: `` prefix (its
    uncaught exceptions after ``init_process_group``), without the prefix."""
    lines = []
    for line in stderr.splitlines():
        match = _RANK_PREFIX.match(line)
        if match and int(match[1]) == rank:
            lines.append(match[2])
    return lines


def first_raised(stderr: str) -> int | None:
    """The rank whose uncaught exception (its ``[rankR]: Traceback ...`` line) comes first in `stderr`, where
    every rank writes as it goes; None if no rank printed one. The first to raise is the cause of the
    others' errors (a peer's closed connection). torchrun's root cause is the failure with the earliest
    time in whole seconds, the lowest rank among ties (`ChildFailedError.get_first_failure`, torch 2.11)."""
    for line in stderr.splitlines():
        match = _RANK_PREFIX.match(line)
        if match and match[2].startswith("Traceback (most recent call last):"):
            return int(match[1])
    return None
