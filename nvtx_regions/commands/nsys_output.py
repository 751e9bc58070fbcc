"""What nsys itself prints, kept apart from the output of the program it runs.

    run_child(argv, env, stdout_to=progress_apart(folder / NSYS_LOG))

nsys writes its own lines to its standard output, where the program's output
goes too: per report a progress bar redrawn with carriage returns, about 800
characters a report, which came before the table ``nvtx-regions profile``
prints. `progress_apart` reads that output line by line and sends nsys's own
lines to a log file (``BACKEND/nsys.txt``), the program's to this process's
standard output.
"""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

__all__ = ["NSYS_LOG", "NSYS_PROGRESS", "is_nsys_progress", "progress_apart"]

# What nsys itself prints on its standard output, where the program's own output goes too (nsys
# 2022.4.2): "Generating '/tmp/nsys-report-6bc6.qdstrm'", then per report a progress bar redrawn
# with carriage returns ("[1/1] [====27%      ] report.nsys-rep", about 800 characters a report, one line),
# "Generated:" and each report's path, indented.
NSYS_PROGRESS = re.compile(r"Generating '[^']*'|\[\d+/\d+\] \[[= ]*\d+%[= ]*\] \S.*|Generated:|\s+/.*\.(?:nsys-rep|qdrep|qdstrm|sqlite)")
NSYS_LOG = "nsys.txt"


def is_nsys_progress(line: bytes) -> bool:
    """Whether a line of nsys's standard output (its newline included) is nsys's own (`NSYS_PROGRESS`):
    each part of it between carriage returns is."""
    parts = [part for part in line.decode("utf-8", "replace").rstrip("\r\n").split("\r") if part]
    return bool(parts) and all(NSYS_PROGRESS.fullmatch(part) for part in parts)


def progress_apart(log: Path) -> Callable[[IO[bytes]], threading.Thread]:
    """For `child.run_child`'s ``stdout_to``: a thread that reads nsys's standard output line by line,
    writes nsys's own lines (`is_nsys_progress`) to `log` and the program's to this process's standard
    output, until EOF. A reader of ours that went away (``| head``) stops the showing, not the reading."""

    def start(source: IO[bytes]) -> threading.Thread:
        def pump() -> None:
            shown = True
            with source, open(log, "wb") as kept:
                for line in source:
                    if is_nsys_progress(line):
                        kept.write(line)
                        kept.flush()
                    elif shown:
                        try:
                            sys.stdout.buffer.write(line)
                            sys.stdout.flush()
                        except (OSError, ValueError):  # BrokenPipeError, a closed stdout
                            shown = False

        thread = threading.Thread(target=pump, name="nvtx-regions-nsys-stdout", daemon=True)
        thread.start()
        return thread

    return start
