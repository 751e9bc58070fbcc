"""What a generated wrapper's range lines call: the one runtime (`nvtx_regions.runtime`), built
from the literals in the wrapper's header.

A wrapper's header reads::

    from nvtx_regions.inductor.runtime import graph_ranges
    nvtx_regions_ranges = graph_ranges(
        'nvtx_regions',
        [('blocks.0', 4278190335, 'blocks'), ...],  # per range: message, colour, category
        [('push', 0, 0), ('pop', 0, 0), ...],       # the lines placed in ``call``, in order: kind, range, group
        [None],                                     # per group: its gates, or None
    )
    globals().update(nvtx_regions_ranges.globals())  # nvtx_regions_push, nvtx_regions_attr_0, ...

so code that Inductor's cache hands to another process builds the same
ranges there. ``call`` then reads, per range,
``nvtx_regions_push(nvtx_regions_attr_0, nvtx_regions_domain)`` ...
``nvtx_regions_pop()``, and a range that crosses another (a module call
Inductor interleaved with another's kernels) is a start/end range. Gated
ranges call their functions through the call's gates,
``nvtx_regions_gates.g1_push(...)``, decided by the body's first line,
``nvtx_regions_gates = nvtx_regions_ranges.enter()``. The body's lines sit in
a ``try``/``except`` that hands a failed call's traceback to
``nvtx_regions_ranges.close_after``: see `runtime.ranges`.
"""

from __future__ import annotations

from typing import Sequence

from ..runtime.domain import Domain
from ..runtime.ranges import GeneratedRanges, Group, Line
from ..runtime.sinks import NVTX_ONLY
from ..selection.compile import Gate
from .loaded import graph_loaded

__all__ = ["graph_ranges", "gate_text", "Names", "NAMES"]

GateText = tuple[tuple[tuple[int, ...] | None, int | None, int | None], ...]


class Names:
    """The names a wrapper's range lines use."""

    ranges = "nvtx_regions_ranges"  # the module global holding the `GeneratedRanges`
    gates = "nvtx_regions_gates"  # the call's local holding its gates
    domain = "nvtx_regions_domain"
    error = "nvtx_regions_error"  # the except clause's

    def attributes(self, number: int) -> str:
        return f"nvtx_regions_attr_{number}"

    def started(self, number: int) -> str:
        return f"nvtx_regions_started_{number}"

    def functions(self, group: int, gated: bool) -> tuple[str, str, str, str]:
        """(push, pop, start, end) of a group: globals for the ungated one, attributes of the gates for gated ones."""
        if not gated:
            return ("nvtx_regions_push", "nvtx_regions_pop", "nvtx_regions_start", "nvtx_regions_end")
        return (f"g{group}_push", f"g{group}_pop", f"g{group}_start", f"g{group}_end")

    def called(self, group: int, gated: bool, kind: int) -> str:
        """How a line names function `kind` (0 push, 1 pop, 2 start, 3 end) of a group."""
        name = self.functions(group, gated)[kind]
        return f"{self.gates}.{name}" if gated else name


NAMES = Names()


def graph_ranges(
    domain: str | None,
    ranges: Sequence[tuple[str, int, str]],
    lines: Sequence[tuple[str, int, int]],
    gates: Sequence[GateText | None],
    *,
    graph: tuple | None = None,
    instances: dict[str, Sequence[str | None]] | None = None,
    on_for: Sequence[Sequence[str] | None] | None = None,
    sinks: tuple[str, ...] = NVTX_ONLY,
) -> GeneratedRanges:
    """The runtime of one wrapper's ranges, from its header's literals (see the module doc).

    `graph`: what the wrapper's backend placed (`NvtxInductor` is told, `backend.graph_loaded`);
    `instances`: per module instance the code runs for, each range's message (None: not its range),
    and `on_for`: per group, the instances it is on for (`runtime.ranges`); `sinks`: where the
    ranges go (`runtime.sinks`)."""
    if graph is not None:
        graph_loaded(graph)
    own = Domain(domain, tuple(sinks))
    groups = []
    for number, text in enumerate(gates):
        gate = None if text is None else frozenset(Gate(None if r is None else frozenset(r), a, b) for r, a, b in text)
        push, pop, start, end = NAMES.functions(number, text is not None or instances is not None)
        names = None if on_for is None or on_for[number] is None else frozenset(on_for[number])
        groups.append(Group(gate, own, push, pop, start, end, NAMES.domain, names))
    attributes = [own.attributes(message, color=color, category=category) for message, color, category in ranges]
    by_instance = None
    if instances is not None:
        by_instance = {
            name: [None if m is None else own.attributes(m, color=c, category=k) for m, (_, c, k) in zip(messages, ranges)]
            for name, messages in instances.items()
        }
    started = {number: NAMES.started(number) for kind, number, _ in lines if kind == "start"}
    return GeneratedRanges(
        groups, [Line(kind, number, group) for kind, number, group in lines], attributes=attributes,
        attribute_names=[NAMES.attributes(n) for n in range(len(ranges))], started_names=started,
        gates_name=NAMES.gates, global_name=NAMES.ranges, instances=by_instance,
    )  # fmt: skip


def gate_text(gate: frozenset[Gate] | None) -> GateText | None:
    """A group's gates as the header's literal."""
    if gate is None:
        return None
    return tuple(sorted(((None if g.ranks is None else tuple(sorted(g.ranks))), g.first_step, g.last_step) for g in gate))
