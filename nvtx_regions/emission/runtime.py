"""What runs inside a transformed trace: the NVTX calls, run-time gates, and
recovery of the NVTX stack after an op raised.

A transformed trace reads, around one op::

    nvtx_call = nvtx_enter()
    nvtx_push(nvtx_range_0, nvtx_domain)  # "t0 = torch.nn.functional.linear(x, w, b)"
    nvtx_call.pushed = nvtx_range_0
    nvtx_call.pops = 0
    t0 = torch.nn.functional.linear(x, w, b)
    nvtx_pop()
    nvtx_call.pops = 1

`nvtx_push` and `nvtx_pop` are the nvtx package's C functions (the pop with
its domain bound), `nvtx_range_0` prebuilt event attributes with a registered
string, `nvtx_domain` the domain's C handle: the per-range path pushes no
Python frame. With no NVTX tool attached the nvtx package hands out a dummy
domain, and push and pop are C no-ops (`nvtx_domain` says how a tool is
recognised).

Recovery. ``nvtx_enter()`` starts the call and gives its `Call`, a local of
the generated function. Every push line is followed by plain stores of the
range's attributes (the object the push line has just loaded) and of a 0,
every pop line by a store of how many pop lines ran since the last push: so a
call that raised leaves in its `Call` the last range it pushed and the pops
since, which give the last push or pop line it passed (its *point*), and the
runtime knows per point which ranges are open after it
(`TraceRuntime.open_after`). The values stored are in cache: a distinct int
per line cost about 250 ns a range in a large trace on a loaded machine (each
store touched a cold int object), and a pop line storing its range's
attributes, which the op in between may have evicted, about 50 ns with a tool.
The next `enter` on the same thread and NVTX domain, of any trace (after an
error the next call often compiles anew, and NVTX stacks are per thread and
domain), pops them. Nothing keeps the failed call's frame, or its tensors,
alive. A call whose last store says nothing is open (it returned, or it raised
after its last range) needs nothing, and the next call of the same trace
reuses its `Call`; a call still running (an outer call on this thread, inside
which `enter` ran) is told apart by a frame walk, done only when an unfinished
call is found.

A start/end range (a module call whose range crosses another: see
`selection.plan`) reads ``nvtx_call.started[5] = nvtx_start(nvtx_range_5, nvtx_domain)``
and ends with ``nvtx_end(*nvtx_call.started.pop(5))``: nvtx's ``start_range``
gives the range id and domain handle that ``end_range`` takes, kept in the call
under the range's number, so a call that raised leaves behind what must be
ended too.

Gates (``rank in <...>``, ``steps a..b``) are decided in `enter`, per call:
the ranges under a gate call their functions through the call,
``nvtx_call.gate_1_push(nvtx_range_7, nvtx_domain)``, which `enter` sets to
nvtx's functions or to C no-ops. The generated function's globals never
change, so threads calling one function at once each get their own gates.
"""

from __future__ import annotations

import functools
import itertools
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any

from ..core.naming import DEFAULT_DOMAIN
from ..internals.nvtx_calls import c_push_pop, c_start_end, local_on_this_stack, unasked_domain
from ..selection.compile import Gate

# DEFAULT_DOMAIN lives in core.naming; it is named here too for callers of this module's API.
__all__ = ["Call", "Domain", "RangesUnderGate", "TraceRuntime", "current_rank", "nvtx_domain", "DEFAULT_DOMAIN"]

# C callables standing in for push(attributes, domain) and pop() when a
# gate is closed or no tool is attached: no Python frame, no effect, no
# allocation (an empty dict's `get` returns its default; an empty list's
# `clear` clears nothing). Measured: ~90 ns a push+pop pair, where `slice`
# (which allocates) took ~180 ns.
_SKIP_PUSH = {}.get
_SKIP_POP = [].clear


def _SKIP_START(attributes: Any, domain: Any) -> tuple[int, None]:
    """Start/end stand-in when a gate is closed or no tool is attached: nvtx's
    `start_range` gives ``(range id, domain)``, which the end line unpacks."""
    return (0, None)


_SKIP_END = {}.get  # takes the (0, None) that _SKIP_START gave


def _push_pop(handle: Any) -> tuple[Any, Any, Any]:
    """(push, pop, domain argument) for the lines ``push(attributes, domain)`` and ``pop()``.

    The pop has the handle bound (`functools.partial`, C too): its line loads
    one global less, which matters more in a large trace than the partial's few ns.
    """
    if not hasattr(handle, "handle"):  # nvtx's DummyDomain: no tool attached, nothing to emit
        return _SKIP_PUSH, _SKIP_POP, None
    functions = c_push_pop()
    if functions is None:  # another nvtx layout: slower, still correct
        return (lambda attributes, _: handle.push_range(attributes)), handle.pop_range, None
    push, pop = functions
    return push, functools.partial(pop, handle.handle), handle.handle


