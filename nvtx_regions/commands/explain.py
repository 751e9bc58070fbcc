"""``nvtx-regions explain SPEC -- COMMAND``: run a script and print `explain()` against SPEC for each model it compiles or calls.

    nvtx-regions explain examples/regions.nvtx -- python train.py --steps 1
    nvtx-regions explain regions.nvtx --max-ops 3 -- torchrun --nproc_per_node=2 train.py

How the script hands over its models: it does nothing. Every Python process
of COMMAND starts with ``nvtx_regions/commands/_site`` first on
``PYTHONPATH`` (`commands.hooks`), whose ``sitecustomize`` arms
`nvtx_regions.commands.explain_child`: it notes what each backend compiles,
on every way there is to it, and with ``NVTX_REGIONS_SPEC`` set to SPEC a
script that leaves the spec to `nvtx_regions.compile` runs SPEC:

- thunder: each ``thunder.jit`` (a function jitted without an
  `NvtxProfileTransform` gets one with SPEC);
- Inductor: each ``torch.compile`` with the Inductor backend (a plain
  ``torch.compile(model)`` gets ``NvtxInductor(spec=SPEC)`` as its backend,
  as ``nvtx_regions.compile(model, backend="inductor")`` would give it);
- eager: each ``nvtx_regions.compile(model, backend="eager")`` (and
  ``nvtx_regions.annotate``);
- a script that compiles nothing: each model it calls, at its first call (a
  root module: one not called inside another), explained as eager would
  place SPEC's ranges in it, without adding any. A model called and never
  compiled is what a script with no compile call runs, so that is the hook point;
  a loss module the spec selects nothing in is left out beside a model with a
  selection.

At exit each noted object is explained against SPEC (`nvtx_regions.explain`).
After COMMAND ends, this prints, per object (and rank), a header naming the
backend, the model's class (a function's name) and where it was compiled,
the `explain()` report and the range tree it plans
(`nvtx_regions.report.rangeart`; ``--no-tree`` leaves it out). COMMAND's own
output is passed through untouched, before the report.

Exit status (`commands.status`): COMMAND's (128 + N when killed by signal
N); 1 when it exited normally but nothing was explained (it neither compiled
a model nor called one); 2 for a spec error, before COMMAND runs. A script
that ends with ``os._exit`` or a fatal signal has no atexit, so it reports
nothing: the message names each such process and what it compiled, and says
why there is no report.
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
from .explain_child import ENV_MAX_OPS, ENV_OUT, ENV_SPEC, NOTED
from .hooks import with_site
from .status import OK, PROBLEM_FOUND, UsageError, child_status

__all__ = ["HELP", "DESCRIPTION", "USAGE", "EXAMPLE", "add_arguments", "run"]

HELP = "run a script and print explain() for each model it compiles (thunder, Inductor, eager) or calls"
DESCRIPTION = (
    "Run COMMAND; print explain() against SPEC for each model it compiles with thunder.jit, torch.compile or "
    "nvtx_regions.compile (any backend), or, where it compiles none, for each model it calls."
)
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
    """The report printed after the command: one section per explained object, ranks in order."""
    out = []
    processes = sorted(processes, key=lambda p: (p.get("rank") is None, int(p.get("rank") or 0), p["pid"]))
    several = len(processes) > 1
    for process in processes:
        for item in process["explained"]:
            who = f"{item['backend']}: {item['name']} ({item['how']})"
            if process.get("rank") is not None:
                who = f"rank {process['rank']}, {who}"
            elif several:
                who = f"pid {process['pid']}, {who}"
            out.append(f"===== {who} =====")
            out.append(item["text"])
            if tree and item["tree"]:
                out.append("")
                out.append(item["tree"])
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
        noted = {
            int(p.stem.rpartition("-")[2]): p.read_text(encoding="utf-8").splitlines()
            for p in sorted(out_dir.glob(NOTED.format(pid="*")))
        }
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    sys.stdout.flush()
    if processes:
        print(render(processes, tree=not args.no_tree), flush=True)
    silent = {pid: names for pid, names in noted.items() if pid not in {p["pid"] for p in processes}}
    for pid, names in silent.items():
        how = "was killed" if returncode < 0 else "ended without running its exit handlers (os._exit)"
        print(
            f"nvtx-regions explain: process {pid} compiled or called {', '.join(dict.fromkeys(names))} and then {how}, "
            "so it wrote no report (explain reports at exit, through atexit); let the script return or call sys.exit",
            file=sys.stderr,
        )
    if returncode:
        print(f"nvtx-regions explain: {ended(command[0], returncode)}", file=sys.stderr)
        return child_status(returncode)
    if not processes:
        if not silent:
            print(
                "nvtx-regions explain: the command compiled no model (thunder.jit, torch.compile with Inductor, "
                "nvtx_regions.compile) and called none; nothing to explain",
                file=sys.stderr,
            )
        return PROBLEM_FOUND
    return OK
