"""The thunder and torch versions the thunder backend was tested with, a check of the
installed ones (`check_versions`, run once by `patches.install`), and the one way to
import thunder (`require_thunder`), which says how to install it when it is missing.

Eager and Inductor need no thunder: what reaches into Inductor checks its reaches
itself (`internals.inductor`).
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from typing import Any

from ..core.errors import MissingDependencyError, NvtxRegionsWarning
from .frames import outside_package

__all__ = [
    "Tested", "TESTED", "THUNDER", "THUNDER_TORCH", "INSTALL_THUNDER", "installed_version", "untested",
    "check_versions", "thunder_installed", "require_thunder",
]  # fmt: skip


@dataclass(frozen=True)
class Tested:
    """A distribution's tested versions: ``low <= version < high``, compared on the leading numbers."""

    distribution: str
    name: str  # as users know it
    low: tuple[int, ...]
    high: tuple[int, ...]
    described: str

    def covers(self, version: str) -> bool:
        found = re.match(r"\d+(?:\.\d+)*", version)
        if found is None:
            return False
        numbers = tuple(int(n) for n in found.group(0).split("."))
        return self.low <= numbers[: len(self.low)] and numbers[: len(self.high)] < self.high


# Every thunder entry of `nvtx_regions.internals` names the version it was checked on: these.
THUNDER = Tested("lightning-thunder", "thunder", (0, 2, 6), (0, 2, 7), "0.2.6")
# thunder 0.2.6's own torch range, narrower than its metadata's torch>=2.7.1: it does not
# import on torch 2.13 (named-tensor methods removed), and its ThunderFX crashes on 2.12.
# pyproject.toml's `thunder` extra states the same bound.
THUNDER_TORCH = Tested("torch", "torch", (2, 8), (2, 12), ">=2.8,<2.12")
TESTED = (THUNDER, THUNDER_TORCH)
INSTALL_THUNDER = "pip install 'nvtx_regions[thunder]'"

_checked = False


def installed_version(distribution: str) -> str | None:
    """The installed version of `distribution`, None if it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def untested() -> list[tuple[Tested, str | None]]:
    """(what was tested, the version found) for each distribution found outside its tested versions."""
    found = [(tested, installed_version(tested.distribution)) for tested in TESTED]
    return [(tested, version) for tested, version in found if version is None or not tested.covers(version)]


def check_versions() -> None:
    """Warn once per process when thunder or torch is outside the tested versions.

    A warning, not an error: the transform still runs there; what reaches
    into their internals reports its own failures (`patches`).
    """
    global _checked
    if _checked:
        return
    _checked = True
    outside = untested()
    if not outside:
        return
    found = ", ".join(f"{tested.name} {version or 'not installed'}" for tested, version in outside)
    wanted = ", ".join(f"{tested.name} {tested.described}" for tested in TESTED)
    warnings.warn(
        f"nvtx_regions' thunder backend was tested with {wanted}; found {found}. Module attribution and the user's markers "
        f"reach into thunder's and torch's internals, which may differ here: if `module`, `class` or `marker` "
        f"rules select nothing or ranges look wrong, install the tested versions",
        NvtxRegionsWarning,
        stacklevel=outside_package(),
    )


def thunder_installed() -> bool:
    """Whether lightning-thunder is installed (not whether it imports on this torch); reads
    the installed distributions only, so nothing tries to import thunder."""
    return installed_version(THUNDER.distribution) is not None


def require_thunder(what: str) -> Any:
    """The ``thunder`` module; `MissingDependencyError` naming `what` and the fix when it is
    not installed, or does not import on this torch."""
    try:
        import thunder
    except ModuleNotFoundError as error:
        if error.name != "thunder":
            raise _does_not_import(what, error) from error
        torch = installed_version("torch")
        moves = (
            f"; this is torch {torch}, which pip would replace"
            if torch is not None and not THUNDER_TORCH.covers(torch)
            else ""
        )
        raise MissingDependencyError(
            f"{what} needs lightning-thunder, which is not installed here: {INSTALL_THUNDER} "
            f"(thunder {THUNDER.described} needs torch {THUNDER_TORCH.described}{moves}). "
            "Eager and Inductor need no thunder: backend='eager' or backend='inductor'"
        ) from None
    except Exception as error:  # thunder imports torch internals that newer torch removed
        raise _does_not_import(what, error) from error
    return thunder


def _does_not_import(what: str, error: BaseException) -> MissingDependencyError:
    found = installed_version("lightning-thunder") or "?"
    return MissingDependencyError(
        f"{what} needs lightning-thunder, and thunder {found} does not import here "
        f"({type(error).__name__}: {error}): thunder {THUNDER.described} needs torch {THUNDER_TORCH.described}, "
        f"and this is torch {installed_version('torch')}. Install a torch in that range for thunder, "
        "or use backend='eager' or backend='inductor', which need no thunder"
    )
