"""What runs inside a transformed trace: the NVTX calls, run-time gates, and
recovery of the NVTX stack after an op raised.

The per-range path pushes no Python frame. A push line in the trace reads

    nvtx_regions_3_push_0(nvtx_regions_3_attr_17, nvtx_regions_3_domain)  # "t5 = ltorch.linear(...)"

where all three names are globals of the generated function: the nvtx
package's C function ``push_range``, prebuilt `EventAttributes` with a
registered string, and the domain's C handle. Pops read
``nvtx_regions_3_pop_0(nvtx_regions_3_domain)``. With no NVTX tool attached
the nvtx package hands out a dummy domain, and push and pop are C no-ops.

The first push of a trace and its last pop are Python calls instead:
`TraceRuntime.enter` and `TraceRuntime.exit`, once per call of the trace, so
that the trace gains exactly two bound symbols per range. `enter`:
- pops the ranges that a previous call on this thread, of any trace with the
  same NVTX domain, left open when an op raised (it finds the failing line in
  that call's frame and counts the push and pop lines before it). Any trace:
  after an error the next call often compiles anew (another batch size), and
  NVTX stacks are per thread and domain, not per trace;
- for gated rules (``rank in <...>``, ``steps a..b``), decides which ranges are
  on for this call and swaps the push/pop globals between nvtx's functions
  and C-level no-ops. A gated-off range costs one call of a C builtin.
"""

from __future__ import annotations

import dis
import itertools
import os
import sys
import threading
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Any

from .compile import Gate

__all__ = ["Domain", "TraceRuntime", "current_rank", "DEFAULT_DOMAIN"]

DEFAULT_DOMAIN = "nvtx_regions"

# C callables standing in for push(attributes, domain) and pop(domain) when a
# gate is closed or no tool is attached: no Python frame, no effect, no
# allocation (an empty dict's `get` returns its default). Measured: ~90 ns a
# push+pop pair, where `slice` (which allocates) took ~180 ns.
_SKIP_PUSH = {}.get
_SKIP_POP = id


def _push_pop(handle: Any) -> tuple[Any, Any, Any]:
    """(push, pop, domain argument) for the lines ``push(attributes, domain)`` and ``pop(domain)``.

    The nvtx package's module-level functions take the domain's C handle: one
    plain C call each, where the `Domain` methods also parse ``**kwargs`` and
    look the handle up (about 40% of a range's cost with a tool attached).
    """
    if not hasattr(handle, "handle"):  # nvtx's DummyDomain: no tool attached, nothing to emit
        return _SKIP_PUSH, _SKIP_POP, None
    try:
        from nvtx._lib.lib import pop_range, push_range
    except ImportError:  # another nvtx layout: slower, still correct
        return (lambda attributes, _: handle.push_range(attributes)), (lambda _: handle.pop_range()), None
    return push_range, pop_range, handle.handle

# Distinct, readable colours (ARGB), one per rule, cycling.
_PALETTE = (
    0xFF76B900, 0xFF1F77B4, 0xFFFF7F0E, 0xFFD62728, 0xFF9467BD,
    0xFF8C564B, 0xFFE377C2, 0xFF17BECF, 0xFFBCBD22, 0xFF7F7F7F,
)  # fmt: skip


def rule_color(number: int) -> int:
    return _PALETTE[number % len(_PALETTE)]


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
                    import nvtx

                    self._handle = nvtx.get_domain(self.name)
        return self._handle

    def attributes(self, message: str, *, color: int | None = None, category: str | None = None) -> Any:
        """Prebuilt event attributes: message as a registered string, colour, named category."""
        handle = self.handle
        category_id = handle.get_category_id(category) if category else None
        return handle.get_event_attributes(message=message, color=color, category=category_id)


