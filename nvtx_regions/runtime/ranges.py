"""The ranges of one generated function (a thunder trace, an Inductor wrapper) at run time:
each call's gates, and what a call that raised left open.

An emitter writes one push line and one pop line per range (a start line and
an end line for a start/end range, whose started range is a local of the
function), and describes them here, in order (`Line`):

    nvtx_push(nvtx_range_0, nvtx_domain)  # transformer.h.0
    ...
    nvtx_pop()

Gates (``rank in <...>``, ``steps a..b``). The lines of ranges under a gate call
their functions through the call's gates, ``nvtx_gates.g1_push(...)``, and the
call's first line, ``nvtx_gates = nvtx_enter()``, reads the step clock and the
rank once (`clock`) and gives each gate group's functions for this call:
nvtx's, or C no-ops. A gates object is immutable and shared (one per set of
open groups), so threads calling one function at once each get their own.

Recovery. A call that raises leaves its ranges on its thread's NVTX stack.
The emitter makes the exception pass `close_after` on its way out of the
generated function (thunder: a guard around the trace's callable; Inductor: a
``try``/``except`` in the wrapper's body). `close_after` finds the function's
frame in the traceback and the line it stopped at, works out from the lines
placed before it which ranges were open there, pops them, innermost first,
with the functions that call used (a closed gate's no-ops too), and ends its
start/end ranges. The next range, and the ranges around the call (a training
step's), are then where they would have been without the failure. Nothing of
the call is kept.
"""

from __future__ import annotations

import functools
import inspect
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Literal, Sequence

from ..core.errors import NvtxRegionsWarning
from ..internals.autograd import autograd_internals
from ..internals.frames import failed_frame, frame_locals, lines_naming
from ..selection.compile import Gate
from .clock import current_rank, current_step
from .domain import SKIPPED, Domain, NvtxCalls, calls_of

__all__ = [
    "Group", "Line", "GeneratedRanges", "leave_open", "forget_left_open", "close_left_open", "set_instance",
    "name_backward",
]  # fmt: skip


@dataclass(frozen=True)
class Group:
    """Ranges of one function that share a gate and an NVTX domain, and the names their lines call:
    globals for an ungated group, attributes of the call's gates for a gated one."""

    gate: frozenset[Gate] | None  # None: always on
    domain: Domain
    push: str
    pop: str
    start: str  # "" where the function has no start/end range
    end: str
    domain_argument: str  # the global holding the domain's argument of push and start
    instances: frozenset[str] | None = None  # instance-named code: the instances it is on for (None: all)

    def is_open(self, rank: int, step: int) -> bool:
        return self.gate is None or any(g.is_open(rank, step) for g in self.gate)


@dataclass(frozen=True)
class Line:
    """One line an emitter placed: a range's push, pop, start or end, in the function's order."""

    kind: Literal["push", "pop", "start", "end"]
    range: int  # the range's number
    group: int  # its group's index


