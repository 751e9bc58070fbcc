"""Recording the model's own NVTX markers into a traced function's `MarkerLog`.

While thunder traces, `internals.lookasides` diverts every marker API here
(this module is its `MarkerRecorder`): a push opens a `Marker` on its
domain's stack, a pop closes the innermost one there, and a pop with nothing
open is kept as an `UnmatchedPop`. Nothing reaches NVTX at trace time.
Warnings name the user's line, once per line.
"""

from __future__ import annotations

import itertools
import linecache
import re
import warnings
from typing import Any

from ..core.errors import NvtxRegionsWarning
from ..core.markers import Marker, MarkerLog, UnmatchedPop

__all__ = ["push", "pop", "graph_break"]

_occurrences = itertools.count(1)
_warned: set[tuple[str, Any]] = set()

# thunder 0.2.6 formats a number proxy as its repr, e.g.
# ``[IntegerProxy name=i1, value=3, static=CONSTRAINT.CONSTRAINABLE]``, so an
# f-string message built from a value that is symbolic under
# ``cache="symbolic values"`` holds that text. Without this, the first call's
# value (or the repr) would be frozen into every later call's message.
_NUMBER_PROXY = re.compile(r"\[(?:Integer|Float|Complex|Number)Proxy name=(\w+), value=[^,\]]*, static=CONSTRAINT\.\w+\]")


def _concrete(message: Any) -> tuple[str | None, tuple[str, ...]]:
    """(message, names of symbolic values in it): each symbolic value shown as ``<name>``."""
    if message is None:
        return None, ()
    name = getattr(message, "name", None)
    if not isinstance(message, str) and isinstance(name, str) and type(message).__name__.endswith("Proxy"):
        return f"<{name}>", (name,)
    message = str(message)
    names = tuple(_NUMBER_PROXY.findall(message))
    return (_NUMBER_PROXY.sub(lambda m: f"<{m.group(1)}>", message), names) if names else (message, ())


def _warn_once(kind: str, where: tuple[str, int] | None, text: str) -> None:
    """Warn at the user's line, once per (kind, line) per process."""
    if (kind, where) in _warned:
        return
    _warned.add((kind, where))
    filename, line = where or ("<unknown>", 0)
    warnings.warn_explicit(text, NvtxRegionsWarning, filename, line)


def push(log: MarkerLog, form: str, domain: str | None, message: Any, color: int | None, where: tuple[str, int] | None) -> int:
    """Record a push; the depth NVTX would return (0-based level opened on its stack in this trace)."""
    message, symbolic = _concrete(message)
    marker = Marker(domain, message, color, form, next(_occurrences), where, symbolic)  # type: ignore[arg-type]
    if symbolic:
        _warn_once(
            "symbolic",
            where,
            f"the NVTX message {message!r} is built from {', '.join(symbolic)}, which changes between calls "
            f"under cache='symbolic values'; nvtx_regions shows it as {message!r} rather than freeze the first "
            f"call's value (format a value that is constant per compilation, or use cache='constant values')",
        )
    stack = log.stacks.setdefault(marker.stack_key, [])
    stack.append(marker)
    log.pushed.append(marker)
    return len(stack) - 1


def pop(log: MarkerLog, key: tuple[str, str | None], api: str, where: tuple[str, int] | None) -> int:
    """Record a pop on the stack `key` by `api`; the depth NVTX would return (-1: nothing open)."""
    stack = log.stacks.get(key)
    if stack:
        stack.pop()
        return len(stack)
    log.unmatched.append(UnmatchedPop(key, where, log.recorded))
    _warn_once(
        "unmatched",
        where,
        f"{api} closes a range that the compiled function did not open (its caller did, or nothing did); "
        f"thunder does not run this pop, so that range is not closed here",
    )
    return -1


def graph_break(where: tuple[str, int], api: str) -> None:
    """Warn once per marker that torch.compile breaks its graph at the user's NVTX push at `where`."""
    code = linecache.getline(*where).strip() or "an NVTX marker"
    _warn_once(
        "thunderfx",
        where,
        f"torch.compile breaks the graph at the NVTX marker `{code}` ({api}): under ThunderFX it runs eagerly "
        f"between thunder's subgraphs, and a `with` block it opens runs, with the rest of the function, without "
        f"thunder; nvtx_regions cannot see or re-emit it (see docs/how-to/your-own-markers.md). "
        f"Use thunder.jit to keep the model in one thunder trace.",
    )
