"""Module calls as value types: one call of a module's ``forward``, the chain of
calls running when an op was recorded, and what chains have in common."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from .globs import split_path
from .naming import module_call_name

__all__ = ["ModuleCall", "Chain", "common_chain", "ancestors", "chain_message"]


@dataclass(frozen=True)
class ModuleCall:
    """One call of a module's ``forward``: its path, class name and a process-wide call number."""

    path: str
    cls: str
    call: int

    @property
    def name(self) -> str:
        """The range message of this call: its path, or its class name for the root module."""
        return module_call_name(self.path, self.cls)


# The module calls running when an op was recorded, outermost (the root) first.
Chain = tuple[ModuleCall, ...]


def common_chain(chains: Iterable[Chain | None]) -> Chain | None:
    """The deepest module call that contains all `chains`, as a chain; None if none is given.

    Two calls of the same module (shared weights) count as one, the earlier
    call standing for both: the gradient they share is summed after the
    earlier call's backward.
    """
    result: list[ModuleCall] | None = None
    for chain in chains:
        if chain is None:
            continue
        if result is None:
            result = list(chain)
            continue
        depth = 0
        for mine, theirs in zip(result, chain):
            if mine.path != theirs.path:
                break
            if theirs.call < mine.call:
                result[depth] = theirs
            depth += 1
        del result[depth:]
    return None if result is None else tuple(result)


def parts_below(common: Chain | None, chains: Iterable[Chain | None]) -> tuple[ModuleCall, ...]:
    """The module calls just below `common` (the `common_chain` of `chains`) that `chains` reach: whose
    work an op of that chain does besides its own module's (a fusion of two siblings' ops has both)."""
    if common is None:
        return ()
    found: dict[str, ModuleCall] = {}
    for chain in chains:
        if chain is not None and len(chain) > len(common):
            found.setdefault(chain[len(common)].path, chain[len(common)])
    return tuple(found.values())


def ancestors(chain: Chain, classes: dict[str, str]) -> list[tuple[str, str]]:
    """(path, class name) of the op's module and of everything above it: every
    prefix of its path (so a ``ModuleList``, whose ``forward`` never runs,
    covers its children) and every call on its chain."""
    found: dict[str, str] = {call.path: call.cls for call in chain}
    if chain:
        parts = split_path(chain[-1].path)
        for n in range(1, len(parts)):
            prefix = ".".join(parts[:n])
            if prefix not in found and prefix in classes:
                found[prefix] = classes[prefix]
    return list(found.items())


def chain_message(chain: Chain | None) -> str | None:
    """The innermost module's name, for short per-op messages."""
    return chain[-1].name if chain else None
