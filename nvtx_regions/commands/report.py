"""``nvtx-regions report FILE...``: the NVTX ranges of a real profile, summarized.

    nvtx-regions report nvtx_regions_report.nsys-rep          # or its .sqlite (nsys export --type sqlite)
    nvtx-regions report nvtx_regions_report.rank*.nsys-rep --domain nvtx_regions
    nvtx-regions report timeline.json                          # a capture of ours, read the same way

Reads Nsight Systems reports (`report.nsys_report`) or our capture's Chrome
traces (`capture.chrome.load_chrome_trace`) and prints, for all the files
together:

- per range: the table ``nvtx-regions capture`` prints (one row per domain and
  message, as ``nsys stats --report nvtx_sum``);
- per rule: the same table with one row per NVTX category, which
  nvtx_regions names after each rule's label (``--summary-by label``);
- per module: the ranges of ``each module``/``each class`` rules (a message
  that is a module path, ``transformer.h.0``, with ``" (backward)"`` on the
  backward one), forward and backward side by side;
- GPU-projected time per range beside its CPU time, where the report holds
  CUDA kernels (as nsys's ``nvtxgpuproj``); otherwise a line that says so.
"""

from __future__ import annotations

import sys

from ..core.errors import CaptureFileError
from ..report.records import load_records, render_report

__all__ = ["main"]


def main(argv: list[str]) -> int:
    """Entry point of ``nvtx-regions report`` (argv after the subcommand name)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="nvtx-regions report",
        description="Summarize the NVTX ranges of Nsight Systems reports (.nsys-rep, or .sqlite from "
        "'nsys export --type sqlite') or of captures (.json): per range, per rule, per module.",
    )
    parser.add_argument("files", nargs="+", help="reports, summarized together (e.g. one per collection or rank)")
    parser.add_argument("--domain", help="only this NVTX domain's ranges")
    args = parser.parse_args(argv)
    try:
        records, reports = load_records(args.files, domain=args.domain)
    except CaptureFileError as error:
        print(f"nvtx-regions report: {error}", file=sys.stderr)
        return 1
    print(render_report(records, reports))
    if not records:
        print(f"nvtx-regions report: no NVTX ranges{' in domain ' + repr(args.domain) if args.domain else ''}", file=sys.stderr)
        return 1
    return 0
