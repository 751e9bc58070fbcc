"""The errors and the warning nvtx_regions raises: about a user's spec, a capture file, and a function explained too early."""

from __future__ import annotations

__all__ = [
    "CaptureFileError", "MissingDependencyError", "NotRunYetError", "SelectorError", "SelectorSyntaxError",
    "NvtxRegionsWarning",
]  # fmt: skip


class SelectorError(ValueError):
    """A spec cannot be used: bad file, conflicting regions, a region that ends
    before it starts, or (with ``strict=True``) a rule that selects nothing."""


class SelectorSyntaxError(SyntaxError, SelectorError):
    """A spec's text does not parse.

    Carries `filename` (the ``.nvtx`` path or ``<select>``), `lineno`, `offset`
    (1-based column), `text` (the source line), `end_lineno` and `end_offset`,
    so Python's own traceback shows ``spec.nvtx, line 3`` and a caret.
    ``str(error)`` renders the location, the message and a caret line.
    """

    def __init__(
        self,
        message: str,
        *,
        filename: str,
        lineno: int,
        offset: int,
        text: str,
        end_offset: int | None = None,
    ) -> None:
        end = max(end_offset if end_offset is not None else offset + 1, offset + 1)
        super().__init__(message, (filename, lineno, offset, text, lineno, end))

    def __str__(self) -> str:
        width = max(1, (self.end_offset or self.offset + 1) - self.offset)
        caret = " " * (self.offset - 1) + "^" * width
        return f"{self.filename}:{self.lineno}:{self.offset}: {self.msg}\n    {self.text}\n    {caret}"


class NvtxRegionsWarning(UserWarning):
    """A rule selected nothing in a compilation, or a name it uses is not in the trace."""


class CaptureFileError(ValueError):
    """A capture file (a Chrome trace given to ``compare``, ``load_chrome_trace``)
    cannot be read: missing, not JSON, or an event that is not a well-formed
    range. The message names the file, the event index when there is one, and
    the fix."""


class MissingDependencyError(ImportError):
    """What was asked for needs an optional dependency that is not installed here (or does
    not import here), such as lightning-thunder for the thunder backend. The message says
    what needs it and how to install it."""


class NotRunYetError(RuntimeError):
    """`explain()` was given a ``thunder.jit`` function that has not run yet, so
    there is no trace to explain: call it once first. Not a spec error: the
    same call succeeds after a run."""
