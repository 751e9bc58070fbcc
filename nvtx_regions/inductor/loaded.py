"""Which `NvtxInductor` a wrapper's header reports to as it loads (`runtime.graph_ranges`).

A wrapper's header names its backend by the backend's cache key: the same
text in every process, so a wrapper Inductor's cache serves reaches the
backend of this process with that key. While a backend compiles, it is the
one told first (two backends of the same spec and model share a key). The
wrappers' ranges are kept per key, weakly, for `release`.
"""

from __future__ import annotations

import functools
import hashlib
import threading
import weakref
from pathlib import Path
from typing import Any

__all__ = ["register", "compiling_as", "current_number", "graph_loaded", "release", "build_digest"]

_backends: "weakref.WeakValueDictionary[str, Any]" = weakref.WeakValueDictionary()
_alive: "weakref.WeakSet[Any]" = weakref.WeakSet()  # every backend registered, while it lives
_ranges: "dict[str, weakref.WeakSet[Any]]" = {}  # per key: the runtimes of its loaded wrappers
_compiling = threading.local()


@functools.cache
def build_digest() -> str:
    """A digest of this build of nvtx_regions: the path and bytes of every ``.py`` file of the
    package and of its grammar, read once per process.

    Any of them may decide what a wrapper gets (attribution, selection, module paths, the lines,
    what they call), so it is part of the cache key: a wrapper cached by any other build is a miss
    (a key over the files that write the lines only once replayed a wrapper with no ranges).
    """
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted([*package.rglob("*.py"), *package.glob("grammar/*.lark")]):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def register(key: str, backend: Any) -> None:
    """`backend` (with a ``_loaded(report)`` method) is told of the wrappers whose header names `key`."""
    _backends[key] = backend
    _alive.add(backend)


def graph_loaded(report: tuple, ranges: Any) -> None:
    """Tell the backend of `report` (its first item is the backend's key) that its wrapper loaded,
    with `ranges`, its runtime (`runtime.ranges.GeneratedRanges`)."""
    key = report[0]
    _ranges.setdefault(key, weakref.WeakSet()).add(ranges)
    current = getattr(_compiling, "backend", None)
    backend = current if current is not None and current.cache_key == key else _backends.get(key)
    if backend is not None:
        backend._loaded(report)


def release(backend: Any) -> None:
    """`backend` is removed: unless another backend alive and not removed has its key, the wrappers
    loaded for that key emit no range from now on (`GeneratedRanges.silence`)."""
    _alive.discard(backend)
    if _backends.get(backend.cache_key) is backend:
        del _backends[backend.cache_key]
    others = [b for b in _alive if b.cache_key == backend.cache_key]
    if others:
        _backends[backend.cache_key] = others[-1]
        return
    for ranges in list(_ranges.pop(backend.cache_key, ())):
        ranges.silence()


def current_number(backend: Any, default: int) -> int:
    """The number of the graph `backend` is compiling on this thread, or `default`."""
    return _compiling.number if getattr(_compiling, "backend", None) is backend else default


class compiling_as:
    """While on, `graph_loaded` tells `backend` first, and the graph being compiled is `number`."""

    def __init__(self, backend: Any, number: int) -> None:
        self.backend, self.number = backend, number

    def __enter__(self) -> None:
        self.saved = (getattr(_compiling, "backend", None), getattr(_compiling, "number", None))
        _compiling.backend, _compiling.number = self.backend, self.number

    def __exit__(self, *exc: Any) -> None:
        _compiling.backend, _compiling.number = self.saved
