"""The ``nvtx-regions`` command line: one parser, one subcommand per module, one error handler.

    nvtx-regions check regions.nvtx [more.nvtx ...]   # or: python -m nvtx_regions check ...
    nvtx-regions grammar
    nvtx-regions capture -o timeline.json -- python train.py
    nvtx-regions nsys regions.nvtx -- python train.py
    nvtx-regions explain regions.nvtx -- python train.py
    nvtx-regions report nvtx_regions_report.nsys-rep
    nvtx-regions compare eager.json thunder.json
    nvtx-regions --version

Each command is a module of this package (named as the command) with
``HELP`` (its line in ``nvtx-regions --help``), ``DESCRIPTION``,
``add_arguments(parser)`` and ``run(args) -> int``; a runner (a command that
runs another command after ``--``) also has ``USAGE`` and ``EXAMPLE``.
`build_parser` builds the one parser with a subparser per command;
`command_parsers` gives each subparser, in help order (the CLI reference is
generated from their ``format_help()``). `main` splits a runner's command off
at the first ``--``, parses the rest with that parser (the command is then
``args.command``), runs the command and maps errors to the exit statuses of
`commands.status`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from ..core.errors import CaptureFileError, SelectorError
from .status import CLOSED_PIPE, EPILOG, PROBLEM_FOUND, USAGE_ERROR, UsageError

__all__ = ["COMMANDS", "RUNNERS", "build_parser", "command_parsers", "main"]

# In help order. A new command is a module here and a name in this tuple.
COMMANDS = ("check", "grammar", "capture", "nsys", "explain", "profile", "report", "compare")
# The commands that run another command, given after `--`.
RUNNERS = ("capture", "nsys", "explain", "profile")


_RUNNER_EPILOG = "COMMAND: the command to run, after `--`; everything after the first `--` is its own."


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nvtx_regions")
    except PackageNotFoundError:
        return "(not installed: running from a source tree)"


def _build() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(
        prog="nvtx-regions",
        description="Check nvtx_regions spec files; see and summarize NVTX ranges before the GPU run.",
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    subparsers = parser.add_subparsers(dest="name", required=True)
    parsers = {}
    for name in COMMANDS:
        module = importlib.import_module(f".{name}", __package__)
        sub = subparsers.add_parser(
            name, help=module.HELP, description=module.DESCRIPTION, usage=getattr(module, "USAGE", None),
            epilog=_RUNNER_EPILOG if name in RUNNERS else None,
        )  # fmt: skip
        module.add_arguments(sub)
        sub.set_defaults(run=module.run, example=getattr(module, "EXAMPLE", None))
        parsers[name] = sub
    return parser, parsers


def build_parser() -> argparse.ArgumentParser:
    """The ``nvtx-regions`` parser: a subparser per command (`COMMANDS`), the exit statuses in its epilog."""
    return _build()[0]


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    """Each command's own parser (``prog`` is ``nvtx-regions NAME``), in help order."""
    return _build()[1]


def _split_child(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """(the options, a runner's command after the first ``--``, or None when there is no ``--``)."""
    if argv and argv[0] in RUNNERS and "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1 :]
    return argv, None


def _child_command(child: list[str] | None, example: str) -> list[str]:
    if child is None:
        raise UsageError(f"put the command to run after `--`, for example: {example}")
    if not child:
        raise UsageError(f"nothing to run after `--`; give the command, for example: {example}")
    return child


def main(argv: list[str] | None = None) -> int:
    """Run ``nvtx-regions ARGV``; return the exit status (`commands.status`).

    ``--help``, ``--version`` and argparse's usage errors raise `SystemExit`
    (status 0 or 2) as argparse does.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    options, child = _split_child(argv)
    parser = build_parser()
    if child is None and options and options[0] in RUNNERS:
        # No `--`: argparse still answers --help and bad options; then the missing command is the error.
        args, _ = parser.parse_known_args(options)
    else:
        args = parser.parse_args(options)
    try:
        if args.name in RUNNERS:
            args.command = _child_command(child, args.example)
        status = args.run(args)
        sys.stdout.flush()  # a pipe closed early shows here, not as Python exits
        return status
    except BrokenPipeError:
        # The reader closed the pipe (`... | head -1`): stop quietly, as `cat` does, with the status of a
        # process ended by SIGPIPE; what is left to flush goes nowhere, or Python's exit would raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return CLOSED_PIPE
    except (UsageError, SelectorError) as error:
        print(f"nvtx-regions {args.name}: {error}", file=sys.stderr)
        return USAGE_ERROR
    except CaptureFileError as error:
        print(f"nvtx-regions {args.name}: {error}", file=sys.stderr)
        return PROBLEM_FOUND
