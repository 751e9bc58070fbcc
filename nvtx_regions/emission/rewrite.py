"""The trace rewrite: a plan of ranges and a trace give a new trace with push
and pop bound symbols around the planned ranges.

The trace changes only by gaining bound symbols: one push and one pop per
range (the first push and the last pop of a trace also start and end the call,
see `runtime`). Pops are placed right after the range's last bound symbol, so
every pop comes before the ``return``.

The four operators are registered once, at import, tagged so that dead-code
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

from ..attribution.thunder_internals import bind_with_globals
from ..core.naming import rule_category, rule_color
from ..selection.compile import CompiledSpec
from ..selection.plan import Plan
from .runtime import Domain, RangesUnderGate, TraceRuntime, next_serial

__all__ = ["annotate_trace"]


def _operator(name: str, line: Callable[[tuple], str]) -> Symbol:
    def python_printer(bsym: BoundSymbol, out_printables, arg_printables, kwarg_printables) -> str:
        return line(bsym.args)

    # DONT_DCE: these have no outputs, and a later dead-code pass must keep them.
    return Symbol(name=name, id=name, meta=None, is_prim=True, tags=(OpTags.DONT_DCE,), python_printer=python_printer)


# Arguments: (attributes, message as JSON, push, domain, progress, group number) -- globals' names but the last two.
_PUSH = _operator("nvtx_regions_push", lambda a: f"{a[2]}({a[0]}, {a[3]}); {a[4]}.append({a[5]})  # {a[1]}")
# Arguments: (pop, domain, progress).
_POP = _operator("nvtx_regions_pop", lambda a: f"{a[0]}({a[1]}); {a[2]}.pop()")
# The trace's first push: (attributes, message as JSON, enter, progress).
_ENTER = _operator("nvtx_regions_push_enter", lambda a: f"{a[3]} = {a[2]}(globals(), {a[0]})  # {a[1]}")
# The trace's last pop: (pop, domain, progress).
_EXIT = _operator("nvtx_regions_pop_exit", lambda a: f"{a[0]}({a[1]}); {a[2]}.calls.remove({a[2]})")
# Start/end ranges: (attributes, message as JSON, start, domain, progress, range number).
_START = _operator("nvtx_regions_start", lambda a: f"{a[4]}.started[{a[5]}] = {a[2]}({a[0]}, {a[3]})  # {a[1]}")
# (end, domain, progress, range number); `started` holds end's arguments (see runtime).
_END = _operator("nvtx_regions_end", lambda a: f"{a[0]}(*{a[2]}.started.pop({a[3]}))")
# The trace's first range, a start/end one: (attributes, message as JSON, enter, progress, range number).
_ENTER_START = _operator(
    "nvtx_regions_start_enter", lambda a: f"{a[3]} = {a[2]}(globals(), {a[0]}, {a[4]})  # {a[1]}"
)
# The trace's last end: (end, domain, progress, range number).
_EXIT_END = _operator(
    "nvtx_regions_end_exit", lambda a: f"{a[0]}(*{a[2]}.started.pop({a[3]})); {a[2]}.calls.remove({a[2]})"
)


def annotate_trace(
    trace: TraceCtx,
    plan: Plan,
    compiled: CompiledSpec,
    domain: Domain,
    op_message: Callable[[int, BoundSymbol], str],
) -> tuple[TraceCtx, list[tuple[int, str]]]:
    """`trace` with the ranges of `plan` (which must not be empty), and the
    (depth, message) of each range in push order.

    `op_message(index, bsym)` is the message of a per-op range around bound symbol `index`.
    """
    serial = next_serial()
    prefix = f"nvtx_regions_{serial}"
    groups: dict[Any, RangesUnderGate] = {}
    start_end = any(planned.style == "StartEnd" for planned in plan.ranges)
    for planned in plan.ranges:
        if planned.gate not in groups:
            n = len(groups)
            names = (f"{prefix}_start_{n}", f"{prefix}_end_{n}") if start_end else ("", "")
            groups[planned.gate] = RangesUnderGate(f"{prefix}_push_{n}", f"{prefix}_pop_{n}", planned.gate, *names)
    numbers = {key: n for n, key in enumerate(groups)}
    enter_name, exit_name = f"{prefix}_push_enter", f"{prefix}_pop_exit"
    domain_name, progress = f"{prefix}_domain", f"{prefix}_open"
    runtime = TraceRuntime(
        domain,
        list(groups.values()),
        enter_name=enter_name,
        exit_name=exit_name,
        domain_name=domain_name,
        progress_name=progress,
        start_end_groups={
            number: numbers[planned.gate] for number, planned in enumerate(plan.ranges) if planned.style == "StartEnd"
        },
    )
    functions = runtime.initial_globals()

    bsyms = trace.bound_symbols
    emitted: list[tuple[int, str]] = []
    pushes: dict[int, list[BoundSymbol]] = {}
    pops: dict[int, list[tuple[BoundSymbol, dict[str, Any]]]] = {}
    open_ends: list[int] = []  # ends of the ranges enclosing the current one
    for number, planned in enumerate(plan.ranges):
        message = planned.label if planned.label is not None else op_message(planned.start, bsyms[planned.start])
        rule = compiled.rules[planned.rules[0]]
        attributes = domain.attributes(message, color=rule_color(rule.number), category=rule_category(rule.rule))
        attr_name = f"{prefix}_attr_{number}"
        group = groups[planned.gate]
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
                start = bind_with_globals(
                    _ENTER_START, (attr_name, quoted, enter_name, progress, number),
                    {enter_name: runtime.enter, attr_name: attributes, **context},
                )  # fmt: skip
            else:
                args = (attr_name, quoted, group.start_name, domain_name, progress, number)
                start = bind_with_globals(_START, args, {attr_name: attributes, **context})
            pushes.setdefault(planned.start, []).append(start)
            end = bind_with_globals(_END, (group.end_name, domain_name, progress, number), context)
            pops.setdefault(planned.end, []).append((end, context))
            continue
        while open_ends and open_ends[-1] < planned.start:
            open_ends.pop()
        emitted.append((len(open_ends), message))
        open_ends.append(planned.end)
        if number == 0:
            push = bind_with_globals(
                _ENTER, (attr_name, quoted, enter_name, progress), {enter_name: runtime.enter, attr_name: attributes, **context}
            )
        else:
            args = (attr_name, quoted, group.push_name, domain_name, progress, numbers[planned.gate])
            push = bind_with_globals(_PUSH, args, {attr_name: attributes, **context})
        pushes.setdefault(planned.start, []).append(push)
        pop = bind_with_globals(_POP, (group.pop_name, domain_name, progress), context)
        pops.setdefault(planned.end, []).insert(0, (pop, context))
    # The trace's last pop: at the latest end, the last of that list (the outermost
    # range, or a start/end range: those end after the pops at the same place).
    end_pops = pops[max(pops)]
    last_pop, context = end_pops[-1]
    final = _EXIT_END if last_pop.sym is _END else _EXIT
    end_pops[-1] = (bind_with_globals(final, last_pop.args, context), context)

    new_bsyms: list[BoundSymbol] = []
    for index, bsym in enumerate(bsyms):
        new_bsyms.extend(pushes.get(index, ()))
        new_bsyms.append(bsym)
        new_bsyms.extend(pop for pop, _ in pops.get(index, ()))
    annotated = from_trace(trace)
    annotated.bound_symbols = new_bsyms
    return annotated, emitted
