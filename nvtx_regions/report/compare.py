"""Two range captures side by side, per range name: counts, median times, their ratio.

    nvtx-regions compare eager.json thunder.json
    rows = compare("eager.json", "thunder.json"); print(render_table(rows, "eager", "thunder"))

The inputs are Chrome Trace Event Format files (what ``nvtx-regions capture
-o file.json`` writes, and `nvtx_regions.capture.write_chrome_trace`), read by
`report.chrome_trace`, or Nsight Systems reports (`report.nsys_report`): a JSON
object with a ``traceEvents`` list, or a bare list of events. Complete
events (``"ph": "X"``, push/pop ranges) count, each a range named ``name``
lasting ``dur`` microseconds, in the domain ``args.domain`` if present, else
``cat`` (``"NVTX"``: the default domain); so do nestable async pairs
(``"b"``/``"e"`` with the same ``id``: NVTX start/end ranges), lasting from
``b`` to ``e``. Every other phase (metadata, instants, ``B``/``E`` pairs) is
not a range and is passed over; a complete event without
a string ``name`` or with a ``dur`` that is not a number >= 0 is an error
(`CaptureFileError`, naming the file and the event's index).

Nothing here imports torch or thunder.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..core.naming import ANY_DOMAIN, in_domain
from ..core.table import text_table
from .chrome_trace import TraceInput, complete_events
from .nsys_report import REPORT_SUFFIXES, read_report

__all__ = ["CompareRow", "compare", "load_ranges", "render_table"]


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


def load_ranges(source: TraceInput, *, domain: Any = ANY_DOMAIN) -> list[tuple[str | None, str, float]]:
    """(domain, name, duration in µs) of each complete event of a Chrome trace (a path or loaded JSON).

    `domain` keeps only that domain's ranges (None: NVTX's default domain;
    the default, `ANY_DOMAIN`: every domain).
    An Nsight Systems report (``.nsys-rep``, or its ``.sqlite`` export) is
    read with `report.nsys_report.read_report`.
    Raises `CaptureFileError` for a file that is missing or not a Chrome
    trace or an nsys report, naming the event for one that is not a
    well-formed range (`nvtx_regions.report.chrome_trace.complete_events`).
    """
    if isinstance(source, (str, os.PathLike)) and os.fspath(source).endswith(REPORT_SUFFIXES):
        ranges = read_report(source).ranges
        return [(r.domain, r.message or "", r.duration_ns / 1000) for r in ranges if in_domain(r.domain, domain)]
    events = complete_events(source)
    return [(event.domain, event.name, event.dur_us) for event in events if in_domain(event.domain, domain)]


def compare(a: TraceInput, b: TraceInput, *, domain: Any = ANY_DOMAIN) -> list[CompareRow]:
    """One row per range name found in `a` or `b` (Chrome traces: paths or loaded JSON).

    Rows come in order of first occurrence in `a`, then the names only `b` has,
    in their order there. `domain` restricts both sides to one NVTX domain
    (as for `load_ranges`).
    """
    durations: dict[str, tuple[list[float], list[float]]] = {}
    for side, trace in enumerate((a, b)):
        for _, name, dur in load_ranges(trace, domain=domain):
            durations.setdefault(name, ([], []))[side].append(dur)
    return [
        CompareRow(
            name,
            len(da),
            len(db),
            statistics.median(da) if da else None,
            statistics.median(db) if db else None,
        )
        for name, (da, db) in durations.items()
    ]


def _time(us: float | None) -> str:
    if us is None:
        return "-"
    if us >= 1000:
        return f"{us / 1000:.2f} ms"
    return f"{us:.1f} us"


def render_table(rows: Iterable[CompareRow], a: str = "a", b: str = "b") -> str:
    """A plain-text table of `rows`, columns named after the captures `a` and `b`."""
    header = ("range", f"{a} n", f"{b} n", f"{a} median", f"{b} median", f"{b}/{a}")
    body = [
        (
            row.name,
            str(row.count_a),
            str(row.count_b),
            _time(row.median_a_us),
            _time(row.median_b_us),
            "-" if row.ratio is None else f"{row.ratio:.2f}",
        )
        for row in rows
    ]
    return text_table(header, body, "l" + "r" * 5)