def _start_end(handle: Any) -> tuple[Any, Any]:
    """(start, end) for the lines ``started = start(attributes, domain)`` and ``end(*started)``."""
    if not hasattr(handle, "handle"):
        return _SKIP_START, _SKIP_END
    functions = c_start_end()
    if functions is None:
        return (lambda attributes, _: (handle.start_range(attributes), None)), (lambda range_id, _: handle.end_range(range_id))
    return functions  # start_range gives (range id, domain handle): end_range's arguments


class Domain:
    """One NVTX domain and the event attributes built for it, created on first use.

    `name=None` is NVTX's default domain (where ``torch.cuda.nvtx`` writes).
    """

    def __init__(self, name: str | None) -> None:
        self.name = name
        self._handle: Any = None
        self._lock = threading.Lock()

    @property
    def handle(self) -> Any:
        """The `nvtx` package's domain object (a dummy one when no tool is attached)."""
        if self._handle is None:
            with self._lock:
                if self._handle is None:
                    self._handle = nvtx_domain(self.name)
        return self._handle

    def attributes(self, message: str, *, color: int | None = None, category: str | None = None) -> Any:
        """Prebuilt event attributes: message as a registered string, colour, named category."""
        handle = self.handle
        category_id = handle.get_category_id(category) if category else None
        return handle.get_event_attributes(message=message, color=color, category=category_id)


def nvtx_domain(name: str | None) -> Any:
    """The `nvtx` package's domain object for `name`: a real one whenever an NVTX tool is attached.

    With no tool attached it is nvtx's dummy domain, whose ranges cost nothing
    (`_push_pop` then hands out C no-ops). nvtx >= 0.2.12 decides "no tool"
    by asking ``nvtxDomainIsEnabled``, which comes from NVTX's payload
    extension: Nsight Systems 2022.4 (CUDA 11.8's) does not implement it and
    answers "disabled", so `nvtx.get_domain` hands out the dummy and every
    range is silently lost. A tool is attached when NVTX was told to load one
    (``NVTX_INJECTION64_PATH``, which nsys and our capture tool both set);
    then the domain is built from its C handle without that question.
    """
    import nvtx

    domain = nvtx.get_domain(name)
    if hasattr(domain, "handle") or not os.environ.get("NVTX_INJECTION64_PATH") or not nvtx.enabled():
        return domain
    return unasked_domain(name)


