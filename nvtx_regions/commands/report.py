"""``nvtx-regions report FILE...``: the NVTX ranges of a real profile, summarized.

    nvtx-regions report nvtx_regions_report.nsys-rep          # or its .sqlite (nsys export --type sqlite)
    nvtx-regions report nvtx_regions_report.rank*.nsys-rep --domain nvtx_regions
    nvtx-regions report nvtx_regions_report.nsys-rep --domain default   # NVTX's default domain
    nvtx-regions report timeline.json                          # a capture of ours, read the same way

Reads Nsight Systems reports or our capture's Chrome traces
(`report.reader.read_ranges`) and prints, for all the files together:

- per range: the table ``nvtx-regions capture`` prints (one row per domain and
  message, as ``nsys stats --report nvtx_sum``);
- per rule: the same table with one row per NVTX category, which
  nvtx_regions names after each rule's label (``--summary-by label``);
- per module: the ranges of ``each module``/``each class`` rules (a message
  that is a module path, ``transformer.h.0``, with ``" (backward)"`` on the
  backward one), forward and backward side by side, times as every table of
  ours gives them (`report.numbers`);
- GPU-projected time per range beside its CPU time, where the report holds
  CUDA kernels (as nsys's ``nvtxgpuproj``); otherwise a line that says so.

Exit status (`commands.status`): 1 when a file cannot be read or there are
no ranges (in the ``--domain`` asked for).
"""

from __future__ import annotations

import argparse
import sys

from ..core.naming import ANY_DOMAIN
from .domain import add_domain_option, domain_word
from .status import OK, PROBLEM_FOUND

__all__ = ["HELP", "DESCRIPTION", "add_arguments", "run"]

HELP = "summarize nsys reports (.nsys-rep, .sqlite) or captures per range, rule and module"
DESCRIPTION = (
    "Summarize the NVTX ranges of Nsight Systems reports (.nsys-rep, or .sqlite from "
    "'nsys export --type sqlite') or of captures (.json): per range, per rule, per module."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", help="reports, summarized together (e.g. one per collection or rank)")
    add_domain_option(parser, "only this NVTX domain's ranges (default: every domain)", default=ANY_DOMAIN)


def run(args: argparse.Namespace) -> int:
    from ..report.reader import read_ranges
    from ..report.records import render_report

    ranges = read_ranges(args.files, domain=args.domain)
    print(render_report(ranges))
    if not ranges.records:
        where = "" if args.domain is ANY_DOMAIN else f" in domain {domain_word(args.domain)!r}"
        print(f"nvtx-regions report: no NVTX ranges{where}", file=sys.stderr)
        return PROBLEM_FOUND
    return OK
