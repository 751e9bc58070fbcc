"""Captured NVTX events as a Chrome Trace Event Format file (Perfetto UI, ``chrome://tracing``), and back.

    from nvtx_regions.testing import capture_subprocess, to_chrome_trace
    trace = to_chrome_trace(capture_subprocess(["python", "train.py"]))   # a JSON-ready dict

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
of events in bounded memory. `load_chrome_trace` reads such a file back into
`RangeRecord` items, which `nvtx_regions.testing.summarize` accepts too.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any, Union

from ..core.errors import CaptureFileError
from .events import NvtxEvent, int_or_none

__all__ = [
    "ChromeTraceWriter",
    "CompleteEvent",
    "MarkRecord",
    "ProcessInfo",
    "RangeRecord",
    "TraceInput",
    "complete_events",
    "start_end_events",
    "event_domain",
    "iter_items",
    "load_chrome_trace",
    "to_chrome_trace",
    "write_chrome_trace",
]

DEFAULT_DOMAIN_CAT = "NVTX"  # what the nvtx package calls the default domain


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


def write_chrome_trace(source: Any, stream: IO[str]) -> int:
    """Write `source` (see `to_chrome_trace`) to a text stream; return the number of range and mark events."""
    writer = ChromeTraceWriter(stream)
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


TraceInput = Union[str, "os.PathLike[str]", Mapping[str, Any], list]
"""A Chrome trace: a file path, or its JSON already loaded (an object with ``traceEvents``, or a list of events)."""

_FIX = "pass a file written by 'nvtx-regions capture -o FILE.json'"


@dataclass(frozen=True)
class CompleteEvent:
    """One complete (``"ph": "X"``) event of a Chrome trace, its fields checked.

    index: its position in ``traceEvents``. domain: ``args.domain`` if the
    event has one, else its ``cat``, where ``"NVTX"`` (and no ``cat``) is
    NVTX's default domain, None. ts_us: None when the event has no ``ts``.
    event: the event as read (``pid`` and ``tid`` are not checked: other
    producers, such as PyTorch's profiler, write strings there).
    """

    index: int
    name: str
    domain: str | None
    dur_us: float
    ts_us: float | None
    args: Mapping[str, Any]
    event: Mapping[str, Any]


def event_domain(event: Mapping[str, Any], args: Mapping[str, Any]) -> str | None:
    """The NVTX domain of a trace event: ``args.domain`` if present, else its ``cat`` (``"NVTX"``: None)."""
    if "domain" in args:
        return args["domain"]
    cat = event.get("cat")
    return None if cat in (None, DEFAULT_DOMAIN_CAT) else cat


def trace_events(source: TraceInput) -> tuple[str, list[Any]]:
    """(the name to show in messages, the event list) of a Chrome trace; raises `CaptureFileError`."""
    where = _where(source)
    if isinstance(source, (str, os.PathLike)):
        try:
            with open(where, encoding="utf-8") as stream:
                data = json.load(stream)
        except OSError as error:
            raise CaptureFileError(f"{where}: cannot read the capture file: {error.strerror or error}") from None
        except RecursionError:
            raise CaptureFileError(f"{where}: JSON nested too deeply to be a Chrome trace; {_FIX}") from None
        except (UnicodeDecodeError, ValueError) as error:  # JSONDecodeError, and int() limits, are ValueErrors
            raise CaptureFileError(f"{where}: not JSON ({error}); {_FIX}") from None
    else:
        data = source
    events = data.get("traceEvents") if isinstance(data, Mapping) else data
    if not isinstance(events, list):
        raise CaptureFileError(
            f"{where}: not a Chrome trace (expected a 'traceEvents' list or a list of events); {_FIX}"
        )
    return where, events


def _where(source: TraceInput) -> str:
    return os.fspath(source) if isinstance(source, (str, os.PathLike)) else "<trace>"


def _number(value: Any) -> bool:
    """A finite JSON number (not a bool) that fits a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond float's range
        return False


def complete_events(source: TraceInput) -> Iterator[CompleteEvent]:
    """The ranges of a Chrome trace, each checked: its complete (``"ph": "X"``)
    events (push/pop ranges), in file order, and its nestable async pairs
    (``"b"``/``"e"`` with the same pid, ``cat`` and ``id``: start/end ranges),
    each where its ``e`` is, as a `CompleteEvent` of the ``b`` (its index,
    name and ``ts``; ``dur`` from ``b`` to ``e``; ``args.style`` ``StartEnd``).

    Events of other phases (metadata, instants, ``B``/``E`` pairs) are not
    ranges and are passed over, and so is an async event without a string
    ``name`` or a numeric ``ts``, or an ``e`` with no ``b``. Raises `CaptureFileError`, naming the file
    and the event's index, for an event that is not a JSON object, or a
    complete event without a string ``name``, with a ``dur`` that is not a
    finite number >= 0, or with ``args``, ``args.domain``, ``cat`` or ``ts``
    of the wrong type.
    """
    where, events = trace_events(source)
    begun: dict[tuple[Any, Any, Any], tuple[int, Mapping[str, Any]]] = {}
    for index, event in enumerate(events):

        def bad(what: str) -> CaptureFileError:
            return CaptureFileError(f"{where}: event {index}: {what}; {_FIX}")

        if not isinstance(event, Mapping):
            raise bad(f"{_short(event)} is not a JSON object")
        if event.get("ph") in ("b", "e"):
            found = _start_end(event, index, begun)
            if found is not None:
                yield found
            continue
        if event.get("ph") != "X":
            continue
        name, dur, args = event.get("name"), event.get("dur"), event.get("args")
        if not isinstance(name, str):
            raise bad("a complete event ('ph': 'X') needs a string 'name'" + ("" if name is None else f", not {_short(name)}"))
        if dur is None:
            raise bad(f"complete event {name!r} has no 'dur' (its duration in microseconds)")
        if not _number(dur) or dur < 0:
            raise bad(f"complete event {name!r} has 'dur' {_short(dur)}, not a duration in microseconds (a number >= 0)")
        if args is None:
            args = {}
        elif not isinstance(args, Mapping):
            raise bad(f"complete event {name!r} has 'args' {_short(args)}, not a JSON object")
        if not isinstance(args.get("domain"), (str, type(None))):
            raise bad(f"complete event {name!r} has 'args.domain' {_short(args['domain'])}, not a string or null")
        if not isinstance(event.get("cat"), (str, type(None))):
            raise bad(f"complete event {name!r} has 'cat' {_short(event['cat'])}, not a string")
        ts = event.get("ts")
        if ts is not None and not _number(ts):
            raise bad(f"complete event {name!r} has 'ts' {_short(ts)}, not a time in microseconds")
        yield CompleteEvent(index, name, event_domain(event, args), float(dur), None if ts is None else float(ts), args, event)


def _start_end(
    event: Mapping[str, Any], index: int, begun: dict[tuple[Any, Any, Any], tuple[int, Mapping[str, Any]]]
) -> CompleteEvent | None:
    """Pair async events (`complete_events`): remember a ``b``; at its ``e``, the range."""
    if not isinstance(event.get("name"), str) or not _number(event.get("ts")):
        return None
    key = (event.get("pid"), event.get("cat"), json.dumps(event.get("id")))
    if event["ph"] == "b":
        begun[key] = (index, event)
        return None
    if key not in begun:
        return None
    first, begin = begun.pop(key)
    args = begin.get("args")
    args = {"style": "StartEnd", **(args if isinstance(args, Mapping) else {})}
    if not isinstance(args.get("domain"), (str, type(None))) or not isinstance(begin.get("cat"), (str, type(None))):
        return None
    ts = float(begin["ts"])
    return CompleteEvent(first, begin["name"], event_domain(begin, args), max(float(event["ts"]) - ts, 0.0), ts, args, begin)


def _short(value: Any) -> str:
    text = json.dumps(value, allow_nan=True) if not isinstance(value, (Mapping, list)) else type(value).__name__
    text = {"dict": "an object", "list": "a list"}.get(text, text)
    return text if len(text) <= 40 else text[:37] + "..."


def load_chrome_trace(source: TraceInput) -> list[RangeRecord]:
    """The ranges of a Chrome trace written by this module, as `RangeRecord` items.

    Complete (``ph: "X"``) events and async pairs (``b``/``e``: start/end
    ranges) are ranges (`complete_events`); times come back in whole
    nanoseconds (the file keeps microseconds to 3 decimals). Events of other
    producers load too: without ``args.domain`` the ``cat`` is the domain
    (``"NVTX"``: the default domain, None), as `nvtx_regions.compare.load_ranges`
    reads it. Raises `CaptureFileError` for a file that is not such a trace.
    """
    out = []
    for ev in complete_events(source):
        if ev.ts_us is None:
            raise CaptureFileError(f"{_where(source)}: event {ev.index}: complete event {ev.name!r} has no 'ts'; {_FIX}")
        pid, tid = ev.event.get("pid", 0), ev.event.get("tid", 0)
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in (pid, tid)):
            raise CaptureFileError(
                f"{_where(source)}: event {ev.index}: complete event {ev.name!r} needs integer 'pid' and 'tid' "
                f"(not {_short(pid)}, {_short(tid)}); {_FIX}"
            )
        args = ev.args
        category = args.get("nvtx_category")
        color = args.get("color")
        start = round(ev.ts_us * 1000)
        out.append(
            RangeRecord(
                pid=pid,
                tid=tid,
                domain=ev.domain,
                message=ev.name,
                start_ns=start,
                end_ns=start + round(ev.dur_us * 1000),
                depth=int_or_none(args.get("depth")) or 0,
                style=args.get("style", "PushPop"),
                color=int(color[1:], 16) if isinstance(color, str) and color.startswith("#") else None,
                category=category if isinstance(category, int) else None,
                category_name=category if isinstance(category, str) else None,
                rank=int_or_none(args.get("rank")),
                unclosed=bool(args.get("unclosed", False)),
            )
        )
    return out
