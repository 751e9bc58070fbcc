"""``nvtx-regions profile``: run a training script once per backend, and show per module where time goes.

    nvtx-regions profile blocks.nvtx --backends eager,thunder,inductor -- python train.py
    nvtx-regions profile blocks.nvtx -- torchrun --standalone --nproc_per_node=4 train.py   # every rank, the slowest named
    nvtx-regions profile blocks.nvtx --warmup 2 --rank 1 -- torchrun --nproc_per_node=2 train.py
    nvtx-regions profile blocks.nvtx --tool torch -- python train.py      # torch.profiler, no nsys needed

The script chooses backend and ranges in one line, `nvtx_regions.compile(model)`,
and loops over `nvtx_regions.steps(...)`. For each backend this command runs
the command with ``NVTX_REGIONS_BACKEND`` set to it, ``NVTX_REGIONS_SPEC``
to the spec's path and ``NVTX_REGIONS_EMIT`` to the sinks its tool reads
(`commands.emit`), under one tool (``--tool``; ``auto``, the default, is nsys
when it is on PATH, else torch.profiler, and it says which):

- ``nsys``: the real nsys, with the flags of ``nvtx-regions nsys``
  (`commands.nsys.nsys_command`), one report per rank under torchrun; NVTX
  ranges (``--emit`` may add record_function, never leave NVTX out);
- ``torch``: torch.profiler, started in each Python process of the command as
  torch is imported (`commands.profiler_child`: the script needs no change),
  CPU activity plus CUDA where CUDA is available; the ranges go to
  record_function (``--emit nvtx,record_function`` adds NVTX), and each process
  with our ranges exports its Chrome trace, for Perfetto, TensorBoard and HTA,
  as ``rank<RANK>.pt.trace.json``; GPU times where the traces hold GPU work,
  else CPU times (`report.torch_trace`);
- ``capture``: our NVTX capture (`commands.capture.run_capture`), CPU times only;
- each run's reports, its stderr (``stderr.txt``, also shown as it comes) and,
  under nsys, what nsys itself prints (``nsys.txt``: its progress bars, kept off
  stdout) go to ``OUTPUT/BACKEND/``; the table to ``OUTPUT/table.txt``, the chart to
  ``OUTPUT/profile.png`` and ``OUTPUT/profile.svg`` (`report.chart`; without
  matplotlib, a line that says what to install instead). An existing OUTPUT
  is refused unless ``--force-overwrite``, which replaces only what this
  command writes.

Each run's reports are read rank by rank (`commands.profile_folder`: ``profile.json``
says what ran, the files' names say the ranks) and summarized as they are read
(`report.summary`). Under torchrun with several ranks it prints `report.ranks_table`:
per module (and region) and pass, for each backend, the median across ranks, their
spread, the slowest rank and its ratio to the median, the largest imbalance first,
then the outliers (one-off calls, with their rank and step); a rank that left no
report is named under the table. It prints the table to fit the terminal (``$COLUMNS``,
else the terminal's width: `core.table.terminal_width`) and writes it whole. With ``--rank N``, or with one
rank, it prints `report.backends_table`: per module and pass, the median over the
measured steps (the compile step 0 and ``--warmup N`` more are left out) per backend
with n, the ratio to ``--baseline`` (default the first backend), largest ratios
first. A module one backend lacks is ``missing``; a rule a backend cannot express
(eager and ``between``, say) runs nowhere there, and its rows read ``n/a`` (the run
itself warns once and runs the rest of the spec); a backend whose run fails is
reported with its exit status and the failure's own last lines (under torchrun, the
exception of the rank that failed first), naming its ``stderr.txt``, and the others still
run (`commands.rank_ends`; a rank that only aborted at exit after its report was complete,
torch's gloo threads as Python exits, fails nothing: a note says so).
Either way ``OUTPUT/profile.csv`` gets one line per backend, rank, row and pass
(``backend, rank, range, pass, n, median_us, min_us, max_us, max_step``), and the chart is per backend
(``profile.png``) for one rank, per rank (``ranks.png``, `report.ranks_chart`) for several.

Exit status: 0 (also when a rank only aborted at exit, its report complete); 1 when a backend failed,
a rank left no report, or no run held a module range;
2 for a usage or spec error.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ..core.errors import CaptureFileError
from ..core.naming import DEFAULT_DOMAIN
from ..core.table import terminal_width
from ..core.profiling import BACKENDS, ENV_BACKEND, ENV_SPEC
from ..internals.torchrun import torchrun_start
from ..internals.versions import INSTALL_THUNDER, thunder_installed
from ..report.backends_table import BackendRun, BackendsTable, compare_backends, render_backends
from ..report.chart import ChartUnavailable, write_chart
from ..report.ranks_chart import write_ranks_chart
from ..report.ranks_table import BackendRanks, RanksTable, compare_ranks, ranks_text, render_ranks, write_csv
from ..report.summary import RankSummary, RowKinds
from ..selection.compile import CompiledSpec
from .child import run_child
from .domain import add_domain_option
from .emit import add_emit_option, emit_env, require_nvtx
from .profile_folder import CAPTURE_FILE, MANIFEST, Manifest, now, read_backend, torchrun_job, torchrun_ranks, write_manifest
from .rank_ends import RunEnd
from .status import OK, PROBLEM_FOUND, UsageError

__all__ = ["add_arguments", "run"]

HELP = "run a script once per backend (eager, thunder, inductor); per module, time side by side"
DESCRIPTION = (
    "Run COMMAND once per backend under nsys (else torch.profiler); print per module the median time "
    "of each backend over the measured steps, and the ratio to a baseline; write the reports and a chart."
)
USAGE = (
    "nvtx-regions profile SPEC [--backends eager,thunder,inductor] [--baseline B] [--warmup N] [-o DIR] "
    "[--force-overwrite] [--rank R] [--tool {auto,nsys,torch,capture}] [--emit SINKS] [--domain NAME] -- COMMAND..."
)
EXAMPLE = "nvtx-regions profile blocks.nvtx --backends eager,thunder -- python train.py"
TABLE, CSV, CHART, RANKS_CHART, STDERR = "table.txt", "profile.csv", "profile", "ranks", "stderr.txt"
CHART_FILES = (f"{CHART}.png", f"{CHART}.svg", f"{RANKS_CHART}.png", f"{RANKS_CHART}.svg")
TOOLS = ("auto", "nsys", "torch", "capture")
TOOL_WORDS = {
    "nsys": "nsys",
    "torch": "torch.profiler",
    "capture": "nvtx-regions capture (CPU times of the NVTX ranges only)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``nvtx-regions profile`` (the command after ``--`` is not among them)."""
    parser.add_argument("spec", help="a .nvtx spec file; its `each module`, `each class` and `between` rules give the table's rows")
    parser.add_argument("--backends", help="comma-separated, in column order (default eager,thunder,inductor; eager,inductor where thunder is not installed)")
    parser.add_argument("--baseline", help="the backend the ratios divide by (default: the first)")
    parser.add_argument("--warmup", type=int, default=1, help="steps left out after the compile step 0 (default 1)")
    parser.add_argument("-o", "--output", default="nvtx_regions_profile", help="folder for the reports, table and chart (default nvtx_regions_profile)")
    parser.add_argument("--force-overwrite", action="store_true", help="reuse an existing output folder, replacing what this command writes there")
    parser.add_argument("--rank", type=int, help="under torchrun, show this rank alone (default: every rank, the slowest named per row)")
    parser.add_argument("--tool", choices=TOOLS, default="auto",
                        help="run under nsys, torch.profiler or our NVTX capture (default auto: nsys when it is on PATH, else torch)")  # fmt: skip
    add_emit_option(parser, "default: what the tool reads; torch always adds record_function, nsys and capture need nvtx")
    add_domain_option(parser, f"the spec's NVTX domain (default {DEFAULT_DOMAIN})", default=DEFAULT_DOMAIN)


