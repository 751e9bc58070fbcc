"""The trace rewrite: a plan of ranges and a trace give a new trace with push
and pop bound symbols around the planned ranges.

The trace changes only by gaining bound symbols: one push and one pop per
range (a start and an end for a start/end range; the first push and the last
pop of a trace also start and end the call, see `runtime`). Pops are placed
right after the range's last bound symbol, so every pop comes before the
``return``.

The operators are registered once, at import, tagged so that dead-code
elimination keeps them (they have no outputs). What differs per trace (the
names of its globals) travels in each bound symbol's arguments, and the
printed line calls those globals.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from thunder.core.prims import OpTags
from thunder.core.symbol import BoundSymbol, Symbol
from thunder.core.trace import TraceCtx, from_trace

from ..internals.thunder import bind_with_globals, cannot_raise
from ..core.markers import RECORD_FUNCTION
from ..core.naming import rule_category, rule_color
from ..selection.compile import CompiledSpec
from ..selection.plan import Plan
from . import unwind_watch
from .runtime import Domain, RangesUnderGate, TraceRuntime, next_serial

__all__ = ["annotate_trace"]


def _operator(name: str, line: Callable[[tuple], str]) -> Symbol:
    def python_printer(bsym: BoundSymbol, out_printables, arg_printables, kwarg_printables) -> str:
        return line(bsym.args)

    # DONT_DCE: these have no outputs, and a later dead-code pass must keep them.
    return Symbol(name=name, id=name, meta=None, is_prim=True, tags=(OpTags.DONT_DCE,), python_printer=python_printer)


def _then(statement: str) -> str:
    return f"; {statement}" if statement else ""


def _store_point(cell: str, point: int, high: int) -> str:
    """The statement that records `point` in the call's position cell (see runtime),
    where `high` is the high part the cell holds already.

    Only ints 0-255 are stored: CPython keeps them preallocated side by side,
    so the stores touch a few hot cache lines, where one distinct constant
    per point (thousands in a large trace) would miss the cache on every
    store. The point's high part goes to ``cell[1]`` when it changes.
    """
    low = f"{cell}[0] = {point & 255}"
    return low if point >> 8 == high else f"{cell}[1] = {point >> 8}; {low}"


# A push or pop line may also store its *point* (its number among the trace's
# push and pop lines) in the call's position cell, a two-item list: specialized
# list stores, where a call that raised shows how far it got (see runtime).
# Arguments: (attributes, message as JSON, push, domain, store) -- globals' names but the last,
# the store statement ("" for none).
_PUSH = _operator("nvtx_regions_push", lambda a: f"{a[2]}({a[0]}, {a[3]}){_then(a[4])}  # {a[1]}")
# Arguments: (pop, store); the pop has its domain bound (see runtime).
_POP = _operator("nvtx_regions_pop", lambda a: f"{a[0]}(){_then(a[1])}")
# The trace's first push: (attributes, message as JSON, enter, progress, the statement that takes
# the position cell into a local: "" when the trace stores no points).
_ENTER = _operator("nvtx_regions_push_enter", lambda a: f"{a[3]} = {a[2]}(globals(), {a[0]}){_then(a[4])}  # {a[1]}")
# The trace's last pop: (pop, progress).
_EXIT = _operator("nvtx_regions_pop_exit", lambda a: f"{a[0]}(); {a[1]}.calls.remove({a[1]})")
# Start/end ranges: (attributes, message as JSON, start, domain, progress, range number).
_START = _operator("nvtx_regions_start", lambda a: f"{a[4]}.started[{a[5]}] = {a[2]}({a[0]}, {a[3]})  # {a[1]}")
# (end, progress, range number); `started` holds end's arguments (see runtime).
_END = _operator("nvtx_regions_end", lambda a: f"{a[0]}(*{a[1]}.started.pop({a[2]}))")
# The trace's first range, a start/end one: (attributes, message as JSON, enter, progress,
# as _ENTER's, range number).
_ENTER_START = _operator(
    "nvtx_regions_start_enter", lambda a: f"{a[3]} = {a[2]}(globals(), {a[0]}, {a[5]}){_then(a[4])}  # {a[1]}"
)
# The trace's last end: (end, progress, range number).
_EXIT_END = _operator(
    "nvtx_regions_end_exit", lambda a: f"{a[0]}(*{a[1]}.started.pop({a[2]})); {a[1]}.calls.remove({a[1]})"
)


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
    serial = next_serial()
    prefix = f"nvtx_regions_{serial}"
    # One group per (gate, domain): its push and pop globals, and the global holding its domain argument.
    groups: dict[Any, RangesUnderGate] = {}
    domain_globals: dict[Any, str] = {}
    start_end = any(planned.style == "StartEnd" for planned in plan.ranges)

    def key_of(planned: Any) -> tuple[Any, Any]:
        return (planned.gate, planned.domain(domain.name))

    for planned in plan.ranges:
        key = key_of(planned)
        if key not in groups:
            n, name = len(groups), key[1]
            if name not in domain_globals:
                domain_globals[name] = f"{prefix}_domain" + (f"_{len(domain_globals)}" if domain_globals else "")
            used = domain if name == domain.name or domain_of is None else domain_of(name)
            names = (f"{prefix}_start_{n}", f"{prefix}_end_{n}") if start_end else ("", "")
            groups[key] = RangesUnderGate(
                f"{prefix}_push_{n}", f"{prefix}_pop_{n}", planned.gate, used, domain_globals[name], *names
            )
    numbers = {key: n for n, key in enumerate(groups)}
    enter_name, exit_name = f"{prefix}_push_enter", f"{prefix}_pop_exit"
    progress, cell = f"{prefix}_open", f"{prefix}_at"

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
    last = after[max(after)][-1]
    # The groups of the push/pop ranges open after each point (`runtime.TraceRuntime.open_after`);
    # point 0 is `enter`'s.
    first = plan.ranges[0]
    open_after: list[tuple[int, ...]] = [() if first.style == "StartEnd" else (numbers[key_of(first)],)]
    stack: list[int] = []
    points: dict[tuple[str, int], int] = {}
    # Without `sys.monitoring` (see unwind_watch) the lines store their points. Only the last
    # pointed line before each original bound symbol that may raise stores: the lines up to it
    # run back to back with nothing that raises in between (their calls are nvtx's or no-ops,
    # and ``del`` lines), so no op can fail after one of them and before the last.
    stores: dict[tuple[str, int], str] = {}
    store_points = not unwind_watch.enabled()
    take_cell = f"{cell} = {progress}.at" if store_points else ""
    run: list[tuple[str, int]] = []
    high = 0

    def end_run() -> None:
        nonlocal high
        if run:
            point = points[run[-1]]
            stores[run[-1]] = _store_point(cell, point, high)
            high = point >> 8
        run.clear()

    for index in range(len(trace.bound_symbols)):
        for kind, found in (("push", before.get(index, ())), ("pop", after.get(index, ()))):
            if store_points and kind == "pop" and not cannot_raise(trace.bound_symbols[index]):
                end_run()  # bound symbol `index` runs here, and may raise
            for number in found:
                if plan.ranges[number].style == "StartEnd":
                    continue
                if kind == "push":
                    stack.append(numbers[key_of(plan.ranges[number])])
                else:
                    stack.pop()
                if (kind == "push" and number == 0) or (kind == "pop" and number == last):
                    continue  # enter's push is point 0; exit's pop is the last point, below
                points[(kind, number)] = len(open_after)
                open_after.append(tuple(stack))
                if store_points:
                    run.append((kind, number))
    end_run()
    # Past the exit's pop nothing is open: the point `unwind_watch` gives for its line.
    open_after.append(())
    runtime = TraceRuntime(
        domain,
        list(groups.values()),
        enter_name=enter_name,
        exit_name=exit_name,
        progress_name=progress,
        start_end_groups={
            number: numbers[key_of(planned)] for number, planned in enumerate(plan.ranges) if planned.style == "StartEnd"
        },
        open_after=open_after,
        located_by_interpreter=not store_points,
    )
    functions = runtime.initial_globals()

    bsyms = trace.bound_symbols
    emitted: list[tuple[int | None, str]] = []
    starts: dict[int, BoundSymbol] = {}
    ends: dict[int, BoundSymbol] = {}
    open_ends: dict[Any, list[int]] = {}  # per domain: ends of the push/pop ranges enclosing the current one
    for number, planned in enumerate(plan.ranges):
        marker = planned.marker
        if marker is not None or planned.label is not None:
            message = planned.label
        else:
            message = op_message(planned.start, bsyms[planned.start])
        rule = compiled.rules[planned.rules[0]]
        key = key_of(planned)
        group = groups[key]
        if marker is not None and marker.form != RECORD_FUNCTION:
            # The user's own marker, as the user pushed it: message and colour, no category.
            attributes = group.domain.attributes(message, color=marker.color)
        else:
            attributes = group.domain.attributes(message, color=rule_color(rule.number), category=rule_category(rule.rule))
        attr_name = f"{prefix}_attr_{number}"
        domain_name = group.domain_name
        context = {
            group.push_name: functions[group.push_name],
            group.pop_name: functions[group.pop_name],
            domain_name: functions[domain_name],
        }
        quoted = json.dumps(message, ensure_ascii=False)
        if planned.style == "StartEnd":
            # Not on the thread's stack: no depth (None), and nothing nests in it.
            emitted.append((None, message))
            context = {group.start_name: functions[group.start_name], group.end_name: functions[group.end_name], **context}
            if number == 0:
                starts[number] = bind_with_globals(
                    _ENTER_START, (attr_name, quoted, enter_name, progress, take_cell, number),
                    {enter_name: runtime.enter, attr_name: attributes, **context},
                )  # fmt: skip
            else:
                args = (attr_name, quoted, group.start_name, domain_name, progress, number)
                starts[number] = bind_with_globals(_START, args, {attr_name: attributes, **context})
            operator = _EXIT_END if number == last else _END
            ends[number] = bind_with_globals(operator, (group.end_name, progress, number), context)
            continue
        enclosing = open_ends.setdefault(key[1], [])
        while enclosing and enclosing[-1] < planned.start:
            enclosing.pop()
        emitted.append((len(enclosing), message))
        enclosing.append(planned.end)
        if number == 0:
            starts[number] = bind_with_globals(
                _ENTER, (attr_name, quoted, enter_name, progress, take_cell),
                {enter_name: runtime.enter, attr_name: attributes, **context},
            )  # fmt: skip
        else:
            args = (attr_name, quoted, group.push_name, domain_name, stores.get(("push", number), ""))
            starts[number] = bind_with_globals(_PUSH, args, {attr_name: attributes, **context})
        if number == last:
            ends[number] = bind_with_globals(_EXIT, (group.pop_name, progress), context)
        else:
            ends[number] = bind_with_globals(_POP, (group.pop_name, stores.get(("pop", number), "")), context)

    new_bsyms: list[BoundSymbol] = []
    for index, bsym in enumerate(bsyms):
        new_bsyms.extend(starts[number] for number in before.get(index, ()))
        new_bsyms.append(bsym)
        new_bsyms.extend(ends[number] for number in after.get(index, ()))
    annotated = from_trace(trace)
    annotated.bound_symbols = new_bsyms
    return annotated, emitted
