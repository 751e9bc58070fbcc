"""Every rank's time per module, drawn with matplotlib: a PNG and an SVG of one figure.

    png, svg = write_ranks_chart(compare_ranks(runs), "out/ranks")   # out/ranks.png, out/ranks.svg

One row per module (or region) and pass, in the table's order (the largest
imbalance at the top), one panel per backend. Each row is drawn against
its own median: the axis is a rank's median over the median across ranks,
on a log scale, so 1.1x, 3x and 300x read apart on one axis, and a row of
microseconds sits beside a row of milliseconds. The row's median time is
written at the panel's left edge, and a line marks 1x.

In a row: one dot per rank (sky blue) at its median; a line from the
fastest to the slowest rank. Where the slowest rank stands out (its median
`ranks_table.STANDS_OUT` times the median or more) its dot is vermillion
and named with its ratio (``rank 2, 26.00x``), as in the table. Where a
call is an outlier (`ranks_table`), the rank's longest call is a reddish
purple diamond at its own ratio, named with its rank, step and time
(``rank 1, step 3: 200.31 ms``). Colours: Okabe-Ito, safe for colour-blind
readers. ``missing``, ``n/a`` and ``failed`` stand where a backend has no
time, as in the table.

In the SVG, text stays text and each mark sits in a group whose id says what
it is (``rank:MODULE:PASS:BACKEND:RANK``, ``slowest:MODULE:PASS:BACKEND``,
``outlier:MODULE:PASS:BACKEND``, ``median:MODULE:PASS:BACKEND``).
matplotlib is optional, as for `report.chart` (`ChartUnavailable`).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from .chart import chart_figure, chart_paths, no_time, stripe
from .numbers import format_duration
from .ranks_table import STANDS_OUT, RanksTable, call_text, cell_word, slowest_text
from .summary import Timing

__all__ = ["write_ranks_chart", "RANK_COLOR", "SLOWEST_COLOR", "OUTLIER_COLOR"]

_ROW_IN, _HEAD_IN, _AXIS_IN = 0.32, 0.7, 0.6  # inches: a row, the title, the axis
# Okabe-Ito, by the names the docs use: sky blue, vermillion, reddish purple; the 1x line in black.
RANK_COLOR, SLOWEST_COLOR, OUTLIER_COLOR, _MEDIAN = "#56B4E9", "#D55E00", "#CC79A7", "#222222"


def write_ranks_chart(table: RanksTable, stem: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Draw `table` (see the module docstring) to ``STEM.png`` and ``STEM.svg``; their paths.

    Raises `ChartUnavailable` when matplotlib is not installed.
    """
    rows = max(len(table.rows), 1)
    with chart_figure(stem, _HEAD_IN + rows * _ROW_IN + _AXIS_IN) as figure:
        figure.suptitle(
            f"{table.time} per module call, every rank: one dot per rank, its median over the measured steps / the median across\n"
            f"ranks (log scale); named: the slowest rank where it is {STANDS_OUT:g}x or more, and an outlier call (diamond)",
            fontsize=10,
        )
        axes = figure.subplots(1, len(table.backends), sharex=True, sharey=True, squeeze=False)[0]
        low, high = _extent(table)
        for b, ax in enumerate(axes):
            _draw(ax, table, b)
            _axis(ax, low, high)
            ax.set_title(table.backends[b] + (" (failed)" if table.failures[b] is not None else ""), fontsize=9)
    return chart_paths(stem)


def _ratios(table: RanksTable) -> list[float]:
    """Every ratio the chart draws: each rank's median and each outlier call, over its row's median."""
    found = []
    for row in table.rows:
        for cell in row.cells:
            if cell is None or not cell.median_ns:
                continue
            found += [t.median_ns / cell.median_ns for _, t in cell.per_rank if t.median_ns > 0]
            if cell.outlier is not None:
                found.append(_call_ns(cell.timing(cell.outlier)) / cell.median_ns)
    return found


