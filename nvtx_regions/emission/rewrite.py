"""The trace rewrite: a plan of ranges and a trace give a new trace with NVTX
lines around the planned ranges.

The trace changes only by gaining bound symbols, one line each: a push before
a range's first bound symbol and a pop after its last (a start and an end for
a start/end range), and, in a trace with gated ranges, one
``nvtx_gates = nvtx_enter()`` before the first range, which decides the
call's gates (`runtime.ranges`). Pops come right after the range's last bound
symbol, so every pop comes before the ``return``. The trace's callable is
guarded (`internals.thunder.CallGuard`): a call that raises closes what it
opened on its way out.

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
from ..internals.thunder import CallGuard, bind_with_globals, call_guards
from ..runtime.domain import Domain
from ..runtime.ranges import GeneratedRanges, Group, Line
from ..selection.compile import CompiledSpec
from ..selection.plan import Plan

__all__ = ["annotate_trace"]

COMMENT_CHARS = 80  # a message longer than this is cut short in the line's comment (the range keeps it whole)


def _comment(message_json: str) -> str:
    message = json.loads(message_json)
    if len(message) > COMMENT_CHARS:
        message = message[: COMMENT_CHARS - 3] + "..."
    return json.dumps(message, ensure_ascii=False)


class Enter(NamedTuple):
    gates: str  # the local that holds the call's gates
    enter: str  # the global holding `GeneratedRanges.enter`


class Push(NamedTuple):
    attributes: str  # the global holding the range's event attributes
    message: str  # as JSON
    push: str  # a global, or an attribute of the call's gates
    domain: str


class Pop(NamedTuple):
    pop: str


class Start(NamedTuple):
    started: str  # the local that holds what `end` takes
    attributes: str
    message: str
    start: str
    domain: str


class End(NamedTuple):
    end: str
    started: str


def _operator(name: str, fields: type, line: Callable[[Any], str]) -> Symbol:
    def python_printer(bsym: BoundSymbol, out_printables, arg_printables, kwarg_printables) -> str:
        return line(fields(*bsym.args))

    # DONT_DCE: these have no outputs, and a later dead-code pass must keep them.
    return Symbol(name=name, id=name, meta=None, is_prim=True, tags=(OpTags.DONT_DCE,), python_printer=python_printer)


_ENTER = _operator("nvtx_regions_enter", Enter, lambda a: f"{a.gates} = {a.enter}()")
_PUSH = _operator("nvtx_regions_push", Push, lambda a: f"{a.push}({a.attributes}, {a.domain})  # {_comment(a.message)}")
_POP = _operator("nvtx_regions_pop", Pop, lambda a: f"{a.pop}()")
_START = _operator(
    "nvtx_regions_start", Start, lambda a: f"{a.started} = {a.start}({a.attributes}, {a.domain})  # {_comment(a.message)}"
)
_END = _operator("nvtx_regions_end", End, lambda a: f"{a.end}(*{a.started})")


def _prefix(trace: TraceCtx) -> str:
    """``nvtx_`` for the first transform that annotates `trace`, ``nvtx2_`` for a second one, ...
    (each transform's lines call their own names), skipping any taken by the trace's own names."""
    level = 1 + len(call_guards(trace))
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
) -> tuple[TraceCtx, list[tuple[int | None, str]], GeneratedRanges]:
    """`trace` with the ranges of `plan` (which must not be empty), the
    (depth, message) of each range in push order (depth within its NVTX domain;
    None: a start/end range), and the ranges' runtime.

    `op_message(index, bsym)` is the message of a per-op range around bound symbol `index`.
    `domain` is the transform's own domain; `domain_of(name)` gives the `Domain` of a user's
    marker's domain, for the ranges of ``each marker`` rules, which carry the user's
    message and colour and no category.
    """
    prefix = _prefix(trace)
    gates = f"{prefix}gates"
    # One group per (gate, domain). Names per domain: "" for the transform's own, "_1", "_2", ...
    # for users' marker domains; the ranges under a gate call their functions through the gates.
    keys: dict[Any, int] = {}
    groups: list[Group] = []
    suffixes: dict[Any, str] = {domain.name: ""}
    start_end = any(planned.style == "StartEnd" for planned in plan.ranges)

    def key_of(planned: Any) -> tuple[Any, Any]:
        return (planned.gate, planned.domain(domain.name))

    for planned in plan.ranges:
        key = key_of(planned)
        if key in keys:
            continue
        gate, name = key
        suffix = suffixes.setdefault(name, f"_{len(suffixes)}")
        used = domain if name == domain.name or domain_of is None else domain_of(name)
        if gate is None:
            names = [f"{prefix}{kind}{suffix}" for kind in ("push", "pop", "start", "end")]
        else:
            number = sum(g.gate is not None for g in groups) + 1
            names = [f"g{number}_{kind}" for kind in ("push", "pop", "start", "end")]
        if not start_end:
            names[2:] = ["", ""]
        keys[key] = len(groups)
        groups.append(Group(gate, used, *names, domain_argument=f"{prefix}domain{suffix}"))

    def called(group: Group, name: str) -> str:
        """How a line names one of `group`'s functions."""
        return name if group.gate is None else f"{gates}.{name}"

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
    bsyms = trace.bound_symbols
    messages: list[str] = []
    attributes_of: list[Any] = []
    for planned in plan.ranges:
        marker = planned.marker
        if marker is not None or planned.label is not None:
            message = planned.label
        else:
            message = op_message(planned.start, bsyms[planned.start])
        rule = compiled.rules[planned.rules[0]]
        group = groups[keys[key_of(planned)]]
        if marker is not None and marker.form != RECORD_FUNCTION:
            # The user's own marker, as the user pushed it: message and colour, no category.
            attributes = group.domain.attributes(message, color=marker.color)
        else:
            attributes = group.domain.attributes(message, color=rule_color(rule.number), category=rule_category(rule.rule))
        messages.append(message)
        attributes_of.append(attributes)
    lines: list[Line] = []
    for index in range(len(bsyms)):
        for number in before.get(index, ()):
            kind = "start" if plan.ranges[number].style == "StartEnd" else "push"
            lines.append(Line(kind, number, keys[key_of(plan.ranges[number])]))
        for number in after.get(index, ()):
            kind = "end" if plan.ranges[number].style == "StartEnd" else "pop"
            lines.append(Line(kind, number, keys[key_of(plan.ranges[number])]))
    attribute_names = [f"{prefix}range_{number}" for number in range(len(plan.ranges))]
    started_names = {n: f"{prefix}started_{n}" for n, p in enumerate(plan.ranges) if p.style == "StartEnd"}
    runtime = GeneratedRanges(
        groups, lines, attributes=attributes_of, attribute_names=attribute_names, started_names=started_names,
        gates_name=gates, global_name=f"{prefix}ranges",
    )  # fmt: skip
    values = runtime.globals()
    # The runtime travels with its push lines: the guard finds it there, and the generated
    # function's globals hold it, by which the guard knows the function's frame.
    own = {runtime.global_name: runtime, f"{prefix}guard": CallGuard(runtime.guard)}

    emitted: list[tuple[int | None, str]] = []
    starts: dict[int, BoundSymbol] = {}
    ends: dict[int, BoundSymbol] = {}
    open_ends: dict[Any, list[int]] = {}  # per domain: ends of the push/pop ranges enclosing the current one
    for number, planned in enumerate(plan.ranges):
        group = groups[keys[key_of(planned)]]
        context = {name: values[name] for name in (group.push, group.pop, group.start, group.end) if name in values}
        context[group.domain_argument] = values[group.domain_argument]
        attributes = {attribute_names[number]: attributes_of[number], **context, **own}
        quoted = json.dumps(messages[number], ensure_ascii=False)
        if planned.style == "StartEnd":
            # Not on the thread's stack: no depth (None), and nothing nests in it.
            emitted.append((None, messages[number]))
            started = started_names[number]
            line = Start(started, attribute_names[number], quoted, called(group, group.start), group.domain_argument)
            starts[number] = bind_with_globals(_START, tuple(line), attributes)
            ends[number] = bind_with_globals(_END, tuple(End(called(group, group.end), started)), context)
            continue
        enclosing = open_ends.setdefault(group.domain.name, [])
        while enclosing and enclosing[-1] < planned.start:
            enclosing.pop()
        emitted.append((len(enclosing), messages[number]))
        enclosing.append(planned.end)
        push = Push(attribute_names[number], quoted, called(group, group.push), group.domain_argument)
        starts[number] = bind_with_globals(_PUSH, tuple(push), attributes)
        ends[number] = bind_with_globals(_POP, tuple(Pop(called(group, group.pop))), context)

    first = min(planned.start for planned in plan.ranges)
    enter = None
    if any(group.gate is not None for group in groups):
        enter = bind_with_globals(_ENTER, tuple(Enter(gates, f"{prefix}enter")), {f"{prefix}enter": runtime.enter, **own})
    new_bsyms: list[BoundSymbol] = []
    for index, bsym in enumerate(bsyms):
        if index == first and enter is not None:
            new_bsyms.append(enter)
        new_bsyms.extend(starts[number] for number in before.get(index, ()))
        new_bsyms.append(bsym)
        new_bsyms.extend(ends[number] for number in after.get(index, ()))
    annotated = from_trace(trace)
    annotated.bound_symbols = new_bsyms
    return annotated, emitted, runtime
