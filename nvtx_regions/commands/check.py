"""``nvtx-regions check FILE...``: parse and compile spec files; print each rule in canonical form.

    nvtx-regions check regions.nvtx [more.nvtx ...]
    nvtx-regions check -                              # the spec on standard input

Every file is checked, one error each on standard error (``spec.nvtx:3:5:
message``). Exit status: 2 when a file does not parse or compile (a spec
error), else 1 when one has no rules (it would select nothing), else 0.
"""

from __future__ import annotations

import argparse
import sys

from ..core.errors import SelectorError
from ..language.parse import NO_RULES, load, parse_bytes
from ..language.tree import render
from ..selection.compile import compile_spec
from .status import OK, PROBLEM_FOUND, USAGE_ERROR, UsageError

__all__ = ["HELP", "DESCRIPTION", "add_arguments", "run"]

HELP = "parse and compile .nvtx files; print each rule in canonical form"
DESCRIPTION = "Parse and compile .nvtx spec files; print each rule in canonical form, or each error with its place."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", help='.nvtx files; "-" reads the spec from standard input')


def _read_stdin() -> bytes:
    """The spec bytes on standard input (decoded by `parse_bytes`); `UsageError` when there is none to read."""
    if sys.stdin is None:
        raise UsageError("-: standard input is closed; pipe the spec in (nvtx-regions check - < spec.nvtx) or give a file")
    try:
        data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read()
    except OSError as error:
        raise UsageError(f"-: cannot read standard input ({error.strerror or error}); give a file instead") from None
    return data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data


def run(args: argparse.Namespace) -> int:
    spec_errors = no_rules = False
    for path in args.files:
        try:
            spec = parse_bytes(_read_stdin(), "<stdin>") if path == "-" else load(path)
            compile_spec(spec)
        except UsageError as error:
            print(f"nvtx-regions check: {error}", file=sys.stderr)
            spec_errors = True
            continue
        except SelectorError as error:
            print(error, file=sys.stderr)  # it starts with the file, line and column
            spec_errors = True
            continue
        if not spec.rules:
            print(f"{spec.filename}: {NO_RULES}", file=sys.stderr)
            no_rules = True
            continue
        for rule in spec.rules:
            print(f"{spec.filename}:{rule.line}: {render(rule)}")
    return USAGE_ERROR if spec_errors else PROBLEM_FOUND if no_rules else OK
