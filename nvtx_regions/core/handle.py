"""One handle for a spec's life on a model, whatever the backend.

Each backend's object is a `SpecHandle`: `EagerAnnotation` (eager's hooks), `NvtxInductor` (a
``torch.compile`` backend) and `NvtxProfileTransform` (a thunder transform). What
`nvtx_regions.compile` returns carries it as ``nvtx_regions_backend`` (`HANDLE`), which
`nvtx_regions.explain` reads. Each one holds its spec compiled for its backend and its NVTX
domain; its gates read the one step clock (`runtime.clock`); what a call that raises leaves open
is closed by the one runtime of its kind (`runtime.ranges` for generated code, `runtime.hook_ranges`
for hooks); `explain()` says what each rule selects in what the backend compiled; and `remove()`
ends its ranges.
"""

from __future__ import annotations

import abc
import os
from typing import Any

__all__ = ["HANDLE", "SpecHandle", "handle_of"]

HANDLE = "nvtx_regions_backend"  # the attribute of what `nvtx_regions.compile` returns that holds its handle


class SpecHandle(abc.ABC):
    """A spec on one model (see the module doc)."""

    @abc.abstractmethod
    def explain(self, select: str | None = None, *, spec: str | os.PathLike[str] | None = None, max_ops: int = 12) -> Any:
        """What each rule of this spec (or of `select`/`spec`) selects in what the backend compiled:
        an `Explanation`."""

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
