"""The one plain-text table renderer: every table nvtx_regions prints goes through `text_table`."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["text_table"]


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
