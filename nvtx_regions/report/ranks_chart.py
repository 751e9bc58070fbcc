"""Every rank's time per module, drawn with matplotlib: a PNG and an SVG of one figure.

    png, svg = write_ranks_chart(compare_ranks(runs), "out/ranks")   # out/ranks.png, out/ranks.svg

One row per module (or region) and pass, in the table's order (the largest
imbalance at the top), one panel per backend, all on one time axis in the
unit that suits the longest rank (`report.numbers`). In a row, one dot per
rank at its median; a line from the fastest to the slowest rank; a tick at
the median across ranks; the slowest rank's dot in the colour of alarm,
named beside it (``rank 2``) with its ratio to the median (``26.0x``). So a
slow rank stands apart at a glance, at 3 ranks and at 64. ``missing``,
``n/a`` and ``failed`` stand where a backend has no time, as in the table.

In the SVG, text stays text and each mark sits in a group whose id says what
it is (``rank:MODULE:PASS:BACKEND:RANK``, ``slowest:MODULE:PASS:BACKEND``).
matplotlib is optional, as for `report.chart` (`ChartUnavailable`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .chart import chart_figure, chart_paths, no_time, stripe
from .numbers import duration_unit, format_ratio
from .ranks_table import RanksTable, cell_word

__all__ = ["write_ranks_chart"]

_ROW_IN, _HEAD_IN, _AXIS_IN = 0.32, 0.7, 0.6  # inches: a row, the title, the time axis
_RANK, _SLOWEST, _MEDIAN = "#56B4E9", "#D55E00", "#222222"  # Okabe-Ito: sky blue, vermillion; the median in black


def write_ranks_chart(table: RanksTable, stem: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Draw `table` (see the module docstring) to ``STEM.png`` and ``STEM.svg``; their paths.

    Raises `ChartUnavailable` when matplotlib is not installed.
    """
    rows = max(len(table.rows), 1)
    with chart_figure(stem, _HEAD_IN + rows * _ROW_IN + _AXIS_IN) as figure:
        figure.suptitle(
            f"{table.time} per module call, every rank: one dot per rank (its median over the measured steps)\n"
            "tick: the median across ranks; named: the slowest rank and its ratio to that median; largest imbalance first",
            fontsize=10,
        )
        axes = figure.subplots(1, len(table.backends), sharex=True, sharey=True, squeeze=False)[0]
        longest = max((t.median_ns for row in table.rows for c in row.cells if c for _, t in c.per_rank), default=1.0)
        unit, scale = duration_unit(longest)
        for b, ax in enumerate(axes):
            _draw(ax, table, b, scale, longest / scale)
            ax.set_xlabel(f"{table.time} ({unit})")
            ax.set_title(table.backends[b] + (" (failed)" if table.failures[b] is not None else ""), fontsize=9)
    return chart_paths(stem)


def _draw(ax: Any, table: RanksTable, b: int, scale: float, longest: float) -> None:
    backend = table.backends[b]
    for i, row in enumerate(table.rows):
        stripe(ax, i)
        key = f"{row.module}:{row.phase}:{backend}"
        cell = row.cells[b]
        word = cell_word(table, row, b)
        if word is not None or cell is None:
            no_time(ax, i, word, key)
            continue
        xs = [t.median_ns / scale for _, t in cell.per_rank]
        ax.hlines(i, min(xs), max(xs), color="#999999", linewidth=1, zorder=1)
        for rank, timing in cell.per_rank:
            slow = rank == cell.slowest
            ax.plot(timing.median_ns / scale, i, "o", markersize=6 if slow else 4, color=_SLOWEST if slow else _RANK,
                    zorder=3 if slow else 2, gid=f"rank:{key}:{rank}")  # fmt: skip
        ax.plot(cell.median_ns / scale, i, "|", markersize=12, color=_MEDIAN, zorder=4, gid=f"median:{key}")
        ax.annotate(
            f"rank {cell.slowest}, {format_ratio(cell.imbalance)}x", xy=(max(xs), i), xytext=(5, 0), textcoords="offset points",
            va="center", ha="left", fontsize=7, color=_SLOWEST, gid=f"slowest:{key}",
        )  # fmt: skip
    ax.set_yticks(range(len(table.rows)), labels=[f"{row.module} ({row.phase})" for row in table.rows])
    ax.set_ylim(max(len(table.rows), 1) - 0.5, -0.5)  # the first row (largest imbalance) at the top
    ax.set_xlim(0, longest * 1.3)  # room for the slowest rank's name
    ax.grid(axis="x", color="#d9d9d9", linewidth=0.8)
    ax.set_axisbelow(True)
    ax.tick_params(axis="y", length=0)
    ax.spines[["top", "right"]].set_visible(False)
    if not table.rows:
        ax.text(0.5, 0.5, "no module ranges", transform=ax.transAxes, ha="center", va="center", color="#555555")
