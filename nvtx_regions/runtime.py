"""What runs inside a transformed trace: the NVTX calls, run-time gates, and
recovery of the NVTX stack after an op raised.

The per-range path pushes no Python frame. A push line in the trace reads

    nvtx_regions_push_3_0(nvtx_regions_attr_3_17)  # "t5 = ltorch.linear(...)"

where both names are globals of the generated function: a prebuilt domain's
bound method (C code) and prebuilt `EventAttributes` with a registered string.

The first push of a trace and its last pop are Python calls instead:
`TraceRuntime.enter` and `TraceRuntime.exit`, once per call of the trace, so
that the trace gains exactly two bound symbols per range. `enter`:
- pops the ranges a previous call on this thread left open when an op raised
  (it finds the failing line in that call's frame and counts the push and pop
  lines before it);
- for gated rules (``rank in <...>``, ``steps a..b``), decides which ranges are
  on for this call and swaps the push/pop globals between the domain's methods
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

# C builtins standing in for push(attributes) and pop() when a gate is closed:
# calling them pushes no Python frame and has no effect.
_SKIP_PUSH = id
_SKIP_POP = tuple

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


class TraceRuntime:
    """Run-time state of one transformed trace (one compiled function).

    Steps are counted per call of that function, from 0, across threads.
    Gate changes happen at call boundaries; calling one function from several
    threads while its gate opens or closes can cut a range short in the call
    that is in flight.
    """

    def __init__(self, domain: Domain, groups: list[Group], *, enter_name: str, exit_name: str) -> None:
        self.domain = domain
        self.groups = groups
        # The lines that call enter/exit also push/pop a range of these groups.
        self.enter_name, self.exit_name = enter_name, exit_name
        self._gated = [g for g in groups if g.gate is not None]
        self._open = {g.push_name: False for g in self._gated}
        self._calls = itertools.count()
        self._local = threading.local()
        self._lines: dict[CodeType, dict[str, list[int]]] = {}

    def initial_globals(self) -> dict[str, Any]:
        """Globals the generated function starts with (gated groups start closed)."""
        handle = self.domain.handle
        values: dict[str, Any] = {}
        for group in self.groups:
            on = group.gate is None
            values[group.push_name] = handle.push_range if on else _SKIP_PUSH
            values[group.pop_name] = handle.pop_range if on else _SKIP_POP
        return values

    def enter(self, function_globals: dict[str, Any], attributes: Any, push_name: str) -> None:
        """Start a call: recover, apply gates, then push the trace's first range."""
        local = self._local
        stale = getattr(local, "frame", None)
        if stale is not None:
            local.frame = None
            self._recover(stale, local.open_pushes)
        local.frame = sys._getframe(1)
        if self._gated:
            self._apply_gates(function_globals)
        local.open_pushes = {
            name
            for g in self.groups
            if g.gate is None or self._open[g.push_name]
            for name in (g.push_name, g.pop_name)
        }
        function_globals[push_name](attributes)
        local.first_push = push_name

    def exit(self, function_globals: dict[str, Any], pop_name: str) -> None:
        """End a call: pop the trace's last range."""
        function_globals[pop_name]()
        self._local.frame = None

    def _apply_gates(self, function_globals: dict[str, Any]) -> None:
        step = next(self._calls)
        rank = current_rank()
        handle = self.domain.handle
        for group in self._gated:
            now = group.is_open(rank, step)
            if now != self._open[group.push_name]:
                self._open[group.push_name] = now
                function_globals[group.push_name] = handle.push_range if now else _SKIP_PUSH
                function_globals[group.pop_name] = handle.pop_range if now else _SKIP_POP

    def _recover(self, frame: FrameType, live_names: set[str]) -> None:
        """Pop what the call that `frame` ran left open when it raised.

        `live_names` are the push/pop globals that were not gated off in that call.
        """
        failed_line = frame.f_lineno
        lines = self._call_lines(frame.f_code)
        left_open = 0
        for group in self.groups:
            if group.push_name in live_names:
                left_open += sum(1 for line in lines.get(group.push_name, ()) if line < failed_line)
                left_open -= sum(1 for line in lines.get(group.pop_name, ()) if line < failed_line)
        # The enter line pushed (it raised nothing: we are past it); the exit line was not reached.
        if self._local.__dict__.get("first_push") in live_names:
            left_open += 1
        pop = self.domain.handle.pop_range
        for _ in range(left_open):
            pop()
        try:
            frame.clear()  # free the failed call's tensors now
        except RuntimeError:  # still executing (a re-entrant call): leave it
            pass

    def _call_lines(self, code: CodeType) -> dict[str, list[int]]:
        """Global name -> source lines where the generated function loads it."""
        if code not in self._lines:
            lines: dict[str, list[int]] = {}
            current = 0
            for instruction in dis.get_instructions(code):
                if instruction.starts_line is not None:
                    current = instruction.starts_line
                if instruction.opname == "LOAD_GLOBAL":
                    lines.setdefault(instruction.argval, []).append(current)
            self._lines[code] = lines
        return self._lines[code]


_serials = itertools.count()


def next_serial() -> int:
    """A process-wide number that keeps each transformed trace's global names unique."""
    return next(_serials)
