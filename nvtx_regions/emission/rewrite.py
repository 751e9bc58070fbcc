"""The trace rewrite: a plan of ranges and a trace give a new trace with NVTX
lines around the planned ranges.

The trace changes only by gaining bound symbols: one ``nvtx_call = nvtx_enter()``
before the first range, then a push and a pop per range (a start and an end
for a start/end range). A push or pop prints two lines, the NVTX call and the
stores that say how far the call got (see `runtime`). Pops are placed right after the range's
last bound symbol, so every pop comes before the ``return``.

The operators are registered once, at import, tagged so that dead-code
elimination keeps them (they have no outputs). What differs per trace (the
names its lines call) travels in each bound symbol's arguments, read by the
printers through named fields; the objects behind the names travel with the
bound symbol (`bind_with_globals`).
"""

from __future__ import annotations

import json
from typing import Any, Callable, NamedTuple

from thunder.core.prims import OpTags
from thunder.core.symbol import BoundSymbol, Symbol
from thunder.core.trace import TraceCtx, from_trace

from ..core.markers import RECORD_FUNCTION
from ..core.naming import rule_category, rule_color
from ..internals.thunder import bind_with_globals
from ..selection.compile import CompiledSpec
from ..selection.plan import Plan
from .runtime import Domain, RangesUnderGate, TraceRuntime

__all__ = ["annotate_trace"]

COMMENT_CHARS = 80  # a message longer than this is cut short in the line's comment (the range keeps it whole)


def _comment(message_json: str) -> str:
    message = json.loads(message_json)
    if len(message) > COMMENT_CHARS:
        message = message[: COMMENT_CHARS - 3] + "..."
    return json.dumps(message, ensure_ascii=False)


class Enter(NamedTuple):
    call: str  # the local that holds the call's `runtime.Call`
    enter: str  # the global holding `TraceRuntime.enter`


class Push(NamedTuple):
    attributes: str  # the global holding the range's event attributes
    message: str  # as JSON
    push: str  # a global, or an attribute of the call under a gate
    domain: str
    call: str


class Pop(NamedTuple):
    pop: str
    call: str
    since_push: int  # pop lines since the last push line, this one included


class Start(NamedTuple):
    attributes: str
    message: str
    start: str
    domain: str
    call: str
    number: int  # the range's number: where the call keeps its (range id, domain)


class End(NamedTuple):
    end: str
    call: str
    number: int


def _operator(name: str, fields: type, line: Callable[[Any], str | list[str]]) -> Symbol:
    def python_printer(bsym: BoundSymbol, out_printables, arg_printables, kwarg_printables) -> str | list[str]:
        return line(fields(*bsym.args))

    # DONT_DCE: these have no outputs, and a later dead-code pass must keep them.
    return Symbol(name=name, id=name, meta=None, is_prim=True, tags=(OpTags.DONT_DCE,), python_printer=python_printer)


_ENTER = _operator("nvtx_regions_enter", Enter, lambda a: f"{a.call} = {a.enter}()")
_PUSH = _operator(
    "nvtx_regions_push", Push,
    lambda a: [
        f"{a.push}({a.attributes}, {a.domain})  # {_comment(a.message)}",
        f"{a.call}.pushed = {a.attributes}",
        f"{a.call}.pops = 0",
    ],
)  # fmt: skip
_POP = _operator("nvtx_regions_pop", Pop, lambda a: [f"{a.pop}()", f"{a.call}.pops = {a.since_push}"])
_START = _operator(
    "nvtx_regions_start", Start,
    lambda a: f"{a.call}.started[{a.number}] = {a.start}({a.attributes}, {a.domain})  # {_comment(a.message)}",
)  # fmt: skip
_END = _operator("nvtx_regions_end", End, lambda a: f"{a.end}(*{a.call}.started.pop({a.number}))")