def current_rank() -> int:
    """This process's distributed rank: torch.distributed's if initialized, else $RANK, else 0."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0") or 0)


@dataclass(frozen=True)
class Group:
    """The ranges of one trace that share a gate, and the globals their lines call."""

    push_name: str
    pop_name: str
    gate: frozenset[Gate] | None  # None: always on

    def is_open(self, rank: int, step: int) -> bool:
        return self.gate is None or any(g.is_open(rank, step) for g in self.gate)


@dataclass
class _Call:
    """A call of a transformed trace that has entered and not exited."""

    runtime: TraceRuntime
    frame: FrameType
    live_names: frozenset[str]  # push/pop globals not gated off in this call
    first_push_live: bool  # whether `enter` pushed a range


# Per thread: NVTX domain name -> the calls in flight there, outermost first.
# A call that raised stays here until the next `enter` on the thread and domain.
_in_flight = threading.local()


class TraceRuntime:
    """Run-time state of one transformed trace (one compiled function).

    Steps are counted per call of that function, from 0, across threads.
    Gate changes happen at call boundaries; calling one function from several
    threads while its gate opens or closes can cut a range short in the call
    that is in flight.
    """

    def __init__(
        self, domain: Domain, groups: list[Group], *, enter_name: str, exit_name: str, domain_name: str
    ) -> None:
        self.domain = domain
        self.domain_name = domain_name  # the global that holds the domain argument
        self._push, self._pop, self._domain_arg = _push_pop(domain.handle)
        self.groups = groups
        # The lines that call enter/exit also push/pop a range of these groups.
        self.enter_name, self.exit_name = enter_name, exit_name
        self._gated = [g for g in groups if g.gate is not None]
        self._open = {g.push_name: False for g in self._gated}
        self._live_names = self._live()  # changes only when a gate opens or closes
        self._calls = itertools.count()
        self._lines: dict[CodeType, dict[str, list[int]]] = {}

    def initial_globals(self) -> dict[str, Any]:
        """Globals the generated function starts with (gated groups start closed)."""
        values: dict[str, Any] = {self.domain_name: self._domain_arg}
        for group in self.groups:
            on = group.gate is None
            values[group.push_name] = self._push if on else _SKIP_PUSH
            values[group.pop_name] = self._pop if on else _SKIP_POP
        return values

    def enter(self, function_globals: dict[str, Any], attributes: Any, push_name: str) -> None:
        """Start a call: recover, apply gates, then push the trace's first range."""
        calls: list[_Call] = _in_flight.__dict__.setdefault(self.domain.name, [])
        if calls:
            _recover(calls)
        if self._gated:
            self._apply_gates(function_globals)
        live_names = self._live_names
        calls.append(_Call(self, sys._getframe(1), live_names, push_name in live_names))
        function_globals[push_name](attributes, self._domain_arg)

    def exit(self, function_globals: dict[str, Any], pop_name: str) -> None:
        """End a call: pop the trace's last range."""
        function_globals[pop_name](self._domain_arg)
        _in_flight.__dict__[self.domain.name].pop()

    def _live(self) -> frozenset[str]:
        """The push/pop globals that are not gated off now."""
        return frozenset(
            name
            for g in self.groups
            if g.gate is None or self._open[g.push_name]
            for name in (g.push_name, g.pop_name)
        )

    def _apply_gates(self, function_globals: dict[str, Any]) -> None:
        step = next(self._calls)
        rank = current_rank()
        changed = False
        for group in self._gated:
            now = group.is_open(rank, step)
            if now != self._open[group.push_name]:
                self._open[group.push_name] = now
                function_globals[group.push_name] = self._push if now else _SKIP_PUSH
                function_globals[group.pop_name] = self._pop if now else _SKIP_POP
                changed = True
        if changed:
            self._live_names = self._live()

    def _left_open(self, code: CodeType, failed_line: int, call: _Call) -> int:
        """How many ranges `call`, which raised on `failed_line` of `code`, left open."""
        lines = self._call_lines(code)
        left_open = 0
        for group in self.groups:
            if group.push_name in call.live_names:
                left_open += sum(1 for line in lines.get(group.push_name, ()) if line < failed_line)
                left_open -= sum(1 for line in lines.get(group.pop_name, ()) if line < failed_line)
        # The enter line pushed (it raised nothing: we are past it); the exit line was not reached.
        return left_open + call.first_push_live

    def _call_lines(self, code: CodeType) -> dict[str, list[int]]:
        """Global name -> source lines where the generated function loads it."""
        if code not in self._lines:
            lines: dict[str, list[int]] = {}
            current = 0
            for instruction in dis.get_instructions(code):
                # 3.13 made starts_line a bool and added line_number.
                line = instruction.line_number if _LINE_NUMBER else instruction.starts_line
                if line is not None:
                    current = line
                if instruction.opname == "LOAD_GLOBAL":
                    lines.setdefault(instruction.argval, []).append(current)
            self._lines[code] = lines
        return self._lines[code]


_LINE_NUMBER = sys.version_info >= (3, 13)


def _recover(calls: list[_Call]) -> None:
    """Pop what the calls in `calls` that raised left open, newest first, and forget them.

    A call still executing (an outer call on this thread: `enter` ran inside
    it) is no failed one; it and the calls before it stay.
    """
    while calls:
        call = calls[-1]
        frame = call.frame
        code, failed_line = frame.f_code, frame.f_lineno
        try:
            frame.clear()  # also frees the failed call's tensors now
        except RuntimeError:  # still executing
            return
        calls.pop()
        pop = call.runtime.domain.handle.pop_range
        for _ in range(call.runtime._left_open(code, failed_line, call)):
            pop()


_serials = itertools.count()


def next_serial() -> int:
    """A process-wide number that keeps each transformed trace's global names unique."""
    return next(_serials)
