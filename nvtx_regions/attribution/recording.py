"""Turning on what attribution needs while thunder traces: the module recorder
and the marker lookasides (`internals.patches`), with `marker_logs` recording
the markers. `NvtxProfileTransform` calls `install_module_recorder` when it is
constructed, so every function jitted with it is recorded.
"""

from __future__ import annotations

__all__ = ["install_module_recorder", "uninstall_module_recorder"]


def install_module_recorder() -> None:
    """Install thunder's patches for module and marker attribution (once; see `internals.patches.install`)."""
    from ..internals.patches import install
    from . import marker_logs

    install(marker_logs)


def uninstall_module_recorder() -> None:
    """Undo `install_module_recorder`: thunder is left exactly as it was."""
    from ..internals.patches import uninstall

    uninstall()
