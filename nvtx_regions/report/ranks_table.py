"""Every rank in one table: per module (and region) and pass, for each backend, the median across ranks,
the spread (min..max), and the slowest rank with its ratio to the median; the largest imbalance first.

    runs = [BackendRanks("eager", summaries), BackendRanks("inductor", other)]   # rank -> report.summary.RankSummary
    table = compare_ranks(runs, baseline="eager", warmup=1, spec=compiled)
    print(render_ranks(table))
    write_csv(runs, "out/profile.csv")

A rank's figure for a row is its summary's median (`report.summary`: the
median of the calls in the measured steps, the lower middle one for an even
n, the compile step and the warm-up steps left out). Across ranks: their
median (again the lower middle one for an even number of ranks), the
shortest and the longest rank, and the ratio of the longest to the median:
the imbalance. Rows are ordered by their largest imbalance over the backends.
Beside it, the slowest rank's calls: how many, and their spread, so that a
rank slowed on every call reads apart from one spike.

A rank the run should have had but that left no report (it crashed, or wrote
none) is named in a note under the table (`BackendRanks.missing`). Which time
(CPU or GPU) follows `summary.time_kind`. `write_csv` writes one line per
backend, rank, row and pass: ``backend, rank, range, pass, n, median_us``.
"""

from __future__ import annotations

import csv
import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..core.table import text_table
from ..selection.compile import CompiledSpec
from .backends_table import PASSES, left_out, spec_notes, steps_text
from .numbers import format_duration, format_ratio, format_spread
from .summary import Key, RankSummary, RowKinds, Timing, time_kind

__all__ = ["BackendRanks", "RankCell", "RanksRow", "RanksTable", "compare_ranks", "render_ranks", "write_csv",
           "ranks_text", "CSV_COLUMNS"]  # fmt: skip

CSV_COLUMNS = ("backend", "rank", "range", "pass", "n", "median_us")


@dataclass(frozen=True)
class BackendRanks:
    """One backend's run over every rank: each rank's summary, by rank; the ranks it should have had and
    has no report of (`missing`); or why it has no table (`failure`). problem: how a run that left
    reports of some ranks ended badly (e.g. a rank crashed and torchrun's exit status)."""

    backend: str
    ranks: Mapping[int, RankSummary] = field(default_factory=dict)
    failure: str | None = None
    missing: tuple[int, ...] = ()
    problem: str | None = None


@dataclass(frozen=True)
class RankCell:
    """One backend in one row: each rank's timing (the ranks that have the row), the median across them,
    and the fastest and slowest rank."""

    per_rank: tuple[tuple[int, Timing], ...]
    median_ns: float
    fastest: int
    slowest: int

    @classmethod
    def of(cls, per_rank: Sequence[tuple[int, Timing]]) -> RankCell:
        medians = [timing.median_ns for _, timing in per_rank]
        fastest = min(per_rank, key=lambda item: (item[1].median_ns, item[0]))[0]
        slowest = max(per_rank, key=lambda item: (item[1].median_ns, -item[0]))[0]
        return cls(tuple(per_rank), statistics.median_low(medians), fastest, slowest)

    def timing(self, rank: int) -> Timing:
        return dict(self.per_rank)[rank]

    @property
    def imbalance(self) -> float | None:
        """The slowest rank's median over the median across ranks (None for a median of 0)."""
        return self.timing(self.slowest).median_ns / self.median_ns if self.median_ns else None


@dataclass(frozen=True)
class RanksRow:
    module: str
    phase: str
    cells: tuple[RankCell | None, ...]  # per backend
    ratios: tuple[float | None, ...]  # per backend: its median across ranks / the baseline's
    not_applicable: tuple[bool, ...] = ()
    region: bool = False

    @property
    def imbalance(self) -> float:
        """The sort key: the largest imbalance over the backends (-1 where there is none)."""
        return max((c.imbalance for c in self.cells if c is not None and c.imbalance is not None), default=-1.0)


