"""Command line: check spec files, print the grammar.

    nvtx-regions check regions.nvtx [more.nvtx ...]   # or: python -m nvtx_regions check ...
    nvtx-regions grammar
"""

from __future__ import annotations

import argparse
import sys

from .compile import compile_spec
from .errors import SelectorError
from .parse import grammar_resource, grammar_text, load
from .tree import render


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nvtx-regions", description="Check nvtx_regions spec files.")
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="parse and compile .nvtx files; print each rule in canonical form")
    check.add_argument("files", nargs="+")
    commands.add_parser("grammar", help="print the grammar (the one definition of the syntax)")
    # -- compare (issue 10) --
    compare = commands.add_parser("compare", help="two capture files (Chrome trace JSON) side by side per range name")
    compare.add_argument("a")
    compare.add_argument("b")
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
            spec = load(path)
            compile_spec(spec)
        except SelectorError as error:
            print(error, file=sys.stderr)
            status = 1
            continue
        for rule in spec.rules:
            print(f"{path}:{rule.line}: {render(rule)}")
    return status


if __name__ == "__main__":
    sys.exit(main())
