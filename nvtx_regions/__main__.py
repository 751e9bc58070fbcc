"""Command line: check spec files, print the grammar.

    nvtx-regions check regions.nvtx [more.nvtx ...]   # or: python -m nvtx_regions check ...
    nvtx-regions check -                              # the spec on standard input
    nvtx-regions grammar
"""

from __future__ import annotations

import argparse
import sys

from .compile import compile_spec
from .errors import SelectorError
from .parse import grammar_resource, grammar_text, load, parse
from .tree import render


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nvtx-regions", description="Check nvtx_regions spec files.")
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="parse and compile .nvtx files; print each rule in canonical form")
    check.add_argument("files", nargs="+", help='.nvtx files; "-" reads the spec from standard input')
    commands.add_parser("grammar", help="print the grammar (the one definition of the syntax)")
    args = parser.parse_args(argv)

    if args.command == "grammar":
        print(f"# {grammar_resource()}")
        print(grammar_text(), end="")
        return 0
    status = 0
    for path in args.files:
        try:
            spec = parse(sys.stdin.read(), filename="<stdin>") if path == "-" else load(path)
            compile_spec(spec)
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


if __name__ == "__main__":
    sys.exit(main())
