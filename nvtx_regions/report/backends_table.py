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

A run's ranges are read by `report.reader.read_ranges`: nsys reports or
captures, one rank's (``rank=``).

A run's steps are its ``step N`` ranges (`nvtx_regions.steps`, `core.profiling`).
A module range (`records.module_range`) belongs to the step range of the same
process that holds it. Step 0 is the compile step; it and the `warmup` steps
after it are left out; ranges outside every step range are left out too.
A run without step ranges counts every range, and the table says so.

Time: the GPU time of each range when every run's file holds CUDA kernels,
counting the ranges that launched GPU work: projected from its kernels in an
nsys report (`report.nsys_report`, as nsys's ``nvtxgpuproj``), that of its
``gpu_user_annotation`` in a torch.profiler trace (`report.torch_trace`);
otherwise the ranges' CPU (wall-clock) durations. The table says which, and
from what, for torch.profiler traces. A range without a category (torch.profiler
keeps none) whose message is a region rule's label is that region's. Durations and ratios read as in every table (`report.numbers`).
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..capture.chrome import RangeRecord
from ..core.profiling import step_number
from ..core.naming import rule_category
from ..core.table import text_table
from ..selection.compile import CompiledSpec, OpRule, RegionRule
from ..selection.support import BACKEND_NAMES, why_not
from .numbers import format_duration, format_ratio
from .reader import Ranges
from .records import module_range

__all__ = ["BackendRun", "Timing", "BackendRow", "BackendsTable", "compare_backends", "render_backends", "cell_word",
           "GPU_TIME", "CPU_TIME", "TORCH_GPU_TIME", "TORCH_CPU_TIME"]  # fmt: skip

GPU_TIME = "GPU-projected time"
CPU_TIME = "CPU time"
TORCH_GPU_TIME = "GPU time (torch.profiler's gpu_user_annotation)"
TORCH_CPU_TIME = "CPU time (torch.profiler's user_annotation)"
PASSES = ("forward", "backward", "both")  # "both": a region rule that applies to either pass


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
    """One module (or region) in one pass: a timing per backend (None: none there), the ratio to the baseline."""

    module: str  # a module path, or a region's label
    phase: str  # "forward", "backward", or "both" (a region rule for either pass)
    times: tuple[Timing | None, ...]
    ratios: tuple[float | None, ...]  # per backend: its median / the baseline's; None where either is missing
    # Per backend: the rule behind the row is one the backend cannot express (n/a, not missing).
    not_applicable: tuple[bool, ...] = ()
    region: bool = False


@dataclass(frozen=True)
class _Rows:
    """Which ranges are rows (see the module doc)."""

    regions: dict[tuple[str, str], str]  # (NVTX category, message) of a region rule's ranges -> its pass
    per_op: frozenset[str]  # the NVTX categories of rules with one range per op

    def category(self, record: RangeRecord) -> str | None:
        """The NVTX category of a range: its own, else that of the region rule its message is the label of."""
        if record.category_name is not None:
            return record.category_name
        return next((category for category, label in self.regions if label == record.message), None)

    def key(self, record: RangeRecord) -> tuple[str, str] | None:
        """(row name, pass) of a range, or None for a range that is no row."""
        found = self.regions.get((self.category(record), record.message))
        if found is not None:
            return record.message, found
        if record.category_name in self.per_op:
            return None
        return module_range(record)

    @classmethod
    def of(cls, spec: CompiledSpec | None) -> _Rows:
        regions: dict[tuple[str, str], str] = {}
        per_op = set()
        for rule in spec.rules if spec is not None else ():
            if isinstance(rule, RegionRule):
                label = rule.rule.label if rule.rule.label is not None else rule.region.text()
                regions[(rule_category(rule.rule), label)] = rule.region.phase or "both"
            elif isinstance(rule, OpRule):
                per_op.add(rule_category(rule.rule))
        return cls(regions, frozenset(per_op))


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

    def row(self, module: str, phase: str) -> BackendRow:
        """The row of `module` in `phase`; KeyError when no backend has it."""
        for row in self.rows:
            if (row.module, row.phase) == (module, phase):
                return row
        raise KeyError((module, phase))


def _measured(
    run: BackendRun, warmup: int, use_gpu: bool, rows: _Rows
) -> tuple[dict[tuple[str, str], list[int]], dict[tuple[str, str], str | None], tuple[int, ...], list[str]]:
    """Per row (name, pass), the measured times of `run` and its ranges' NVTX category; the step
    numbers measured; notes."""
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
    categories: dict[tuple[str, str], str | None] = {}
    measured: set[int] = set()
    warm = 0  # ranges in the steps left out
    outside = 0
    gpu = run.ranges.gpu_ns if use_gpu and run.ranges.gpu_ns is not None else (None,) * len(records)
    for record, gpu_ns in zip(records, gpu):
        module = rows.key(record)
        if module is None:
            continue
        categories.setdefault(module, rows.category(record))
        if steps:
            found = steps.get(record.pid, [])
            at = bisect.bisect_right(found, (record.start_ns, float("inf"), 0)) - 1
            if at < 0 or found[at][1] < record.end_ns:
                outside += 1
                continue
            number = found[at][2]
            if number <= warmup:
                warm += 1
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
    if warm and not measured:
        last = max(number for found in steps.values() for _, _, number in found)
        notes.append(
            f"{run.backend}: no step left to measure: its steps are 0..{last}, and step 0 (compile) and "
            f"{warmup} warm-up step{'s' * (warmup != 1)} are left out; run more steps, or lower --warmup"
        )
    return times, categories, tuple(sorted(measured)), notes


def _ratio(value: Timing | None, base: Timing | None) -> float | None:
    if value is None or base is None or base.median_ns == 0:
        return None
    return value.median_ns / base.median_ns


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
    ran = [run for run in runs if run.failure is None]
    use_gpu = bool(ran) and all(run.ranges.gpu_ns is not None for run in ran)
    rows_of = _Rows.of(spec)
    per_backend: list[dict[tuple[str, str], list[int]]] = []
    steps: list[tuple[int, ...]] = []
    notes: list[str] = []
    order: dict[tuple[str, str], int] = {}
    categories: dict[tuple[str, str], str | None] = {}
    for run in runs:
        if run.failure is not None:
            per_backend.append({})
            steps.append(())
            continue
        times, found, measured, run_notes = _measured(run, warmup, use_gpu, rows_of)
        per_backend.append(times)
        steps.append(measured)
        notes += run_notes
        for key in times:
            order.setdefault(key, len(order))
            categories.setdefault(key, found[key])
    left_out = _left_out(spec, backends)
    notes += _spec_notes(spec, backends, left_out)
    base = backends.index(baseline)
    modules = tuple(dict.fromkeys(module for module, _ in order))
    keys = sorted(order, key=lambda key: (modules.index(key[0]), PASSES.index(key[1])))
    rows = []
    for module, phase in keys:
        cells = tuple(
            Timing(len(found), statistics.median(found)) if (found := times.get((module, phase))) else None
            for times in per_backend
        )
        na = tuple(categories[(module, phase)] in left_out[b] for b in range(len(backends)))
        region = (categories[(module, phase)], module) in rows_of.regions
        rows.append(BackendRow(module, phase, cells, tuple(_ratio(cell, cells[base]) for cell in cells), na, region))
    rows.sort(key=lambda row: -_largest(row, base))
    if not use_gpu and ran and any(run.ranges.gpu_ns is not None for run in ran):
        notes.append("some reports hold CUDA kernels and some do not, so CPU times are shown for all")
    files = [file for run in ran for file in run.ranges.files]
    torch = bool(files) and all(file.torch for file in files)
    time = (TORCH_GPU_TIME if torch else GPU_TIME) if use_gpu else (TORCH_CPU_TIME if torch else CPU_TIME)
    return BackendsTable(
        backends, baseline, time, tuple(rows), modules, tuple(steps), warmup,
        tuple(run.failure for run in runs), tuple(notes), any(row.region for row in rows),
    )  # fmt: skip


def _left_out(spec: CompiledSpec | None, backends: Sequence[str]) -> list[frozenset[str]]:
    """Per backend, the NVTX categories of the rules it cannot express."""
    rules = spec.rules if spec is not None else ()
    known = [backend in BACKEND_NAMES for backend in backends]
    return [
        frozenset(rule_category(r.rule) for r in rules if ok and why_not(r, backend) is not None)
        for backend, ok in zip(backends, known)
    ]


def _spec_notes(spec: CompiledSpec | None, backends: Sequence[str], left_out: list[frozenset[str]]) -> list[str]:
    notes = []
    if spec is not None:
        per_op = [rule_category(r.rule) for r in spec.rules if isinstance(r, OpRule)]
        if per_op:
            notes.append(f"rules with one range per op have no rows (their ranges are named after ops): {', '.join(per_op)}")
    for backend, names in zip(backends, left_out):
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
    what = "module call and region" if table.regions else "module call"
    lines = [
        f"{table.time} per {what}: median over the measured steps (n ranges), warm-up {warm} left out; "
        f"ratio: backend / {table.baseline}"
    ]
    for backend, steps, failure in zip(table.backends, table.steps, table.failures):
        lines.append(f"  {backend}: " + ("failed (see below)" if failure is not None else f"steps {_steps_text(steps)} measured"))
    head = ["module", "pass", *table.backends, *(f"{table.backends[i]}/{table.baseline}" for i in others)]
    body = []
    for row in table.rows:
        cells = []
        for b, (cell, failure) in enumerate(zip(row.times, table.failures)):
            cells.append(cell_word(table, row, b) or f"{format_duration(cell.median_ns)} ({cell.n})")  # type: ignore[union-attr]
        ratios = [format_ratio(row.ratios[i]) for i in others]
        body.append([row.module, row.phase, *cells, *ratios])
    lines += ["", text_table(head, body, "ll" + "r" * (len(head) - 2), rule=True)]
    if not table.rows and all(failure is not None for failure in table.failures):
        lines.append("(no module ranges: every run failed)")
    elif not table.rows and any("no step left to measure" in note for note in table.notes):
        lines.append("(no step left to measure: every module range is in the compile step or the warm-up steps)")
    elif not table.rows:
        lines.append("(no module or region ranges in any run: the spec needs an `each module`, `each class` or `between` rule)")
    after = [f"note: {note}" for note in table.notes]
    after += [f"{backend} failed: {failure}" for backend, failure in zip(table.backends, table.failures) if failure is not None]
    return "\n".join(lines + ([""] + after if after else []))
