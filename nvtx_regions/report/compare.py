"""Two range captures side by side, per range name: counts, median times, their ratio.

    nvtx-regions compare eager.json thunder.json
    rows = compare("eager.json", "thunder.json"); print(render_table(rows, "eager", "thunder"))

The inputs are Chrome Trace Event Format files (what ``nvtx-regions capture
-o file.json`` writes, and what `write_chrome_trace` here writes): a JSON
object with a ``traceEvents`` list, or a bare list of events. Complete
events (``"ph": "X"``, push/pop ranges) count, each a range named ``name``
lasting ``dur`` microseconds, in the domain ``args.domain`` if present, else
``cat``; so do nestable async pairs (``"b"``/``"e"`` with the same ``id``:
NVTX start/end ranges), lasting from ``b`` to ``e``. Every other phase
(metadata, instants, ``B``/``E`` pairs) is ignored.

Nothing here imports torch or thunder.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..capture.chrome import start_end_pairs
from ..core.errors import SelectorError

__all__ = ["CompareRow", "compare", "load_ranges", "render_table", "write_chrome_trace", "chrome_trace"]

DEFAULT_DOMAIN_CAT = "NVTX"  # what the nvtx package calls NVTX's default domain

_ANY: Any = object()


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


Source = str | os.PathLike[str] | Mapping[str, Any] | list[Any]


def load_ranges(source: Source, *, domain: str | None = _ANY) -> list[tuple[str | None, str, float]]:
    """(domain, name, duration in µs) of each complete event of a Chrome trace (a path or loaded JSON).

    `domain` keeps only that domain's ranges (None: NVTX's default domain).
    Raises `SelectorError` for a file that is missing or not a Chrome trace.
    """
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        try:
            with open(path, encoding="utf-8") as stream:
                data = json.load(stream)
        except OSError as error:
            raise SelectorError(f"{path}: cannot read the capture file: {error.strerror}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise SelectorError(
                f"{path}: not JSON ({error}); pass a file written by 'nvtx-regions capture -o FILE.json'"
            ) from None
    else:
        path, data = "<trace>", source
    events = data.get("traceEvents") if isinstance(data, Mapping) else data
    if not isinstance(events, list):
        raise SelectorError(
            f"{path}: not a Chrome trace (expected a 'traceEvents' list or a list of events); "
            "pass a file written by 'nvtx-regions capture -o FILE.json'"
        )
    complete = [
        (event, float(event.get("dur", 0.0))) for event in events if isinstance(event, Mapping) and event.get("ph") == "X"
    ]
    out = []
    for event, dur in complete + list(start_end_pairs(events)):
        if "name" not in event:
            continue
        args = event.get("args") or {}
        cat = event.get("cat")
        event_domain = args["domain"] if "domain" in args else (None if cat == DEFAULT_DOMAIN_CAT else cat)
        if domain is not _ANY and event_domain != domain:
            continue
        out.append((event_domain, str(event["name"]), dur))
    return out


def compare(a: Source, b: Source, *, domain: str | None = _ANY) -> list[CompareRow]:
    """One row per range name found in `a` or `b` (Chrome traces: paths or loaded JSON).

    Rows come in order of first occurrence in `a`, then the names only `b` has,
    in their order there. `domain` restricts both sides to one NVTX domain.
    """
    durations: dict[str, tuple[list[float], list[float]]] = {}
    for side, source in enumerate((a, b)):
        for _, name, dur in load_ranges(source, domain=domain):
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
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    lines = []
    for line in [header, *body]:
        cells = [line[0].ljust(widths[0])] + [cell.rjust(width) for cell, width in zip(line[1:], widths[1:])]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def chrome_trace(events: Iterable[Any]) -> dict[str, Any]:
    """Captured NVTX events (`nvtx_regions.testing.NvtxEvent`) as a Chrome trace: one complete
    event per push/pop range, named by its message, ``cat`` its domain (``"NVTX"`` for
    the default domain), ``ts``/``dur`` in µs. Ranges never popped are left out."""
    from ..capture.events import range_tree

    events = list(events)
    out: list[dict[str, Any]] = []
    for pid in sorted({e.pid for e in events}):
        mine = [e for e in events if e.pid == pid]

        def walk(ranges: Iterable[Any]) -> None:
            for r in ranges:
                if r.end_ns is not None:
                    out.append(
                        {
                            "name": r.message or "",
                            "cat": r.domain if r.domain is not None else DEFAULT_DOMAIN_CAT,
                            "ph": "X",
                            "ts": r.start_ns / 1000,
                            "dur": (r.end_ns - r.start_ns) / 1000,
                            "pid": pid,
                            "tid": r.tid,
                            "args": {"domain": r.domain, "depth": r.depth},
                        }
                    )
                walk(r.children)

        for roots in range_tree(mine).values():
            walk(roots)
    out.sort(key=lambda e: (e["pid"], e["tid"], e["ts"], e["args"]["depth"]))
    return {"displayTimeUnit": "ms", "traceEvents": out}


def write_chrome_trace(path: str | os.PathLike[str], events: Iterable[Any]) -> None:
    """Write `chrome_trace(events)` to `path` as JSON."""
    with open(path, "w", encoding="utf-8") as stream:
        json.dump(chrome_trace(events), stream)
        stream.write("\n")
