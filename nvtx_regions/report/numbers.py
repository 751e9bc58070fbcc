"""How a duration and a ratio read in every table and chart of `report`, `compare` and `profile`.

    format_duration(812)          # '812 ns'
    format_duration(182_900)      # '182.9 us'
    format_duration(1_504_000)    # '1.50 ms'
    format_duration(5_767_210_679)  # '5.77 s'
    format_ratio(1.594)           # '1.59'
    format_spread(170_200, 190_400)  # '170.2 us..190.4 us'

The rule: the largest unit of s, ms, us and ns that the duration reaches
once rounded, with two decimals in s and ms, one in us and none in ns. So a
column reads at a glance (``999.96 us`` is ``1.00 ms``, not ``1000.0 us``),
and two cells compare to about three digits. ``us`` is written in ASCII, so
the text is the same on every terminal and in every log.

The per-range and per-rule tables laid out like ``nsys stats --report
nvtx_sum`` (`capture.summary`) keep nsys's integer nanoseconds, column for
column, so they can be checked against nsys's own output.
"""

from __future__ import annotations

__all__ = ["UNITS", "duration_unit", "format_duration", "format_ratio", "format_spread"]

# (unit, nanoseconds in one, decimals shown), largest first.
UNITS: tuple[tuple[str, float, int], ...] = (("s", 1e9, 2), ("ms", 1e6, 2), ("us", 1e3, 1), ("ns", 1.0, 0))


def duration_unit(ns: float) -> tuple[str, float]:
    """(unit, nanoseconds in one unit) that `format_duration` writes `ns` in: e.g. ``("ms", 1e6)``."""
    for unit, scale, decimals in UNITS:
        if round(abs(ns) / scale, decimals) >= 1:
            return unit, scale
    return "ns", 1.0


def format_duration(ns: float) -> str:
    """A duration given in nanoseconds, in the one rule of this module: ``'182.9 us'``."""
    unit, scale = duration_unit(ns)
    decimals = next(d for u, _, d in UNITS if u == unit)
    return f"{ns / scale:.{decimals}f} {unit}"


def format_ratio(ratio: float | None) -> str:
    """A ratio with two decimals, or three significant digits below 0.1 (never a bare 0.00); ``-`` for None."""
    if ratio is None:
        return "-"
    return f"{ratio:.2f}" if ratio >= 0.1 else f"{ratio:.3g}"


def format_spread(low_ns: float | None, high_ns: float | None) -> str:
    """The shortest and the longest of some durations, ``'170.2 us..190.4 us'``; ``-`` where either is None."""
    return f"{format_duration(low_ns)}..{format_duration(high_ns)}" if low_ns is not None and high_ns is not None else "-"
