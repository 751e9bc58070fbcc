"""Frame walks: what the caller of a function is doing, found where no public API says it."""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = [
    "backward_follows", "compiling_on_some_thread", "line_outside_package", "outside_package", "failed_frame",
    "frame_locals", "lines_naming",
]  # fmt: skip

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def line_outside_package() -> tuple[str, int]:
    """(filename, line) of the caller's nearest calling frame outside nvtx_regions: the user's line
    (``nvtx_regions.compile`` calls ``thunder.jit`` for the user).

    CPython 3.11 and 3.12: ``sys._getframe``. Without it the explain child
    could not say where the user asked for the compilation.
    """
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
    return frame.f_code.co_filename, frame.f_lineno


def outside_package() -> int:
    """The ``stacklevel`` that makes the caller's ``warnings.warn`` name the first frame outside nvtx_regions.

    CPython 3.11 and 3.12: ``sys._getframe``. Without it a warning from deep
    inside the package would name one of its own lines, not the user's.
    """
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


def backward_follows() -> bool:
    """Whether thunder will hand this transform a backward trace after this forward.

    thunder 0.2.6 calls post-optimization transforms from
    ``apply_transforms_and_build_cache_entry`` with the backward trace in a
    local; a forward tagged AUGMENTED_FORWARD under ``torch.no_grad`` gets
    none. If that frame is not found, assume a backward follows (the check
    then runs at the next compilation instead).
    """
    frame = sys._getframe(1)
    for _ in range(8):
        if frame is None:
            break
        if frame.f_code.co_name == "apply_transforms_and_build_cache_entry" and "backward_trc" in frame.f_locals:
            return frame.f_locals["backward_trc"] is not None
        frame = frame.f_back
    return True


def failed_frame(traceback: Any, name: str, value: Any) -> tuple[Any, int] | None:
    """(frame, line it stopped at) of the first frame of `traceback` whose global `name` is `value`
    (by identity): the generated function a failed call ran, or None.

    CPython 3.11.7 and 3.12.1 (checked): ``tb_frame``, ``tb_lineno``, ``f_globals``.
    Without it a call that raised could not say where it stopped, and its ranges stayed open.
    """
    while traceback is not None:
        frame = traceback.tb_frame
        if frame.f_globals.get(name) is value:
            return frame, traceback.tb_lineno
        traceback = traceback.tb_next
    return None


def frame_locals(frame: Any) -> dict[str, Any]:
    """The local variables of `frame` (a frame a traceback holds: its function has stopped).

    CPython 3.11.7 and 3.12.1 (checked): ``f_locals``, a snapshot dict (3.13 gives a
    read-through proxy, which ``dict()`` copies alike).
    """
    return dict(frame.f_locals)


def lines_naming(code: Any, names: set[str]) -> list[tuple[int, str, bool]]:
    """(source line, name, whether it stores) of each instruction of `code` that names one of
    `names` (a global, an attribute or a local), in the code's order.

    CPython bytecode through `dis`, checked on 3.11.7 and 3.12.1: line numbers
    from ``positions``; 3.13's ``line_number`` and superinstructions (two locals
    at once) and 3.10's ``starts_line`` are read too. Without it the line a
    failed call stopped at could not be told apart from the lines around it.
    """
    import dis

    found: list[tuple[int, str, bool]] = []
    line = code.co_firstlineno
    for instruction in dis.get_instructions(code):
        number = getattr(instruction, "line_number", None)
        if number is None:
            positions = getattr(instruction, "positions", None)
            number = positions.lineno if positions is not None else None
        if number is None and type(instruction.starts_line) is int:
            number = instruction.starts_line
        if number is not None:
            line = number
        if isinstance(instruction.argval, tuple):  # e.g. STORE_FAST_LOAD_FAST: one store, one load
            kinds = instruction.opname.split("_FAST_")
            named = zip(instruction.argval, (kind.startswith("STORE") for kind in kinds))
        else:
            named = iter([(instruction.argval, instruction.opname.startswith("STORE"))])
        for value, stores in named:
            if isinstance(value, str) and value in names:
                found.append((line, value, stores))
    return found


# Where a compiler's frames live (torch 2.8 to 2.14.1, thunder 0.2.6): Dynamo, AOTAutograd, Inductor,
# and thunder's interpreter, which checks that the module globals it read stay the same while it traces.
_COMPILERS = tuple(
    os.sep + os.path.join(*parts) + os.sep
    for parts in (("torch", "_dynamo"), ("torch", "_functorch"), ("torch", "_inductor"), ("thunder", "core"))
)


def compiling_on_some_thread() -> bool:
    """Whether a thread of this process is inside Dynamo, AOTAutograd, Inductor or thunder's tracing now
    (one of its frames is theirs). ``sys._current_frames`` (CPython 3.10 to 3.13)."""
    for frame in list(sys._current_frames().values()):
        while frame is not None:
            if any(part in frame.f_code.co_filename for part in _COMPILERS):
                return True
            frame = frame.f_back
    return False
