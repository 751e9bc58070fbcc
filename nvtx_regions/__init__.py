"""nvtx_regions: choose which parts of a compiled PyTorch model become NVTX ranges.

    import nvtx_regions
    compiled = nvtx_regions.compile(model, "each module <transformer.h.*>", backend="inductor")

`compile` gives the model compiled by torch.compile (Inductor) or thunder, or
eager, with the spec's ranges; `steps` marks training steps. The three
backends are also here by name: `NvtxInductor` (a ``torch.compile``
backend), `NvtxProfileTransform` (a thunder transform) and `annotate` (hooks
on an eager model); `explain` says what a spec selected on any of them, as an
`Explanation`. `parse`, `load` and `render` work without importing thunder or
torch, and so does ``import nvtx_regions``: every other name imports what it
needs on first use. lightning-thunder is optional: `NvtxProfileTransform`,
`TraceReport` and `explain` of a thunder function raise
`MissingDependencyError` (saying how to install it) where it is not
installed. `compare(a, b)` puts two captures side by side per range name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .core.errors import (
    CaptureFileError,
    MissingDependencyError,
    NotRunYetError,
    NvtxRegionsWarning,
    SelectorError,
    SelectorSyntaxError,
)
from .language.parse import load, parse
from .language.tree import render
from .selection.compile import RegionOrderError

if TYPE_CHECKING:
    from .backends import compile, steps
    from .emission.eager import annotate
    from .emission.transform import NvtxProfileTransform, TraceReport
    from .inductor.backend import NvtxInductor
    from .report.compare import compare
    from .report.explanation import explain
    from .selection.explanation import Explanation

__all__ = [
    "compile",
    "steps",
    "NvtxInductor",
    "NvtxProfileTransform",
    "annotate",
    "TraceReport",
    "explain",
    "Explanation",
    "compare",
    "parse",
    "load",
    "render",
    "SelectorError",
    "SelectorSyntaxError",
    "RegionOrderError",
    "NotRunYetError",
    "CaptureFileError",
    "MissingDependencyError",
    "NvtxRegionsWarning",
]

# Imported on first use: thunder and torch take seconds to import, and only these need them
# (compare needs neither, but reads nsys reports through sqlite3).
_LAZY = {
    "NvtxProfileTransform": ".emission.transform",
    "TraceReport": ".emission.transform",
    "NvtxInductor": ".inductor.backend",
    "annotate": ".emission.eager",
    "explain": ".report.explanation",
    "Explanation": ".selection.explanation",
    "compare": ".report.compare",
    "compile": ".backends",
    "steps": ".backends",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'nvtx_regions' has no attribute {name!r}")


def __dir__() -> list[str]:
    # The lazily imported names are attributes too, though not yet in globals().
    return sorted(set(globals()) | set(__all__))
