"""One rank's run, summarized as it is read: per row (module or region, and pass), how many calls
were measured, their median and their spread. The tables of `backends_table` and `ranks_table`
are made from these summaries, never from the events, so a table over 64 ranks holds 64 × rows
numbers, not every range of every rank.

    rows = RowKinds.of(compile_spec(load("blocks.nvtx")))
    per_rank = summarize_ranks(read_ranges(["out/eager/timeline.json"], domain="nvtx_regions"), rows=rows, warmup=1)
    per_rank[2].cpu[("blocks.1", "forward")]   # Timing(n=3, median_ns=..., low_ns=..., high_ns=...)

Rows: one per module and pass for the ranges of ``each module``/``each class``
rules (`records.module_range`), and, given the spec, one per region and pass
for the ranges of its ``between`` rules (named by the rule's label; a region
rule without ``and forward``/``and backward`` has one row, pass ``both``).
Rules with one range per op give no rows: their ranges are named after ops,
which differ from backend to backend.

Steps: a run's steps are its ``step N`` ranges (`nvtx_regions.steps`). A
module range belongs to the step range of the same process that holds it.
Step 0 is the compile step; it and the `warmup` steps after it are left
out; ranges outside every step range are left out too. A run without step
ranges counts every range, and its notes say so.

A module call whose range comes in parts, where a compiler ran other modules'
work between the call's own (``o_proj (backward, continued)``, `records.continues`),
is one call, as long as its parts together.

A range that never ended (``unclosed``: its process crashed or was stopped
inside it, so its end is only the process's last event) is no call: it is
left out, and the notes say how many.

The median of a row is the lower middle call for an even n (`statistics.median_low`):
over two calls, one a 125 ms spike (a compile, a page fault), it is the other call, never
their mean. `Timing.low_ns` and `Timing.high_ns` give the spread across calls, and
`Timing.high_step` the step of the longest call.

An outlier is a call over `OUTLIER_RATIO` (3) times its row's median and longer than it
by `OUTLIER_FLOOR_NS` (20 ms) or more (`is_outlier`): a one-off stall (a GC pause, a
retried send, a page-in from disk), not a slow rank, whose every call is slow and whose
median is. Both bounds keep noise out: the ratio, a slower call of a long module; the
floor, a short call the OS took the core from, which can be 100 times its median: a few
ms, and over 10 ms on a CPU with three busy processes per core. `Timing.outliers` counts them.

Time: a summary keeps CPU (wall-clock) times, and GPU times where its files
hold CUDA kernels (counting the ranges that launched GPU work); a table shows
GPU times when every summary has them (`time_kind`).
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..capture.chrome import RangeRecord
from ..core.naming import rule_category
from ..core.profiling import step_number
from ..selection.compile import CompiledSpec, OpRule, RegionRule
from .reader import Ranges
from .records import call_times, module_range

__all__ = ["Key", "Timing", "RowKinds", "RankSummary", "summarize", "summarize_ranks", "time_kind", "is_outlier",
           "OUTLIER_RATIO", "OUTLIER_FLOOR_NS", "GPU_TIME", "CPU_TIME", "TORCH_GPU_TIME", "TORCH_CPU_TIME"]  # fmt: skip

GPU_TIME = "GPU-projected time"
CPU_TIME = "CPU time"
TORCH_GPU_TIME = "GPU time (torch.profiler's gpu_user_annotation)"
TORCH_CPU_TIME = "CPU time (torch.profiler's user_annotation)"

Key = tuple[str, str]
"""A row: (module path or region label, pass)."""


OUTLIER_RATIO = 3.0
OUTLIER_FLOOR_NS = 20_000_000  # 20 ms


def is_outlier(call_ns: float, median_ns: float) -> bool:
    """Whether a call of `call_ns` is an outlier among calls of median `median_ns` (see the module doc)."""
    return call_ns > OUTLIER_RATIO * median_ns and call_ns - median_ns >= OUTLIER_FLOOR_NS


@dataclass(frozen=True)
class Timing:
    """One row's calls: how many were measured, their median (the lower middle one for an even n), their
    spread (the shortest and the longest call), in ns; the step of the longest call (None without step
    numbers), and how many calls are outliers (`is_outlier`)."""

    n: int
    median_ns: float
    low_ns: float | None = None
    high_ns: float | None = None
    high_step: int | None = None
    outliers: int = 0

    @classmethod
    def of(cls, durations: Iterable[float], steps: Iterable[int] | None = None) -> Timing:
        """The timing of `durations` (ns; at least one), made in `steps` (one per duration) where given.
        Of calls equally long, the longest is the first."""
        found = list(durations)
        at = sorted(found)
        median = statistics.median_low(at)
        longest = max(range(len(found)), key=found.__getitem__)
        step = list(steps)[longest] if steps is not None else None
        return cls(len(found), median, at[0], at[-1], step, sum(is_outlier(call, median) for call in found))


@dataclass(frozen=True)
class RowKinds:
    """Which ranges are rows (see the module doc), from the spec."""

    regions: Mapping[tuple[str, str], str]  # (NVTX category, message) of a region rule's ranges -> its pass
    per_op: frozenset[str]  # the NVTX categories of rules with one range per op

    def category(self, record: RangeRecord) -> str | None:
        """The NVTX category of a range: its own, else that of the region rule its message is the label of."""
        if record.category_name is not None:
            return record.category_name
        return next((category for category, label in self.regions if label == record.message), None)

    def key(self, record: RangeRecord) -> Key | None:
        """(row name, pass) of a range, or None for a range that is no row."""
        found = self.regions.get((self.category(record), record.message))
        if found is not None:
            return record.message, found
        if record.category_name in self.per_op:
            return None
        return module_range(record)

    @classmethod
    def of(cls, spec: CompiledSpec | None) -> RowKinds:
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
class RankSummary:
    """One rank of one backend's run: per row its CPU timing and, where the files hold CUDA kernels, its
    GPU timing (`gpu` None otherwise); the rows' NVTX categories, in the order the run met them; the
    step numbers measured; notes (in words, without the backend's name); whether every file was a
    torch.profiler trace; the files read."""

    rank: int
    cpu: Mapping[Key, Timing]
    gpu: Mapping[Key, Timing] | None
    categories: Mapping[Key, str | None]
    steps: tuple[int, ...]
    notes: tuple[str, ...] = ()
    torch: bool = False
    sources: tuple[str, ...] = ()
    ran: tuple[int, ...] = ()  # the numbers of every step range in the files, measured or not

    def times(self, use_gpu: bool) -> Mapping[Key, Timing]:
        """The GPU timings with `use_gpu` (when there are any), else the CPU ones."""
        return self.gpu if use_gpu and self.gpu is not None else self.cpu


def time_kind(summaries: Iterable[RankSummary]) -> tuple[str, bool, bool]:
    """(which time a table of `summaries` shows, whether it is the GPU time, whether some summaries have
    GPU times and others do not): GPU where every summary has GPU times."""
    summaries = list(summaries)
    use_gpu = bool(summaries) and all(s.gpu is not None for s in summaries)
    mixed = not use_gpu and any(s.gpu is not None for s in summaries)
    torch = bool(summaries) and all(s.torch for s in summaries)
    time = (TORCH_GPU_TIME if torch else GPU_TIME) if use_gpu else (TORCH_CPU_TIME if torch else CPU_TIME)
    return time, use_gpu, mixed


def summarize(
    records: Iterable[RangeRecord], gpu_ns: Iterable[int | None] | None, *, rank: int, rows: RowKinds, warmup: int,
    torch: bool = False, sources: tuple[str, ...] = (),
) -> RankSummary:  # fmt: skip
    """The summary of one rank's `records` (`gpu_ns`: per record its GPU ns, None where the files hold no
    CUDA kernels); see the module doc for rows, steps and times."""
    records = list(records)
    gpu = list(gpu_ns) if gpu_ns is not None else None
    steps: dict[int, list[tuple[int, int, int]]] = {}  # pid -> (start, end, number), by start
    for record in records:
        number = step_number(record.message)
        if number is not None:
            steps.setdefault(record.pid, []).append((record.start_ns, record.end_ns, number))
    for found in steps.values():
        found.sort()
    notes: list[str] = []
    if not steps:
        notes.append(
            "no step ranges (the script does not loop over nvtx_regions.steps(...)), so every range is counted, the compile step's too"
        )
    cpu_times: dict[Key, list[int]] = {}
    gpu_times: dict[Key, list[int]] = {}
    cpu_steps: dict[Key, list[int]] = {}  # the step of each call in cpu_times, where there are step ranges
    gpu_steps: dict[Key, list[int]] = {}
    categories: dict[Key, str | None] = {}
    measured: set[int] = set()
    warm = outside = unclosed = 0
    # A call's time is its range's and its later parts' (`records.continues`).
    cpu_calls = call_times(records, rows.key, [None if r.unclosed else r.duration_ns for r in records])
    gpu_calls = call_times(records, rows.key, gpu) if gpu is not None else {}
    for index, record in enumerate(records):
        key = rows.key(record)
        if key is None or index not in cpu_calls:
            continue
        if record.unclosed:  # its end is only the process's last event: no duration
            unclosed += 1
            continue
        categories.setdefault(key, rows.category(record))
        if steps:
            found = steps.get(record.pid, [])
            at = bisect.bisect_right(found, (record.start_ns, float("inf"), 0)) - 1
            if at < 0 or found[at][1] < record.end_ns:
                outside += 1
                continue
            if found[at][2] <= warmup:
                warm += 1
                continue
            measured.add(found[at][2])
            cpu_steps.setdefault(key, []).append(found[at][2])
        cpu_times.setdefault(key, []).append(cpu_calls[index])
        if gpu_calls.get(index) is not None:  # a range that launched no GPU work has no GPU time
            gpu_times.setdefault(key, []).append(gpu_calls[index])
            if steps:
                gpu_steps.setdefault(key, []).append(found[at][2])
    if unclosed:
        notes.append(
            f"{unclosed} module range{'s' * (unclosed != 1)} never ended (the process crashed or was stopped inside "
            f"{'them' if unclosed != 1 else 'it'}), left out; the rows hold the calls that ended"
        )
    if outside:
        notes.append(f"{outside} module range{'s' * (outside != 1)} outside every step range, left out")
    if warm and not measured:
        last = max(number for found in steps.values() for _, _, number in found)
        notes.append(
            f"no step left to measure: its steps are 0..{last}, and step 0 (compile) and "
            f"{warmup} warm-up step{'s' * (warmup != 1)} are left out; run more steps, or lower --warmup"
        )
    return RankSummary(
        rank,
        {key: Timing.of(found, cpu_steps.get(key)) for key, found in cpu_times.items()},
        {key: Timing.of(found, gpu_steps.get(key)) for key, found in gpu_times.items()} if gpu is not None else None,
        {key: categories[key] for key in cpu_times},
        tuple(sorted(measured)), tuple(notes), torch, sources, tuple(sorted({n for found in steps.values() for *_, n in found})),
    )  # fmt: skip


def summarize_ranks(ranges: Ranges, *, rows: RowKinds, warmup: int, rank: int | None = None) -> dict[int, RankSummary]:
    """The summary of each rank in `ranges`, by rank: a record's own rank (a capture's or torch.profiler's),
    else `rank` (an nsys report holds one rank's ranges; its name says which), else 0."""
    by_rank: dict[int, tuple[list[RangeRecord], list[int | None]]] = {}
    gpu = ranges.gpu_ns
    for index, record in enumerate(ranges.records):
        number = record.rank if record.rank is not None else rank if rank is not None else 0
        found, found_gpu = by_rank.setdefault(number, ([], []))
        found.append(record)
        if gpu is not None:
            found_gpu.append(gpu[index])
    if not by_rank:  # no ranges at all: one empty summary, so the table can say so
        by_rank[rank if rank is not None else 0] = ([], [])
    torch = bool(ranges.files) and all(file.torch for file in ranges.files)
    sources = tuple(file.source for file in ranges.files)
    return {
        number: summarize(records, found_gpu if gpu is not None else None, rank=number, rows=rows, warmup=warmup,
                          torch=torch, sources=sources)  # fmt: skip
        for number, (records, found_gpu) in sorted(by_rank.items())
    }
