"""The one plain-text table renderer: every table nvtx_regions prints goes through `text_table`.
`fit_table` fits one to a width, the terminal's where it is printed (`terminal_width`), and
`wrap_prose` the lines around it.

    text, left_out = fit_table([Column("module", "l", names, name=True), Column("min..max", "r", spreads, drop=1)], 120)
"""

from __future__ import annotations

import os
import re
import sys
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["text_table", "Column", "fit_table", "wrap_name", "wrap_prose", "terminal_width", "NAME_MIN"]

NAME_MIN = 12  # the narrowest a column of wrapped names gets


def text_table(head: Sequence[str], rows: Sequence[Sequence[str]], align: str, *, rule: bool = False) -> str:
    """`head` and `rows` in columns two spaces apart, each as wide as its widest cell.

    align: one letter per column, ``l`` (left) or ``r`` (right). rule: a line
    of dashes under the head. Lines carry no trailing spaces.
    """
    if len(align) != len(head) or set(align) - {"l", "r"}:
        raise ValueError(f"align must give 'l' or 'r' for each of the {len(head)} columns, not {align!r}")
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(head)]
    lines = [head, *([["-" * w for w in widths]] if rule else []), *rows]
    return "\n".join(
        "  ".join(cell.ljust(w) if a == "l" else cell.rjust(w) for cell, w, a in zip(line, widths, align)).rstrip()
        for line in lines
    )


def terminal_width() -> int | None:
    """The width a table printed now fits: ``$COLUMNS``, else that of the terminal standard output is;
    None (every column) when standard output is a file or a pipe and ``$COLUMNS`` is unset.

    `sys.stdout`'s, not `shutil.get_terminal_size`'s `sys.__stdout__`: a table printed where stdout was
    redirected (a test's capture, `contextlib.redirect_stdout`) does not go to the terminal."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        return os.get_terminal_size(sys.stdout.fileno()).columns or None
    except (AttributeError, ValueError, OSError):  # no stdout, or none with a file descriptor, or not a terminal
        return None


@dataclass(frozen=True)
class Column:
    """A column of a table to fit (`fit_table`): its head, alignment (``l``/``r``), a cell per row, and when
    it is left out to fit a width: `drop` 1 first, 2 next, 0 never. `name`: its cells are dotted names,
    wrapped (`wrap_name`) where the table is still too wide."""

    head: str
    align: str
    cells: list[str]
    drop: int = 0
    name: bool = False


def wrap_name(name: str, width: int) -> list[str]:
    """`name` in lines of at most `width` characters, broken after a dot (or a space); lines after the
    first indented by two spaces. A part longer than a line is cut at the line's end."""
    packed: list[str] = []
    line = ""
    for part in re.findall(r"[^. ]*[. ]|[^. ]+", name):
        room = width - 2 if packed else width
        if line and len(line + part.rstrip()) > room:
            packed.append(line.rstrip())
            line = ""
        line += part
    packed.append(line.rstrip())
    lines: list[str] = []
    for line in packed:
        while len(line) > (room := width - 2 if lines else width):
            lines.append(line[:room])
            line = line[room:]
        lines.append(line)
    return [lines[0], *(f"  {line}" for line in lines[1:])]


def _width(columns: Sequence[Column]) -> int:
    return sum(max(len(c.head), *map(len, c.cells)) if c.cells else len(c.head) for c in columns) + 2 * (len(columns) - 1)


def fit_table(columns: list[Column], width: int | None) -> tuple[str, list[str]]:
    """The table of `columns` (`text_table`, with a rule) in at most `width` characters where it can,
    and the heads of the columns it left out. Too wide, it leaves out the columns of `Column.drop` 1,
    then those of 2, then wraps the cells of the first `Column.name` column (`wrap_name`), each cell
    on lines of its own, the other cells of the row on its first. No cell is cut; with the columns
    that stay wider than `width`, the lines are too. None: every column."""
    dropped: list[str] = []
    if width is not None:
        for level in (1, 2):
            if _width(columns) <= width:
                break
            dropped += [c.head for c in columns if c.drop == level]
            columns = [c for c in columns if c.drop != level]
    rows = [list(cells) for cells in zip(*(c.cells for c in columns))]
    names = [i for i, c in enumerate(columns) if c.name]
    if width is not None and names and _width(columns) > width:
        at = names[0]
        others = _width(columns[:at] + columns[at + 1 :]) + 2
        room = max(width - others, NAME_MIN, len(columns[at].head))
        wrapped = []
        for cells in rows:
            first, *more = wrap_name(cells[at], room)
            wrapped.append([*cells[:at], first, *cells[at + 1 :]])
            wrapped += [["" if i != at else line for i in range(len(cells))] for line in more]
        rows = wrapped
    text = text_table([c.head for c in columns], rows, "".join(c.align for c in columns), rule=True)
    return text, dropped


def wrap_prose(lines: Iterable[str], width: int | None, indent: str = "") -> list[str]:
    """`lines` wrapped between words to `width` (none without one), continuations indented by `indent`."""
    if width is None:
        return list(lines)
    return [wrapped for line in lines for wrapped in textwrap.wrap(line, width, subsequent_indent=indent, break_on_hyphens=False)]
