"""What runs inside a transformed trace: the NVTX calls, run-time gates, and
recovery of the NVTX stack after an op raised.

The per-range path pushes no Python frame. A push line in the trace reads

    nvtx_regions_3_push_0(nvtx_regions_3_attr_17, nvtx_regions_3_domain)  # "t5 = ltorch.linear(...)"

where the three names are globals of the generated function: the nvtx
package's C function ``push_range``, prebuilt `EventAttributes` with a
registered string, and the domain's C handle. Pops read
``nvtx_regions_3_pop_0()``: nvtx's ``pop_range`` with the handle bound.
With no NVTX tool attached the nvtx package hands out a dummy domain, and
push and pop are C no-ops (`nvtx_domain` says how a tool is recognised).

Recovery after an exception costs nothing per range until something raises.
Every push and pop line has a *point* (its number among the trace's push and
pop lines, fixed when the trace is rewritten), and the runtime knows, per
point, which push/pop ranges are open after it (`TraceRuntime.open_after`).
A call that raised leaves in its `Progress` the last point it passed, so what
must be popped follows, without anyone keeping its frame (and with it the
call's tensors) alive. Where that point comes from:
- Python 3.12 and later: `unwind_watch`. ``sys.monitoring`` reports the
  instruction where the exception left the generated function, and the point
  follows from its line. The lines store nothing.
- Python 3.11 (or when ``sys.monitoring`` has no free tool id): the lines
  store it in the call's *position cell*, a two-item list that is a local of
  the generated function, as ``...; nvtx_regions_3_at[0] = 9``: the low byte
  in ``at[0]``, the rest in ``at[1]`` when it changes, each a specialized
  list store of a preallocated small int, no call (one distinct int constant
  per point missed the cache on every store in large traces). Only the last
  line before an op that may raise stores (see `rewrite`), about one store
  per range where every op has one.
Both replaced a list of open ranges that every push appended to and every pop
popped (two method calls per range, about 55-60 ns).

A start/end range (a module call whose range crosses another: see
`selection.plan`) reads ``nvtx_regions_3_open.started[5] = nvtx_regions_3_start_0(nvtx_regions_3_attr_5,
nvtx_regions_3_domain)`` and ends with ``nvtx_regions_3_end_0(*nvtx_regions_3_open.started.pop(5))``:
nvtx's ``start_range`` gives the range id with the domain, and they wait in
the call's `Progress` under the range's number, so a call that raised leaves
behind what must be ended too. (Start/end ranges are one per crossing module
call, so this dict costs little.)

The trace's first push (or start) is `TraceRuntime.enter`, a Python call once
per call of the trace, which returns the call's `Progress` (where the lines
store points, the line also takes its position cell into a local). The last
pop removes the call from this thread's calls in flight, with C calls only. So the trace gains exactly
two bound symbols per range. `enter`:
- pops (and ends) the ranges that a previous call on this thread, of any trace with the
  same NVTX domain, left open when an op raised (the calls that never ended
  and are no longer executing). Any trace: after an error the
  next call often compiles anew (another batch size), and NVTX stacks are per
  thread and domain, not per trace;
- for gated rules (``rank in <...>``, ``steps a..b``), decides which ranges are
  on for this call and swaps the push/pop globals between nvtx's functions
  and C-level no-ops. A gated-off range costs two calls of C builtins.
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
from ..selection.compile import Gate
from . import unwind_watch

# DEFAULT_DOMAIN lives in core.naming; it is named here too for callers of this module's API.
__all__ = ["Domain", "TraceRuntime", "current_rank", "nvtx_domain", "DEFAULT_DOMAIN"]

# C callables standing in for push(attributes, domain) and pop() when a
# gate is closed or no tool is attached: no Python frame, no effect, no
# allocation (an empty dict's `get` returns its default; an empty list's
# `clear` clears nothing). Measured: ~90 ns a push+pop pair, where `slice`
# (which allocates) took ~180 ns.
_SKIP_PUSH = {}.get
_SKIP_POP = [].clear


def _start_end(handle: Any) -> tuple[Any, Any]:
    """(start, end) for the lines ``started = start(attributes, domain)`` and ``end(*started)``:
    the nvtx package's C functions for start/end ranges, like `_push_pop`."""
    if not hasattr(handle, "handle"):
        return _SKIP_START, _SKIP_END
    try:
        from nvtx._lib.lib import end_range, start_range
    except ImportError:
        return (lambda attributes, _: (handle.start_range(attributes), None)), (lambda range_id, _: handle.end_range(range_id))
    return start_range, end_range  # start_range gives (range id, domain handle): end_range's arguments


def _SKIP_START(attributes: Any, domain: Any) -> tuple[int, None]:
    """Start/end stand-in when a gate is closed or no tool is attached: nvtx's
    `start_range` gives ``(range id, domain)``, which the end line unpacks."""
    return (0, None)


_SKIP_END = {}.get  # takes the (0, None) that _SKIP_START gave


