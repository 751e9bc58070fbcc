"""The thunder and torch versions nvtx_regions was tested with, and a check of
the installed ones (`check_versions`, run once by `patches.install`)."""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass

from ..core.errors import NvtxRegionsWarning
from .frames import outside_package

__all__ = ["Tested", "TESTED", "installed_version", "untested", "check_versions"]


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


# Every entry of `nvtx_regions.internals` names the version it was checked on: these.
TESTED = (
    Tested("lightning-thunder", "thunder", (0, 2, 6), (0, 2, 7), "0.2.6"),
    Tested("torch", "torch", (2, 8), (2, 12), ">=2.8,<2.12 (2.11 tested)"),
)

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
        f"nvtx_regions was tested with {wanted}; found {found}. Module attribution and the user's markers "
        f"reach into thunder's and torch's internals, which may differ here: if `module`, `class` or `marker` "
        f"rules select nothing or ranges look wrong, install the tested versions",
        NvtxRegionsWarning,
        stacklevel=outside_package(),
    )
