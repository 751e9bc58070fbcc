"""A summary of NVTX ranges, laid out like Nsight Systems' ``nsys stats --report nvtx_sum``.

    from nvtx_regions.capture import capture_subprocess, summarize
    print(summarize(capture_subprocess(["python", "train.py"])))

One row per (domain, message), or with ``by="label"`` per (domain, rule):
each nvtx_regions rule gives its ranges an NVTX category named after the rule
(its label, else its text), so the per-op ranges of a rule, whose messages
are each op's Python line, add up to one row. Ranges with no named category
keep their message. Columns, as nsys prints them: time %, total, instances,
average, median, min, max and standard deviation (sample, n - 1; 0 for one
instance) in nanoseconds, style (``PushPop``/``StartEnd``) and the range as
``domain:message`` (``:message`` for the default domain). Rows are sorted
by total time, largest first.

Input: captured events (a `CaptureResult`, a `ProcessCapture`, `NvtxEvent`
items) or `RangeRecord` items (`iter_items`, or
`nvtx_regions.report.chrome_trace.load_chrome_trace` of a saved timeline).
Memory: one 8-byte duration per range (for the median).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..core.table import text_table
from .chrome import RangeRecord, iter_items

__all__ = ["Summary", "SummaryRow", "Summarizer", "summarize", "BY"]

BY = ("message", "label")


@dataclass(frozen=True)
class SummaryRow:
    """One row of the table; times in nanoseconds. unclosed: instances never closed (closed at exit)."""

    domain: str | None
    name: str | None
    style: str
    instances: int
    total_ns: int
    avg_ns: float
    med_ns: float
    min_ns: int
    max_ns: int
    stddev_ns: float
    time_pct: float
    unclosed: int = 0

    @property
    def range(self) -> str:
        return f"{self.domain or ''}:{self.name or ''}"


@dataclass(frozen=True)
class Summary:
    """The rows, sorted by total time (largest first); `str()` is the table."""

    rows: tuple[SummaryRow, ...]
    by: str = "message"

    def instances(self) -> dict[tuple[str | None, str | None], int]:
        """(domain, name) -> instances, for assertions."""
        return {(r.domain, r.name): r.instances for r in self.rows}

    def __str__(self) -> str:
        head = ("Time (%)", "Total Time (ns)", "Instances", "Avg (ns)", "Med (ns)", "Min (ns)", "Max (ns)", "StdDev (ns)", "Style", "Range")
        cells = [
            (f"{r.time_pct:.1f}", str(r.total_ns), str(r.instances), f"{r.avg_ns:.1f}", f"{r.med_ns:.1f}",
             str(r.min_ns), str(r.max_ns), f"{r.stddev_ns:.1f}", r.style, r.range)
            for r in self.rows
        ]  # fmt: skip
        out = [text_table(head, cells, "r" * 8 + "ll", rule=True)]
        unclosed = sum(r.unclosed for r in self.rows)
        if unclosed:
            out.append(f"({unclosed} range{'s' * (unclosed != 1)} never closed: counted up to the process's last event)")
        if not self.rows:
            out.append("(no NVTX ranges)")
        return "\n".join(out)


class Summarizer:
    """Accumulate `RangeRecord` items one at a time; `result()` gives the `Summary`."""

    def __init__(self, by: str = "message"):
        if by not in BY:
            raise ValueError(f"by= must be one of {BY}, not {by!r}")
        self.by = by
        self._groups: dict[tuple[str | None, str | None, str], tuple[array, list[int]]] = {}

    def add(self, record: RangeRecord) -> None:
        name = record.message
        if self.by == "label" and record.category_name is not None:
            name = record.category_name
        key = (record.domain, name, record.style)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = (array("q"), [0])
        group[0].append(record.duration_ns)
        group[1][0] += record.unclosed

    def result(self) -> Summary:
        grand = sum(sum(d) for d, _ in self._groups.values()) or 1
        rows = []
        for (domain, name, style), (durations, unclosed) in self._groups.items():
            values = sorted(durations)
            n = len(values)
            total = sum(values)
            mean = total / n
            mid = n // 2
            median = float(values[mid]) if n % 2 else (values[mid - 1] + values[mid]) / 2
            stddev = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
            rows.append(
                SummaryRow(domain, name, style, n, total, mean, median, values[0], values[-1], stddev,
                           100.0 * total / grand, unclosed[0])
            )  # fmt: skip
        rows.sort(key=lambda r: (-r.total_ns, r.range))
        return Summary(tuple(rows), self.by)


def _range_records(source: Any) -> Iterable[RangeRecord]:
    if hasattr(source, "processes"):  # CaptureResult
        for p in source.processes.values():
            yield from _range_records(p)
        return
    if hasattr(source, "events") and hasattr(source, "pid"):  # ProcessCapture
        yield from (i for i in iter_items(source.events, ranks={source.pid: source.rank}) if isinstance(i, RangeRecord))
        return
    items = list(source)
    if items and not isinstance(items[0], RangeRecord):  # NvtxEvent items
        items = [i for i in iter_items(items) if isinstance(i, RangeRecord)]
    yield from items


def summarize(source: Any, *, by: str = "message") -> Summary:
    """Summarize the NVTX ranges of `source` (see the module docstring) like ``nsys stats --report nvtx_sum``.

    by: ``"message"`` (one row per domain and message) or ``"label"`` (per
    domain and NVTX category name, that is per nvtx_regions rule). Marks are
    not ranges and are not counted. Ranges never closed are counted up to
    their process's last event and flagged (`SummaryRow.unclosed`).
    """
    summarizer = Summarizer(by)
    for record in _range_records(source):
        summarizer.add(record)
    return summarizer.result()
