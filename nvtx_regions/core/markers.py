"""The user's own NVTX markers as value types: one pushed range (`Marker`), the
markers open around an op (a `MarkerStack`), and what a traced function did
with markers as a whole (`MarkerLog`).

A marker is what the model's own code pushes: ``torch.cuda.nvtx.range_push``
or ``range``, ``nvtx.annotate`` (context manager or decorator),
``nvtx.push_range``, or ``torch.profiler.record_function``. NVTX keeps one
stack of open ranges per domain; so does the recording, and a pop closes the
innermost open marker of its own domain only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Literal

__all__ = [
    "Marker", "MarkerStack", "MarkerLog", "UnmatchedPop", "common_markers", "by_domain", "RECORD_FUNCTION",
]  # fmt: skip

# `Marker.form` of ``torch.profiler.record_function``: it has no NVTX domain of its own.
RECORD_FUNCTION = "record_function"

Form = Literal["torch.cuda.nvtx", "nvtx", "record_function"]


@dataclass(frozen=True)
class Marker:
    """One occurrence of a user's marker: one push, seen while thunder traced.

    domain: the NVTX domain's name, None for the default domain (and for
    ``record_function``, which has none). message: the text pushed, None if
    the push had none. color: ARGB, None if the push gave none. form: which
    API pushed it. occurrence: a process-wide number, different for every
    push (a marker in a loop, or a function called twice, gives several).
    where: the user's (filename, line) that pushed it. symbolic: names of the
    values the message was built from that change between calls (thunder's
    ``cache="symbolic values"``); the message then shows ``<name>`` in their place.
    """

    domain: str | None
    message: str | None
    color: int | None
    form: Form
    occurrence: int
    where: tuple[str, int] | None = None
    symbolic: tuple[str, ...] = ()

    @property
    def stack_key(self) -> tuple[str, str | None]:
        """The NVTX stack this marker lives on: one per domain, and one for ``record_function``."""
        return ("record_function", None) if self.form == RECORD_FUNCTION else ("nvtx", self.domain)

    @property
    def place(self) -> str:
        """``file:line`` of the push, for messages."""
        return f"{self.where[0]}:{self.where[1]}" if self.where else "<unknown line>"


# The markers open around an op, in the order they were pushed (outermost
# first), across all domains; `by_domain` gives NVTX's per-domain stacks.
MarkerStack = tuple[Marker, ...]


def by_domain(stack: MarkerStack) -> dict[tuple[str, str | None], MarkerStack]:
    """The per-domain stacks of `stack` (keys: `Marker.stack_key`), each outermost first."""
    stacks: dict[tuple[str, str | None], MarkerStack] = {}
    for marker in stack:
        stacks[marker.stack_key] = stacks.get(marker.stack_key, ()) + (marker,)
    return stacks


def common_markers(stacks: Iterable[MarkerStack | None]) -> MarkerStack | None:
    """The markers open around every one of `stacks` (a fusion's parts, a backward op's
    forward origins), in push order; None if none is given."""
    result: MarkerStack | None = None
    for stack in stacks:
        if stack is None:
            continue
        result = stack if result is None else tuple(m for m in result if m in stack)
    return result


@dataclass(frozen=True)
class UnmatchedPop:
    """A pop with nothing open on its stack in the traced function: the caller opened it.

    after: how many ops had been recorded before it (`MarkerLog.recorded`).
    """

    stack_key: tuple[str, str | None]
    where: tuple[str, int] | None
    after: int


@dataclass
class MarkerLog:
    """What one traced function did with markers, in record order.

    Filled while thunder traces (so it is complete by the time a transform
    sees the trace): every push (`pushed`), the pops that found nothing
    open (`unmatched`), the markers still open (`open`: when tracing has
    ended, those left open), and the number of ops recorded so far (`recorded`).
    """

    pushed: list[Marker] = field(default_factory=list)
    unmatched: list[UnmatchedPop] = field(default_factory=list)
    stacks: dict[tuple[str, str | None], list[Marker]] = field(default_factory=dict)
    recorded: int = 0

    @property
    def open(self) -> MarkerStack:
        """The markers open now, in push order; once tracing is done, those the
        traced function left open (its caller may pop them)."""
        return tuple(sorted((m for stack in self.stacks.values() for m in stack), key=lambda m: m.occurrence))