def _prefix(trace: TraceCtx) -> str:
    """``nvtx_`` for the first transform that annotates `trace`, ``nvtx2_`` for a second one, ...
    (each transform's lines call their own names), skipping any taken by the trace's own names."""
    level = 1 + sum(bsym.sym is _ENTER for bsym in trace.bound_symbols)
    names = getattr(trace, "names", set())
    while True:
        prefix = "nvtx_" if level == 1 else f"nvtx{level}_"
        if not any(name.startswith(prefix) for name in names):
            return prefix
        level += 1


def annotate_trace(
    trace: TraceCtx,
    plan: Plan,
    compiled: CompiledSpec,
    domain: Domain,
    op_message: Callable[[int, BoundSymbol], str],
    domain_of: Callable[[Any], Domain] | None = None,
) -> tuple[TraceCtx, list[tuple[int | None, str]]]:
    """`trace` with the ranges of `plan` (which must not be empty), and the
    (depth, message) of each range in push order (depth within its NVTX domain;
    None: a start/end range).

    `op_message(index, bsym)` is the message of a per-op range around bound symbol `index`.
    `domain` is the transform's own domain; `domain_of(name)` gives the `Domain` of a user's
    marker's domain, for the ranges of ``each marker`` rules, which carry the user's
    message and colour and no category.
    """
    prefix = _prefix(trace)
    call = f"{prefix}call"
    # One group per (gate, domain). Names per domain: "" for the transform's own, "_1", "_2", ...
    # for users' marker domains; the ranges under a gate call their functions through the call.
    groups: dict[Any, RangesUnderGate] = {}
    suffixes: dict[Any, str] = {domain.name: ""}
    start_end = any(planned.style == "StartEnd" for planned in plan.ranges)

    def key_of(planned: Any) -> tuple[Any, Any]:
        return (planned.gate, planned.domain(domain.name))

    for planned in plan.ranges:
        key = key_of(planned)
        if key in groups:
            continue
        gate, name = key
        suffix = suffixes.setdefault(name, f"_{len(suffixes)}")
        used = domain if name == domain.name or domain_of is None else domain_of(name)
        if gate is None:
            names = [f"{prefix}{kind}{suffix}" for kind in ("push", "pop", "start", "end")]
        else:
            number = sum(g.gate is not None for g in groups.values()) + 1
            names = [f"gate_{number}_{kind}" for kind in ("push", "pop", "start", "end")]
        if not start_end:
            names[2:] = ["", ""]
        groups[key] = RangesUnderGate(gate, used, *names, domain_argument=f"{prefix}domain{suffix}")
    numbers = {key: n for n, key in enumerate(groups)}

    def called(group: RangesUnderGate, name: str) -> str:
        """How a line names one of `group`'s functions."""
        return name if group.gate is None else f"{call}.{name}"

    # Where each range's lines go: before its first bound symbol, after its last.
    before: dict[int, list[int]] = {}
    after: dict[int, list[int]] = {}
    for number, planned in enumerate(plan.ranges):
        before.setdefault(planned.start, []).append(number)
        ends = after.setdefault(planned.end, [])
        if planned.style == "StartEnd":
            ends.append(number)  # after the pops at the same place: it need not nest
        else:
            ends.insert(0, number)  # inner ranges (later in push order) pop first
    # The point of each push and pop line, and the groups of the push/pop ranges open after it
    # (`runtime.TraceRuntime.open_after`); point 0 is enter's, with nothing open.
    open_after: list[tuple[int, ...]] = [()]
    stack: list[int] = []
    points: dict[tuple[str, int], int] = {}
    since_push: dict[int, int] = {}  # per pop line (range number): pop lines since the last push line
    pops = 0
    for index in range(len(trace.bound_symbols)):
        for kind, found in (("push", before.get(index, ())), ("pop", after.get(index, ()))):
            for number in found:
                if plan.ranges[number].style == "StartEnd":
                    continue
                if kind == "push":
                    stack.append(numbers[key_of(plan.ranges[number])])
                else:
                    stack.pop()
                points[(kind, number)] = len(open_after)
                open_after.append(tuple(stack))
                pops = 0 if kind == "push" else pops + 1
                if kind == "pop":
                    since_push[number] = pops
    bsyms = trace.bound_symbols
    messages: list[str] = []
    attributes_of: list[Any] = []
    # Where a tool disables some domains only, the ranges of those (None attributes: nothing is
    # emitted) still need an object of their own, for the stores that say how far a call got.
    distinct = any(hasattr(group.domain.handle, "handle") for group in groups.values())
    for planned in plan.ranges:
        marker = planned.marker
        if marker is not None or planned.label is not None:
            message = planned.label
        else:
            message = op_message(planned.start, bsyms[planned.start])
        rule = compiled.rules[planned.rules[0]]
        group = groups[key_of(planned)]
        if marker is not None and marker.form != RECORD_FUNCTION:
            # The user's own marker, as the user pushed it: message and colour, no category.
            attributes = group.domain.attributes(message, color=marker.color)
        else:
            attributes = group.domain.attributes(message, color=rule_color(rule.number), category=rule_category(rule.rule))
        messages.append(message)
        attributes_of.append(object() if attributes is None and distinct else attributes)
    runtime = TraceRuntime(
        domain,
        list(groups.values()),
        call_name=call,
        open_after=open_after,
        points=[
            (attributes_of[number], points[("push", number)])
            for number, planned in enumerate(plan.ranges) if planned.style != "StartEnd"
        ],
        start_end_groups={
            number: numbers[key_of(planned)] for number, planned in enumerate(plan.ranges) if planned.style == "StartEnd"
        },
    )
    functions = runtime.initial_globals()

    emitted: list[tuple[int | None, str]] = []
    starts: dict[int, BoundSymbol] = {}
    ends: dict[int, BoundSymbol] = {}
    open_ends: dict[Any, list[int]] = {}  # per domain: ends of the push/pop ranges enclosing the current one
    for number, planned in enumerate(plan.ranges):
        message, attributes = messages[number], attributes_of[number]
        group = groups[key_of(planned)]
        attributes_name = f"{prefix}range_{number}"
        context = {name: functions[name] for name in (group.push, group.pop, group.start, group.end) if name in functions}
        context[group.domain_argument] = functions[group.domain_argument]
        quoted = json.dumps(message, ensure_ascii=False)
        if planned.style == "StartEnd":
            # Not on the thread's stack: no depth (None), and nothing nests in it.
            emitted.append((None, message))
            line = Start(attributes_name, quoted, called(group, group.start), group.domain_argument, call, number)
            starts[number] = bind_with_globals(_START, tuple(line), {attributes_name: attributes, **context})
            ends[number] = bind_with_globals(_END, tuple(End(called(group, group.end), call, number)), context)
            continue
        enclosing = open_ends.setdefault(group.domain.name, [])
        while enclosing and enclosing[-1] < planned.start:
            enclosing.pop()
        emitted.append((len(enclosing), message))
        enclosing.append(planned.end)
        push = Push(attributes_name, quoted, called(group, group.push), group.domain_argument, call)
        starts[number] = bind_with_globals(_PUSH, tuple(push), {attributes_name: attributes, **context})
        pop = Pop(called(group, group.pop), call, since_push[number])
        ends[number] = bind_with_globals(_POP, tuple(pop), context)

    enter = f"{prefix}enter"
    first = min(planned.start for planned in plan.ranges)
    new_bsyms: list[BoundSymbol] = []
    for index, bsym in enumerate(bsyms):
        if index == first:
            new_bsyms.append(bind_with_globals(_ENTER, tuple(Enter(call, enter)), {enter: runtime.enter}))
        new_bsyms.extend(starts[number] for number in before.get(index, ()))
        new_bsyms.append(bsym)
        new_bsyms.extend(ends[number] for number in after.get(index, ()))
    annotated = from_trace(trace)
    annotated.bound_symbols = new_bsyms
    return annotated, emitted
