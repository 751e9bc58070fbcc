"""``nvtx-regions compare A B``: two captures side by side per range name (`report.compare`).

Exit status (`commands.status`): 1 when a file cannot be read or there is
nothing to compare (in the ``--domain`` asked for).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..core.naming import ANY_DOMAIN
from .domain import add_domain_option, domain_word
from .status import OK, PROBLEM_FOUND

__all__ = ["HELP", "DESCRIPTION", "add_arguments", "run"]

HELP = "two captures (Chrome trace JSON) or nsys reports side by side per range name"
DESCRIPTION = "Two captures (Chrome trace JSON) or nsys reports side by side per range name: counts, medians, ratio."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", help="the first capture: a Chrome trace JSON file (nvtx-regions capture -o A.json) or an nsys report (.nsys-rep, .sqlite)")  # fmt: skip
    parser.add_argument("b", help="the second capture, compared with the first (ratio: b / a)")
    add_domain_option(parser, "only this NVTX domain's ranges (default: every domain)", default=ANY_DOMAIN)
    parser.add_argument("--names", nargs=2, metavar=("A", "B"), help="column names (default: the file names)")


def run(args: argparse.Namespace) -> int:
    from ..report.compare import compare, render_table

    names = args.names or [Path(args.a).stem, Path(args.b).stem]
    if names[0] == names[1]:
        names = [args.a, args.b]
    rows = compare(args.a, args.b, domain=args.domain)
    if not rows:
        print(f"nvtx-regions compare: {_nothing_to_compare(args)}", file=sys.stderr)
        return PROBLEM_FOUND
    print(render_table(rows, *names))
    return OK


def _nothing_to_compare(args: argparse.Namespace) -> str:
    """Why there are no rows: no ranges at all, or none in the domain asked for (naming those there are)."""
    from ..report.reader import read_ranges

    present = set() if args.domain is ANY_DOMAIN else read_ranges([args.a, args.b], domain=args.domain).domains
    if not present:
        return "no complete ('ph': 'X') range events in either file"
    there = ", ".join(sorted(map(domain_word, present)))
    return (
        f"no ranges of domain {domain_word(args.domain)!r} in either file; the domains there are: {there} "
        "(pass one to --domain)"
    )