def _push_pop(handle: Any) -> tuple[Any, Any, Any]:
    """(push, pop, domain argument) for the lines ``push(attributes, domain)`` and ``pop()``.

    The nvtx package's module-level functions take the domain's C handle: one
    plain C call each, where the `Domain` methods also parse ``**kwargs`` and
    look the handle up (about 40% of a range's cost with a tool attached).
    The pop has the handle bound (`functools.partial`, C too): its line
    loads one global less, which matters more in a large trace than the
    partial's few ns.
    """
    if not hasattr(handle, "handle"):  # nvtx's DummyDomain: no tool attached, nothing to emit
        return _SKIP_PUSH, _SKIP_POP, None
    try:
        from nvtx._lib.lib import pop_range, push_range
    except ImportError:  # another nvtx layout: slower, still correct
        return (lambda attributes, _: handle.push_range(attributes)), handle.pop_range, None
    return push_range, functools.partial(pop_range, handle.handle), handle.handle


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
    return _unasked_domain(name)


@functools.lru_cache(maxsize=None)
def _unasked_domain(name: str | None) -> Any:
    """nvtx's `Domain` for `name` without ``nvtxDomainIsEnabled``; one per name, as `nvtx.get_domain`
    keeps (category ids are numbered per object, and dropping the handle destroys the NVTX domain)."""
    from nvtx._lib.lib import Domain as NvtxDomain, DomainHandle

    # nvtx's Domain.__new__ is what asks the question; __init__ only fills in the rest.
    domain = object.__new__(NvtxDomain)
    domain.handle = DomainHandle(name)
    domain.__init__(name)
    return domain


