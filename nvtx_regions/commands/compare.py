"""``nvtx-regions compare A B``: two captures side by side (`report.compare`)."""

from __future__ import annotations

from typing import Any

from ..core.errors import CaptureFileError
from ..capture.chrome import DEFAULT_DOMAIN_CAT
from ..report.compare import _ANY, compare, load_ranges, render_table

__all__ = ["compare_main"]


def compare_main(args: Any) -> int:
    """``nvtx-regions compare``: print the table; errors go to stderr with status 1."""
    import sys
    from pathlib import Path

    names = args.names or [Path(args.a).stem, Path(args.b).stem]
    if names[0] == names[1]:
        names = [args.a, args.b]
    domain = _ANY if args.domain is None else None if args.domain == DEFAULT_DOMAIN_CAT else args.domain
    try:
        rows = compare(args.a, args.b, domain=domain)
    except CaptureFileError as error:
        print(f"nvtx-regions compare: {error}", file=sys.stderr)
        return 1
    if not rows:
        print(f"nvtx-regions compare: {_nothing_to_compare(args, domain)}", file=sys.stderr)
        return 1
    print(render_table(rows, *names))
    return 0


def _nothing_to_compare(args: Any, domain: Any) -> str:
    """Why there are no rows: no ranges at all, or none in the domain asked for (naming those there are)."""
    if domain is _ANY:
        return "no complete ('ph': 'X') range events in either file"
    present = {d for path in (args.a, args.b) for d, _, _ in load_ranges(path)}
    if not present:
        return "no complete ('ph': 'X') range events in either file"
    names = ", ".join(sorted(DEFAULT_DOMAIN_CAT if d is None else d for d in present))
    return f"no ranges of domain {args.domain!r} in either file; the domains there are: {names} (pass one to --domain)"
