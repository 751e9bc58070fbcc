"""The one owner of every change nvtx_regions makes outside its own objects, and its undo log.

    installs.make("the wrapped torch._dynamo.convert_frame.exceeds_recompile_limit", apply)  # apply(undo) makes the change, once
    installs.hold(handle)     # each handle, as it is made (`runtime.handle.SpecHandle.hold`)
    installs.release(handle)  # its remove(), or its garbage collection

Each change is made by `make`, through the `Undo` it is given, which records how to put it back;
a name is made once until it is put back. The handles alive and not removed hold every change made:
when the last of them is removed or collected (`release`), each change is put back, the latest first,
each object by identity, and a handle made after that makes them again as it needs them. (A holder collected while a compiler
traces leaves the put back to the next call here: `_collected`.)

What is made, and by whom (the stand-ins' and wrappers' reasons are in their modules):
- Dynamo's stand-ins for the markers of ``torch.cuda.nvtx`` and ``nvtx`` (its wrapped
  ``InstructionTranslatorBase.call_function``, which also hears a ``record_function`` that 2.8 drops;
  neither library's functions are replaced), and its ``capture_profiler_record_function``
  (`compiled_markers.install`, each `NvtxInductor`);
- the three wrapped methods of Inductor's code generation (`inductor.install`, each compile);
- the wrapped ``exceeds_recompile_limit`` of Dynamo (`dynamo.recompile_limit_hits`), each `NvtxInductor`;
- torch.optim's global step hook (`runtime.clock.start_counting`: step gates, `nvtx_regions.steps`);
- thunder's patches (`patches.install`, each `NvtxProfileTransform`).

Not changes of this kind: hooks on the user's model and Dynamo's compile callbacks, which the handle
that put them on takes off itself; the ``nvtx_regions::marker`` op of our own library namespace; the
one ``atexit`` report, which says nothing of removed handles.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable

from .frames import compiling_on_some_thread

__all__ = ["Undo", "hold", "made", "make", "put_back", "release"]

_MISSING = object()


class Undo:
    """Changes made to another library's objects, each recorded as how to put it back; `restore` puts
    them back in reverse order."""

    def __init__(self) -> None:
        self._steps: list[Callable[[], None]] = []

    def __bool__(self) -> bool:
        """Whether a change is in place."""
        return bool(self._steps)

    def setattr(self, owner: Any, name: str, value: Any) -> None:
        """Set ``owner.name``; `restore` puts back the value the owner itself held, or deletes the
        attribute where it held none (a class's inherited method comes back so). A module whose
        attributes live elsewhere (torch's config modules, torch 2.11 and 2.14) gets its value back
        by ``setattr``: deleting there would remove the option."""
        if name in vars(owner):
            before = vars(owner)[name]
        elif isinstance(owner, type) or not hasattr(owner, name):
            before = _MISSING
        else:
            before = getattr(owner, name)
        self._steps.append(lambda: delattr(owner, name) if before is _MISSING else setattr(owner, name, before))
        setattr(owner, name, value)

    def setitem(self, mapping: dict, key: Any, value: Any) -> None:
        """Set ``mapping[key]``; `restore` puts back the value before, or removes the key."""
        before = mapping.get(key, _MISSING)
        self._steps.append(lambda: mapping.pop(key, None) if before is _MISSING else mapping.__setitem__(key, before))
        mapping[key] = value

    def then(self, step: Callable[[], None]) -> None:
        """Have `restore` call `step` (for a change made another way: a hook's handle's ``remove``)."""
        self._steps.append(step)

    def restore(self) -> None:
        """Undo every change, the latest first."""
        while self._steps:
            self._steps.pop()()


_lock = threading.RLock()
_made: dict[str, Undo] = {}  # by name, in the order made
_holders: dict[int, weakref.finalize] = {}  # id(handle) -> what releases it when it is collected


def make(name: str, apply: Callable[[Undo], None]) -> None:
    """Make the change `name` by calling ``apply(undo)``, unless it is made already; `apply` records each
    change it makes in `undo`. If `apply` raises, what it made is put back and the error goes on."""
    with _lock:
        _settle()
        if name in _made:
            return
        undo = Undo()
        try:
            apply(undo)
        except BaseException:
            undo.restore()
            raise
        _made[name] = undo


def made(name: str) -> bool:
    """Whether the change `name` is in place."""
    return name in _made


def put_back(name: str | None = None) -> None:
    """Put back the change `name` (None: every change, the latest first), whoever holds it."""
    with _lock:
        names = [name] if name is not None else list(_made)[::-1]
        for each in names:
            undo = _made.pop(each, None)
            if undo is not None:
                undo.restore()


def hold(handle: Any) -> None:
    """`handle` holds every change made until it is released (`release`), or collected."""
    with _lock:
        _settle()
        if id(handle) in _holders:
            return
        finalizer = weakref.finalize(handle, _collected, id(handle))
        finalizer.atexit = False  # at exit nothing needs putting back
        _holders[id(handle)] = finalizer


def release(handle: Any) -> None:
    """`handle` holds nothing from now on (its ``remove()``); the last holder's release puts every change
    back."""
    with _lock:
        _settle()
        finalizer = _holders.pop(id(handle), None)
        if finalizer is None:
            return
        finalizer.detach()
        if not _holders:
            put_back()


_pending = False  # the last holder was collected while a compiler ran: `_collected`


def _collected(key: int) -> None:
    """A holder was garbage collected. Collection happens at any allocation, inside a compiler too, which
    reads what we changed as it traces (thunder's interpreter asserts that a module's globals do not change
    under it): where the last holder goes while one runs, the changes are put back by the next `hold`,
    `release` or `make`, whichever comes first."""
    global _pending
    with _lock:
        if _holders.pop(key, None) is None or _holders:
            return
        if compiling_on_some_thread():
            _pending = True
        else:
            put_back()


def _settle() -> None:
    """Put back what a collection left pending (`_collected`), if still no handle holds it and no compiler
    runs."""
    global _pending
    if _pending and not compiling_on_some_thread():  # `make` runs inside a compile (our backend's)
        _pending = False
        if not _holders:
            put_back()