def _backends(text: str | None, baseline: str | None) -> tuple[list[str], str]:
    if text is None:
        chosen = [name for name in BACKENDS if name != "thunder" or thunder_installed()]
    else:
        chosen = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in BACKENDS]
    if not chosen or unknown:
        raise UsageError(f"--backends {text}: choose from {', '.join(BACKENDS)}, comma-separated")
    if len(set(chosen)) != len(chosen):
        raise UsageError(f"--backends {text}: a backend is named twice")
    if "thunder" in chosen and not thunder_installed():
        raise UsageError(
            f"--backends {text}: thunder is not installed here ({INSTALL_THUNDER}); leave it out, e.g. --backends eager,inductor"
        )
    baseline = chosen[0] if baseline is None else baseline
    if baseline not in chosen:
        raise UsageError(f"--baseline {baseline}: not among --backends {','.join(chosen)}")
    return chosen, baseline


def _output_folder(output: str, backends: Sequence[str], force: bool) -> Path:
    """The output folder, checked (and cleared of what this command writes, with `force`) before any run."""
    folder = Path(output)
    if folder.exists() or folder.is_symlink():
        if not folder.is_dir():
            raise UsageError(f"-o {output}: exists and is not a folder; give another name")
        if not force:
            raise UsageError(f"-o {output}: the folder exists; add --force-overwrite to replace its reports, or give another name")
        for name in (*backends, TABLE, CSV, MANIFEST, *CHART_FILES):
            path = folder / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for backend in backends:
            (folder / backend).mkdir()
    except OSError as error:
        raise UsageError(f"-o {output}: cannot create it ({error.strerror or error}); choose a folder you can write to") from None
    return folder


