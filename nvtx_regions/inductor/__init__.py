"""The spec's ranges under ``torch.compile``: ``from nvtx_regions.inductor import NvtxInductor``.

`backend` is the ``torch.compile`` backend, `kernels` the view of a graph's
kernel calls that selection works on, `check` the rules refused there,
`placement` the lines a wrapper gains, `runtime` what those lines call, and
`explain` what each rule selected. Imports `core`, `internals`, `language`,
`selection` and `emission`; torch's Inductor is imported when a backend is
made, which checks that it has what placing ranges reaches into
(`UnsupportedTorchError` if not; `TESTED_TORCH`: the releases checked).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .backend import NvtxInductor

__all__ = ["NvtxInductor", "UnsupportedTorchError", "TESTED_TORCH"]


def __getattr__(name: str) -> Any:
    if name == "NvtxInductor":
        from .backend import NvtxInductor

        return NvtxInductor
    if name in ("UnsupportedTorchError", "TESTED_TORCH"):
        from ..internals import inductor

        return getattr(inductor, name)
    raise AttributeError(f"module 'nvtx_regions.inductor' has no attribute {name!r}")
