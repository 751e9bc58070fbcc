"""Command line: check spec files, print the grammar, and look at ranges before the GPU run.

    nvtx-regions check regions.nvtx [more.nvtx ...]   # or: python -m nvtx_regions check ...
    nvtx-regions check -                              # the spec on standard input
    nvtx-regions grammar
    nvtx-regions capture -o timeline.json -- python train.py     # commands/capture.py
    nvtx-regions nsys regions.nvtx -- python train.py            # commands/nsys.py
    nvtx-regions explain regions.nvtx -- python train.py         # commands/explain.py
    nvtx-regions compare eager.json thunder.json                  # commands/compare.py
    nvtx-regions report nvtx_regions_report.nsys-rep              # commands/report.py
    nvtx-regions --version
"""

from __future__ import annotations

import argparse
import sys

from ..core.errors import SelectorError
from ..language.parse import grammar_resource, grammar_text, load, parse_bytes
from ..language.tree import render
from ..selection.compile import compile_spec
from .child import CommandError


# Commands that run another command after `--`; each module parses its own options.
RUNNERS = {
    "capture": ("capture", "run a command with NVTX capture; write a Chrome trace; print a summary"),
    "nsys": ("nsys", "print the nsys profile command line that fits a spec"),
    "explain": ("explain", "run a script and print explain() for each function it jits"),
    "profile": ("profile", "run a script once per backend (eager, thunder, inductor); per module, time side by side"),
}


def _run_command(name: str, argv: list[str]) -> int:
    import importlib

    module = importlib.import_module(f".{RUNNERS[name][0]}", __package__)
    try:
        return module.main(argv)
    except (CommandError, SelectorError) as error:
        print(f"nvtx-regions {name}: {error}", file=sys.stderr)
        return 2


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nvtx_regions")
    except PackageNotFoundError:
        return "(not installed: running from a source tree)"


def _read_stdin() -> bytes:
    """The spec bytes on standard input (decoded by `parse_bytes`); `CommandError` when there is none to read."""
    if sys.stdin is None:
        raise CommandError("-: standard input is closed; pipe the spec in (nvtx-regions check - < spec.nvtx) or give a file")
    try:
        data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read()
    except OSError as error:
        raise CommandError(f"-: cannot read standard input ({error.strerror or error}); give a file instead") from None
    return data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in RUNNERS:
        return _run_command(argv[0], argv[1:])
    if argv and argv[0] == "report":
        from .report import main as report_main

        return report_main(argv[1:])
    parser = argparse.ArgumentParser(prog="nvtx-regions", description="Check nvtx_regions spec files; see and summarize NVTX ranges before the GPU run.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="parse and compile .nvtx files; print each rule in canonical form")
    check.add_argument("files", nargs="+", help='.nvtx files; "-" reads the spec from standard input')
    commands.add_parser("grammar", help="print the grammar (the one definition of the syntax)")
    for name, (_, text) in RUNNERS.items():
        commands.add_parser(name, help=f"{text} (nvtx-regions {name} --help)")
    commands.add_parser("report", help="summarize nsys reports (.nsys-rep, .sqlite) or captures per range, rule and module (nvtx-regions report --help)")
    compare = commands.add_parser("compare", help="two captures (Chrome trace JSON) or nsys reports side by side per range name")
    compare.add_argument("a", help="the first capture: a Chrome trace JSON file (nvtx-regions capture -o A.json) or an nsys report (.nsys-rep, .sqlite)")
    compare.add_argument("b", help="the second capture, compared with the first (ratio: b / a)")
    compare.add_argument("--domain", help="only this NVTX domain's ranges (NVTX: the default domain)")
    compare.add_argument("--names", nargs=2, metavar=("A", "B"), help="column names (default: the file names)")
    args = parser.parse_args(argv)

    if args.command == "compare":
        from .compare import compare_main

        return compare_main(args)

    if args.command == "grammar":
        print(f"# {grammar_resource()}")
        print(grammar_text(), end="")
        return 0
    status = 0
    for path in args.files:
        try:
            spec = parse_bytes(_read_stdin(), "<stdin>") if path == "-" else load(path)
            compile_spec(spec)
        except CommandError as error:
            print(f"nvtx-regions check: {error}", file=sys.stderr)
            status = 2
            continue
        except SelectorError as error:
            print(error, file=sys.stderr)
            status = 1
            continue
        if not spec.rules:
            print(f"{spec.filename}: no rules (only blank lines and comments), so it selects nothing", file=sys.stderr)
            status = 1
            continue
        for rule in spec.rules:
            print(f"{spec.filename}:{rule.line}: {render(rule)}")
    return status