def choose_tool(asked: str) -> str:
    """``nsys``, ``torch`` or ``capture``: `asked`, or for ``auto`` nsys when it is on PATH, else torch;
    `UsageError` for a missing nsys."""
    found = shutil.which("nsys") is not None
    if asked == "nsys" and not found:
        raise UsageError("--tool nsys: nsys is not on PATH; install Nsight Systems, or use --tool torch")
    if asked == "auto":
        return "nsys" if found else "torch"
    return asked


def tool_sinks(tool: str, asked: Sequence[str] | None) -> tuple[str, ...]:
    """The sinks the runs emit to (``$NVTX_REGIONS_EMIT``): for torch, record_function, plus NVTX if
    `asked`; for nsys and capture, `asked` (default NVTX), which must hold NVTX (else `UsageError`)."""
    if tool == "torch":
        return ("nvtx", "record_function") if asked and "nvtx" in asked else ("record_function",)
    require_nvtx(asked, "nsys" if tool == "nsys" else "nvtx-regions capture")
    return tuple(asked) if asked else ("nvtx",)


def _nsys_did_not_start(returncode: int, seconds: float, stderr: Path) -> bool:
    # nsys 2022.4.2 sometimes fails to start under load: status 1 and only "End of file"
    # within a second (its CLI lost the agent it had just started); tests/test_nsys_real.py sees it too.
    try:
        text = stderr.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return False
    return returncode == 1 and seconds < 10 and text == "End of file"


def _run_backend(backend: str, args: argparse.Namespace, command: list[str], folder: Path, tool: str) -> RunEnd | str | None:
    """Run `command` for `backend` under `tool`, its reports into `folder`; None, why it could not run, or
    how it ended when it failed (`RunEnd`)."""
    from ..language.parse import load

    if backend == "inductor" and importlib.util.find_spec("nvtx_regions.inductor") is None:
        return "nvtx_regions.inductor is not part of this installation; leave inductor out of --backends"
    env = {**os.environ, ENV_BACKEND: backend, ENV_SPEC: os.path.abspath(args.spec), **emit_env(tool_sinks(tool, args.emit))}
    if tool == "nsys":
        from .nsys import nsys_command
        from .nsys_output import NSYS_LOG, progress_apart

        profile = nsys_command(load(args.spec), command, domain=args.domain, output=str(folder / "report"))
        for attempt in (1, 2):
            started = time.monotonic()
            # nsys's progress bars (thousands of characters) go to nsys.txt, not before the table
            returncode = run_child(list(profile.argv), env, stderr_copy=folder / STDERR, stdout_to=progress_apart(folder / NSYS_LOG))
            if attempt == 2 or not _nsys_did_not_start(returncode, time.monotonic() - started, folder / STDERR):
                break
            print("nvtx-regions profile: nsys did not start (\"End of file\"); trying once more", flush=True)
        returncode = profile.status(returncode)
    elif tool == "torch":
        from .hooks import with_site
        from .profiler_child import ENV_TRACE_DIR

        returncode = run_child(command, with_site({**env, ENV_TRACE_DIR: str(folder.resolve())}), stderr_copy=folder / STDERR)
    else:
        from .capture import run_capture

        returncode = run_capture(command, folder / CAPTURE_FILE, env=env, stderr_copy=folder / STDERR).returncode
    if returncode != 0:
        return RunEnd.of(returncode, folder / STDERR, torchrun=torchrun_start(command) is not None)
    return None


