"""Nsight Systems reports read back: the NVTX ranges in ``nsys export --type sqlite``.

    report = read_report("nvtx_regions_report.nsys-rep")   # or an exported .sqlite
    print(summarize(report.ranges))                          # capture.summary, as for our own capture

A ``.nsys-rep`` is first exported to SQLite with ``nsys export`` (beside the
report, as ``nsys stats`` does, and reused while it is newer than the
report; in a temporary folder when that folder is read-only). The ranges come
back as the `RangeRecord` items our own capture gives, so every table and
comparison made for a capture works on a real profile too.

Tables read (the Nsight Systems SQLite export schema, checked on 2022.4.2):

- ``NVTX_EVENTS``: ``start``/``end`` (ns), ``eventType`` (numbers looked up
  by name in ``ENUM_NSYS_EVENT_TYPE``: ``NvtxPushPopRange``,
  ``NvtxStartEndRange``, ``NvtxDomainCreate``, ``NvtxCategory``),
  ``textId`` (into ``StringIds``, for registered strings) or ``text``,
  ``color`` (ARGB), ``category``, ``domainId`` (0: the default domain) and
  ``globalTid`` (process id in bits 24-47, thread id in bits 0-23);
- for GPU-projected time, when the report has CUDA kernels:
  ``CUPTI_ACTIVITY_KIND_RUNTIME`` (CUDA API calls: ``start``, ``end``,
  ``globalTid``, ``correlationId``) and ``CUPTI_ACTIVITY_KIND_KERNEL``,
  ``..._MEMCPY``, ``..._MEMSET`` (``start``, ``end``, ``correlationId``).
  A range's GPU-projected time runs from the start of the first to the end
  of the last GPU operation launched by a CUDA call of the range's thread
  inside the range, as nsys's own ``nvtxgpuproj`` report defines it.

Nothing here imports torch or thunder.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import CaptureFileError
from ..capture.chrome import RangeRecord

__all__ = ["NsysReport", "read_report", "export_sqlite", "REPORT_SUFFIXES"]

REPORT_SUFFIXES = (".nsys-rep", ".qdrep", ".sqlite")
_GPU_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
_STYLES = {"NvtxPushPopRange": "PushPop", "NvtxStartEndRange": "StartEnd"}


@dataclass(frozen=True)
class NsysReport:
    """The NVTX ranges of one report, and what its CUDA activity says about them.

    ranges: in start order per thread. gpu_ns: per range (same order), its
    GPU-projected time in ns, or None where it launched no GPU work; the
    whole field is None when the report holds no CUDA kernels at all (no
    GPU, or CUDA not traced). kernels: how many kernels the report holds.
    """

    path: str
    ranges: tuple[RangeRecord, ...]
    gpu_ns: tuple[int | None, ...] | None
    kernels: int = 0


def export_sqlite(report: str | os.PathLike[str]) -> Path:
    """The SQLite export of a ``.nsys-rep`` (made with ``nsys export`` when missing or older than it).

    Raises `CaptureFileError` when nsys is not on PATH or the export fails.
    """
    report = Path(report)
    if not report.is_file():
        raise CaptureFileError(f"{report}: no such report file")
    target = report.with_suffix(".sqlite")
    if target.is_file() and target.stat().st_mtime >= report.stat().st_mtime:
        return target
    nsys = shutil.which("nsys")
    if nsys is None:
        raise CaptureFileError(
            f"{report}: reading a .nsys-rep needs nsys on PATH to export it (Nsight Systems; "
            "in this repository .ci/install-nsys installs it), or pass the .sqlite of 'nsys export --type sqlite'"
        )
    if not os.access(report.parent, os.W_OK):
        target = Path(tempfile.mkdtemp(prefix="nvtx_regions_nsys-")) / target.name
    result = subprocess.run(
        [nsys, "export", "--type=sqlite", "--force-overwrite=true", f"--output={target}", str(report)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    if result.returncode != 0 or not target.is_file():
        raise CaptureFileError(f"{report}: nsys export failed (status {result.returncode}): {result.stderr.strip()[-500:]}")
    return target


def _tables(db: sqlite3.Connection) -> set[str]:
    return {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def read_report(path: str | os.PathLike[str]) -> NsysReport:
    """The NVTX ranges (and GPU-projected times) of an nsys report: ``.nsys-rep``/``.qdrep`` or its ``.sqlite``.

    Ranges never closed end at the report's last NVTX timestamp and are
    marked ``unclosed``. Raises `CaptureFileError` for a file that is not an
    nsys report or its export.
    """
    path = Path(path)
    sqlite_path = path if path.suffix == ".sqlite" else export_sqlite(path)
    if not sqlite_path.is_file():
        raise CaptureFileError(f"{sqlite_path}: no such report file")
    try:
        db = sqlite3.connect(f"file:{sqlite_path}?mode=ro", uri=True)
        try:
            tables = _tables(db)
            if "StringIds" not in tables:
                raise CaptureFileError(
                    f"{sqlite_path}: not an Nsight Systems SQLite export (no StringIds table); "
                    "make one with 'nsys export --type sqlite REPORT.nsys-rep'"
                )
            if "NVTX_EVENTS" not in tables:  # nsys writes no table for what it did not record
                return NsysReport(str(path), (), None)
            ranges = _ranges(db, tables)
            gpu_ns, kernels = _gpu_projection(db, tables, ranges)
        finally:
            db.close()
    except sqlite3.DatabaseError as error:
        raise CaptureFileError(f"{sqlite_path}: not a readable SQLite export of an nsys report ({error})") from None
    return NsysReport(str(path), tuple(r for r, _ in ranges), gpu_ns, kernels)


def _event_types(db: sqlite3.Connection, tables: set[str]) -> dict[str, int]:
    if "ENUM_NSYS_EVENT_TYPE" in tables:
        return {name: number for number, name in db.execute("SELECT id, name FROM ENUM_NSYS_EVENT_TYPE")}
    # Exports without the enum table: the numbers of 2022.4's ENUM_NSYS_EVENT_TYPE.
    return {"NvtxCategory": 33, "NvtxPushPopRange": 59, "NvtxStartEndRange": 60, "NvtxDomainCreate": 75}


def _ranges(db: sqlite3.Connection, tables: set[str]) -> list[tuple[RangeRecord, int]]:
    """(record, globalTid) per range, in (thread, start) order, depth by nesting per thread and domain."""
    types = _event_types(db, tables)
    text = "COALESCE(s.value, e.text)"
    domains: dict[int, str | None] = {0: None}
    categories: dict[tuple[int, int], str] = {}
    named = [types.get("NvtxDomainCreate", -1), types.get("NvtxCategory", -1)]
    query = f"SELECT e.eventType, e.domainId, e.category, {text} FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId WHERE e.eventType IN (?, ?)"
    for kind, domain_id, category, name in db.execute(query, named):
        if kind == named[0]:
            domains[domain_id or 0] = name
        elif category is not None and name is not None:
            categories[(domain_id or 0, category)] = name
    styles = {types[name]: style for name, style in _STYLES.items() if name in types}
    if not styles:
        return []
    (last,) = db.execute("SELECT MAX(MAX(start), COALESCE(MAX(end), 0)) FROM NVTX_EVENTS").fetchone()
    marks = ", ".join("?" * len(styles))
    rows = db.execute(
        f"SELECT e.start, e.end, e.eventType, e.category, e.color, {text}, e.globalTid, e.domainId "
        f"FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId WHERE e.eventType IN ({marks}) "
        "ORDER BY e.globalTid, e.start, e.end DESC",
        list(styles),
    )
    out: list[tuple[RangeRecord, int]] = []
    open_ends: dict[tuple[int, int], list[int]] = {}  # (thread, domain) -> ends of the push/pop ranges around
    for start, end, kind, category, color, message, global_tid, domain_id in rows:
        domain_id = domain_id or 0
        unclosed = end is None
        end = last if unclosed else end
        style = styles[kind]
        depth = 0
        if style == "PushPop":
            stack = open_ends.setdefault((global_tid, domain_id), [])
            while stack and stack[-1] <= start:
                stack.pop()
            depth = len(stack)
            stack.append(end)
        record = RangeRecord(
            pid=(global_tid >> 24) & 0xFFFFFF,
            tid=global_tid & 0xFFFFFF,
            domain=domains.get(domain_id, str(domain_id)),
            message=message,
            start_ns=start,
            end_ns=end,
            depth=depth,
            style=style,
            color=color,
            category=category,
            category_name=categories.get((domain_id, category)) if category is not None else None,
            unclosed=unclosed,
        )
        out.append((record, global_tid))
    return out


def _gpu_projection(
    db: sqlite3.Connection, tables: set[str], ranges: list[tuple[RangeRecord, int]]
) -> tuple[tuple[int | None, ...] | None, int]:
    """Per range, the span of the GPU work its thread's CUDA calls launched inside it (see the module docstring)."""
    if "CUPTI_ACTIVITY_KIND_KERNEL" not in tables or "CUPTI_ACTIVITY_KIND_RUNTIME" not in tables:
        return None, 0
    (kernels,) = db.execute("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    if not kernels:
        return None, 0
    gpu = " UNION ALL ".join(f"SELECT correlationId, start, end FROM {t}" for t in _GPU_TABLES if t in tables)
    launches: dict[int, list[tuple[int, int, int]]] = {}  # globalTid -> (api start, gpu start, gpu end), by api start
    query = (
        f"SELECT r.globalTid, r.start, g.start, g.end FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
        f"JOIN ({gpu}) g ON g.correlationId = r.correlationId ORDER BY r.globalTid, r.start"
    )
    for global_tid, api_start, gpu_start, gpu_end in db.execute(query):
        launches.setdefault(global_tid, []).append((api_start, gpu_start, gpu_end))
    import bisect

    out: list[int | None] = []
    for record, global_tid in ranges:
        calls = launches.get(global_tid, [])
        lo = bisect.bisect_left(calls, (record.start_ns,))
        hi = bisect.bisect_right(calls, (record.end_ns, float("inf")))
        inside = calls[lo:hi]
        out.append(max(g_end for _, _, g_end in inside) - min(g_start for _, g_start, _ in inside) if inside else None)
    return tuple(out), kernels

