"""The backends comparison as a chart, drawn with matplotlib: a PNG and an SVG of one figure.

    png, svg = write_chart(compare_backends(runs), "out/profile")   # out/profile.png, out/profile.svg

One row per module (or region) and pass (labelled ``transformer.h.0 (forward)``), in
the table's order, so the largest ratio to the baseline is at the top. In a
row, one horizontal bar per backend, one colour per backend (Okabe-Ito,
colour-blind safe; the legend names them and marks the baseline), all on
one time axis with ticks, in the unit that suits the longest bar
(`report.numbers`). At the end of each other backend's bar stands its ratio
to the baseline (``1.59x``). A backend with no range in a row has the word
the table has there where its bar would start: ``missing``, ``n/a`` (the
backend cannot express the row's rule), ``failed`` (its run failed). The
title says which time is shown.

The chart is `WIDTH_PX` pixels wide and each row adds the same height, so it
reads the same at 2 modules and at 32. In the SVG, text stays text, and each
bar and ratio sits in a group whose id says what it is
(``bar:MODULE:PASS:BACKEND``, ``ratio:MODULE:PASS:BACKEND``, ``missing:...``, ``n/a:...``, ``failed:...``).

matplotlib is an optional dependency (``pip install 'nvtx_regions[chart]'``),
imported only when a chart is drawn. The figure goes to matplotlib's Agg
canvas without pyplot: no display is needed and no global state changes.
Without matplotlib, `write_chart` raises `ChartUnavailable`, which says what
to install.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .backends_table import BackendsTable, cell_word
from .numbers import duration_unit, format_ratio

__all__ = ["COLORS", "DPI", "INSTALL", "STYLE", "WIDTH_PX", "ChartUnavailable", "write_chart"]

# One colour per backend column, in order (colour-blind safe: Okabe-Ito).
COLORS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00")
DPI = 120
WIDTH_PX = 1200
INSTALL = "pip install 'nvtx_regions[chart]'"
# Inches: a bar's thickness, the space between rows, the title and legend above the rows, the time axis.
_BAR_IN, _ROW_GAP_IN, _HEAD_IN, _AXIS_IN = 0.15, 0.12, 0.75, 0.6
_TOP_AXIS_ROWS = 12  # more rows than this: the time axis above the rows too
STYLE = {
    "font.size": 9,
    "svg.fonttype": "none",  # text as <text>, searchable and selectable, not outlines
    "svg.hashsalt": "nvtx_regions",  # the same ids on every run
}


class ChartUnavailable(RuntimeError):
    """matplotlib is not installed; the message says how to install it."""


def write_chart(table: BackendsTable, stem: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Draw `table` (see the module docstring) to ``STEM.png`` and ``STEM.svg``; their paths.

    Raises `ChartUnavailable` when matplotlib is not installed.
    """
    rows = max(len(table.rows), 1)
    plot = rows * (len(table.backends) * _BAR_IN + _ROW_GAP_IN) + _AXIS_IN * (1 + (len(table.rows) > _TOP_AXIS_ROWS))
    with chart_figure(stem, _HEAD_IN + plot) as figure:
        head, body = figure.subfigures(2, 1, height_ratios=(_HEAD_IN, plot))
        _head(head, table)
        _draw(body.add_subplot(), table)
    return chart_paths(stem)


def stripe(ax: Any, row: int) -> None:
    """Shade every second row, so that a row reads across."""
    if row % 2:
        ax.axhspan(row - 0.5, row + 0.5, color="#f3f3f3", zorder=0, linewidth=0)


def no_time(ax: Any, y: float, word: str | None, key: str) -> None:
    """In place of a time: the word that says why there is none (``missing``, ``n/a``)."""
    ax.text(0, y, f" {word}", va="center", ha="left", fontsize=7, color="#555555", style="italic", gid=f"{word}:{key}")


def chart_paths(stem: str | os.PathLike[str]) -> tuple[Path, Path]:
    """``STEM.png`` and ``STEM.svg``."""
    return Path(f"{os.fspath(stem)}.png"), Path(f"{os.fspath(stem)}.svg")


