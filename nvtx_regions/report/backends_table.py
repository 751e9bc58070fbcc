"""Backends side by side: per module and pass, the median time of its ranges over the
measured steps of each backend's run, and the ratio to a baseline backend.

    runs = [BackendRun("eager", read_ranges(["out/eager/report.nsys-rep"], domain="nvtx_regions")), ...]
    table = compare_backends(runs, baseline="eager", warmup=1)
    print(render_backends(table))

A run's ranges are read by `report.reader.read_ranges`: nsys reports or
captures, one rank's (``rank=``).

A run's steps are its ``step N`` ranges (`nvtx_regions.steps`, `core.profiling`).
A module range (`records.module_range`) belongs to the step range of the same
process that holds it. Step 0 is the compile step; it and the `warmup` steps
after it are left out; ranges outside every step range are left out too.
A run without step ranges counts every range, and the table says so.

Time: the GPU-projected time of each range (`report.nsys_report`, as nsys's
``nvtxgpuproj``) when every run's report holds CUDA kernels, counting the
ranges that launched GPU work; otherwise the ranges' CPU (wall-clock)
durations. The table says which. Durations and ratios read as in every table (`report.numbers`).
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..core.profiling import step_number
from ..core.table import text_table
from .numbers import format_duration, format_ratio
from .reader import Ranges
from .records import module_range

__all__ = ["BackendRun", "Timing", "BackendRow", "BackendsTable", "compare_backends", "render_backends",
           "GPU_TIME", "CPU_TIME"]  # fmt: skip

GPU_TIME = "GPU-projected time"
CPU_TIME = "CPU time"
PASSES = ("forward", "backward")


@dataclass(frozen=True)
class BackendRun:
    """One backend's run: the ranges of its reports in the spec's domain, one rank's (`report.reader.read_ranges`).

    failure: why the run gave no table (e.g. its exit status and the tail of its stderr).
    """

    backend: str
    ranges: Ranges = field(default_factory=lambda: Ranges(()))
    failure: str | None = None


@dataclass(frozen=True)
class Timing:
    """One cell: how many ranges were measured and their median (ns)."""

    n: int
    median_ns: float


@dataclass(frozen=True)
class BackendRow:
    """One module in one pass: a timing per backend (None: missing there), the ratio to the baseline."""

    module: str
    phase: str
    times: tuple[Timing | None, ...]
    ratios: tuple[float | None, ...]  # per backend: its median / the baseline's; None where either is missing


@dataclass(frozen=True)
class BackendsTable:
    """The comparison: rows with the largest ratio first; `modules` in the order the runs met them."""

    backends: tuple[str, ...]
    baseline: str
    time: str  # GPU_TIME or CPU_TIME
    rows: tuple[BackendRow, ...]
    modules: tuple[str, ...]
    steps: tuple[tuple[int, ...], ...]  # per backend, the step numbers measured
    warmup: int
    failures: tuple[str | None, ...]
    notes: tuple[str, ...] = ()

    def row(self, module: str, phase: str) -> BackendRow:
        """The row of `module` in `phase`; KeyError when no backend has it."""
        for row in self.rows:
            if (row.module, row.phase) == (module, phase):
                return row
        raise KeyError((module, phase))


def _measured(run: BackendRun, warmup: int, use_gpu: bool) -> tuple[dict[tuple[str, str], list[int]], tuple[int, ...], list[str]]:
    """Per (module, pass), the measured times of `run`; the step numbers measured; notes."""
    steps: dict[int, list[tuple[int, int, int]]] = {}  # pid -> (start, end, number), by start
    records = run.ranges.records
    for record in records:
        number = step_number(record.message)
        if number is not None:
            steps.setdefault(record.pid, []).append((record.start_ns, record.end_ns, number))
    for found in steps.values():
        found.sort()
    notes: list[str] = []
    if not steps:
        notes.append(
            f"{run.backend}: no step ranges (the script does not loop over nvtx_regions.steps(...)), "
            "so every range is counted, the compile step's too"
        )
    times: dict[tuple[str, str], list[int]] = {}
    measured: set[int] = set()
    outside = 0
    gpu = run.ranges.gpu_ns if use_gpu and run.ranges.gpu_ns is not None else (None,) * len(records)
    for record, gpu_ns in zip(records, gpu):
        module = module_range(record)
        if module is None:
            continue
        if steps:
            found = steps.get(record.pid, [])
            at = bisect.bisect_right(found, (record.start_ns, float("inf"), 0)) - 1
            if at < 0 or found[at][1] < record.end_ns:
                outside += 1
                continue
            number = found[at][2]
            if number <= warmup:
                continue
            measured.add(number)
        if use_gpu:
            if gpu_ns is None:
                continue  # this range launched no GPU work
            times.setdefault(module, []).append(gpu_ns)
        else:
            times.setdefault(module, []).append(record.duration_ns)
    if outside:
        notes.append(f"{run.backend}: {outside} module range{'s' * (outside != 1)} outside every step range, left out")
    return times, tuple(sorted(measured)), notes


def _ratio(value: Timing | None, base: Timing | None) -> float | None:
    if value is None or base is None or base.median_ns == 0:
        return None
    return value.median_ns / base.median_ns


def compare_backends(runs: Sequence[BackendRun], *, baseline: str | None = None, warmup: int = 0) -> BackendsTable:
    """The table of `runs` (one per backend, in column order); `baseline` defaults to the first.

    warmup: steps left out after the compile step (step 0), which is always left out.
    Raises ValueError for a baseline that is not one of the runs' backends.
    """
    backends = tuple(run.backend for run in runs)
    baseline = backends[0] if baseline is None else baseline
    if baseline not in backends:
        raise ValueError(f"baseline {baseline!r} is not one of the backends {', '.join(backends)}")
    ran = [run for run in runs if run.failure is None]
    use_gpu = bool(ran) and all(run.ranges.gpu_ns is not None for run in ran)
    per_backend: list[dict[tuple[str, str], list[int]]] = []
    steps: list[tuple[int, ...]] = []
    notes: list[str] = []
    order: dict[tuple[str, str], int] = {}
    for run in runs:
        if run.failure is not None:
            per_backend.append({})
            steps.append(())
            continue
        times, measured, run_notes = _measured(run, warmup, use_gpu)
        per_backend.append(times)
        steps.append(measured)
        notes += run_notes
        for key in times:
            order.setdefault(key, len(order))
    base = backends.index(baseline)
    modules = tuple(dict.fromkeys(module for module, _ in order))
    keys = sorted(order, key=lambda key: (modules.index(key[0]), PASSES.index(key[1])))
    rows = []
    for module, phase in keys:
        cells = tuple(
            Timing(len(found), statistics.median(found)) if (found := times.get((module, phase))) else None
            for times in per_backend
        )
        rows.append(BackendRow(module, phase, cells, tuple(_ratio(cell, cells[base]) for cell in cells)))
    rows.sort(key=lambda row: -_largest(row, base))
    if not use_gpu and ran and any(run.ranges.gpu_ns is not None for run in ran):
        notes.append("some reports hold CUDA kernels and some do not, so CPU times are shown for all")
    return BackendsTable(
        backends, baseline, GPU_TIME if use_gpu else CPU_TIME, tuple(rows), modules, tuple(steps), warmup,
        tuple(run.failure for run in runs), tuple(notes),
    )  # fmt: skip


def _largest(row: BackendRow, base: int) -> float:
    """The sort key: the largest ratio of a backend other than the baseline (-1 when there is none)."""
    found = [ratio for i, ratio in enumerate(row.ratios) if i != base and ratio is not None]
    return max(found, default=-1.0)


def _steps_text(numbers: Iterable[int]) -> str:
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
    lines = [
        f"{table.time} per module call: median over the measured steps (n ranges), warm-up {warm} left out; "
        f"ratio: backend / {table.baseline}"
    ]
    for backend, steps, failure in zip(table.backends, table.steps, table.failures):
        lines.append(f"  {backend}: " + ("failed (see below)" if failure is not None else f"steps {_steps_text(steps)} measured"))
    head = ["module", "pass", *table.backends, *(f"{table.backends[i]}/{table.baseline}" for i in others)]
    body = []
    for row in table.rows:
        cells = []
        for cell, failure in zip(row.times, table.failures):
            cells.append("failed" if failure is not None else "missing" if cell is None else f"{format_duration(cell.median_ns)} ({cell.n})")
        ratios = [format_ratio(row.ratios[i]) for i in others]
        body.append([row.module, row.phase, *cells, *ratios])
    lines += ["", text_table(head, body, "ll" + "r" * (len(head) - 2), rule=True)]
    if not table.rows and all(failure is not None for failure in table.failures):
        lines.append("(no module ranges: every run failed)")
    elif not table.rows:
        lines.append("(no module ranges in any run: the spec needs an `each module` or `each class` rule)")
    after = [f"note: {note}" for note in table.notes]
    after += [f"{backend} failed: {failure}" for backend, failure in zip(table.backends, table.failures) if failure is not None]
    return "\n".join(lines + ([""] + after if after else []))