def _no_report(tool: str, folder: Path, rank: int | None) -> str:
    which = "any rank" if rank is None else f"rank {rank}"
    if tool == "torch":
        return (
            f"no torch.profiler trace of {which} in {folder}/: a process writes one at exit when "
            "it ran nvtx_regions' ranges (nvtx_regions.compile, steps) and ended normally"
            + (" (is --rank right?)" if rank is not None else "")
        )
    return f"no report of {which} in {folder}/" + (" (is --rank right?)" if rank is not None else "")


def _read_run(backend: str, failure: str | None, folder: Path, manifest: Manifest, rows: RowKinds,
              rank: int | None) -> BackendRanks:  # fmt: skip
    """The ranks of one backend's run (only `rank`, given one). A run that failed but left reports (a rank
    crashed, or the one process did after some steps) keeps them, and its failure becomes a problem said
    under the table."""
    try:
        found = {s.rank: s for s in read_backend(folder, manifest.tool, manifest.domain, rows=rows, warmup=manifest.warmup, rank=rank)}
    except CaptureFileError as error:
        return BackendRanks(backend, failure=str(error) if failure is None else f"{failure}\n    and its reports cannot be read: {error}")
    unmeasured: dict[int, str] = {}  # a rank whose report holds no measured call is no missing one: said as it is
    if failure is not None:  # a failed run keeps only the ranks that got as far as a step or a module
        unmeasured = {number: _unmeasured(summary, manifest.warmup) for number, summary in found.items() if not (summary.cpu or summary.steps)}
        found = {number: summary for number, summary in found.items() if number not in unmeasured}
        failure = "\n".join([failure, *unmeasured.values()])
    expected = (rank,) if rank is not None else manifest.ranks or tuple(sorted(found))
    if not found:
        return BackendRanks(backend, failure=failure or _no_report(manifest.tool, folder, rank))
    missing = tuple(r for r in expected if r not in found and r not in unmeasured)
    return BackendRanks(backend, found, missing=missing, problem=failure)


def _unmeasured(summary: RankSummary, warmup: int) -> str:
    """A line under a failed run's problem for a rank whose report holds no measured call."""
    files = ", ".join(Path(source).name for source in summary.sources) or "its report"
    left = tuple(range(warmup + 1))
    out = f"step{'s' * (len(left) > 1)} {ranks_text(left)} (compile{' and warm-up' if warmup else ''}) {'are' if warmup else 'is'} left out"
    ran = f"it ran step{'s' * (len(summary.ran) > 1)} {ranks_text(summary.ran)} only, and {out}" if summary.ran else "it began no step"
    return f"    rank {summary.rank}: {files} holds no measured call: {ran}"


def write_outputs(folder: Path, table: BackendsTable | RanksTable, text: str, runs: Sequence[BackendRanks]) -> str:
    """Write the table's `text`, ``profile.csv`` and the chart (per backend for one rank, per rank for
    several) into `folder`; where they went, in words (or why there is no chart)."""
    (folder / TABLE).write_text(text + "\n", encoding="utf-8")
    write_csv(runs, folder / CSV)
    try:
        if isinstance(table, RanksTable):
            png, svg = write_ranks_chart(table, folder / RANKS_CHART)
        else:
            png, svg = write_chart(table, folder / CHART)
    except ChartUnavailable as error:
        return f"the table in {folder / TABLE}, one line per rank and row in {folder / CSV}; no chart: {error}"
    return f"the table in {folder / TABLE}, one line per rank and row in {folder / CSV}, the chart in {png} and {svg}"


def one_rank(runs: Sequence[BackendRanks], rank: int | None) -> int | None:
    """The rank the table shows alone: `rank` (``--rank``), or 0 when every run read rank 0 only (a
    world size of 1); None when the table shows every rank."""
    if rank is not None:
        return rank
    ranks = {r for run in runs for r in (*run.ranks, *run.missing)}
    return 0 if ranks <= {0} else None