@contextlib.contextmanager
def chart_figure(stem: str | os.PathLike[str], height_in: float) -> Iterator[Any]:
    """A matplotlib ``Figure`` `height_in` inches high, in the charts' style, saved to ``STEM.png``
    and ``STEM.svg`` as the block ends. Raises `ChartUnavailable` when matplotlib is not installed."""
    try:
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ChartUnavailable(f"the chart needs matplotlib, which is not installed: {INSTALL}") from None
    png, svg = chart_paths(stem)
    with matplotlib.rc_context(STYLE):
        figure = Figure(figsize=(WIDTH_PX / DPI, height_in), dpi=DPI, layout="constrained")
        FigureCanvasAgg(figure)
        yield figure
        figure.savefig(png, dpi=DPI, metadata={"Software": None})
        figure.savefig(svg, metadata={"Date": None})


def _label(module: str, phase: str) -> str:
    """The row's label: its module and pass."""
    return f"{module} ({phase})"


def _head(head: Any, table: BackendsTable) -> None:
    """The title, and under it the legend: one colour per backend, the baseline marked."""
    from matplotlib.patches import Patch

    base = table.backends.index(table.baseline)
    head.suptitle(
        f"{table.time} per module call{' and region' if table.regions else ''}, median over the measured steps\n"
        f"beside each bar: its ratio to {table.baseline}; largest ratio first",
        fontsize=10,
    )
    handles = [Patch(color=COLORS[b % len(COLORS)]) for b in range(len(table.backends))]
    labels = [
        backend + (" (baseline)" if b == base else "") + (" (failed)" if table.failures[b] is not None else "")
        for b, backend in enumerate(table.backends)
    ]
    head.legend(handles, labels, loc="lower center", ncols=len(labels), frameon=False, borderaxespad=0.1)


def _draw(ax: Any, table: BackendsTable) -> None:
    """The rows: bars, ratios and the words missing/n/a/failed, on one time axis."""
    count = len(table.backends)
    base = table.backends.index(table.baseline)
    medians = [cell.median_ns for row in table.rows for cell in row.times if cell is not None]
    unit, scale = duration_unit(max(medians, default=1.0))
    longest = max(medians, default=scale) / scale
    slot = _BAR_IN / (count * _BAR_IN + _ROW_GAP_IN)  # a bar's share of a row
    for i, row in enumerate(table.rows):
        stripe(ax, i)
        for b, backend in enumerate(table.backends):
            y = i + (b - (count - 1) / 2) * slot
            key = f"{row.module}:{row.phase}:{backend}"
            cell = row.times[b]
            word = cell_word(table, row, b)
            if word is not None or cell is None:
                no_time(ax, y, word, key)
                continue
            width = cell.median_ns / scale
            ax.barh(y, width, height=slot * 0.92, color=COLORS[b % len(COLORS)], gid=f"bar:{key}", zorder=2)
            if b != base and row.ratios[b] is not None:
                ax.annotate(
                    f"{format_ratio(row.ratios[b])}x", xy=(width, y), xytext=(3, 0), textcoords="offset points",
                    va="center", ha="left", fontsize=7, color="#222222", gid=f"ratio:{key}",
                )  # fmt: skip
    ax.set_yticks(range(len(table.rows)), labels=[_label(row.module, row.phase) for row in table.rows])
    ax.set_ylim(max(len(table.rows), 1) - 0.5, -0.5)  # the first row (largest ratio) at the top
    ax.set_xlim(0, longest * 1.12)  # room for the ratios
    ax.set_xlabel(f"{table.time}, median per call ({unit})")
    ax.grid(axis="x", color="#d9d9d9", linewidth=0.8)
    ax.set_axisbelow(True)
    ax.tick_params(axis="y", length=0)
    ax.spines[["top", "right"]].set_visible(False)
    if len(table.rows) > _TOP_AXIS_ROWS:  # a tall chart: the time axis above the rows too
        ax.tick_params(axis="x", top=True, labeltop=True)
    if not table.rows:
        ax.text(0.5, 0.5, "no module ranges", transform=ax.transAxes, ha="center", va="center", color="#555555")
