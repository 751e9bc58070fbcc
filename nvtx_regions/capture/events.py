"""Captured NVTX events, and the range trees and balance checks built from them.

The default NVTX domain (a NULL domain handle; the ``nvtx`` package calls it
"NVTX") is ``domain=None`` everywhere in this module.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

from ..core.naming import ANY_DOMAIN, in_domain

__all__ = [
    "KINDS",
    "BalanceProblem",
    "NvtxEvent",
    "Range",
    "UnbalancedRanges",
    "balance_problems",
    "check_balanced",
    "flatten",
    "is_balanced",
    "range_tree",
    "start_end_ranges",
]

KINDS = (
    "push",
    "pop",
    "start",
    "end",
    "mark",
    "domain_create",
    "domain_destroy",
    "register_string",
    "name_category",
    "name_thread",
)


@dataclass(frozen=True)
class NvtxEvent:
    """One NVTX call as the tool saw it.

    kind: one of `KINDS`. domain: the domain's name, None for the default domain.
    message: the text, whatever form it was passed in (ASCII/UTF-8, wide, or a
    registered-string handle); the name for domain/category/thread naming; None
    when the call had none. color: ARGB int when the call gave one. category:
    None when 0 (NVTX's "no category"). tid: OS thread id. ts_ns: CLOCK_MONOTONIC
    nanoseconds, comparable with `time.monotonic_ns()`. range_id: for start/end.
    depth: for push the 0-based level opened, for pop the level closed (-1: no
    open range), per thread and domain, counted since the process's first NVTX
    call. payload: a scalar payload, if any. target_tid: the thread named by
    ``name_thread``. pid: the process that emitted it.
    """

    kind: str
    domain: str | None
    message: str | None
    color: int | None
    category: int | None
    tid: int
    ts_ns: int
    range_id: int | None = None
    depth: int | None = None
    payload: int | float | None = None
    target_tid: int | None = None
    pid: int = 0

    @classmethod
    def from_record(cls, record: Mapping[str, Any], *, pid: int) -> NvtxEvent:
        """Build an event from one ``"type": "event"`` JSON record of the tool."""
        return cls(
            kind=record["kind"],
            domain=record["domain"],
            message=record["message"],
            color=record["color"],
            category=record["category"],
            tid=record["tid"],
            ts_ns=record["ts_ns"],
            range_id=record["range_id"],
            depth=record["depth"],
            payload=record["payload"],
            target_tid=record["target_tid"],
            pid=pid,
        )


def parse_records(lines: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """Yield the JSON records of the tool's output, one per line; a torn last line (crash) is skipped.

    lines: a file opened in binary mode (read one line at a time, so memory
    stays bounded) or ``data.split(b"\\n")``.
    """
    for line in lines:
        if not line.strip():
            continue
        try:
            yield json.loads(line.decode("utf-8", "replace"))
        except json.JSONDecodeError:
            continue


def int_or_none(value: object) -> int | None:
    """`value` as an int (a rank from the environment, a pid), or None when it is absent or not a number."""
    try:
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


@dataclass
class Range:
    """A push/pop (or start/end) range. end_ns is None while the range was never closed.

    depth is the nesting level within its thread and domain, counted from the
    events given (not from the process start); start/end ranges have depth 0
    and no children.
    """

    domain: str | None
    message: str | None
    depth: int
    start_ns: int
    end_ns: int | None
    tid: int
    color: int | None = None
    category: int | None = None
    payload: int | float | None = None
    range_id: int | None = None
    children: list[Range] = field(default_factory=list)

    @property
    def duration_ns(self) -> int | None:
        return None if self.end_ns is None else self.end_ns - self.start_ns

    def holds(self, other: Range) -> bool:
        """Whether `other` starts and ends within this range, both closed (any thread: a start/end
        range may end on another)."""
        if self.end_ns is None or other.end_ns is None:
            return False
        return self.start_ns <= other.start_ns and other.end_ns <= self.end_ns


def _range_from(event: NvtxEvent, depth: int) -> Range:
    return Range(
        domain=event.domain,
        message=event.message,
        depth=depth,
        start_ns=event.ts_ns,
        end_ns=None,
        tid=event.tid,
        color=event.color,
        category=event.category,
        payload=event.payload,
        range_id=event.range_id,
    )


def range_tree(events: Iterable[NvtxEvent], *, domain: Any = ANY_DOMAIN) -> dict[int, list[Range]]:
    """Nest push/pop events into trees: thread id -> root ranges in start order.

    Stacks are per thread and domain, as NVTX's are, so a range's children are
    the ranges of its own domain opened while it was open; roots of different
    domains interleave in start order. Pass ``domain=`` to keep one domain only
    (None: the default domain; the default, `ANY_DOMAIN`: every domain). Pass
    one process's events (tids are per process).
    Ranges never popped keep ``end_ns=None``; pops without a push are dropped
    here and reported by `balance_problems`.
    """
    roots: dict[int, list[Range]] = {}
    stacks: dict[tuple[int, int, str | None], list[Range]] = {}
    for event in events:
        if event.kind not in ("push", "pop") or not in_domain(event.domain, domain):
            continue
        stack = stacks.setdefault((event.pid, event.tid, event.domain), [])
        if event.kind == "push":
            r = _range_from(event, len(stack))
            (stack[-1].children if stack else roots.setdefault(event.tid, [])).append(r)
            stack.append(r)
        elif stack:
            stack.pop().end_ns = event.ts_ns
    return roots


def start_end_ranges(events: Iterable[NvtxEvent], *, domain: Any = ANY_DOMAIN) -> list[Range]:
    """Pair start/end events by range id into ranges, in start order.

    A start/end range may end on another thread; `Range.tid` is the starting
    thread. Ranges never ended keep ``end_ns=None``. ``domain=``: as for `range_tree`.
    """
    ranges: list[Range] = []
    open_ranges: dict[tuple[int, int | None], Range] = {}
    for event in events:
        if event.kind not in ("start", "end") or not in_domain(event.domain, domain):
            continue
        key = (event.pid, event.range_id)
        if event.kind == "start":
            r = _range_from(event, 0)
            ranges.append(r)
            open_ranges[key] = r
        elif key in open_ranges:
            open_ranges.pop(key).end_ns = event.ts_ns
    return ranges


def all_ranges(events: Iterable[NvtxEvent], *, domain: Any = ANY_DOMAIN) -> list[Range]:
    """Every range of `events`, push/pop and start/end alike, in start order: what a count or a
    comparison of ranges should read, since a backend may emit a range either way (Inductor makes a
    start/end range of a module call whose kernels it interleaved with another's). Push/pop ranges
    keep their depth and children (`range_tree`); start/end ranges have depth 0 (`start_end_ranges`).
    ``domain=``: as for `range_tree`."""
    events = list(events)
    found = start_end_ranges(events, domain=domain)

    def walk(ranges: Iterable[Range]) -> None:
        for r in ranges:
            found.append(r)
            walk(r.children)

    for roots in range_tree(events, domain=domain).values():
        walk(roots)
    return sorted(found, key=lambda r: r.start_ns)


Tree = Union[Iterable[Range], Mapping[int, list[Range]]]


def flatten(tree: Tree) -> list[tuple[int, str | None, str | None]]:
    """Depth-first ``(depth, domain, message)`` tuples, for compact assertions.

    Takes a list of root ranges (``range_tree(events)[tid]``) or a whole
    `range_tree` result if it holds at most one thread.
    """
    if isinstance(tree, Mapping):
        if not tree:
            return []
        if len(tree) != 1:
            raise ValueError(
                f"flatten() got ranges of {len(tree)} threads ({sorted(tree)}); pass one thread's list, "
                "e.g. flatten(tree[tid])"
            )
        (tree,) = tree.values()
    out: list[tuple[int, str | None, str | None]] = []

    def walk(ranges: Iterable[Range]) -> None:
        for r in ranges:
            out.append((r.depth, r.domain, r.message))
            walk(r.children)

    walk(tree)
    return out


@dataclass(frozen=True)
class BalanceProblem:
    """One unbalanced range: problem is "pop_without_push", "push_never_popped",
    "end_without_start" or "start_never_ended"; message is that of the push/start."""

    problem: str
    pid: int
    tid: int
    domain: str | None
    message: str | None
    ts_ns: int
    range_id: int | None = None

    def __str__(self) -> str:
        where = f"pid {self.pid} thread {self.tid} domain {self.domain!r}" if self.domain else (
            f"pid {self.pid} thread {self.tid} default domain"
        )
        what = self.problem.replace("_", " ")
        rid = f" (range id {self.range_id})" if self.range_id is not None else ""
        msg = f" {self.message!r}" if self.message is not None else ""
        return f"{where}: {what}{msg}{rid} at ts_ns={self.ts_ns}"


def balance_problems(events: Iterable[NvtxEvent]) -> list[BalanceProblem]:
    """Every push never popped, pop without push, start never ended and end
    without start, per process, thread (start/end: per process) and domain,
    sorted by time."""
    problems: list[BalanceProblem] = []
    stacks: dict[tuple[int, int, str | None], list[NvtxEvent]] = {}
    started: dict[tuple[int, int | None], NvtxEvent] = {}
    for e in events:
        if e.kind == "push":
            stacks.setdefault((e.pid, e.tid, e.domain), []).append(e)
        elif e.kind == "pop":
            stack = stacks.setdefault((e.pid, e.tid, e.domain), [])
            if stack:
                stack.pop()
            else:
                problems.append(BalanceProblem("pop_without_push", e.pid, e.tid, e.domain, None, e.ts_ns))
        elif e.kind == "start":
            started[(e.pid, e.range_id)] = e
        elif e.kind == "end":
            if started.pop((e.pid, e.range_id), None) is None:
                problems.append(
                    BalanceProblem("end_without_start", e.pid, e.tid, e.domain, None, e.ts_ns, e.range_id)
                )
    for stack in stacks.values():
        problems += [
            BalanceProblem("push_never_popped", e.pid, e.tid, e.domain, e.message, e.ts_ns) for e in stack
        ]
    problems += [
        BalanceProblem("start_never_ended", e.pid, e.tid, e.domain, e.message, e.ts_ns, e.range_id)
        for e in started.values()
    ]
    problems.sort(key=lambda p: p.ts_ns)
    return problems


def is_balanced(events: Iterable[NvtxEvent]) -> bool:
    """True when `balance_problems` finds nothing."""
    return not balance_problems(events)


class UnbalancedRanges(AssertionError):
    """Raised by `check_balanced`; ``problems`` holds the `BalanceProblem` list."""

    def __init__(self, problems: list[BalanceProblem]):
        self.problems = problems
        lines = "\n".join(f"  {p}" for p in problems)
        super().__init__(f"{len(problems)} unbalanced NVTX range(s):\n{lines}")


def check_balanced(events: Iterable[NvtxEvent]) -> None:
    """Raise `UnbalancedRanges` (an AssertionError) listing every problem, if any."""
    problems = balance_problems(events)
    if problems:
        raise UnbalancedRanges(problems)
