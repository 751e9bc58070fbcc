"""Reading a capture directory: the ``nvtx-<pid>.jsonl`` file each process wrote, into one
Chrome trace and one summary.

    with open("timeline.json", "w") as stream:
        trace = write_directory_trace(Path("/tmp/nvtx_capture-..."), stream, by="label")

Each file is read line by line (`events.parse_records`), so memory holds the
open ranges only, however long the run was.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from .chrome import ChromeTraceWriter, ProcessInfo, RangeRecord, iter_items
from .events import NvtxEvent, int_or_none, parse_records
from .summary import Summarizer, Summary

__all__ = ["DirectoryTrace", "write_directory_trace"]


@dataclass
class DirectoryTrace:
    """What `write_directory_trace` wrote: the processes (complete or not), the summary and counts."""

    processes: list[ProcessInfo]
    summary: Summary
    ranges: int = 0
    marks: int = 0
    counts: dict[str, int] = field(default_factory=dict)


def write_directory_trace(capture_dir: Path, stream: IO[str], *, by: str = "message") -> DirectoryTrace:
    """Stream every ``nvtx-*.jsonl`` of `capture_dir` into a Chrome trace on `stream`; summarize it `by` message or label."""
    writer = ChromeTraceWriter(stream)
    summarizer = Summarizer(by)
    processes: list[ProcessInfo] = []
    ranges = marks = 0
    counts: dict[str, int] = {}
    for path in sorted(capture_dir.glob("nvtx-*.jsonl")):
        ended = False
        pid = int(path.stem.rpartition("-")[2])
        rank: int | None = None

        def events(lines) -> Iterator[NvtxEvent]:
            nonlocal ended, pid, rank
            for r in parse_records(lines):
                kind = r.get("type")
                if kind == "process":
                    pid = int(r.get("pid") or pid)
                    rank = int_or_none(r.get("rank"))
                elif kind == "end":
                    ended = True
                elif kind == "event":
                    e = NvtxEvent.from_record(r, pid=pid)
                    counts[e.kind] = counts.get(e.kind, 0) + 1
                    if e.kind == "name_thread" and e.target_tid is not None and e.message:
                        writer.name_thread(pid, e.target_tid, e.message)
                    yield e

        with open(path, "rb") as lines:
            stream_events = events(lines)
            first = next(stream_events, None)  # reads the header, so the rank is known before any record
            if first is not None:

                def chained() -> Iterator[NvtxEvent]:
                    yield first
                    yield from stream_events

                for item in iter_items(chained(), ranks={pid: rank}):
                    writer.add(item)
                    if isinstance(item, RangeRecord):
                        summarizer.add(item)
                        ranges += 1
                    else:
                        marks += 1
        processes.append(ProcessInfo(pid, rank, ended))
    writer.close(processes, {"partial": any(not p.complete for p in processes)})
    return DirectoryTrace(processes, summarizer.result(), ranges, marks, counts)