@dataclass(frozen=True)
class RanksTable:
    backends: tuple[str, ...]
    baseline: str
    time: str
    rows: tuple[RanksRow, ...]
    ranks: tuple[tuple[int, ...], ...]  # per backend, the ranks read
    steps: tuple[tuple[int, ...], ...]  # per backend, the steps measured on some rank
    warmup: int
    failures: tuple[str | None, ...]
    notes: tuple[str, ...] = ()
    regions: bool = False

    def row(self, module: str, phase: str) -> RanksRow:
        """The row of `module` in `phase`; KeyError when no backend has it."""
        for row in self.rows:
            if (row.module, row.phase) == (module, phase):
                return row
        raise KeyError((module, phase))


def ranks_text(ranks: Iterable[int]) -> str:
    """``0..7``, ``0, 2, 5`` or ``none``."""
    numbers = sorted(ranks)
    if not numbers:
        return "none"
    if len(numbers) > 2 and numbers == list(range(numbers[0], numbers[-1] + 1)):
        return f"{numbers[0]}..{numbers[-1]}"
    return ", ".join(map(str, numbers))


def compare_ranks(
    runs: Sequence[BackendRanks], *, baseline: str | None = None, warmup: int = 0, spec: CompiledSpec | None = None
) -> RanksTable:
    """The table of `runs` (one per backend, in column order); see the module doc."""
    backends = tuple(run.backend for run in runs)
    baseline = backends[0] if baseline is None else baseline
    if baseline not in backends:
        raise ValueError(f"baseline {baseline!r} is not one of the backends {', '.join(backends)}")
    time, use_gpu, mixed = time_kind(s for run in runs if run.failure is None for s in run.ranks.values())
    rows_of = RowKinds.of(spec)
    order: dict[Key, None] = {}
    categories: dict[Key, str | None] = {}
    per_backend: list[dict[Key, list[tuple[int, Timing]]]] = []
    notes: list[str] = []
    for run in runs:
        found: dict[Key, list[tuple[int, Timing]]] = {}
        per_backend.append(found)
        if run.failure is not None:
            continue
        for rank, summary in sorted(run.ranks.items()):
            for key, timing in summary.times(use_gpu).items():
                order.setdefault(key)
                categories.setdefault(key, summary.categories.get(key))
                found.setdefault(key, []).append((rank, timing))
            notes += [f"{run.backend}: rank {rank}: {note}" for note in summary.notes]
        if run.missing:
            notes.append(
                f"{run.backend}: no report of rank{'s' * (len(run.missing) > 1)} {ranks_text(run.missing)} "
                f"(of ranks {ranks_text([*run.ranks, *run.missing])}): the rank crashed or wrote none; "
                f"the table shows ranks {ranks_text(run.ranks)}"
            )
        partial = [
            f"{module} ({phase}) on rank{'s' * (len(ranks) > 1)} {ranks_text(r for r, _ in ranks)}"
            for (module, phase), ranks in found.items() if len(ranks) < len(run.ranks)
        ]  # fmt: skip
        if partial:
            notes.append(f"{run.backend}: rows not on every rank: {'; '.join(partial)}")
    cannot = left_out(spec, backends)
    notes += spec_notes(spec, backends, cannot)
    if mixed:
        notes.append("some reports hold CUDA kernels and some do not, so CPU times are shown for all")
    base = backends.index(baseline)
    modules = list(dict.fromkeys(module for module, _ in order))
    rows = []
    for module, phase in sorted(order, key=lambda key: (modules.index(key[0]), PASSES.index(key[1]))):
        cells = tuple(RankCell.of(found[(module, phase)]) if (module, phase) in found else None for found in per_backend)
        ratios = tuple(
            c.median_ns / cells[base].median_ns if c is not None and cells[base] is not None and cells[base].median_ns else None
            for c in cells
        )  # fmt: skip
        category = categories[(module, phase)]
        na = tuple(category in cannot[b] for b in range(len(backends)))
        rows.append(RanksRow(module, phase, cells, ratios, na, (category, module) in rows_of.regions))
    rows.sort(key=lambda row: -row.imbalance)
    steps = tuple(tuple(sorted({n for s in run.ranks.values() for n in s.steps})) for run in runs)
    return RanksTable(
        backends, baseline, time, tuple(rows), tuple(tuple(sorted(run.ranks)) for run in runs), steps, warmup,
        tuple(run.failure for run in runs), tuple(notes), any(row.region for row in rows),
    )  # fmt: skip