def render_runs(runs: Sequence[BackendRanks], *, baseline: str, warmup: int, spec: CompiledSpec, rank: int | None,
                distributed: bool, width: int | None = None) -> tuple[BackendsTable | RanksTable, str]:  # fmt: skip
    """The table of `runs` and its text: every rank's, or one rank's (`one_rank`) as the backends table;
    `distributed`: the run was a torchrun's, so a table of its one rank says why there is no other;
    `width`: the columns every rank's table fits (`render_ranks`; None: every column, as in a file)."""
    shown = one_rank(runs, rank)
    if shown is None:
        table = compare_ranks(runs, baseline=baseline, warmup=warmup, spec=spec)
        text = render_ranks(table, width)
        problems = [f"{run.backend}: {run.problem}" for run in runs if run.problem is not None]
        return table, "\n".join([text, *problems])
    one = [
        BackendRun(run.backend, failure=run.failure or run.problem) if run.failure or shown not in run.ranks
        else BackendRun(run.backend, summary=run.ranks[shown])
        for run in runs
    ]  # fmt: skip
    one = [r if r.failure or r.summary else BackendRun(r.backend, failure=f"no report of rank {shown}") for r in one]
    table = compare_backends(one, baseline=baseline, warmup=warmup, spec=spec)
    problems = [f"{run.backend}: {run.problem}" for run in runs if run.problem is not None and shown in run.ranks]
    text = "\n".join([render_backends(table), *problems])
    if rank is None and distributed and any(run.ranks for run in runs):
        text += "\nnote: one rank (world size 1): the table of rank 0; under torchrun with several ranks, every rank is compared"
    return table, text


def run(args: argparse.Namespace) -> int:
    """``nvtx-regions profile`` with parsed options; `args.command` is the command to run."""
    from ..language.parse import load
    from ..language.tree import render
    from ..selection.compile import compile_spec

    command = list(args.command)
    backends, baseline = _backends(args.backends, args.baseline)
    if args.warmup < 0:
        raise UsageError(f"--warmup {args.warmup}: give a number of steps >= 0")
    spec = load(args.spec)
    compiled = compile_spec(spec)  # a spec error stops here, before any run
    tool = choose_tool(args.tool)
    tool_sinks(tool, args.emit)  # a usage error stops here, before any run
    world, node_ranks = torchrun_ranks(command)
    if args.rank is not None and node_ranks is not None and args.rank not in node_ranks:
        raise UsageError(
            f"--rank {args.rank}: this command runs ranks {ranks_text(node_ranks)}; choose one of them, or leave --rank out for every rank"
        )
    folder = _output_folder(args.output, backends, args.force_overwrite)
    manifest = Manifest(render(spec), tuple(backends), baseline, tool, args.domain, args.warmup, world, node_ranks,
                        torchrun_job(command))  # fmt: skip
    write_manifest(folder, manifest)
    rows = RowKinds.of(compiled)
    said = TOOL_WORDS[tool] + (" (nsys is not on PATH)" if args.tool == "auto" and tool == "torch" else "")
    runs, notes = [], []
    for number, backend in enumerate(backends, 1):
        print(f"nvtx-regions profile: {backend} ({number}/{len(backends)}) under {said}: {shlex.join(command)}", flush=True)
        failure = _run_backend(backend, args, command, folder / backend, tool)
        if isinstance(failure, RunEnd):  # a rank that only aborted at exit, its report complete, is a note
            note, failure = failure.judge(command[0], backend, folder / backend, tool, args.domain, node_ranks)
            notes += [note] if note is not None else []
        runs.append(_read_run(backend, failure, folder / backend, manifest, rows, args.rank))
    write_manifest(folder, replace(manifest, job=replace(manifest.job, ended=now())))  # which job: `report` tells reruns apart by time
    distributed = torchrun_start(command) is not None
    table, text = render_runs(runs, baseline=baseline, warmup=args.warmup, spec=compiled, rank=args.rank, distributed=distributed)
    where = write_outputs(folder, table, "\n".join([text, *notes]), runs)
    _, text = render_runs(runs, baseline=baseline, warmup=args.warmup, spec=compiled, rank=args.rank, distributed=distributed,
                          width=terminal_width())  # fmt: skip
    text = "\n".join([text, *notes])
    sys.stdout.flush()
    print(f"\n{text}\n", flush=True)
    print(f"nvtx-regions profile: reports in {folder}/BACKEND/, {where}")
    if any(run.failure is not None or run.problem is not None or run.missing for run in runs) or not table.rows:
        return PROBLEM_FOUND
    return OK
