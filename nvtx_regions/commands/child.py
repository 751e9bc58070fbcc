"""Running the user's command as a child process: the command line's ``--`` split
and help, signal forwarding, and exit statuses as a shell reports them. Shared
by every command that runs another command (capture, explain, nsys)."""

from __future__ import annotations

import argparse
import signal
import subprocess

__all__ = ["CommandError", "parse_command_line", "split_command", "exit_status", "signal_name", "run_child"]


class CommandError(Exception):
    """A usage error of a subcommand: the message says what to do; no traceback is shown."""


def split_command(argv: list[str], usage: str) -> tuple[list[str], list[str]]:
    """Split ``[options..., "--", command...]``; raise `CommandError` naming the fix when either part is missing."""
    if "--" not in argv:
        raise CommandError(f"put the command to run after `--`, for example: {usage}")
    at = argv.index("--")
    options, command = argv[:at], argv[at + 1 :]
    if not command:
        raise CommandError(f"nothing to run after `--`; give the command, for example: {usage}")
    return options, command


def parse_command_line(
    parser: argparse.ArgumentParser, argv: list[str], example: str
) -> tuple[argparse.Namespace, list[str]] | None:
    """Parse ``OPTIONS -- COMMAND...``: (options parsed by `parser`, COMMAND).

    Returns None after printing `parser`'s help when ``-h``/``--help`` is
    among the options (anywhere before ``--``). Raises `CommandError` naming
    the fix, with `example`, when ``--`` or the command is missing.
    """
    options = argv[: argv.index("--")] if "--" in argv else argv
    if "-h" in options or "--help" in options:
        parser.print_help()
        return None
    options, command = split_command(argv, example)
    return parser.parse_args(options), command


def exit_status(returncode: int) -> int:
    """A child's exit status as a shell reports it: 128 + N for death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def run_child(command: list[str], env: dict[str, str]) -> int:
    """Run `command` with inherited stdio; outlive SIGINT, forward SIGTERM and SIGHUP. Returns its returncode."""
    try:
        proc = subprocess.Popen(command, env=env)
    except FileNotFoundError:
        raise CommandError(f"cannot run {command[0]!r}: no such program (is it on PATH?)") from None
    except PermissionError:
        raise CommandError(f"cannot run {command[0]!r}: not executable") from None

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
