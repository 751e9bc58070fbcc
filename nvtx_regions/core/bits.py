"""Selections as Python ints used as bitsets over positions: bit ``p`` stands for position ``p``."""

from __future__ import annotations

__all__ = ["bit_positions"]


def bit_positions(mask: int) -> list[int]:
    """The positions of the set bits of `mask`, ascending."""
    positions = []
    while mask:
        low = mask & -mask
        positions.append(low.bit_length() - 1)
        mask ^= low
    return positions
