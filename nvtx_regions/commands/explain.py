"""``nvtx-regions explain SPEC -- COMMAND``: run a script and print `explain()` for each function it jits.

    nvtx-regions explain examples/regions.nvtx -- python train.py --steps 1
    nvtx-regions explain regions.nvtx --max-ops 3 -- torchrun --nproc_per_node=2 train.py

How the script hands over its jitted functions: it does nothing. Every
Python process of COMMAND starts with ``nvtx_regions/commands/_site`` first
on ``PYTHONPATH`` (`commands.hooks`), whose ``sitecustomize`` wraps ``thunder.jit`` (see
`nvtx_regions.commands.explain_child`): a function jitted without an
`NvtxProfileTransform` gets one with SPEC, one jitted with its own keeps it,
and at exit each jitted function that ran is explained against SPEC. After
COMMAND ends, this prints, per function (and rank), the `explain()` report
and the range tree it plans (`nvtx_regions.report.rangeart`; ``--no-tree`` leaves
it out). COMMAND's own output is passed through untouched, before the report.

Exit status (`commands.status`): COMMAND's (128 + N when killed by signal
N); 1 when it exited normally but jitted nothing that ran; 2 for a spec
error, before COMMAND runs. A script that ends with ``os._exit`` or
a fatal signal has no atexit, so it reports nothing: the message names each
such process and what it jitted, and says why there is no report.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from .child import ended, private_tempdir, run_child
from ..core.profiling import ENV_SPEC as COMPILE_SPEC
from .explain_child import ENV_MAX_OPS, ENV_OUT, ENV_SPEC
from .hooks import with_site
from .status import OK, PROBLEM_FOUND, UsageError, child_status

__all__ = ["HELP", "DESCRIPTION", "USAGE", "EXAMPLE", "add_arguments", "run"]

HELP = "run a script and print explain() for each function it jits"
DESCRIPTION = "Run COMMAND; print explain() against SPEC for each function it jits with thunder."
USAGE = "nvtx-regions explain SPEC [--max-ops N] [--no-tree] -- COMMAND..."
EXAMPLE = "nvtx-regions explain examples/regions.nvtx -- python train.py"


def child_env(spec: Path, out_dir: str, max_ops: int) -> dict[str, str]:
    """This environment, plus what arms `explain_child` in every Python process of the command."""
    return with_site({
        **os.environ,
        ENV_SPEC: str(spec),
        # A script that leaves the spec to `nvtx_regions.compile` gets this one too.
        COMPILE_SPEC: str(spec),
        ENV_OUT: out_dir,
        ENV_MAX_OPS: str(max_ops),
    })


def render(processes: list[dict], *, tree: bool = True) -> str:
    """The report printed after the command: one section per jitted function, ranks in order."""
    out = []
    processes = sorted(processes, key=lambda p: (p.get("rank") is None, int(p.get("rank") or 0), p["pid"]))
    several = len(processes) > 1
    for process in processes:
        for fn in process["functions"]:
            who = f"{fn['name']} (jitted at {fn['where']}"
            who += ", with its own NvtxProfileTransform)" if fn["own_transform"] else ", spec added)"
            if several:
                who = (f"rank {process['rank']}, " if process.get("rank") is not None else f"pid {process['pid']}, ") + who
            out.append(f"===== {who} =====")
            out.append(fn["text"])
            if tree and fn["tree"]:
                out.append("")
                out.append(fn["tree"])
            out.append("")
    return "\n".join(out).rstrip("\n")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="a .nvtx spec file")
    parser.add_argument("--max-ops", type=int, default=12, help="op lines shown per rule and trace (default 12)")
    parser.add_argument("--no-tree", action="store_true", help="leave out the range-tree pictures")


def run(args: argparse.Namespace) -> int:
    """``nvtx-regions explain``: `args.command` is the command after ``--``."""
    from ..language.parse import load
    from ..selection.compile import compile_spec

    command = args.command
    if args.max_ops < 0:
        raise UsageError("--max-ops takes a number >= 0")
    spec_path = Path(args.spec)  # as given: the command runs in this directory, and reports show the path
    compile_spec(load(args.spec))  # the spec's own errors come out here, before the command runs
    out_dir = private_tempdir("nvtx_explain-")
    try:
        returncode = run_child(command, child_env(spec_path, str(out_dir), args.max_ops))
        processes = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(out_dir.glob("explain-*.json"))]
        jitted = {
            int(p.stem.rpartition("-")[2]): p.read_text(encoding="utf-8").splitlines()
            for p in sorted(out_dir.glob("jitted-*.txt"))
        }
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    sys.stdout.flush()
    if processes:
        print(render(processes, tree=not args.no_tree), flush=True)
    silent = {pid: names for pid, names in jitted.items() if pid not in {p["pid"] for p in processes}}
    for pid, names in silent.items():
        how = "was killed" if returncode < 0 else "ended without running its exit handlers (os._exit)"
        print(
            f"nvtx-regions explain: process {pid} jitted {', '.join(dict.fromkeys(names))} and then {how}, "
            "so it wrote no report (explain reports at exit, through atexit); let the script return or call sys.exit",
            file=sys.stderr,
        )
    if returncode:
        print(f"nvtx-regions explain: {ended(command[0], returncode)}", file=sys.stderr)
        return child_status(returncode)
    if not processes:
        if not silent:
            print(
                "nvtx-regions explain: the command jitted no function that ran (thunder.jit, then a call); "
                "nothing to explain",
                file=sys.stderr,
            )
        return PROBLEM_FOUND
    return OK
