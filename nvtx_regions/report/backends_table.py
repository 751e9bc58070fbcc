"""Backends side by side: per module (and region) and pass, the median time of its ranges over
the measured steps of each backend's run, and the ratio to a baseline backend.

    runs = [BackendRun("eager", read_ranges(["out/eager/report.nsys-rep"], domain="nvtx_regions")), ...]
    table = compare_backends(runs, baseline="eager", warmup=1, spec=compile_spec(load("blocks.nvtx")))
    print(render_backends(table))

Rows: one per module and pass for the ranges of ``each module``/``each class``
rules (`records.module_range`), and, given the `spec`, one per region and
pass for the ranges of its ``between`` rules (named by the rule's label; a
region rule without ``and forward``/``and backward`` has one row, pass
``both``). Rules with one range per op give no rows: their ranges are named
after ops, which differ from backend to backend; a note names them. Given
the `spec`, a backend that cannot express a rule (`selection.support`; e.g.
eager and ``between``) shows ``n/a`` in that rule's rows, not ``missing``.

A run's ranges are read by `report.reader.read_ranges` (nsys reports or
captures, one rank's) and summarized by `report.summary` (rows, steps, the
compile step and `warmup` steps left out, the median of an even n being the
lower middle call, CPU or GPU time); the table is made from the summaries.
A range without a category (torch.profiler keeps none) whose message is a
region rule's label is that region's. Durations and ratios read as in every
table (`report.numbers`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..core.naming import rule_category
from ..core.table import text_table
from ..language.tree import render
from ..selection.compile import CompiledSpec, EachRule, OpRule, RegionRule
from ..selection.support import BACKEND_NAMES, why_not
from .numbers import format_duration, format_ratio, format_spread
from .reader import Ranges
from .summary import (CPU_TIME, GPU_TIME, TORCH_CPU_TIME, TORCH_GPU_TIME, Key, RankSummary, RowKinds, Timing,
                      summarize, time_kind)  # fmt: skip

__all__ = ["BackendRun", "Timing", "BackendRow", "BackendsTable", "compare_backends", "render_backends", "cell_word",
           "left_out", "spec_notes", "steps_text", "timing_text", "GPU_TIME", "CPU_TIME", "TORCH_GPU_TIME", "TORCH_CPU_TIME"]  # fmt: skip

PASSES = ("forward", "backward", "both")  # "both": a region rule that applies to either pass


@dataclass(frozen=True)
class BackendRun:
    """One backend's run: the ranges of its reports in the spec's domain, one rank's (`report.reader.read_ranges`),
    or that rank's summary (`report.summary`), read already.

    failure: why the run gave no table (e.g. its exit status and the tail of its stderr).
    """

    backend: str
    ranges: Ranges = field(default_factory=lambda: Ranges(()))
    failure: str | None = None
    summary: RankSummary | None = None


@dataclass(frozen=True)
class BackendRow:
    """One module (or region) in one pass: a timing per backend (None: none there), the ratio to the baseline."""

    module: str  # a module path, or a region's label
    phase: str  # "forward", "backward", or "both" (a region rule for either pass)
    times: tuple[Timing | None, ...]
    ratios: tuple[float | None, ...]  # per backend: its median / the baseline's; None where either is missing
    # Per backend: the rule behind the row is one the backend cannot express (n/a, not missing).
    not_applicable: tuple[bool, ...] = ()
    region: bool = False


@dataclass(frozen=True)
class BackendsTable:
    """The comparison: rows with the largest ratio first; `modules` in the order the runs met them."""

    backends: tuple[str, ...]
    baseline: str
    time: str  # GPU_TIME, CPU_TIME, TORCH_GPU_TIME or TORCH_CPU_TIME
    rows: tuple[BackendRow, ...]
    modules: tuple[str, ...]
    steps: tuple[tuple[int, ...], ...]  # per backend, the step numbers measured
    warmup: int
    failures: tuple[str | None, ...]
    notes: tuple[str, ...] = ()
    regions: bool = False  # whether some rows are regions
    ran: tuple[tuple[int, ...], ...] = ()  # per backend, the step numbers that ran (measured or not)
    row_rules: tuple[str, ...] = ()  # the spec's rules that give rows (each module, each class, between), as written

    def row(self, module: str, phase: str) -> BackendRow:
        """The row of `module` in `phase`; KeyError when no backend has it."""
        for row in self.rows:
            if (row.module, row.phase) == (module, phase):
                return row
        raise KeyError((module, phase))


def _ratio(value: Timing | None, base: Timing | None) -> float | None:
    if value is None or base is None or base.median_ns == 0:
        return None
    return value.median_ns / base.median_ns


def _summary(run: BackendRun, rows: RowKinds, warmup: int) -> RankSummary:
    """The run's summary: its own, or that of all its ranges together (they are one rank's)."""
    if run.summary is not None:
        return run.summary
    ranges = run.ranges
    torch = bool(ranges.files) and all(file.torch for file in ranges.files)
    return summarize(ranges.records, ranges.gpu_ns, rank=0, rows=rows, warmup=warmup, torch=torch,
                     sources=tuple(file.source for file in ranges.files))  # fmt: skip


def compare_backends(
    runs: Sequence[BackendRun], *, baseline: str | None = None, warmup: int = 0, spec: CompiledSpec | None = None
) -> BackendsTable:
    """The table of `runs` (one per backend, in column order); `baseline` defaults to the first.

    warmup: steps left out after the compile step (step 0), which is always left out.
    spec: the spec the runs ran, for region rows, per-op rules and ``n/a`` (see the module doc).
    Raises ValueError for a baseline that is not one of the runs' backends.
    """
    backends = tuple(run.backend for run in runs)
    baseline = backends[0] if baseline is None else baseline
    if baseline not in backends:
        raise ValueError(f"baseline {baseline!r} is not one of the backends {', '.join(backends)}")
    rows_of = RowKinds.of(spec)
    summaries = [None if run.failure is not None else _summary(run, rows_of, warmup) for run in runs]
    time, use_gpu, mixed = time_kind(s for s in summaries if s is not None)
    per_backend: list[Mapping[Key, Timing]] = []
    steps: list[tuple[int, ...]] = []
    ran: list[tuple[int, ...]] = []
    notes: list[str] = []
    order: dict[Key, int] = {}
    categories: dict[Key, str | None] = {}
    for run, summary in zip(runs, summaries):
        if summary is None:
            per_backend.append({})
            steps.append(())
            ran.append(())
            continue
        times = summary.times(use_gpu)
        per_backend.append(times)
        steps.append(summary.steps)
        ran.append(summary.ran)
        notes += [f"{run.backend}: {note}" for note in summary.notes]
        for key in times:
            order.setdefault(key, len(order))
            categories.setdefault(key, summary.categories.get(key))
    cannot = left_out(spec, backends)
    notes += spec_notes(spec, backends, cannot)
    base = backends.index(baseline)
    modules = tuple(dict.fromkeys(module for module, _ in order))
    keys = sorted(order, key=lambda key: (modules.index(key[0]), PASSES.index(key[1])))
    rows = []
    for module, phase in keys:
        cells = tuple(times.get((module, phase)) for times in per_backend)
        na = tuple(categories[(module, phase)] in cannot[b] for b in range(len(backends)))
        region = (categories[(module, phase)], module) in rows_of.regions
        rows.append(BackendRow(module, phase, cells, tuple(_ratio(cell, cells[base]) for cell in cells), na, region))
    rows.sort(key=lambda row: -_largest(row, base))
    if mixed:
        notes.append("some reports hold CUDA kernels and some do not, so CPU times are shown for all")
    row_rules = tuple(render(r.rule) for r in (spec.rules if spec is not None else ()) if isinstance(r, (EachRule, RegionRule)))
    return BackendsTable(
        backends, baseline, time, tuple(rows), modules, tuple(steps), warmup,
        tuple(run.failure for run in runs), tuple(notes), any(row.region for row in rows), tuple(ran), row_rules,
    )  # fmt: skip


def left_out(spec: CompiledSpec | None, backends: Sequence[str]) -> list[frozenset[str]]:
    """Per backend, the NVTX categories of the rules it cannot express."""
    rules = spec.rules if spec is not None else ()
    known = [backend in BACKEND_NAMES for backend in backends]
    return [
        frozenset(rule_category(r.rule) for r in rules if ok and why_not(r, backend) is not None)
        for backend, ok in zip(backends, known)
    ]


def spec_notes(spec: CompiledSpec | None, backends: Sequence[str], cannot: list[frozenset[str]]) -> list[str]:
    notes = []
    if spec is not None:
        per_op = [rule_category(r.rule) for r in spec.rules if isinstance(r, OpRule)]
        if per_op:
            notes.append(f"rules with one range per op have no rows (their ranges are named after ops): {', '.join(per_op)}")
    for backend, names in zip(backends, cannot):
        if names:
            notes.append(f"{backend} cannot express {', '.join(sorted(names))}: n/a in their rows (see the run's warning)")
    return notes


def cell_word(table: BackendsTable, row: BackendRow, backend: int) -> str | None:
    """The word that stands in a cell without a time: ``failed`` (the run failed), ``n/a`` (the
    backend cannot express the row's rule), ``missing`` (no such range); None where there is a time."""
    if table.failures[backend] is not None:
        return "failed"
    if row.times[backend] is not None:
        return None
    return "n/a" if row.not_applicable and row.not_applicable[backend] else "missing"


def _largest(row: BackendRow, base: int) -> float:
    """The sort key: the largest ratio of a backend other than the baseline (-1 when there is none)."""
    found = [ratio for i, ratio in enumerate(row.ratios) if i != base and ratio is not None]
    return max(found, default=-1.0)


def timing_text(timing: Timing) -> str:
    """A cell: the median, then the number of calls and their spread, ``182.9 us (3: 170.1 us..190.4 us)``
    (one call: ``182.9 us (1)``)."""
    spread = ""
    if timing.n > 1 and timing.low_ns is not None and timing.high_ns is not None:
        spread = f": {format_spread(timing.low_ns, timing.high_ns)}"
    return f"{format_duration(timing.median_ns)} ({timing.n}{spread})"


def steps_text(numbers: Iterable[int]) -> str:
    numbers = list(numbers)
    if not numbers:
        return "none"
    if numbers == list(range(numbers[0], numbers[-1] + 1)):
        return f"{numbers[0]}..{numbers[-1]}" if len(numbers) > 1 else str(numbers[0])
    return ", ".join(map(str, numbers))


def render_backends(table: BackendsTable) -> str:
    """The table as text: a header saying which time and steps, then one line per row."""
    base = table.backends.index(table.baseline)
    others = [i for i in range(len(table.backends)) if i != base]
    warm = "step 0 (compile)" + (f" and {table.warmup} more" if table.warmup else "")
    what = "module call and region" if table.regions else "module call"
    lines = [
        f"{table.time} per {what}: median over the measured steps (n ranges: shortest..longest), warm-up {warm} left out; "
        f"ratio: backend / {table.baseline}"
    ]
    for backend, steps, ran, failure in zip(table.backends, table.steps, table.ran or [()] * len(table.backends), table.failures):
        said = "failed (see below)" if failure is not None else f"steps {steps_text(steps)} measured"
        if failure is None and not steps and ran:
            said += f" ({len(ran)} ran: {steps_text(ran)})"
        lines.append(f"  {backend}: {said}")
    head = ["module", "pass", *table.backends, *(f"{table.backends[i]}/{table.baseline}" for i in others)]
    body = []
    for row in table.rows:
        cells = []
        for b, (cell, failure) in enumerate(zip(row.times, table.failures)):
            cells.append(cell_word(table, row, b) or timing_text(cell))  # type: ignore[arg-type]
        ratios = [format_ratio(row.ratios[i]) for i in others]
        body.append([row.module, row.phase, *cells, *ratios])
    lines += ["", text_table(head, body, "ll" + "r" * (len(head) - 2), rule=True)]
    if not table.rows and all(failure is not None for failure in table.failures):
        lines.append("(no module ranges: every run failed)")
    elif not table.rows and any("no step left to measure" in note for note in table.notes):
        lines.append("(no step left to measure: every module range is in the compile step or the warm-up steps)")
    elif not table.rows and table.row_rules:
        lines.append(
            f"(no module or region ranges in any run: the spec's rules {'; '.join(table.row_rules)} left none; they matched "
            "no module call, or their gates (steps, rank in) never opened: each run's warning, on its stderr, names a rule "
            "that selected nothing and the nearest names)"
        )
    elif not table.rows:
        lines.append("(no module or region ranges in any run: the spec needs an `each module`, `each class` or `between` rule)")
    after = [f"note: {note}" for note in table.notes]
    after += [f"{backend} failed: {failure}" for backend, failure in zip(table.backends, table.failures) if failure is not None]
    return "\n".join(lines + ([""] + after if after else []))
