"""Where a failed call of a transformed trace stopped, told by the interpreter
(Python 3.12 and later), so that the trace's lines need no position stores.

`sys.monitoring` reports ``PY_UNWIND`` when an exception leaves a Python frame,
with the frame's code object and the offset of the instruction that raised.
Python 3.12-3.14 offer it only as a global event: the callback runs once per
frame that an exception leaves, anywhere in the process, and returns at once
for code that is not a transformed trace (one dict lookup). Nothing runs while
no exception leaves a frame, so a range costs its push and pop calls only.

For a watched trace the callback turns the offset into the trace's *point*
(how many push and pop lines the call had passed, see `runtime`) and writes it
into the call's `Progress` (a local of the failing frame, read while the frame
is still on the stack; nothing keeps the frame afterwards). A push or pop
line counts as passed when the instruction that raised is on it or after it:
nvtx's C calls and the runtime's no-ops do not raise, so an exception on such
a line is an asynchronous one (a signal) arriving after its call returned.

Where `sys.monitoring` is missing (Python 3.11) or all six tool ids are
taken, or ``NVTX_REGIONS_SYS_MONITORING=0`` is set (for a debugger or
coverage tool that wants every id, or to compare the two paths), `enabled()`
is false and the trace records its points itself.
"""

from __future__ import annotations

import atexit
import bisect
import dis
import os
import sys
import threading
import weakref
from types import CodeType
from typing import Any

__all__ = ["enabled", "watch"]

TOOL_NAME = "nvtx_regions"
ENV_SWITCH = "NVTX_REGIONS_SYS_MONITORING"  # "0": do not use sys.monitoring; "1" (default): use it where it exists
# Tried in this order; sys.monitoring reserves 0 (debugger), 1 (coverage), 2 (profiler), 5 (optimizer).
_TOOL_IDS = (4, 3, 5, 2, 1, 0)

_lock = threading.Lock()
_state: dict[str, Any] = {"tool": None, "tried": False}
# id() of a watched code object -> (a weak reference to it, a watcher per transform whose lines
# it holds: several transforms may annotate one trace). Keyed by id() so that the callback's test,
# for the frames of all other code, is one dict lookup; an entry goes when its code object does.
_watched: dict[int, tuple[weakref.ref, list[_Watcher]]] = {}


def enabled() -> bool:
    """Whether failed calls are located by `sys.monitoring` in this process (takes a tool id on first use)."""
    if _state["tried"]:
        return _state["tool"] is not None
    with _lock:
        if not _state["tried"]:
            _state["tool"] = _take_tool_id()
            _state["tried"] = True
    return _state["tool"] is not None


def _take_tool_id() -> int | None:
    switch = os.environ.get(ENV_SWITCH, "1")
    if switch not in ("0", "1"):
        raise ValueError(f"${ENV_SWITCH} is {switch!r}; set it to 0 (the trace records its points) or 1 (the default)")
    monitoring = getattr(sys, "monitoring", None)
    if monitoring is None or switch == "0":
        return None
    for tool in _TOOL_IDS:
        if monitoring.get_tool(tool) == TOOL_NAME:  # a reloaded copy of this module took it before
            break
        try:
            monitoring.use_tool_id(tool, TOOL_NAME)
        except ValueError:  # in use by another tool
            continue
        break
    else:
        return None
    monitoring.register_callback(tool, monitoring.events.PY_UNWIND, _on_unwind)
    monitoring.set_events(tool, monitoring.get_events(tool) | monitoring.events.PY_UNWIND)
    # Before the interpreter tears modules down: frames still unwind then, and this one's globals go.
    atexit.register(_stop, monitoring, tool)
    return tool


def _stop(monitoring: Any, tool: int) -> None:
    monitoring.set_events(tool, 0)
    monitoring.register_callback(tool, monitoring.events.PY_UNWIND, None)
    monitoring.free_tool_id(tool)


def watch(code: CodeType, runtime: Any) -> None:
    """Locate failed calls of `code`, a generated trace function whose calls `runtime` runs.

    Holds neither: the entry goes when `code` does (the runtime lives in the generated
    function's globals, as long as `code`).
    """
    key = id(code)
    entry = _watched.get(key)
    if entry is None or entry[0]() is not code:
        entry = _watched[key] = (weakref.ref(code, lambda ref: _forget(key, ref)), [])
    watchers = entry[1]
    if not any(watcher.runtime() is runtime for watcher in watchers):
        watchers.append(_Watcher(weakref.ref(runtime)))


def _forget(key: int, ref: weakref.ref) -> None:
    entry = _watched.get(key)
    if entry is not None and entry[0] is ref:
        del _watched[key]


class _Watcher:
    """One transform's ranges in one generated function; what it needs is worked out at the first failure."""

    __slots__ = ("runtime", "offsets", "line_at", "point_lines")

    def __init__(self, runtime: weakref.ref) -> None:
        self.runtime = runtime
        self.offsets: list[int] = []  # instruction offsets, in order
        self.line_at: list[int] = []  # and their lines
        self.point_lines: list[int] | None = None  # line of point 0, 1, 2, ...

    def point_at(self, code: CodeType, runtime: Any, offset: int) -> int:
        """The last point passed when the instruction at `offset` raised."""
        if self.point_lines is None:
            self.offsets, self.line_at, self.point_lines = _lines(code, runtime)
        found = bisect.bisect_right(self.offsets, offset)  # the instruction at or before `offset`
        passed = bisect.bisect_right(self.point_lines, self.line_at[found - 1]) if found else 0
        return max(passed - 1, 0)


def _on_unwind(code: CodeType, offset: int, exception: BaseException) -> None:
    entry = _watched.get(id(code))
    if entry is None or entry[0]() is not code:
        return
    try:
        frame_locals = None
        for watcher in entry[1]:
            runtime = watcher.runtime()
            if runtime is None:
                continue
            if frame_locals is None:
                frame_locals = sys._getframe(1).f_locals
            progress = frame_locals.get(runtime.progress_name)
            if progress is None or progress.runtime is not runtime:  # it raised before `enter` returned
                continue
            point = watcher.point_at(code, runtime, offset)
            progress.at[0], progress.at[1] = point & 255, point >> 8
    except Exception:  # noqa: BLE001 -- a monitoring callback must not raise into the user's exception
        return


def _lines(code: CodeType, runtime: Any) -> tuple[list[int], list[int], list[int]]:
    """The instructions of `code` that have a line (offsets, and the line of each), in order,
    and the line of each of `runtime`'s points.

    A point's line is found from the global it calls: `enter`'s line is point 0, then
    every line that calls a group's push or pop global is the next point, up to the
    trace's last pop (`exit`), past which nothing is open (`TraceRuntime.open_after`).
    """
    names = {runtime.enter_name} | {group.push_name for group in runtime.groups} | {group.pop_name for group in runtime.groups}
    offsets: list[int] = []
    line_at: list[int] = []
    point_lines: list[int] = []
    for instruction in dis.get_instructions(code):
        line = instruction.positions.lineno if instruction.positions else None
        if line is None:
            continue
        offsets.append(instruction.offset)
        line_at.append(line)
        if instruction.opname == "LOAD_GLOBAL" and instruction.argval in names and (not point_lines or line > point_lines[-1]):
            point_lines.append(line)
    return offsets, line_at, point_lines