def current_rank() -> int:
    """This process's distributed rank: torch.distributed's if initialized, else $RANK, else 0."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0") or 0)


@dataclass(frozen=True)
class RangesUnderGate:
    """The ranges of one trace that share a gate and an NVTX domain, and the globals their lines call."""

    push_name: str
    pop_name: str
    gate: frozenset[Gate] | None  # None: always on
    # The domain (the transform's own, or a user's marker's: `each marker`) and the global holding its argument.
    domain: Domain | None = None  # None: the runtime's own
    domain_name: str = ""
    # The globals that start and end this gate's start/end ranges ("": it has none).
    start_name: str = ""
    end_name: str = ""

    def is_open(self, rank: int, step: int) -> bool:
        return self.gate is None or any(g.is_open(rank, step) for g in self.gate)


class Progress:
    """One call of a transformed trace in flight: where it got to, and what it started.

    It is a local of the generated function, so it lives as long as the call's
    frame and no longer. Exactly one thread writes to it.
    """

    __slots__ = ("runtime", "calls", "live", "started", "at")

    runtime: TraceRuntime
    calls: list[Progress]  # this thread's calls in flight in the domain, outermost first
    live: tuple[bool, ...]  # per group: on in this call (gates are decided when it starts)
    # Start/end ranges the call has started and not ended: range number -> (NVTX range
    # id, domain handle), what `end` takes (set only in traces that have start/end ranges).
    started: dict[int, Any]
    # The position cell: ``at[1] * 256 + at[0]`` is the last push or pop point the
    # call passed (`TraceRuntime.open_after`), written by `unwind_watch` when the
    # call raised, or else by the lines as they pass (only ints 0-255, see `rewrite`;
    # the generated function then keeps it in a local too).
    at: list[int]


_thread_states: dict[str | None, threading.local] = {}
_thread_states_lock = threading.Lock()


def _thread_state(domain: str | None) -> threading.local:
    """Per thread, for one NVTX domain name: ``.calls``, the `Progress` of the calls in flight.

    A call that raised stays there until the next `enter` on the thread and domain.
    """
    with _thread_states_lock:
        return _thread_states.setdefault(domain, threading.local())


class TraceRuntime:
    """Run-time state of one transformed trace (one compiled function).

    Steps are counted per call of that function, from 0, across threads.
    Gate changes happen at call boundaries; calling one function from several
    threads while its gate opens or closes can cut a range short in the call
    that is in flight.
    """

    def __init__(
        self,
        domain: Domain,
        groups: list[RangesUnderGate],
        *,
        enter_name: str,
        exit_name: str,
        progress_name: str,
        start_end_groups: dict[int, int] | None = None,
        open_after: list[tuple[int, ...]] = [],  # noqa: B006 (read only)
        located_by_interpreter: bool = False,
    ) -> None:
        self.domain = domain  # the transform's own: calls in flight are kept per thread and this domain
        # Per push/pop point of the trace: the groups of the push/pop ranges open after it.
        self.open_after = open_after
        # Range number -> group number, of each start/end range of the trace.
        self.start_end_groups = start_end_groups or {}
        self.progress_name = progress_name  # the local that holds the call's `Progress`
        # Per group: (push, pop, domain argument) of its domain.
        self._calls_of = [_push_pop((g.domain or domain).handle) for g in groups]
        # Per group: (start, end) of its domain, for its start/end ranges.
        self._start_end_of = [_start_end((g.domain or domain).handle) for g in groups]
        self._state = _thread_state(domain.name)
        self.groups = groups  # groups[0] holds the trace's first range: `enter` pushes it
        # The lines that call enter/exit also push/pop a range of these groups.
        self.enter_name, self.exit_name = enter_name, exit_name
        self._gated = [g for g in groups if g.gate is not None]
        self._open = {g.push_name: False for g in self._gated}
        self._live = self._live_flags()  # changes only when a gate opens or closes
        self._calls = itertools.count()
        # Whether `unwind_watch` finds where a failed call stopped (the lines store no points),
        # and the code object it last watched for it (the generated function that calls `enter`).
        self._located_by_interpreter = located_by_interpreter
        self._code: Any = None

    def initial_globals(self) -> dict[str, Any]:
        """Globals the generated function starts with (gated groups start closed)."""
        values: dict[str, Any] = {}
        for group, (push, pop, argument), (start, end) in zip(self.groups, self._calls_of, self._start_end_of):
            on = group.gate is None
            values[group.domain_name] = argument
            values[group.push_name] = push if on else _SKIP_PUSH
            values[group.pop_name] = pop if on else _SKIP_POP
            if group.start_name:
                values[group.start_name] = start if on else _SKIP_START
                values[group.end_name] = end if on else _SKIP_END
        return values

    def enter(self, function_globals: dict[str, Any], attributes: Any, started: int | None = None) -> Progress:
        """Start a call: recover, apply gates, push the trace's first range (start it,
        for a start/end range: `started` is its number); return the call's progress."""
        state = self._state
        try:
            calls = state.calls
        except AttributeError:  # first call on this thread in this domain
            calls = state.calls = []
        if calls:
            _recover(calls)
        if self._gated:
            self._apply_gates(function_globals)
        if self._located_by_interpreter:
            code = sys._getframe(1).f_code
            if code is not self._code:  # the first call of this generated function
                self._code = code
                unwind_watch.watch(code, self)
        progress = Progress()
        progress.runtime, progress.calls, progress.live, progress.at = self, calls, self._live, [0, 0]
        calls.append(progress)
        if self.start_end_groups:
            progress.started = {}
        argument = self._calls_of[0][2]
        if started is None:
            function_globals[self.groups[0].push_name](attributes, argument)
        else:
            progress.started[started] = function_globals[self.groups[0].start_name](attributes, argument)
        return progress

    def _live_flags(self) -> tuple[bool, ...]:
        """Per group: whether it is not gated off now."""
        return tuple(g.gate is None or self._open[g.push_name] for g in self.groups)

    def _apply_gates(self, function_globals: dict[str, Any]) -> None:
        step = next(self._calls)
        rank = current_rank()
        changed = False
        for group, (push, pop, _), (start, end) in zip(self.groups, self._calls_of, self._start_end_of):
            if group.gate is None:
                continue
            now = group.is_open(rank, step)
            if now != self._open[group.push_name]:
                self._open[group.push_name] = now
                function_globals[group.push_name] = push if now else _SKIP_PUSH
                function_globals[group.pop_name] = pop if now else _SKIP_POP
                if group.start_name:
                    function_globals[group.start_name] = start if now else _SKIP_START
                    function_globals[group.end_name] = end if now else _SKIP_END
                changed = True
        if changed:
            self._live = self._live_flags()


def _recover(calls: list[Progress]) -> None:
    """Pop what the calls in `calls` that raised left open, newest first, and forget them.

    A call still executing (an outer call on this thread: `enter` ran inside
    it, or another transform's `enter` earlier in the same call) is no failed
    one; it and the calls before it stay.
    """
    while calls:
        progress = calls[-1]
        if _executing(progress):
            return
        calls.pop()
        runtime = progress.runtime
        calls_of = runtime._calls_of
        live = progress.live
        low, high = progress.at
        for group in runtime.open_after[high << 8 | low]:
            if live[group]:
                calls_of[group][1]()
        if runtime.start_end_groups:  # a failed call must not leave a start/end range open forever
            groups = runtime.start_end_groups
            for number, started in progress.started.items():
                if live[groups[number]]:
                    runtime._start_end_of[groups[number]][1](*started)


def _executing(progress: Progress) -> bool:
    """Whether the call that owns `progress` is on this thread's stack.

    Only the frames of generated functions that have the progress local are
    looked into; this runs only when a call starts while another is in flight.
    """
    name = progress.runtime.progress_name
    frame = sys._getframe(2)
    while frame is not None:
        if name in frame.f_code.co_varnames and frame.f_locals.get(name) is progress:
            return True
        frame = frame.f_back
    return False


_serials = itertools.count()


def next_serial() -> int:
    """A process-wide number that keeps each transformed trace's global names unique."""
    return next(_serials)