class GeneratedRanges:
    """The run-time side of one generated function's ranges (see the module doc).

    `attributes[n]` is range n's prebuilt event attributes, a global of the function named
    ``attribute_names[n]``; `started_names[n]` the local that holds a start/end range's
    started value; `gates_name` the local that holds the call's gates; `global_name` the
    global that holds this object, by which `close_after` knows the function's frame.
    """

    def __init__(
        self,
        groups: Sequence[Group],
        lines: Sequence[Line],
        *,
        attributes: Sequence[Any],
        attribute_names: Sequence[str],
        started_names: dict[int, str],
        gates_name: str,
        global_name: str,
        instances: dict[str, Sequence[Any]] | None = None,
        forward: bool = False,
    ) -> None:
        """`instances`: per instance, the attributes of each range, for code whose every group
        is gated and whose lines read the attributes from the call's gates (see the module doc).
        `forward`: the code is an instance-named forward's, whose calls take the instance their
        caller said (`set_instance`) and, inside a backward (activation checkpointing recomputing
        it), get no range, as eager's hooks give none; read where the gates are. Other
        instance-named code is a backward's, whose calls take the instance their autograd node holds
        (`name_backward`)."""
        self.groups = tuple(groups)
        self.instances = instances
        self._recompute = autograd_internals().graph_task_id if forward else None
        self._take_instance = _take_instance
        if instances is not None and not forward:
            self._take_instance = functools.partial(_backward_instance, autograd_internals().current_node)
        self.lines = tuple(lines)
        self.attributes = tuple(attributes)
        self.attribute_names = tuple(attribute_names)
        self.started_names = dict(started_names)
        self.gates_name = gates_name
        self.global_name = global_name
        self.calls: tuple[NvtxCalls, ...] = tuple(calls_of(g.domain) for g in self.groups)
        # Instance-named code calls every group's functions through the call's gates.
        self._gated = [n for n, g in enumerate(self.groups) if g.gate is not None or instances is not None]
        self._timed = any(g.gate is not None for g in self.groups)  # whether a gate reads the rank and step
        self._gates: dict[tuple[bool, ...], Any] = {}
        # Instance-named code no gate times: the gates of each instance (None: unknown) outside a
        # recompute, kept as `enter` first makes them.
        self._untimed = instances is not None and not self._timed
        self._by_instance: dict[str | None, Any] = {}
        self._placed: dict[Any, list[tuple[int, Line]]] = {}  # per code object of the function
        self._namespaces: list[dict[str, Any]] = []  # the generated code's globals (`install`, `guard`)
        self.silenced = False
        slots = tuple(name for n in self._gated for name in self._names(n))
        if instances is not None:
            slots += self.attribute_names
        self._gates_type = type("CallGates", (), {"__slots__": slots}) if slots else None

    def _names(self, group: int) -> tuple[str, ...]:
        g = self.groups[group]
        return tuple(name for name in (g.push, g.pop, g.start, g.end) if name)

    def globals(self) -> dict[str, Any]:
        """The globals the function's lines read (they never change): per ungated group its
        functions, per group its domain argument, and this object."""
        values: dict[str, Any] = {self.global_name: self}
        for number, (group, calls) in enumerate(zip(self.groups, self.calls)):
            values[group.domain_argument] = calls.domain_argument
            if number not in self._gated:
                for name, function in zip((group.push, group.pop, group.start, group.end), _functions(calls)):
                    if name:
                        values[name] = function
        if self.instances is None:
            for name, attributes in zip(self.attribute_names, self.attributes):
                values[name] = attributes
        return values

    def install(self, namespace: dict[str, Any]) -> None:
        """Put `globals` into `namespace`, the generated code's globals, where `silence` finds them."""
        namespace.update(self.globals())
        self._namespaces.append(namespace)

    def silence(self) -> None:
        """From now on the function emits no range (see the module doc)."""
        self.silenced = True
        self._gates.clear()
        self._by_instance.clear()
        self.calls = tuple(SKIPPED for _ in self.groups)
        for namespace in self._namespaces:
            for number, group in enumerate(self.groups):
                if number not in self._gated:
                    for name, function in zip((group.push, group.pop, group.start, group.end), _functions(SKIPPED)):
                        if name:
                            namespace[name] = function

    # -- per call --------------------------------------------------------------

    def enter(self) -> Any:
        """The gates of a call starting now: per gated group, nvtx's functions where its gate is
        open at this rank and step (`clock`) and for this call's instance, else C no-ops."""
        if self._untimed:  # the common instance-named call: one lookup
            instance = self._take_instance()
            if self._recompute is None or self._recompute() == -1:
                gates = self._by_instance.get(instance)
                if gates is None:
                    gates = self._by_instance[instance] = self._gates_of(instance, 0, 0)
                return gates
            return self._gates_of(instance, 0, 0)
        step, rank = (current_step(), current_rank()) if self._timed else (0, 0)
        return self._gates_of(self._take_instance() if self.instances is not None else None, rank, step)

    def _gates_of(self, instance: str | None, rank: int, step: int) -> Any:
        if instance is not None and instance not in self.instances:  # type: ignore[operator]
            instance = None
        known = not self.silenced and (self.instances is None or instance is not None)
        if known and self._recompute is not None and self._recompute() != -1:
            known = False
        key = (instance, *(known and self._is_on(self.groups[n], instance, rank, step) for n in self._gated))
        gates = self._gates.get(key)
        if gates is None:
            gates = self._gates_type()
            for n, on in zip(self._gated, key[1:]):
                for name, function in zip(self._names(n), _functions(self.calls[n] if on else SKIPPED)):
                    setattr(gates, name, function)
            if self.instances is not None:
                attributes = self.instances[instance] if instance is not None else [None] * len(self.attribute_names)
                for name, value in zip(self.attribute_names, attributes):
                    setattr(gates, name, value)
            self._gates[key] = gates
        return gates

    @staticmethod
    def _is_on(group: Group, instance: str | None, rank: int, step: int) -> bool:
        return (group.instances is None or instance in group.instances) and group.is_open(rank, step)

    def guard(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """`function` (the generated one, or what wraps it), closing what a call that raises left open."""
        namespace = getattr(inspect.unwrap(function), "__globals__", None)
        if namespace is not None:
            self._namespaces.append(namespace)

        @functools.wraps(function)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return function(*args, **kwargs)
            except BaseException as error:
                self.close_after(error.__traceback__)
                raise

        return guarded

    def close_after(self, traceback: Any) -> None:
        """Close what the failed call whose `traceback` this is left open (see the module doc).
        Never raises: the call's own exception is what the caller must see."""
        try:
            self._close_after(traceback)
        except Exception as error:  # noqa: BLE001
            warnings.warn(
                f"nvtx_regions could not close the NVTX ranges a failed call left open ({type(error).__name__}: "
                f"{error}); later ranges on this thread may nest inside them",
                NvtxRegionsWarning,
                stacklevel=3,
            )

    def _close_after(self, traceback: Any) -> None:
        found = failed_frame(traceback, self.global_name, self)
        if found is None:
            return
        frame, stopped = found
        stack: dict[int, int] = {}  # open push/pop ranges, in push order: range -> group
        started: dict[int, int] = {}
        for line, placed in self._placed_at(frame.f_code):
            if line >= stopped:
                break
            if placed.kind == "push":
                stack[placed.range] = placed.group
            elif placed.kind == "pop":
                # By range: the lines of ranges of different instances' groups may interleave.
                stack.pop(placed.range, None)
            elif placed.kind == "start":
                started[placed.range] = placed.group
            else:
                started.pop(placed.range, None)
        local = frame_locals(frame)
        gates = local.get(self.gates_name)
        for group in reversed(stack.values()):
            self._function(group, "pop", gates)()
        for number, group in started.items():
            value = local.get(self.started_names[number])
            if value is not None:
                self._function(group, "end", gates)(*value)

    def _function(self, group: int, kind: str, gates: Any) -> Callable[..., Any]:
        name = getattr(self.groups[group], kind)
        if group not in self._gated:
            return getattr(self.calls[group], kind)
        return getattr(gates, name, None) or getattr(SKIPPED, kind)

    def _placed_at(self, code: Any) -> list[tuple[int, Line]]:
        """(source line, what was placed there) of each placed line of the function `code` is, in order."""
        found = self._placed.get(code)
        if found is None:
            found = self._placed[code] = self._find_placed(code)
        return found

    def _find_placed(self, code: Any) -> list[tuple[int, Line]]:
        pops = {g.pop for g in self.groups}
        by_attributes = {name: n for n, name in enumerate(self.attribute_names)}
        by_started = {name: n for n, name in self.started_names.items()}
        pushes: dict[int, int] = {}  # range -> line of its push or start
        ends: dict[int, int] = {}
        pop_lines: list[int] = []
        for line, name, stores in lines_naming(code, {*pops, *by_attributes, *by_started}):
            if name in by_attributes:
                pushes.setdefault(by_attributes[name], line)
            elif name in by_started:
                if not stores:
                    ends.setdefault(by_started[name], line)
            elif not pop_lines or pop_lines[-1] != line:
                pop_lines.append(line)
        placed: list[tuple[int, Line]] = []
        next_pop = iter(pop_lines)
        for entry in self.lines:
            if entry.kind in ("push", "start"):
                placed.append((pushes[entry.range], entry))
            elif entry.kind == "end":
                placed.append((ends[entry.range], entry))
            else:
                placed.append((next(next_pop), entry))
        return sorted(placed, key=lambda item: item[0])


def _functions(calls: NvtxCalls) -> tuple[Callable[..., Any], ...]:
    return calls.push, calls.pop, calls.start, calls.end


_left_open = threading.local()
_instance = threading.local()


def set_instance(name: str | None) -> None:
    """Say, on this thread, which module instance the next call of instance-named forward code runs
    for (None: not known); that call's `GeneratedRanges.enter` takes it (see the module doc)."""
    _instance.name = name


def _take_instance() -> str | None:
    found = _instance.__dict__
    name = found.get("name")
    found["name"] = None
    return name


_INSTANCE = "nvtx_regions instance"  # the key of an autograd node's metadata: `name_backward`


def name_backward(node: Any, name: str | None) -> None:
    """Say that the backward `node` runs (a compiled call's autograd node) is that of module instance
    `name`'s call: its instance-named backward code's `GeneratedRanges.enter` reads it from the node
    running then, the current one (`internals.autograd`). One item of the node's metadata, which
    costs less than a pre-hook on it (registered per call, called per backward)."""
    node.metadata[_INSTANCE] = name


def _backward_instance(current_node: Callable[[], Any]) -> str | None:
    node = current_node()
    return None if node is None else node.metadata.get(_INSTANCE)


def leave_open(close: Callable[[], None]) -> None:
    """Register, on this thread, what closes ranges that a call may leave open with no place to
    close them as it fails (an eager backward: autograd calls no hook of ours when it raises).
    `close_left_open` calls it at the next step boundary; each `close` must be harmless when
    nothing is open."""
    found = _left_open.__dict__.setdefault("closers", {})
    found[id(getattr(close, "__self__", close))] = close


def forget_left_open(close: Callable[[], None]) -> None:
    """Unregister, on this thread, what `leave_open` registered for `close` (what it closes is
    closed: the call ended), so that nothing keeps it alive until a step boundary that a loop
    without `nvtx_regions.steps` never reaches."""
    found = _left_open.__dict__.get("closers")
    if found:
        found.pop(id(getattr(close, "__self__", close)), None)


def close_left_open() -> None:
    """Close, on this thread, what `leave_open` registered (at a `nvtx_regions.steps` step's end,
    before its range is popped: what a failed call left open is inside it)."""
    closers = _left_open.__dict__.pop("closers", {})
    for close in closers.values():
        close()
