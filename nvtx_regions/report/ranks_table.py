"""Every rank in one table, steady and transient: per module (and region) and pass, for each backend,
the median across ranks and the slowest rank by its median (steady); under it, the outliers, one-off
calls with their rank and step (transient).

    runs = [BackendRanks("eager", summaries), BackendRanks("inductor", other)]   # rank -> report.summary.RankSummary
    table = compare_ranks(runs, baseline="eager", warmup=1, spec=compiled)
    print(render_ranks(table, width=120))   # fitted to 120 columns; width=None: every column
    write_csv(runs, "out/profile.csv")

Steady. A rank's figure for a row is its summary's median (`report.summary`:
the median of the calls in the measured steps, the lower middle one for an
even n, the compile step and the warm-up steps left out). Across ranks:
their median (again the lower middle one for an even number of ranks), the
shortest and the longest rank, and the slowest rank with the ratio of its
median to the median across ranks: the imbalance. Rows are ordered by their
largest imbalance over the backends. A rank's median is slow only when at
least half its calls are, so a rank slowed on every call leads the table
and one long call does not move it.

Transient. An outlier is a call over 3 times its rank's median in the row
and 20 ms longer (`summary.is_outlier`). Under the table, one line per row
and backend that has one: the rank whose longest call is the furthest over
its own median, the step of that call, the call, the rank's median and
their ratio, how many of the rank's calls are outliers, and the other ranks
with an outlier in the row; the most time over first, `OUTLIERS_SHOWN`
lines at most. A healthy row has none; a rank slow on every call has none
either (its median is as slow as its calls).

Width. `render_ranks` fits its text to `width` columns (`core.table.fit_table`):
it leaves out first each backend's ``min..max``, then the ratios between
backends, then wraps the names of modules after a dot, each continuation
indented; prose wraps between words. No cell is cut, the slowest ranks and
the outliers stay, and a note says what was left out. Up to 3 backends fit
120 columns (a name over about 25 characters wrapped).

A rank the run should have had but that left no report (it crashed, or wrote
none) is named in a note under the table (`BackendRanks.missing`). Which time
(CPU or GPU) follows `summary.time_kind`. `write_csv` writes one line per
backend, rank, row and pass (`CSV_COLUMNS`): n, the median, the shortest and
the longest call, and the step of the longest.
"""

from __future__ import annotations

import csv
import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..core.table import Column, fit_table, wrap_prose
from ..selection.compile import CompiledSpec
from .backends_table import PASSES, left_out, spec_notes, steps_text
from .numbers import format_duration, format_ratio, format_spread
from .summary import OUTLIER_FLOOR_NS, OUTLIER_RATIO, Key, RankSummary, RowKinds, Timing, time_kind

__all__ = ["BackendRanks", "RankCell", "RanksRow", "RanksTable", "compare_ranks", "render_ranks", "write_csv",
           "ranks_text", "slowest_text", "call_text", "CSV_COLUMNS", "STANDS_OUT", "OUTLIERS_SHOWN", "OUTLIER_RULE"]  # fmt: skip

CSV_COLUMNS = ("backend", "rank", "range", "pass", "n", "median_us", "min_us", "max_us", "max_step")
STANDS_OUT = 1.5  # the imbalance from which the chart names the slowest rank
OUTLIERS_SHOWN = 10
OUTLIER_RULE = f"over {OUTLIER_RATIO:g}x its rank's median in the row and at least {OUTLIER_FLOOR_NS / 1e6:g} ms longer"


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

    @property
    def stands_out(self) -> bool:
        """Whether the slowest rank's imbalance reaches `STANDS_OUT`."""
        return self.imbalance is not None and self.imbalance >= STANDS_OUT

    @property
    def outlier_ranks(self) -> tuple[int, ...]:
        """The ranks with an outlier call in the row (see the module doc)."""
        return tuple(rank for rank, timing in self.per_rank if timing.outliers)

    @property
    def outlier(self) -> int | None:
        """The rank whose longest call is an outlier the furthest over its own median; None where no call is one."""
        found = [(rank, timing) for rank, timing in self.per_rank if timing.outliers]
        return max(found, key=lambda item: (_over(item[1]), -item[0]))[0] if found else None


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

    def outliers(self) -> list[tuple[RanksRow, int, int]]:
        """(row, backend, rank) of each row and backend with an outlier (`RankCell.outlier`), the most time
        over its rank's median first."""
        found = []
        for row in self.rows:
            for b, cell in enumerate(row.cells):
                rank = cell.outlier if cell is not None else None
                if cell is not None and rank is not None:
                    found.append((_over(cell.timing(rank)), row, b, rank))
        found.sort(key=lambda item: -item[0])
        return [(row, b, rank) for _, row, b, rank in found]


def _over(timing: Timing) -> float:
    """How much longer a rank's longest call is than its median, in ns."""
    return (timing.high_ns if timing.high_ns is not None else timing.median_ns) - timing.median_ns


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


def slowest_text(cell: RankCell) -> str:
    """The slowest rank and its imbalance, ``rank 2, 212.95x`` (as the chart names it)."""
    return f"rank {cell.slowest}, {format_ratio(cell.imbalance)}x"


def call_text(rank: int, timing: Timing) -> str:
    """A rank's longest call, where and how long: ``rank 1, step 3: 200.31 ms`` (as the chart names it)."""
    where = f"rank {rank}" + (f", step {timing.high_step}" if timing.high_step is not None else "")
    return f"{where}: {format_duration(timing.median_ns + _over(timing))}"