def current_rank() -> int:
    """This process's distributed rank: torch.distributed's if initialized, else $RANK, else 0."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0") or 0)


@dataclass(frozen=True)
class RangesUnderGate:
    """The ranges of one trace that share a gate and an NVTX domain, and the names their lines call.

    Without a gate the names are globals of the generated function; under a gate
    they are attributes of the call (`Call`), set per call by `TraceRuntime.enter`.
    `domain_argument` is always a global: the domain's C handle.
    """

    gate: frozenset[Gate] | None  # None: always on
    domain: Domain  # the transform's own, or a user's marker's (`each marker`)
    push: str
    pop: str
    start: str
    end: str
    domain_argument: str

    def is_open(self, rank: int, step: int) -> bool:
        return self.gate is None or any(g.is_open(rank, step) for g in self.gate)


class Call:
    """One call of a transformed trace: how far it got, and what it started.

    It is a local of the generated function, and stays in this thread's list of
    calls until the next `enter` there: that one drops it, or takes it over when
    it is over and of the same trace. It holds no tensor. Exactly one thread
    writes to it.
    """

    __slots__ = ("runtime", "pushed", "pops", "live", "started")

    runtime: TraceRuntime
    pushed: Any  # the attributes of the last range the call pushed (None: none yet)
    pops: int  # the pop lines it passed since
    live: tuple[bool, ...]  # per group: on in this call (gates are decided when it starts)
    # Start/end ranges started and not ended: range number -> (NVTX range id, domain handle),
    # what `end` takes; None in a trace without start/end ranges.
    started: dict[int, Any] | None


_thread_states: dict[str | None, threading.local] = {}
_thread_states_lock = threading.Lock()


def _thread_state(domain: str | None) -> threading.local:
    """Per thread, for one NVTX domain name: ``.calls``, the calls of transformed traces,
    outermost first: those running, and the last one that ended (or raised), until the
    next `enter` on the thread and domain."""
    with _thread_states_lock:
        return _thread_states.setdefault(domain, threading.local())


class TraceRuntime:
    """Run-time state of one transformed trace (one compiled function).

    Steps are counted per call of that function, from 0, across threads; each
    call's gates are decided when it starts, and hold for that call only.
    """

    def __init__(
        self,
        domain: Domain,
        groups: list[RangesUnderGate],
        *,
        call_name: str,
        open_after: list[tuple[int, ...]],
        points: list[tuple[Any, int]],
        start_end_groups: dict[int, int],
    ) -> None:
        self.domain = domain  # the transform's own: calls are kept per thread and this domain
        self.groups = groups
        self.call_name = call_name  # the generated function's local that holds its `Call`
        # Per point (0: enter, then each push and pop line): the groups of the push/pop ranges
        # open after it. The last point is the trace's last pop, past which nothing is open.
        self.open_after = open_after
        # Per push/pop range: (its attributes, the point of its push line). Held here so that
        # the ids stay theirs. Without a tool every range's attributes are None: then nothing
        # is emitted and nothing needs closing.
        self._points = points
        self._push_point = {id(attributes): push for attributes, push in points}
        # What a call that is over has stored: the last range pushed, and the pops after it.
        self.last_pushed, last_push = max(points, key=lambda p: p[1], default=(None, 0))
        self.last_pops = len(open_after) - 1 - last_push
        # Range number -> group number, of each start/end range of the trace.
        self.start_end_groups = start_end_groups
        # Per group: (push, pop, domain argument) and (start, end) of its domain.
        self._push_pop = [_push_pop(g.domain.handle) for g in groups]
        self._start_end = [_start_end(g.domain.handle) for g in groups]
        self._state = _thread_state(domain.name)
        self._gated = [n for n, g in enumerate(groups) if g.gate is not None]
        self._all_on = (True,) * len(groups)
        self._steps = itertools.count()
        if self._gated:
            names = []
            for n in self._gated:
                group = groups[n]
                names += [group.push, group.pop] + ([group.start, group.end] if group.start else [])
            self._call_type = type("Call", (Call,), {"__slots__": tuple(names)})
        else:
            self._call_type = Call

    def initial_globals(self) -> dict[str, Any]:
        """The globals the generated function's NVTX lines read (they never change)."""
        values: dict[str, Any] = {}
        for group, (push, pop, argument), (start, end) in zip(self.groups, self._push_pop, self._start_end):
            values[group.domain_argument] = argument
            if group.gate is None:
                values[group.push], values[group.pop] = push, pop
                if group.start:
                    values[group.start], values[group.end] = start, end
        return values

    def enter(self) -> Call:
        """Start a call: close what calls on this thread that raised left open, decide
        the gates, and give the call's `Call`."""
        state = self._state
        try:
            calls = state.calls
        except AttributeError:  # the first call on this thread in this domain
            calls = state.calls = []
        if len(calls) == 1:
            call = calls[0]
            if call.runtime is self and call.pushed is self.last_pushed and call.pops == self.last_pops and not call.started:
                # The common path: this thread's one call in the domain was of this trace and
                # is over, so it writes to its `Call` no more; the new call takes it over.
                call.pushed, call.pops = None, 0
                if self._gated:
                    call.live = self._open_gates(call)
                return call
        while calls:  # the calls that are over
            last = calls[-1]
            if not last.runtime.over(last):
                _recover(calls)
                break
            calls.pop()
        call = self._call_type()
        call.runtime = self
        call.pushed, call.pops = None, 0
        call.started = {} if self.start_end_groups else None
        call.live = self._open_gates(call) if self._gated else self._all_on
        calls.append(call)
        return call

    def _open_gates(self, call: Call) -> tuple[bool, ...]:
        """Set `call`'s functions of each gated group to nvtx's or to no-ops; give the live flags."""
        step = next(self._steps)
        rank = current_rank()
        live = list(self._all_on)
        for n in self._gated:
            group = self.groups[n]
            on = live[n] = group.is_open(rank, step)
            push, pop, _ = self._push_pop[n]
            setattr(call, group.push, push if on else _SKIP_PUSH)
            setattr(call, group.pop, pop if on else _SKIP_POP)
            if group.start:
                start, end = self._start_end[n]
                setattr(call, group.start, start if on else _SKIP_START)
                setattr(call, group.end, end if on else _SKIP_END)
        return tuple(live)

    def over(self, call: Call) -> bool:
        """Whether `call` has nothing left open: it passed the last pop line and ended its start/end ranges."""
        return call.pushed is self.last_pushed and call.pops == self.last_pops and not call.started

    def passed(self, call: Call) -> int:
        """The last push or pop point `call` passed (0: none)."""
        pushed = self._push_point.get(id(call.pushed), 0) if call.pushed is not None else 0
        return pushed + call.pops

    def close(self, call: Call) -> None:
        """Pop and end what `call`, which raised, left open."""
        live = call.live
        for group in reversed(self.open_after[self.passed(call)]):
            if live[group]:
                self._push_pop[group][1]()
        if call.started:  # a failed call must not leave a start/end range open forever
            for number, started in call.started.items():
                group = self.start_end_groups[number]
                if live[group]:
                    self._start_end[group][1](*started)
            call.started.clear()
        call.pushed, call.pops = self.last_pushed, self.last_pops


def _recover(calls: list[Call]) -> None:
    """Close what the calls in `calls` that raised left open, newest first, and forget
    the calls that are over.

    A call still running (an outer call on this thread: `enter` ran inside
    it) is not over; it and the calls before it stay.
    """
    while calls:
        call = calls[-1]
        runtime = call.runtime
        if not runtime.over(call):
            if local_on_this_stack(runtime.call_name, call):
                return
            runtime.close(call)
        calls.pop()
