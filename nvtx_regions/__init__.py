"""nvtx_regions: choose which parts of a thunder trace become NVTX ranges.

    import thunder
    from nvtx_regions import NvtxProfileTransform
    jm = thunder.jit(model, transforms=[NvtxProfileTransform(select="op in <linear, nvFusion*>")])

`parse`, `load` and `render` work without importing thunder or torch;
`NvtxProfileTransform` and `explain` import thunder on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .selection.compile import RegionOrderError
from .core.errors import NvtxRegionsWarning, SelectorError, SelectorSyntaxError
from .language.parse import load, parse
from .language.tree import render

if TYPE_CHECKING:
    from .report.explanation import explain
    from .emission.transform import NvtxProfileTransform
    from .backends import compile, steps

__all__ = [
    "NvtxProfileTransform",
    "explain",
    "compile",
    "steps",
    "parse",
    "load",
    "render",
    "SelectorError",
    "SelectorSyntaxError",
    "RegionOrderError",
    "NvtxRegionsWarning",
]


def __getattr__(name: str) -> Any:
    # Thunder takes seconds to import; only the transform needs it.
    if name == "NvtxProfileTransform":
        from .emission.transform import NvtxProfileTransform

        return NvtxProfileTransform
    if name == "explain":
        from .report.explanation import explain

        return explain
    if name in ("compile", "steps"):
        from . import backends

        return getattr(backends, name)
    raise AttributeError(f"module 'nvtx_regions' has no attribute {name!r}")


def __dir__() -> list[str]:
    # The lazily imported names are attributes too, though not yet in globals().
    return sorted(set(globals()) | set(__all__))
