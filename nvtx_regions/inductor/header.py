"""What a generated wrapper's header holds and its range lines call: the graph's `GraphRecord`, and
the one runtime (`nvtx_regions.runtime`) built from the header's literals.

A wrapper's header reads::

    from nvtx_regions.inductor.header import GraphRecord, graph_ranges
    nvtx_regions_ranges = graph_ranges(
        'nvtx_regions',
        [('blocks.0', 4278190335, 'blocks'), ...],  # per range: message, colour, category
        [('push', 0, 0), ('pop', 0, 0), ...],       # the lines placed in ``call``, in order: kind, range, group
        [None],                                     # per group: its gates, or None
        graph=GraphRecord(key='nvtx_regions:...', number=0, phase='forward', ...),
    )
    nvtx_regions_ranges.install(globals())  # nvtx_regions_push, nvtx_regions_attr_0, ...

so code that Inductor's cache hands to another process builds the same
ranges there, and hands the same record to its backend (`tracker.graph_loaded`).
Ranges that go to another NVTX domain or sink (the user's own
markers, `placer`) sit in groups of their own, whose domain and sinks
``targets=`` and ``group_targets=`` name. ``call`` then reads, per range,
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

from dataclasses import dataclass
from typing import Sequence

from ..runtime.domain import Domain
from ..runtime.ranges import GeneratedRanges, Group, Line
from ..runtime.sinks import NVTX_ONLY
from ..selection.compile import Gate
from .kernels import KernelView, view_from_literal
from .tracker import graph_loaded

__all__ = ["GraphRecord", "graph_ranges", "gate_text", "Names", "NAMES"]


@dataclass(frozen=True)
class GraphRecord:
    """What is known of one graph when its ranges are placed (`placer.Placer`): made then, written
    into its wrapper's header as code (its ``repr``), and read back from there each time the wrapper
    loads, compiled now or served by Inductor's cache, in this process or another. Its backend's
    tracker (`tracker.Tracker.loaded`) builds from it the graph's views and plans, and how a call's
    module instance is found. Literals only, so that the header is plain Python."""

    key: str  # the backend's cache key: which backend of this process the wrapper reports to
    number: int  # the graph's number among those torch.compile gave that backend
    phase: str  # "forward" or "backward"
    inference: bool  # compiled for inference (no backward graph)
    root: str | None  # the module its paths start at when it is a submodule's code: its instance is found per call
    left_out: str | None  # why no call of it can be named (it then gets no range)
    whole: bool  # the graph is the whole call of `root` (whose range it then holds)
    view: tuple  # its kernels, as `kernels.view_literal` writes them

    def kernels(self, number: int) -> KernelView:
        """Its `KernelView`, named as graph `number` (the number this process gives it)."""
        view = view_from_literal(self.view)
        view.name = f"graph {number} ({self.phase})"
        return view

GateText = tuple[tuple[tuple[int, ...] | None, int | None, int | None], ...]


class Names:
    """The names a wrapper's range lines use."""

    ranges = "nvtx_regions_ranges"  # the module global holding the `GeneratedRanges`
    gates = "nvtx_regions_gates"  # the call's local holding its gates
    domain = "nvtx_regions_domain"
    error = "nvtx_regions_error"  # the except clause's

    def domain_of(self, target: int) -> str:
        """The global holding the domain argument of target `target`'s groups (0: the spec's domain and sinks)."""
        return f"{self.domain}{_suffix(target)}"

    def attributes(self, number: int) -> str:
        return f"nvtx_regions_attr_{number}"

    def started(self, number: int) -> str:
        return f"nvtx_regions_started_{number}"

    def functions(self, group: int, gated: bool, target: int = 0) -> tuple[str, str, str, str]:
        """(push, pop, start, end) of a group: globals for an ungated one (one per target: a domain and its
        sinks), attributes of the gates for gated ones."""
        if not gated:
            suffix = _suffix(target)
            return tuple(f"nvtx_regions_{kind}{suffix}" for kind in ("push", "pop", "start", "end"))  # type: ignore[return-value]
        return (f"g{group}_push", f"g{group}_pop", f"g{group}_start", f"g{group}_end")

    def called(self, group: int, gated: bool, kind: int, target: int = 0) -> str:
        """How a line names function `kind` (0 push, 1 pop, 2 start, 3 end) of a group."""
        name = self.functions(group, gated, target)[kind]
        return f"{self.gates}.{name}" if gated else name


def _suffix(target: int) -> str:
    return "" if target == 0 else f"_{target}"


NAMES = Names()


def graph_ranges(
    domain: str | None,
    ranges: Sequence[tuple[str, int | None, str | None]],
    lines: Sequence[tuple[str, int, int]],
    gates: Sequence[GateText | None],
    *,
    graph: GraphRecord | None = None,
    instances: dict[str, Sequence[str | None]] | None = None,
    on_for: Sequence[Sequence[str] | None] | None = None,
    sinks: tuple[str, ...] = NVTX_ONLY,
    targets: Sequence[tuple[str | None, tuple[str, ...]]] | None = None,
    group_targets: Sequence[int] | None = None,
) -> GeneratedRanges:
    """The runtime of one wrapper's ranges, from its header's literals (see the module doc).

    `graph`: the graph's record, handed to its backend's tracker (`tracker.graph_loaded`);
    `instances`: per module instance the code runs for, each range's message (None: not its range),
    and `on_for`: per group, the instances it is on for (`runtime.ranges`); `sinks`: where the
    ranges go (`runtime.sinks`). `targets`: the domains and sinks of ranges that go elsewhere (the
    user's own markers, in their own domain and sink), the first being (`domain`, `sinks`), and
    `group_targets` each group's."""
    domains = [Domain(name, tuple(its_sinks)) for name, its_sinks in (targets or [(domain, tuple(sinks))])]
    of_group = list(group_targets or [0] * len(gates))
    groups = []
    for number, text in enumerate(gates):
        gate = None if text is None else frozenset(Gate(None if r is None else frozenset(r), a, b) for r, a, b in text)
        target = of_group[number]
        push, pop, start, end = NAMES.functions(number, text is not None or instances is not None, target)
        names = None if on_for is None or on_for[number] is None else frozenset(on_for[number])
        groups.append(Group(gate, domains[target], push, pop, start, end, NAMES.domain_of(target), names))

    group_of = {number: group for _, number, group in lines}
    own = [domains[of_group[group_of[number]]] for number in range(len(ranges))]
    attributes = [d.attributes(m, color=c, category=k) for d, (m, c, k) in zip(own, ranges)]
    by_instance = None
    if instances is not None:
        by_instance = {
            name: [None if m is None else d.attributes(m, color=c, category=k) for d, m, (_, c, k) in zip(own, messages, ranges)]
            for name, messages in instances.items()
        }
    started = {number: NAMES.started(number) for kind, number, _ in lines if kind == "start"}
    runtime = GeneratedRanges(
        groups, [Line(kind, number, group) for kind, number, group in lines], attributes=attributes,
        attribute_names=[NAMES.attributes(n) for n in range(len(ranges))], started_names=started,
        gates_name=NAMES.gates, global_name=NAMES.ranges, instances=by_instance,
        forward=by_instance is not None and graph is not None and graph.phase == "forward",
    )  # fmt: skip
    if graph is not None:
        graph_loaded(graph, runtime)
    return runtime


def gate_text(gate: frozenset[Gate] | None) -> GateText | None:
    """A group's gates as the header's literal."""
    if gate is None:
        return None
    return tuple(sorted(((None if g.ranks is None else tuple(sorted(g.ranks))), g.first_step, g.last_step) for g in gate))
