"""The backends comparison as a picture: an SVG file that a browser or image viewer opens.

    write_svg("out/profile.svg", compare_backends(runs))

One group per module (``<g class="module" data-module="transformer.h.0">``),
in model order; inside it one group per pass (``class="pass"``,
``data-pass="forward"``), each with one bar per backend (``<rect
class="bar" data-backend="thunder" data-median-ns="...">``, one colour per
backend, heights proportional to the medians on one scale) and, above the
bars, the ratio of each other backend to the baseline (``<text
class="ratio" data-backend="thunder">``, e.g. ``1.63x``, in that backend's colour). A backend with no range for
a pass gets ``<text class="missing">`` where its bar would be. The title
says which time is shown. Written by hand: no plotting library is needed.
"""

from __future__ import annotations

import os
from xml.sax.saxutils import escape, quoteattr

from .backends_table import PASSES, BackendsTable
from .numbers import format_duration, format_ratio

__all__ = ["render_svg", "write_svg", "COLORS", "PLOT_HEIGHT"]

# One colour per backend column, in order (colour-blind safe: Okabe-Ito).
COLORS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00")
PLOT_HEIGHT = 240.0  # px of the tallest bar
_BAR, _GAP, _PASS_GAP, _MODULE_GAP = 18.0, 2.0, 14.0, 30.0
_LEFT, _TOP = 60.0, 90.0


def _color(index: int) -> str:
    return COLORS[index % len(COLORS)]


def render_svg(table: BackendsTable) -> str:
    """The SVG text of `table` (see the module docstring)."""
    count = len(table.backends)
    base = table.backends.index(table.baseline)
    others = [i for i in range(count) if i != base]
    cells = {(row.module, row.phase): row for row in table.rows}
    tallest = max((c.median_ns for row in table.rows for c in row.times if c is not None), default=0.0) or 1.0
    ratio_lines = len(others)
    pass_width = count * (_BAR + _GAP)
    module_width = len(PASSES) * pass_width + _PASS_GAP
    width = max(_LEFT + max(1, len(table.modules)) * (module_width + _MODULE_GAP) + 20, 760.0)
    top = _TOP + ratio_lines * 13
    axis = top + PLOT_HEIGHT
    height = axis + 110
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif" font-size="11">',
        '<rect width="100%" height="100%" fill="white"/>',
        (
            f'<text class="title" x="{_LEFT}" y="20" font-size="14">'
            f"{escape(table.time)} per module call, median over the measured steps; ratio: backend / {escape(table.baseline)}</text>"
        ),
    ]
    for i, backend in enumerate(table.backends):
        x = _LEFT + i * 130
        failed = " (failed)" if table.failures[i] is not None else ""
        out.append(f'<rect class="legend" data-backend={quoteattr(backend)} x="{x}" y="34" width="12" height="12" fill="{_color(i)}"/>')
        out.append(f'<text x="{x + 16}" y="44">{escape(backend + failed)}</text>')
    out.append(
        f'<text x="{_LEFT}" y="66">per module: forward left, backward right; above the bars: ratio to '
        f"{escape(table.baseline)} in each backend's colour; full height: {escape(format_duration(tallest))}</text>"
    )
    out.append(f'<line x1="{_LEFT - 5}" y1="{axis}" x2="{width - 10:.0f}" y2="{axis}" stroke="black"/>')
    for m, module in enumerate(table.modules):
        x0 = _LEFT + m * (module_width + _MODULE_GAP)
        out.append(f'<g class="module" data-module={quoteattr(module)}>')
        for p, phase in enumerate(PASSES):
            px = x0 + p * (pass_width + _PASS_GAP)
            row = cells.get((module, phase))
            out.append(f'<g class="pass" data-pass="{phase}">')
            for b in range(count):
                bx = px + b * (_BAR + _GAP)
                cell = row.times[b] if row is not None else None
                if cell is None:
                    out.append(
                        f'<text class="missing" data-backend={quoteattr(table.backends[b])} x="{bx + _BAR / 2:.1f}" '
                        f'y="{axis - 4}" font-size="9" text-anchor="end" transform="rotate(-90 {bx + _BAR / 2:.1f} {axis - 4})">'
                        f"{'failed' if table.failures[b] is not None else 'missing'}</text>"
                    )
                    continue
                h = cell.median_ns / tallest * PLOT_HEIGHT
                out.append(
                    f'<rect class="bar" data-backend={quoteattr(table.backends[b])} data-median-ns="{cell.median_ns:.1f}" '
                    f'data-n="{cell.n}" x="{bx:.1f}" y="{axis - h:.2f}" width="{_BAR}" height="{h:.2f}" fill="{_color(b)}">'
                    f"<title>{escape(f'{module} {phase}, {table.backends[b]}: {format_duration(cell.median_ns)} (n={cell.n})')}</title></rect>"
                )
            for line, i in enumerate(others):
                ratio = row.ratios[i] if row is not None else None
                text = "-" if ratio is None else f"{format_ratio(ratio)}x"
                out.append(
                    f'<text class="ratio" data-backend={quoteattr(table.backends[i])} x="{px:.1f}" '
                    f'y="{_TOP + line * 13}" font-size="9" fill="{_color(i)}">{escape(text)}</text>'
                )
            out.append(
                f'<text x="{px + pass_width / 2:.1f}" y="{axis + 12}" font-size="9" text-anchor="middle">'
                f"{'fwd' if phase == 'forward' else 'bwd'}</text>"
            )
            out.append("</g>")
        out.append(
            f'<text class="label" x="{x0 + module_width / 2:.1f}" y="{axis + 26}" text-anchor="end" '
            f'transform="rotate(-30 {x0 + module_width / 2:.1f} {axis + 26})">{escape(module)}</text>'
        )
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_svg(path: str | os.PathLike[str], table: BackendsTable) -> None:
    """Write `render_svg(table)` to `path`."""
    with open(path, "w", encoding="utf-8") as stream:
        stream.write(render_svg(table))
