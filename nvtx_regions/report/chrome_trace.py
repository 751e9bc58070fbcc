"""Chrome Trace Event Format files read back: the ranges of a capture, checked event by event.

    records = load_chrome_trace("timeline.json")      # RangeRecord items, as report.nsys_report gives
                                                      # (report.reader.read_ranges reads either)
    for event in complete_events("timeline.json"): ...

What ``nvtx-regions capture -o FILE.json`` (`nvtx_regions.capture.chrome`)
writes, and files of other producers: a JSON object with a ``traceEvents``
list, or a bare list of events. Complete events (``"ph": "X"``) are
push/pop ranges; nestable async pairs (``"b"``/``"e"`` with the same ``id``)
are start/end ranges. Every other phase is passed over. An event's domain is
``args.domain`` if present, else its ``cat``, where ``"NVTX"`` (and no
``cat``) is NVTX's default domain, None.

Reading lives here, beside the nsys report reader, and not in `capture`: both
readers turn a finished run's file into `capture.chrome.RangeRecord` items for
reports and comparisons, and the layers let `report` import `capture` (the
records' home), never the other way.

Nothing here imports torch or thunder.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Union

from ..capture.chrome import DEFAULT_DOMAIN_CAT, RangeRecord
from ..capture.events import int_or_none
from ..core.errors import CaptureFileError

__all__ = ["CompleteEvent", "TraceInput", "complete_events", "event_domain", "load_chrome_trace", "load_trace", "trace_events"]

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


def load_trace(source: TraceInput) -> tuple[str, Any]:
    """(the name to show in messages, the JSON) of a Chrome trace, read once; raises `CaptureFileError`
    for a file that cannot be read or is not JSON."""
    where = _where(source)
    if isinstance(source, (str, os.PathLike)):
        try:
            with open(where, encoding="utf-8") as stream:
                data = json.load(stream)
        except OSError as error:
            raise CaptureFileError(f"{where}: cannot read the capture file: {error.strerror or error}") from None
        except RecursionError:
            raise CaptureFileError(f"{where}: JSON nested too deeply to be a Chrome trace; {_FIX}") from None
        except json.JSONDecodeError as error:
            if _cut_short(error):
                what = "empty" if not error.doc.strip() else f"cut short: its JSON ends mid-way, at byte {len(error.doc.encode())}"
                raise CaptureFileError(
                    f"{where}: {what} (the run that wrote it was killed, or the disk filled); "
                    "run that command again, to its end, with room on the disk"
                ) from None
            raise CaptureFileError(f"{where}: not JSON ({error}); {_FIX}") from None
        except (UnicodeDecodeError, ValueError) as error:  # int() limits are ValueErrors too
            raise CaptureFileError(f"{where}: not JSON ({error}); {_FIX}") from None
        return where, data
    return where, source


def trace_events(source: TraceInput, *, where: str | None = None) -> tuple[str, list[Any]]:
    """(the name to show in messages, the event list) of a Chrome trace; raises `CaptureFileError`.
    where: the name of a trace already loaded (`load_trace`)."""
    named, data = load_trace(source)
    where = where or named
    events = data.get("traceEvents") if isinstance(data, Mapping) else data
    if not isinstance(events, list):
        raise CaptureFileError(
            f"{where}: not a Chrome trace (expected a 'traceEvents' list or a list of events); {_FIX}"
        )
    return where, events


# What is left of a number or a literal that a file's end cut short.
_PARTIAL_TOKEN = re.compile(r"[-+.0-9eE]*|t(r(u)?)?|f(a(l(s)?)?)?|n(u(l)?)?|N(a)?|-?I(n(f(i(n(i(t)?)?)?)?)?)?")


def _cut_short(error: json.JSONDecodeError) -> bool:
    """Whether the JSON was cut short: more text after its end could make it valid (a writer was stopped)."""
    return error.msg.startswith("Unterminated string") or _PARTIAL_TOKEN.fullmatch(error.doc[error.pos :].rstrip()) is not None


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


def complete_events(source: TraceInput, *, where: str | None = None) -> Iterator[CompleteEvent]:
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
    of the wrong type. where: the name of a trace already loaded (`load_trace`).
    """
    where, events = trace_events(source, where=where)
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
    (``"NVTX"``: the default domain, None); a ``pid`` or ``tid`` that is not
    an integer (PyTorch's profiler writes names there) becomes a negative
    number, one per distinct value, which no real process or thread has.
    Raises `CaptureFileError` for a file that is not such a trace.
    """
    out = []
    named: dict[str, int] = {}  # a pid or tid that is not an integer -> its negative stand-in

    def number(value: Any) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        return named.setdefault(json.dumps(value, sort_keys=True, default=repr), -1 - len(named))

    for ev in complete_events(source):
        if ev.ts_us is None:
            raise CaptureFileError(f"{_where(source)}: event {ev.index}: complete event {ev.name!r} has no 'ts'; {_FIX}")
        pid, tid = number(ev.event.get("pid", 0)), number(ev.event.get("tid", 0))
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
