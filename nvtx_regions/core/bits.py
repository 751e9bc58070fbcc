"""Selections as Python ints used as bitsets over positions: bit ``p`` stands for position ``p``."""

from __future__ import annotations

__all__ = ["bit_positions", "anchored_span"]


def bit_positions(mask: int) -> list[int]:
    """The positions of the set bits of `mask`, ascending."""
    positions = []
    while mask:
        low = mask & -mask
        positions.append(low.bit_length() - 1)
        mask ^= low
    return positions


def anchored_span(positions: int, parameter_only_ops: int) -> tuple[int, int]:
    """The (first, last) positions of a module call's range: those of its ops
    (`positions`, a bitset) that are not parameter-only, or of all of them if
    every one is."""
    anchored = positions & ~parameter_only_ops or positions
    return (anchored & -anchored).bit_length() - 1, anchored.bit_length() - 1
