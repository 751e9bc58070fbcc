"""The exit status of every ``nvtx-regions`` command, and the one error a command raises for a usage error.

======  ===========================================================================
status  meaning
======  ===========================================================================
0       ok
1       a problem found: the command ran and what it read shows a problem (no ranges,
        nothing to compare, a capture or report file that cannot be read, a spec with
        no rules, nothing jitted to explain, a trace that could not be written)
2       a usage or spec error: a bad command line, a spec that does not parse or
        compile, an output that cannot be used; nothing ran
141     the reader of standard output closed it early (``... | head -1``): the command
        stops quietly, with the status of a process SIGPIPE ended (128 + 13)
N       a runner's child (capture, explain): its own status, 128 + S when signal S
        killed it, as a shell reports it
======  ===========================================================================

`commands.main` maps `UsageError` and the spec's `SelectorError` to 2 and a
capture file's `CaptureFileError` to 1, with the message on one line of
standard error; argparse's own errors exit 2 too.
"""

from __future__ import annotations

__all__ = ["OK", "PROBLEM_FOUND", "USAGE_ERROR", "CLOSED_PIPE", "EPILOG", "UsageError", "child_status"]

OK = 0
PROBLEM_FOUND = 1
USAGE_ERROR = 2
CLOSED_PIPE = 128 + 13  # SIGPIPE

EPILOG = (
    "exit status: 0 ok; 1 a problem found (no ranges, nothing to compare, an unreadable capture "
    "or report); 2 a usage or spec error; 141 standard output closed early (| head); capture and explain "
    "pass their command's status through (128 + N when signal N killed it)"
)


class UsageError(Exception):
    """A command cannot run as asked: the message says what to do; it exits 2 and no traceback is shown."""


def child_status(returncode: int) -> int:
    """A child's exit status as a shell reports it: 128 + N for death by signal N."""
    return 128 - returncode if returncode < 0 else returncode