def cell_word(table: RanksTable, row: RanksRow, backend: int) -> str | None:
    """``failed``, ``n/a`` or ``missing`` where a backend has no time in `row` (as in `backends_table`)."""
    if table.failures[backend] is not None:
        return "failed"
    if row.cells[backend] is not None:
        return None
    return "n/a" if row.not_applicable and row.not_applicable[backend] else "missing"


def render_ranks(table: RanksTable) -> str:
    """The table as text: a header saying which time, ranks and steps, then one line per row."""
    base = table.backends.index(table.baseline)
    others = [i for i in range(len(table.backends)) if i != base]
    warm = "step 0 (compile)" + (f" and {table.warmup} more" if table.warmup else "")
    what = "module call and region" if table.regions else "module call"
    lines = [
        f"{table.time} per {what}, every rank: per rank the median of its calls in the measured steps "
        f"(the lower middle one for an even n), warm-up {warm} left out",
        "across ranks: their median, min..max, and the slowest rank with its ratio to the median, largest imbalance "
        "first; calls: the slowest rank's n and their spread" + (f"; ratio: backend / {table.baseline}" if others else ""),
    ]
    for backend, ranks, steps, failure in zip(table.backends, table.ranks, table.steps, table.failures):
        said = "failed (see below)" if failure is not None else f"ranks {ranks_text(ranks)}, steps {steps_text(steps)} measured"
        lines.append(f"  {backend}: {said}")
    head = ["module", "pass"]
    for backend in table.backends:
        head += [backend, f"{backend} min..max", f"{backend} slowest", "slowest/median", f"{backend} calls"]
    head += [f"{table.backends[i]}/{table.baseline}" for i in others]
    body = []
    for row in table.rows:
        cells = [row.module, row.phase]
        for b, cell in enumerate(row.cells):
            word = cell_word(table, row, b)
            if word is not None or cell is None:
                cells += [word or "missing", "", "", "", ""]
                continue
            slow = cell.timing(cell.slowest)
            fast = cell.timing(cell.fastest)
            cells += [
                format_duration(cell.median_ns), format_spread(fast.median_ns, slow.median_ns), f"rank {cell.slowest}",
                format_ratio(cell.imbalance), f"{slow.n}: {format_spread(slow.low_ns, slow.high_ns)}",
            ]  # fmt: skip
        cells += [format_ratio(row.ratios[i]) for i in others]
        body.append(cells)
    lines += ["", text_table(head, body, "ll" + "r" * (len(head) - 2), rule=True)]
    if not table.rows:
        lines.append("(no module or region ranges on any rank)")
    after = [f"note: {note}" for note in table.notes]
    after += [f"{backend} failed: {failure}" for backend, failure in zip(table.backends, table.failures) if failure is not None]
    return "\n".join(lines + ([""] + after if after else []))


def write_csv(runs: Sequence[BackendRanks], path: str | os.PathLike[str]) -> None:
    """One line per backend, rank, row and pass (`CSV_COLUMNS`), in the time the table shows."""
    _, use_gpu, _ = time_kind(s for run in runs if run.failure is None for s in run.ranks.values())
    with open(path, "w", newline="", encoding="utf-8") as stream:
        writer = csv.writer(stream)
        writer.writerow(CSV_COLUMNS)
        for run in runs:
            if run.failure is not None:
                continue
            for rank, summary in sorted(run.ranks.items()):
                for (module, phase), timing in summary.times(use_gpu).items():
                    writer.writerow([run.backend, rank, module, phase, timing.n, f"{timing.median_ns / 1000:.3f}"])
