"""Captured NVTX events written as a Chrome Trace Event Format file (Perfetto UI, ``chrome://tracing``).

    from nvtx_regions.capture import capture_subprocess, to_chrome_trace, write_chrome_trace
    trace = to_chrome_trace(capture_subprocess(["python", "train.py"]))   # a JSON-ready dict
    write_chrome_trace(events, "timeline.json")                            # or to an open text stream

The format ("Trace Event Format", Google): a JSON object whose
``traceEvents`` list holds events with ``name``, ``cat``, ``ph`` (phase),
``ts`` (microseconds), ``pid``, ``tid`` and ``args``. Here:

- every push/pop range is one complete event (``ph: "X"``) with ``dur`` in
  microseconds; its name is the message, its ``cat`` the domain (``"NVTX"``
  for the default domain, as the ``nvtx`` package names it);
- every start/end range, which may overlap others, is a nestable async pair
  (``ph: "b"`` then ``ph: "e"``, same name, ``cat`` and ``id``, the id
  ``"<pid>:<range id>"``), so viewers draw it on its own track, apart from
  the thread's push/pop stack, as Nsight does; ``args`` are on the ``b``;
- marks are instant events (``ph: "i"``, thread scope);
- ``args`` hold ``domain`` (null for the default domain), ``color``
  (``"#rrggbb"``), ``nvtx_category`` (its name, or its number when unnamed),
  ``depth``, ``style`` (``PushPop`` or ``StartEnd``, as Nsight calls them),
  ``rank`` when the process had ``RANK`` set, and ``unclosed: true`` for a
  range left open at exit, which is closed at the process's last timestamp;
- metadata events (``ph: "M"``) name each process (``rank 0 (pid 123)``) and
  thread (NVTX's thread name, else ``main thread`` or ``thread <tid>``).

Timestamps are the tool's ``CLOCK_MONOTONIC`` nanoseconds divided by 1000, so
processes of one machine share one time axis.

`iter_items` turns events into `RangeRecord` and `MarkRecord` items one at a
time (stacks only, no event list), so `write_chrome_trace` streams any number
of events in bounded memory. Reading a trace back is a report's job:
`nvtx_regions.report.chrome_trace.load_chrome_trace` gives the same
`RangeRecord` items, as `nvtx_regions.report.nsys_report` does for Nsight's reports.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any, Union

from .events import NvtxEvent

__all__ = [
    "DEFAULT_DOMAIN_CAT",
    "ChromeTraceWriter",
    "MarkRecord",
    "ProcessInfo",
    "RangeRecord",
    "start_end_events",
    "iter_items",
    "to_chrome_trace",
    "write_chrome_trace",
]

# The ``cat`` of a default-domain event in the file: what the nvtx package calls
# the default domain. A file format's word; the command line says ``default``.
DEFAULT_DOMAIN_CAT = "NVTX"


@dataclass(frozen=True)
class RangeRecord:
    """One closed (or force-closed) NVTX range.

    style: ``PushPop`` or ``StartEnd``. category: the NVTX category number
    (None: none); category_name: its name when the process named it.
    unclosed: never popped/ended; end_ns is then the process's last timestamp.
    """

    pid: int
    tid: int
    domain: str | None
    message: str | None
    start_ns: int
    end_ns: int
    depth: int
    style: str = "PushPop"
    color: int | None = None
    category: int | None = None
    category_name: str | None = None
    rank: int | None = None
    unclosed: bool = False
    range_id: int | None = None  # a start/end range's NVTX id

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True)
class MarkRecord:
    """One NVTX mark (an instant)."""

    pid: int
    tid: int
    domain: str | None
    message: str | None
    ts_ns: int
    color: int | None = None
    category: int | None = None
    category_name: str | None = None
    rank: int | None = None


@dataclass(frozen=True)
class ProcessInfo:
    """What the trace says about a process besides its events."""

    pid: int
    rank: int | None = None
    complete: bool = True


Item = Union[RangeRecord, MarkRecord]


def iter_items(
    events: Iterable[NvtxEvent], *, ranks: dict[int, int | None] | None = None
) -> Iterator[Item]:
    """Yield a `RangeRecord` at each pop/end and a `MarkRecord` at each mark, in event order.

    Push/pop nest per process, thread and domain, as NVTX's stacks do; a pop
    with nothing open is dropped (`balance_problems` reports it). After the
    last event, ranges still open are yielded with ``unclosed=True``, closed
    at their process's last timestamp. Category names come from the
    ``name_category`` events seen so far. ranks: pid -> rank, copied into the records.
    Memory: the open ranges only.
    """
    ranks = ranks or {}
    stacks: dict[tuple[int, int, str | None], list[tuple[NvtxEvent, str | None]]] = {}
    started: dict[tuple[int, int | None], tuple[NvtxEvent, str | None]] = {}
    names: dict[tuple[int, str | None, int], str] = {}
    last_ts: dict[int, int] = {}

    def closed(start: NvtxEvent, name: str | None, end_ns: int, depth: int, style: str, unclosed: bool) -> RangeRecord:
        return RangeRecord(
            pid=start.pid, tid=start.tid, domain=start.domain, message=start.message, start_ns=start.ts_ns,
            end_ns=end_ns, depth=depth, style=style, color=start.color, category=start.category,
            category_name=name, rank=ranks.get(start.pid), unclosed=unclosed,
            range_id=start.range_id if style == "StartEnd" else None,
        )  # fmt: skip

    for e in events:
        last_ts[e.pid] = max(last_ts.get(e.pid, e.ts_ns), e.ts_ns)
        name = names.get((e.pid, e.domain, e.category)) if e.category is not None else None
        if e.kind == "push":
            stacks.setdefault((e.pid, e.tid, e.domain), []).append((e, name))
        elif e.kind == "pop":
            stack = stacks.get((e.pid, e.tid, e.domain))
            if stack:
                start, start_name = stack.pop()
                yield closed(start, start_name, e.ts_ns, len(stack), "PushPop", False)
        elif e.kind == "start":
            started[(e.pid, e.range_id)] = (e, name)
        elif e.kind == "end":
            found = started.pop((e.pid, e.range_id), None)
            if found is not None:
                yield closed(found[0], found[1], e.ts_ns, 0, "StartEnd", False)
        elif e.kind == "mark":
            yield MarkRecord(e.pid, e.tid, e.domain, e.message, e.ts_ns, e.color, e.category, name, ranks.get(e.pid))
        elif e.kind == "name_category" and e.category is not None and e.message is not None:
            names[(e.pid, e.domain, e.category)] = e.message
    for stack in stacks.values():
        for depth, (start, name) in enumerate(stack):
            yield closed(start, name, last_ts[start.pid], depth, "PushPop", True)
    for start, name in started.values():
        yield closed(start, name, last_ts[start.pid], 0, "StartEnd", True)


def _us(ns: int) -> float:
    return round(ns / 1000.0, 3)


def _color(argb: int | None) -> str | None:
    return None if argb is None else f"#{argb & 0xFFFFFF:06x}"


def _args(item: Item) -> dict[str, Any]:
    args: dict[str, Any] = {"domain": item.domain, "color": _color(item.color)}
    if item.category is not None:
        args["nvtx_category"] = item.category_name if item.category_name is not None else item.category
    if isinstance(item, RangeRecord):
        args["depth"] = item.depth
        args["style"] = item.style
        if item.unclosed:
            args["unclosed"] = True
    if item.rank is not None:
        args["rank"] = item.rank
    return args


def chrome_event(item: Item) -> dict[str, Any]:
    """The Trace Event Format event for one record."""
    base = {
        "name": item.message if item.message is not None else "",
        "cat": item.domain if item.domain is not None else DEFAULT_DOMAIN_CAT,
        "pid": item.pid,
        "tid": item.tid,
    }
    if isinstance(item, RangeRecord):
        return {**base, "ph": "X", "ts": _us(item.start_ns), "dur": _us(item.end_ns - item.start_ns), "args": _args(item)}
    return {**base, "ph": "i", "s": "t", "ts": _us(item.ts_ns), "args": _args(item)}


def start_end_events(item: RangeRecord) -> list[dict[str, Any]]:
    """The nestable async pair (``b``, ``e``) for one start/end range (see the module docstring)."""
    base = {
        "name": item.message if item.message is not None else "",
        "cat": item.domain if item.domain is not None else DEFAULT_DOMAIN_CAT,
        "pid": item.pid,
        "tid": item.tid,
        "id": f"{item.pid}:{item.range_id if item.range_id is not None else item.start_ns}",
    }
    return [
        {**base, "ph": "b", "ts": _us(item.start_ns), "args": _args(item)},
        {**base, "ph": "e", "ts": _us(item.end_ns)},
    ]


def _metadata(processes: Iterable[ProcessInfo], threads: dict[tuple[int, int], str | None]) -> Iterator[dict]:
    ordered = sorted(processes, key=lambda p: (p.rank is None, p.rank if p.rank is not None else 0, p.pid))
    for index, p in enumerate(ordered):
        name = f"rank {p.rank} (pid {p.pid})" if p.rank is not None else f"pid {p.pid}"
        if not p.complete:
            name += " [partial]"
        yield {"name": "process_name", "ph": "M", "pid": p.pid, "tid": 0, "args": {"name": name}}
        yield {"name": "process_sort_index", "ph": "M", "pid": p.pid, "tid": 0, "args": {"sort_index": index}}
    for (pid, tid), thread_name in sorted(threads.items()):
        label = thread_name or ("main thread" if tid == pid else f"thread {tid}")
        yield {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": label}}


class ChromeTraceWriter:
    """Write a Chrome trace to a text stream one event at a time.

    Call `add` per record, `name_thread` for NVTX thread names, then `close`
    with the processes (for their metadata). The file is valid JSON only
    after `close`.
    """

    def __init__(self, stream: IO[str]):
        self.stream = stream
        self.count = 0
        self.threads: dict[tuple[int, int], str | None] = {}
        stream.write('{"displayTimeUnit": "ms", "traceEvents": [\n')

    def _write(self, event: dict) -> None:
        self.stream.write((",\n" if self.count else "") + json.dumps(event, ensure_ascii=False))
        self.count += 1

    def add(self, item: Item) -> None:
        self.threads.setdefault((item.pid, item.tid), None)
        if isinstance(item, RangeRecord) and item.style == "StartEnd":
            for event in start_end_events(item):
                self._write(event)
            return
        self._write(chrome_event(item))

    def name_thread(self, pid: int, tid: int, name: str) -> None:
        self.threads[(pid, tid)] = name

    def close(self, processes: Iterable[ProcessInfo], other: dict[str, Any] | None = None) -> None:
        for event in _metadata(processes, self.threads):
            self._write(event)
        other = {"clock": "CLOCK_MONOTONIC", "producer": "nvtx_regions", **(other or {})}
        self.stream.write(f'\n], "otherData": {json.dumps(other)}}}\n')


def _sources(source: Any) -> list[tuple[ProcessInfo, Iterable[NvtxEvent]]]:
    """(process, events) pairs from a CaptureResult, a ProcessCapture, or plain events."""
    if hasattr(source, "processes"):  # CaptureResult
        return [(ProcessInfo(p.pid, p.rank, p.complete), p.events) for p in source.processes.values()]
    if hasattr(source, "events") and hasattr(source, "pid"):  # ProcessCapture
        return [(ProcessInfo(source.pid, source.rank, source.complete), source.events)]
    events = list(source)
    pids = sorted({e.pid for e in events})
    return [(ProcessInfo(pid), [e for e in events if e.pid == pid]) for pid in pids]


def write_chrome_trace(source: Any, target: str | os.PathLike[str] | IO[str]) -> int:
    """Write `source` (see `to_chrome_trace`) to `target`, a file path or a text stream, streamed
    event by event; return the number of range and mark events written."""
    if isinstance(target, (str, os.PathLike)):
        with open(target, "w", encoding="utf-8") as stream:
            return write_chrome_trace(source, stream)
    writer = ChromeTraceWriter(target)
    processes = []
    for info, events in _sources(source):
        processes.append(info)
        events = list(events)
        for e in events:
            if e.kind == "name_thread" and e.target_tid is not None and e.message:
                writer.name_thread(e.pid, e.target_tid, e.message)
        for item in iter_items(events, ranks={info.pid: info.rank}):
            writer.add(item)
    count = writer.count
    writer.close(processes)
    return count


def to_chrome_trace(source: Any) -> dict[str, Any]:
    """A Chrome Trace Event Format object (a JSON-ready dict) of captured events.

    source: a `CaptureResult` (every process, torchrun ranks named), a
    `ProcessCapture`, or an iterable of `NvtxEvent`. ``json.dump`` it, or use
    `write_chrome_trace` to stream it to a file.
    """
    import io

    buffer = io.StringIO()
    write_chrome_trace(source, buffer)
    return json.loads(buffer.getvalue())
