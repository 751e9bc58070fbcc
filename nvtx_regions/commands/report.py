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

Given the output folders of ``nvtx-regions profile`` instead (one per node of
a run over several nodes), it merges them into one run and prints the table
``profile`` prints: every rank, the slowest named per module and pass
(`commands.profile_folder` reads them; `-o NEW` also writes the table,
``profile.csv`` and the chart there). Nothing in the folders is changed.

Exit status (`commands.status`): 1 when a file cannot be read or there are
no ranges (in the ``--domain`` asked for), or when merged folders lack a
rank; 2 when the folders are not of one run (their spec, backends or options
differ, they come from different jobs, a rank is in two of them), a folder is
no profile output, or a name given beside folders does not exist.

A folder records which job it came from (`commands.profile_folder.Job`: torchrun's
run id and rendezvous endpoint, and when its runs started and ended): the halves of
two runs of the same command are refused, as their times do not overlap.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..core.naming import ANY_DOMAIN
from .domain import add_domain_option, domain_word
from .status import OK, PROBLEM_FOUND, UsageError

__all__ = ["HELP", "DESCRIPTION", "add_arguments", "run"]

HELP = "summarize nsys reports (.nsys-rep, .sqlite) or captures per range, rule and module; merge profile folders"
DESCRIPTION = (
    "Summarize the NVTX ranges of Nsight Systems reports (.nsys-rep, or .sqlite from "
    "'nsys export --type sqlite') or of captures (.json): per range, per rule, per module. "
    "Given the output folders of 'nvtx-regions profile' (one per node), print their ranks in one table."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "files", nargs="+", help="reports, summarized together (e.g. one per collection or rank); or profile output folders, merged"
    )
    add_domain_option(parser, "only this NVTX domain's ranges (default: every domain)", default=ANY_DOMAIN)
    parser.add_argument(
        "-o", "--output", metavar="NEW", help="with profile folders: a new folder for the merged table, profile.csv and chart"
    )


def merge(folders: list[Path], output: str | None) -> int:
    """Profile folders (one per node) merged into one table (see the module doc)."""
    from ..core.table import terminal_width
    from ..language.parse import parse
    from ..selection.compile import compile_spec
    from .profile import render_runs, write_outputs
    from .profile_folder import missing_words, read_folders

    target = Path(output) if output is not None else None
    if target is not None and (target.exists() or target.is_symlink()):
        raise UsageError(f"-o {output}: exists; give a new folder (nothing is overwritten)")
    manifest, runs = read_folders(folders)
    options = dict(baseline=manifest.baseline, warmup=manifest.warmup, spec=compile_spec(parse(manifest.spec)), rank=None,
                   distributed=manifest.world_size == 1)  # fmt: skip
    table, text = render_runs(runs, **options)  # every column, for the file
    print(render_runs(runs, **options, width=terminal_width())[1])
    if target is not None:
        try:
            target.mkdir(parents=True)
        except OSError as error:
            raise UsageError(f"-o {output}: cannot create it ({error.strerror or error}); choose a folder you can write to") from None
        print(f"\nnvtx-regions report: {write_outputs(target, table, text, runs)}")
    lacking = missing_words(runs, folders)
    if lacking:
        print(f"nvtx-regions report: {lacking}", file=sys.stderr)
    if lacking or any(run.failure is not None for run in runs) or not table.rows:
        return PROBLEM_FOUND
    return OK


def run(args: argparse.Namespace) -> int:
    folders = [Path(name) for name in args.files if Path(name).is_dir()]
    if folders:
        missing = [name for name in args.files if not os.path.lexists(name)]
        if missing:
            raise UsageError(
                f"{', '.join(missing)}: no such file or folder; give each node's output folder of 'nvtx-regions profile' (its -o)"
            )
        if len(folders) != len(args.files):
            files = [name for name in args.files if not Path(name).is_dir()]
            raise UsageError(f"{', '.join(files)}: a file among profile folders; give report files or profile folders, not both")
        return merge(folders, args.output)
    if args.output is not None:
        raise UsageError(f"-o {args.output}: only for profile folders; the summary of report files is printed")
    from ..report.reader import read_ranges
    from ..report.records import render_report

    ranges = read_ranges(args.files, domain=args.domain)
    print(render_report(ranges))
    if not ranges.records:
        where = "" if args.domain is ANY_DOMAIN else f" in domain {domain_word(args.domain)!r}"
        print(f"nvtx-regions report: no NVTX ranges{where}", file=sys.stderr)
        return PROBLEM_FOUND
    return OK
