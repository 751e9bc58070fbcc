"""The user's own NVTX markers as selections: the ops inside matching markers
(``marker <...>``) and one span per marker occurrence (``each marker <...>``).

Promises:
- A glob matches a marker's message (`fnmatch.fnmatchcase`); a marker pushed
  without a message has the message ``""``.
- An op is inside a marker when the marker was open when thunder recorded it
  (`View.marker_stacks`): in the backward, when it was open around every
  forward origin of the op. A fusion is inside the markers open around all
  its parts, so a fusion that crosses a marker's boundary is outside it, as
  `each module` does for module calls.
- A span runs from the first to the last op inside one occurrence, even when
  ops outside it lie in between. Spans are in order of their first op, the
  outer (earlier pushed) first at the same op.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .view import View
from ..core.markers import Marker
from ..core.naming import range_message

__all__ = ["MarkerSpan", "EachMarkerSelector", "marker_mask", "marker_spans", "marker_message", "crossing_fusions"]

Matcher = Callable[[str], bool]


@dataclass(frozen=True)
class MarkerSpan:
    """One marker occurrence's ops in one trace: compute positions `first`..`last`."""

    marker: Marker
    depth: int  # the marker's place in the stack of the markers open around its first op
    first: int
    last: int
    positions: int  # bitset of the ops inside it
    message: str | None  # the marker's message; in a backward trace with `naming.BACKWARD_SUFFIX`


def marker_message(marker: Marker, phase: str) -> str | None:
    """The range message of `marker` in a trace of `phase` (as for a module call's: `naming.range_message`)."""
    if marker.message is None and phase == "forward":
        return None
    return range_message(marker.message or "", phase)


def marker_mask(view: View, matches: Matcher) -> int:
    """The positions of `view`'s ops inside a marker whose message `matches`."""
    mask = 0
    for position, stack in enumerate(view.marker_stacks):
        if any(matches(marker.message or "") for marker in stack):
            mask |= 1 << position
    return mask


def marker_spans(view: View, matches: Matcher, within: int | None = None) -> list[MarkerSpan]:
    """One span per occurrence of a marker whose message `matches` and that has ops in `view`.

    `within` (a bitset): keep only the occurrences all of whose ops it holds
    (``and module <...>``: markers inside a module).
    """
    found: dict[Marker, list[int]] = {}  # marker -> [depth, first, last, positions]
    for position, stack in enumerate(view.marker_stacks):
        for depth, marker in enumerate(stack):
            if not matches(marker.message or ""):
                continue
            entry = found.setdefault(marker, [depth, position, position, 0])
            entry[2] = position
            entry[3] |= 1 << position
    spans = [
        MarkerSpan(marker, depth, first, last, positions, marker_message(marker, view.phase))
        for marker, (depth, first, last, positions) in found.items()
        if within is None or positions & ~within == 0
    ]
    spans.sort(key=lambda span: (span.first, -span.last, span.marker.occurrence))
    return spans


@dataclass(frozen=True)
class EachMarkerSelector:
    """``each marker <...>``: one range per occurrence of a matching marker.

    `within` (``and module <...>`` / ``and class <...>``): selectors whose
    positions must hold all of an occurrence's ops for it to count.
    """

    matches: Matcher
    phase: str | None  # None: forward and backward traces alike
    never: bool = False  # `and forward and backward`: no trace is both
    within: tuple[Callable[[View], int], ...] = ()

    def spans(self, view: View) -> list[MarkerSpan]:
        """Each matching occurrence with ops in `view`, in order of its first op (outer first)."""
        if self.never or (self.phase is not None and self.phase != view.phase):
            return []
        mask = None
        for select in self.within:
            mask = select(view) if mask is None else mask & select(view)
        return marker_spans(view, self.matches, mask)


def crossing_fusions(view: View, marker: Marker) -> list[int]:
    """Positions of the fusions that hold ops recorded inside `marker` and ops outside it
    (so they are outside its range)."""
    return [
        position
        for position, (op, stack) in enumerate(zip(view.ops, view.marker_stacks))
        if op.is_fusion and marker not in stack and marker in view.markers_in_parts(position)
    ]
