"""What a generated wrapper calls: its ranges' prebuilt NVTX attributes, and the functions
that push and pop them.

A wrapper's header builds one `GraphRanges` from literals (its ranges'
messages, colours, categories and gates), so code that Inductor's cache
hands to another process builds the same ranges there. Its ``call`` then
reads, per range, ``nvtx_regions_push(nvtx_regions_attr_3)`` ... ``nvtx_regions_pop()``:
the NVTX domain's own ``push_range``/``pop_range`` (C methods of the ``nvtx``
package; no-ops with no tool attached). A range that crosses another
(a module call Inductor interleaved with another's kernels) is a start/end
range: ``nvtx_regions_started_3 = nvtx_regions_start(...)``, ``nvtx_regions_end(...)``.

Gated ranges (``rank in <...>``, ``steps a..b``) have their own functions,
``nvtx_regions_push_g1`` and so on, locals of the call: its first line,
``nvtx_regions_push_g1, ... = nvtx_regions_ranges.enter()``, counts the call
(steps are calls of this graph, from 0) and gives each gate's functions for
this call, NVTX's or no-ops. The wrapper's globals never change, so threads
calling one graph at once each get their own gates.
"""

from __future__ import annotations

import itertools
from typing import Any, Sequence

from ..runtime.clock import current_rank
from ..runtime.domain import Domain
from ..selection.compile import Gate

__all__ = ["GraphRanges", "function_names"]

# C callables that do nothing, for a closed gate: push(attributes), pop(), start(attributes), end(started).
_NO_PUSH = {}.get
_NO_POP = [].clear
_NO_START = {}.get
_NO_END = {}.get

GateText = tuple[tuple[tuple[int, ...] | None, int | None, int | None], ...]


def function_names(group: str) -> tuple[str, str, str, str]:
    """The globals of a gate group's push, pop, start and end (`group`: "" or "_g1", ...)."""
    return tuple(f"nvtx_regions_{kind}{group}" for kind in ("push", "pop", "start", "end"))  # type: ignore[return-value]


class GraphRanges:
    """The ranges of one generated wrapper.

    `ranges`: per range (message, colour, category). `gates`: per gate group
    name ("_g1", ...), its gates as ``(ranks or None, first step, last step)``.
    """

    def __init__(
        self, domain: str | None, ranges: Sequence[tuple[str, int, str]], gates: dict[str, GateText] | None = None
    ) -> None:
        self.domain = Domain(domain)
        self.attributes = tuple(self.domain.attributes(m, color=c, category=k) for m, c, k in ranges)
        handle = self.domain.handle
        # (push, pop, start, end) of the ranges that no gate holds: the NVTX domain's own.
        self.nvtx_functions = (handle.push_range, handle.pop_range, handle.start_range, handle.end_range)
        self.gates = {
            group: frozenset(Gate(None if r is None else frozenset(r), first, last) for r, first, last in text)
            for group, text in (gates or {}).items()
        }
        self._calls = itertools.count()

    def enter(self) -> tuple[Any, ...]:
        """Count a call of the graph; per gate group (in `gates` order), the (push, pop, start, end)
        of this call: NVTX's where a gate is open at this rank and step, else no-ops."""
        step = next(self._calls)
        rank = current_rank()
        functions: list[Any] = []
        for gates in self.gates.values():
            on = any(gate.is_open(rank, step) for gate in gates)
            functions += self.nvtx_functions if on else (_NO_PUSH, _NO_POP, _NO_START, _NO_END)
        return tuple(functions)
