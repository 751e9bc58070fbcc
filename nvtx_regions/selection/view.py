"""What selection reads of a compiled program: the `View` protocol.

Selection and planning work on any object with these attributes, whichever
compiler made the program: `attribution.traceview.TraceView` is a thunder
trace's, `nvtx_regions.inductor.kernels.KernelView` an Inductor graph's
kernel calls, `nvtx_regions.emission.eager_view.ModuleView` an eager model's
module tree. Positions are indexes into `ops`; selections are Python ints
used as bitsets over them. Facts a backend does not record are empty (no
markers, no source lines, no proxies); the rules that would need them are
left out on that backend (`selection.support`).
"""

from __future__ import annotations

import functools
from types import MappingProxyType
from typing import Any, Protocol, Sequence

from ..core.naming import Phase

__all__ = ["Phase", "ViewOp", "View", "ChainView"]


class ViewOp(Protocol):
    """One op (a bound symbol, a kernel call, a module call) of a program."""

    index: int  # where its range lines go: the emitter's position for it
    name: str
    reads: tuple[str, ...]  # proxy names it consumes
    writes: tuple[str, ...]  # proxy names it produces
    is_fusion: bool
    text: str  # what `explain` lists for it: a bound symbol's line, a kernel's or module's name


class View(Protocol):
    """A program as selection sees it (see the module doc). `__dict__` holds per-view caches."""

    ops: Sequence[ViewOp]
    phase: Phase
    name: str
    forward: View | None  # a backward's forward, when known
    program: str  # what the program is, in its backend's words: "trace", "graph", "model"
    units: str  # what its positions count: "bound symbols", "kernels", "module calls"
    __dict__: dict[str, Any]

    @property
    def everything(self) -> int: ...  # every position set

    @property
    def by_name(self) -> dict[str, int]: ...  # a name an op goes by -> positions of the ops with it

    @property
    def by_read(self) -> dict[str, int]: ...  # proxy name -> positions of the ops that read it

    @property
    def proxy_names(self) -> frozenset[str]: ...

    @property
    def origins(self) -> list[int | None]: ...  # per op of a backward: its forward origins (a bitset)

    @property
    def module_chains(self) -> list[Any]: ...  # per op: its module calls, outermost first, or None

    @property
    def module_parts(self) -> list[Any]: ...  # per op: the calls just below its chain whose work it fuses (`calls.parts_below`)

    @property
    def module_classes(self) -> dict[str, str]: ...  # module path -> class name

    @property
    def parameter_only(self) -> int: ...  # ops that read only static values (hoisted from ranges)

    @property
    def marker_stacks(self) -> list[Any]: ...  # per op: the user's markers open around it

    @property
    def marker_log(self) -> Any: ...

    @property
    def source_lines(self) -> list[tuple[tuple[str, int], ...]]: ...

    def region_start(self, name: str) -> int | None: ...

    def region_end(self, name: str) -> int | None: ...

    def markers_in_parts(self, position: int) -> frozenset[Any]: ...  # a fusion's: markers open around any part


class ChainView:
    """The `View` members of a program whose ops know only their module calls (an Inductor
    graph's kernels, an eager model's modules): no proxies, no backward origins, no markers,
    no source lines, no named regions. A subclass has ``ops`` (each with a ``chain``) and
    ``classes`` (module path -> class name)."""

    forward: Any = None
    by_read: Any = MappingProxyType({})
    proxy_names: frozenset[str] = frozenset()
    marker_log: Any = None

    @functools.cached_property
    def everything(self) -> int:
        return (1 << len(self.ops)) - 1  # type: ignore[attr-defined]

    @functools.cached_property
    def origins(self) -> list[int | None]:
        return [None] * len(self.ops)  # type: ignore[attr-defined]

    @functools.cached_property
    def module_chains(self) -> list[Any]:
        return [op.chain for op in self.ops]  # type: ignore[attr-defined]

    @functools.cached_property
    def module_parts(self) -> list[Any]:
        return [getattr(op, "parts", ()) for op in self.ops]  # type: ignore[attr-defined]

    @property
    def module_classes(self) -> dict[str, str]:
        return self.classes  # type: ignore[attr-defined]

    @functools.cached_property
    def marker_stacks(self) -> list[tuple]:
        return [()] * len(self.ops)  # type: ignore[attr-defined]

    @functools.cached_property
    def source_lines(self) -> list[tuple]:
        return [()] * len(self.ops)  # type: ignore[attr-defined]

    def region_start(self, name: str) -> int | None:
        return None

    def region_end(self, name: str) -> int | None:
        return None

    def markers_in_parts(self, position: int) -> frozenset[Any]:
        return frozenset()
