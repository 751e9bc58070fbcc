"""One handle for a spec's life on a model, whatever the backend.

Each backend's object is a `SpecHandle`: `EagerAnnotation` (eager's hooks), `NvtxInductor` (a
``torch.compile`` backend) and `NvtxProfileTransform` (a thunder transform). What
`nvtx_regions.compile` returns carries it as ``nvtx_regions_backend`` (`HANDLE`), which
`nvtx_regions.explain` reads. Each one holds (`SpecHandle.hold`) its spec compiled for its
backend, its NVTX domain and sinks, ``strict``, and its tally: what each rule has selected in all
that the backend placed, from which it says which rules selected nothing (`say_unselected`: when,
is the backend's to know: eager once its hooks are on, Inductor at the end of the step that
compiled, thunder per compilation). Its gates read the one step clock (`runtime.clock`); what a
call that raises leaves open is closed by the one runtime of its kind (`runtime.ranges` for
generated code, `runtime.hook_ranges` for hooks); `explain()` says what each rule selects in what
the backend compiled; and `remove()` ends its ranges. Each handle holds what nvtx_regions changed
outside its own objects (`internals.installs`) while it lives: the last one's `remove()` (or its
garbage collection) puts all of it back.

One owner per model (`take_model`): the handle that last took a model (an annotation, as it is made;
an Inductor backend, as it is given the model: ``model=``, `adopt`, `nvtx_regions.compile`) gives its ranges,
and the one before lets go of it (`SpecHandle.let_go`): each range comes once.

What a handle has not said by the end of the process is said in one report at exit, for every
backend (`report_at_exit`: one ``atexit`` hook, registered with the first handle): an Inductor
backend's graphs loaded since it last reported (a model called once, without gradients), a thunder
transform that got no trace, ThunderFX subgraphs compiled since `check()`. A removed handle says
nothing more.
"""

from __future__ import annotations

import abc
import atexit
import os
import weakref
from typing import Any

from ..internals import installs
from ..selection.compile import CompiledSpec
from ..selection.unselected import RuleTally
from .domain import Domain

__all__ = ["HANDLE", "SpecHandle", "handle_of", "take_model"]

HANDLE = "nvtx_regions_backend"  # the attribute of what `nvtx_regions.compile` returns that holds its handle

_live: list["weakref.ref[SpecHandle]"] = []  # every handle made, oldest first
_owners: "weakref.WeakKeyDictionary[Any, weakref.ref[SpecHandle]]" = weakref.WeakKeyDictionary()  # model -> its owner


class SpecHandle(abc.ABC):
    """A spec on one model (see the module doc)."""

    removed = False  # set by `remove()`

    def hold(self, compiled: CompiledSpec, domain: Domain, *, strict: bool) -> None:
        """Hold what a handle holds on every backend (each calls this as it is made): `compiled`, the
        spec compiled for the backend; `domain` (with `domain_name` and `sinks`); `strict`; and
        `tally`, empty. Once made, the backend calls `live_until_exit`."""
        self.compiled = compiled
        self.domain = domain
        self.domain_name = domain.name
        self.sinks = domain.sinks
        self.strict = strict
        self.tally = RuleTally(compiled)
        installs.hold(self)

    def release_installs(self) -> None:
        """This handle holds nothing nvtx_regions changed outside its own objects any more (each backend's
        ``remove()`` calls it): after the last handle's, torch, nvtx and thunder are as they were
        (`internals.installs`)."""
        installs.release(self)

    def say_unselected(self, where: str, *, once: bool = True, skip: tuple[type, ...] = (), stacklevel: int = 1) -> None:
        """Warn (with `strict`, raise `SelectorError`) for each rule that `tally` says selected nothing
        in `where` (what the backend placed, in its words); with `once`, only for the rules not said
        before; never for rules of the classes in `skip`. `stacklevel` counts from the caller."""
        self.tally.report(strict=self.strict, where=where, once=once, skip=skip, stacklevel=stacklevel + 1)

    def live_until_exit(self) -> None:
        """Count this handle in the report at exit (each backend calls it once the handle is made)."""
        if not _live:
            atexit.register(_report_at_exit)
        _live[:] = [ref for ref in _live if ref() is not None] + [weakref.ref(self)]

    @classmethod
    def report_at_exit(cls, handles: list[Any]) -> None:
        """At exit, say what `handles` (this backend's, alive and not removed, oldest first) have left
        unsaid: as warnings, since nothing can catch an error then. Nothing by default."""

    @abc.abstractmethod
    def explain(self, select: str | None = None, *, spec: str | os.PathLike[str] | None = None, max_ops: int = 12) -> Any:
        """What each rule of this spec (or of `select`/`spec`) selects in what the backend compiled:
        an `Explanation`."""

    def let_go(self, model: Any) -> None:
        """Another handle took `model` (`take_model`): what this one installed on it comes off, so that
        each of its ranges comes once, from the new owner."""

    @abc.abstractmethod
    def remove(self) -> None:
        """From now on, no range of this handle is emitted, on any thread; what it installed for this
        model comes off. Removing twice is harmless."""


def handle_of(target: Any) -> SpecHandle | None:
    """`target` itself if it is a handle, else the handle `nvtx_regions.compile` hung on it, or None."""
    if isinstance(target, SpecHandle):
        return target
    found = getattr(target, HANDLE, None)
    return found if isinstance(found, SpecHandle) else None


def take_model(model: Any, handle: SpecHandle, *, stacklevel: int = 1) -> None:
    """`handle` gives `model`'s ranges from now on. The model's owner until now, if another handle
    alive and not removed, lets go of it (`SpecHandle.let_go`). Where the two are of different kinds
    (an annotation and a ``torch.compile`` backend), one `NvtxRegionsWarning` says so: the user may
    have meant both to give ranges. `stacklevel` counts from the caller."""
    ref = _owners.get(model)
    previous = None if ref is None else ref()
    _owners[model] = weakref.ref(handle)
    if previous is None or previous is handle or previous.removed:
        return
    previous.let_go(model)
    if type(previous).let_go is not type(handle).let_go:
        import warnings

        from ..core.errors import NvtxRegionsWarning

        warnings.warn(
            f"{handle!r} now gives the ranges of this {type(model).__name__}, which {previous!r} gave until "
            "now: one owner per model, so the earlier one's hooks on it came off and each range comes once. "
            "Give the whole spec to one of them, or remove() the earlier one first to silence this",
            NvtxRegionsWarning,
            stacklevel=stacklevel + 1,
        )


def _report_at_exit() -> None:
    """The one report at exit: each backend's `report_at_exit`, with its handles."""
    groups: dict[Any, list[SpecHandle]] = {}
    for ref in _live:
        handle = ref()
        if handle is not None and not handle.removed:
            # By the method, not the class: a subclass (a user's transform) reports with its base.
            groups.setdefault(type(handle).report_at_exit.__func__, []).append(handle)  # type: ignore[attr-defined]
    for handles in groups.values():
        type(handles[0]).report_at_exit(handles)