def _extent(table: RanksTable) -> tuple[float, float]:
    """The axis's limits: every ratio, 0.5x..2x at least, with room for the row's time at the left and
    the names at the right."""
    ratios = _ratios(table)
    low, high = math.log10(min([0.5, *ratios])), math.log10(max([2.0, *ratios]))
    span = high - low
    return 10 ** (low - 0.25 * span), 10 ** (high + 0.75 * span + 0.3)


def _call_ns(timing: Timing) -> float:
    return timing.high_ns if timing.high_ns is not None else timing.median_ns


def _draw(ax: Any, table: RanksTable, b: int) -> None:
    backend = table.backends[b]
    ax.set_xscale("log")
    ax.axvline(1.0, color=_MEDIAN, linewidth=0.8, zorder=1)
    for i, row in enumerate(table.rows):
        stripe(ax, i)
        key = f"{row.module}:{row.phase}:{backend}"
        cell = row.cells[b]
        word = cell_word(table, row, b)
        if word is not None or cell is None or not cell.median_ns:
            no_time(ax, i, word or "missing", key)
            continue
        median = cell.median_ns
        ax.text(0.005, i, format_duration(median), transform=ax.get_yaxis_transform(), va="center", ha="left", fontsize=6.5,
                color="#555555", gid=f"median:{key}")  # fmt: skip
        xs = [t.median_ns / median for _, t in cell.per_rank if t.median_ns > 0]
        ax.hlines(i, min(xs), max(xs), color="#999999", linewidth=1, zorder=1)
        for rank, timing in cell.per_rank:
            if timing.median_ns <= 0:
                continue
            named = rank == cell.slowest and cell.stands_out
            ax.plot(timing.median_ns / median, i, "o", markersize=6 if named else 4, color=SLOWEST_COLOR if named else RANK_COLOR,
                    zorder=3 if named else 2, gid=f"rank:{key}:{rank}")  # fmt: skip
        if cell.stands_out:
            ax.annotate(
                slowest_text(cell), xy=(cell.timing(cell.slowest).median_ns / median, i), xytext=(5, 0), textcoords="offset points",
                va="center", ha="left", fontsize=7, color=SLOWEST_COLOR, gid=f"slowest:{key}",
            )  # fmt: skip
        if cell.outlier is not None:
            timing = cell.timing(cell.outlier)
            x = _call_ns(timing) / median
            ax.plot(x, i, "D", markersize=5, color=OUTLIER_COLOR, zorder=4, gid=f"outlier:{key}")
            ax.annotate(call_text(cell.outlier, timing), xy=(x, i), xytext=(5, 0), textcoords="offset points", va="center",
                        ha="left", fontsize=7, color=OUTLIER_COLOR, gid=f"outlier-name:{key}")  # fmt: skip
    ax.set_yticks(range(len(table.rows)), labels=[f"{row.module} ({row.phase})" for row in table.rows])
    ax.set_ylim(max(len(table.rows), 1) - 0.5, -0.5)  # the first row (largest imbalance) at the top
    ax.tick_params(axis="y", length=0)
    ax.spines[["top", "right"]].set_visible(False)
    if not table.rows:
        ax.text(0.5, 0.5, "no module ranges", transform=ax.transAxes, ha="center", va="center", color="#555555")


def _axis(ax: Any, low: float, high: float) -> None:
    """The log axis of ratios, ticks at 1, 2 and 5 times a power of ten (at powers of ten alone over
    more than 3 of them), written ``0.5x``, ``1x``, ``200x``."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    ax.set_xlim(low, high)
    subs = (1.0,) if math.log10(high / low) > 3 else (1.0, 2.0, 5.0)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}x"))
    ax.set_xlabel("rank's median / median across ranks")
    ax.grid(axis="x", color="#d9d9d9", linewidth=0.8)
    ax.set_axisbelow(True)
