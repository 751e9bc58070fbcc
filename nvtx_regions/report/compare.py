"""Two range captures side by side, per range name: counts, median times, their ratio.

    nvtx-regions compare eager.json thunder.json
    rows = compare("eager.json", "thunder.json"); print(render_table(rows, "eager", "thunder"))

Each side is a capture (Chrome Trace Event Format, what ``nvtx-regions capture
-o file.json`` writes, or a trace already loaded) or an Nsight Systems report,
read by `report.reader` into range records; a file that cannot be read is a
`CaptureFileError` naming it (and, in a Chrome trace, the event).
Durations and ratios read as in every table (`report.numbers`).

Nothing here imports torch or thunder.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..core.naming import ANY_DOMAIN, range_message, read_range_message
from ..core.table import text_table
from .numbers import format_duration, format_ratio
from .reader import Source, read_file
from .records import call_times

__all__ = ["CompareRow", "compare", "render_table"]


@dataclass(frozen=True)
class CompareRow:
    """One range name: how often it occurred in each capture and its median duration (µs; None if absent)."""

    name: str
    count_a: int
    count_b: int
    median_a_us: float | None
    median_b_us: float | None

    @property
    def ratio(self) -> float | None:
        """median b / median a; None when either is missing or a's is 0."""
        if self.median_a_us is None or self.median_b_us is None or self.median_a_us == 0:
            return None
        return self.median_b_us / self.median_a_us


def compare(a: Source, b: Source, *, domain: Any = ANY_DOMAIN) -> list[CompareRow]:
    """One row per range name found in `a` or `b` (paths of captures or nsys reports, or loaded Chrome traces).

    A module call whose range comes in parts (`records.continues`) is one range of its first part's
    name, as long as its parts together. Rows come in order of first occurrence in `a`, then the names only `b` has,
    in their order there. `domain` keeps only that NVTX domain's ranges on
    both sides (None: NVTX's default domain; the default, `ANY_DOMAIN`: every
    domain). Raises `CaptureFileError` for a file that cannot be read.
    """
    durations: dict[str, tuple[list[int], list[int]]] = {}
    for side, source in enumerate((a, b)):
        records = list(read_file(source, domain=domain).records)
        for index, total in call_times(records, _call_name, [record.duration_ns for record in records]).items():
            durations.setdefault(_call_name(records[index]), ([], []))[side].append(total)
    return [
        CompareRow(name, len(da), len(db), _median_us(da), _median_us(db))
        for name, (da, db) in durations.items()
    ]


def _call_name(record) -> str:
    """The name of the call `record` is a range of: its message, a later part's (`records.continues`) without ", continued"."""
    name, phase, continued = read_range_message(record.message or "")
    return range_message(name, phase) if continued else record.message or ""


def _median_us(durations_ns: list[int]) -> float | None:
    return statistics.median(durations_ns) / 1000 if durations_ns else None


def _time(us: float | None) -> str:
    return "-" if us is None else format_duration(us * 1000)


def render_table(rows: Iterable[CompareRow], a: str = "a", b: str = "b") -> str:
    """A plain-text table of `rows`, columns named after the captures `a` and `b`."""
    header = ("range", f"{a} n", f"{b} n", f"{a} median", f"{b} median", f"{b}/{a}")
    body = [
        (row.name, str(row.count_a), str(row.count_b), _time(row.median_a_us), _time(row.median_b_us), format_ratio(row.ratio))
        for row in rows
    ]
    return text_table(header, body, "l" + "r" * 5)