def render_ranks(table: RanksTable, width: int | None = None) -> str:
    """The table as text, in `width` columns where it can (see the module doc; None: every column): a
    header saying which time, ranks and steps, one line per row (steady), then the outliers (transient)."""
    base = table.backends.index(table.baseline)
    others = [i for i in range(len(table.backends)) if i != base]
    warm = "step 0 (compile)" + (f" and {table.warmup} more" if table.warmup else "")
    what = "module call and region" if table.regions else "module call"
    lines = wrap_prose(
        [
            f"{table.time} per {what}, every rank: per rank the median of its calls in the measured steps "
            f"(the lower middle one for an even n), warm-up {warm} left out",
            "steady: across ranks their median, min..max, and the slowest rank with its ratio to the median, largest "
            "imbalance first" + (f"; ratio: backend / {table.baseline}" if others else ""),
        ],
        width,
    )
    for backend, ranks, steps, failure in zip(table.backends, table.ranks, table.steps, table.failures):
        said = "failed (see below)" if failure is not None else f"ranks {ranks_text(ranks)}, steps {steps_text(steps)} measured"
        lines.append(f"  {backend}: {said}")
    columns = [Column("module", "l", [row.module for row in table.rows], name=True),
               Column("pass", "l", [row.phase for row in table.rows])]  # fmt: skip
    for b, backend in enumerate(table.backends):
        median, spread, slowest = [], [], []
        for row in table.rows:
            cell = row.cells[b]
            word = cell_word(table, row, b)
            if word is not None or cell is None:
                median.append(word or "missing")
                spread.append("")
                slowest.append("")
                continue
            median.append(format_duration(cell.median_ns))
            spread.append(format_spread(cell.timing(cell.fastest).median_ns, cell.timing(cell.slowest).median_ns))
            slowest.append(slowest_text(cell))
        columns += [Column(backend, "r", median), Column(f"{backend} min..max", "r", spread, drop=1),
                    Column(f"{backend} slowest", "r", slowest)]  # fmt: skip
    columns += [
        Column(f"{table.backends[i]}/{table.baseline}", "r", [format_ratio(row.ratios[i]) for row in table.rows], drop=2)
        for i in others
    ]  # fmt: skip
    text, dropped = fit_table(columns, width)
    lines += ["", text]
    if not table.rows:
        lines.append("(no module or region ranges on any rank)")
    lines += ["", *_outliers(table, width)]
    after = []
    if dropped:
        left = [head for head in dropped if not head.endswith(" min..max")]
        words = (["each backend's min..max"] if len(left) < len(dropped) else []) + left
        after.append(f"note: to fit {width} columns, left out: {', '.join(words)} (the table written to a file has every column)")
    after += [f"note: {note}" for note in table.notes]
    after += [f"{backend} failed: {failure}" for backend, failure in zip(table.backends, table.failures) if failure is not None]
    return "\n".join(lines + ([""] + wrap_prose(after, width, "  ") if after else []))


def _outliers(table: RanksTable, width: int | None) -> list[str]:
    """The outliers under the table (see the module doc)."""
    found = table.outliers()
    if not found:
        return wrap_prose([f"outliers: none (no call {OUTLIER_RULE})"], width)
    lines = wrap_prose([f"outliers (a call {OUTLIER_RULE}): per row and backend, the rank whose call is the furthest "
                    "over, the most time over first"], width)  # fmt: skip
    heads = (("module", "l"), ("pass", "l"), ("backend", "l"), ("rank", "r"), ("step", "r"), ("call", "r"),
             ("rank's median", "r"), ("ratio", "r"), ("outliers", "r"), ("other ranks", "l"))  # fmt: skip
    cells: list[list[str]] = []
    for row, b, rank in found[:OUTLIERS_SHOWN]:
        cell = row.cells[b]
        assert cell is not None  # a row and backend with an outlier has a cell
        timing = cell.timing(rank)
        high = timing.high_ns if timing.high_ns is not None else timing.median_ns
        also = [r for r in cell.outlier_ranks if r != rank]
        cells.append([
            row.module, row.phase, table.backends[b], str(rank), "-" if timing.high_step is None else str(timing.high_step),
            format_duration(high), format_duration(timing.median_ns),
            f"{format_ratio(high / timing.median_ns if timing.median_ns else None)}x",
            f"{timing.outliers} of {timing.n}", ranks_text(also) if also else "",
        ])  # fmt: skip
    columns = [Column(head, align, [c[i] for c in cells], name=i == 0) for i, (head, align) in enumerate(heads)]
    if not any(c[-1] for c in cells):  # no other rank has an outlier in these rows
        columns.pop()
    lines.append(fit_table(columns, width)[0])
    if len(found) > OUTLIERS_SHOWN:
        lines += wrap_prose([f"and {len(found) - OUTLIERS_SHOWN} more (profile.csv: each rank's max_us and max_step)"], width)
    return lines


def write_csv(runs: Sequence[BackendRanks], path: str | os.PathLike[str]) -> None:
    """One line per backend, rank, row and pass (`CSV_COLUMNS`), in the time the table shows; ``max_step``
    empty where the run had no step ranges."""
    _, use_gpu, _ = time_kind(s for run in runs if run.failure is None for s in run.ranks.values())

    def us(ns: float | None) -> str:
        return "" if ns is None else f"{ns / 1000:.3f}"

    with open(path, "w", newline="", encoding="utf-8") as stream:
        writer = csv.writer(stream)
        writer.writerow(CSV_COLUMNS)
        for run in runs:
            if run.failure is not None:
                continue
            for rank, summary in sorted(run.ranks.items()):
                for (module, phase), t in summary.times(use_gpu).items():
                    step = "" if t.high_step is None else t.high_step
                    writer.writerow([run.backend, rank, module, phase, t.n, us(t.median_ns), us(t.low_ns), us(t.high_ns), step])
