"""Glob matching, written once for every pass: module paths, plain names (ops, proxies, classes), source files.

Case-sensitive on every OS (`fnmatch.fnmatchcase` semantics), each pattern
compiled once.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from typing import Callable

__all__ = ["split_path", "path_matcher", "name_matcher", "source_matcher"]


def split_path(path: str) -> tuple[str, ...]:
    """The dotted components of a module path; the root's path ``""`` has none."""
    return tuple(path.split(".")) if path else ()


def _component_matcher(glob: str) -> Callable[[tuple[str, ...]], bool]:
    parts = glob.split(".")
    compiled = [None if part == "**" else re.compile(fnmatch.translate(part)) for part in parts]

    @functools.lru_cache(maxsize=None)
    def match(i: int, path: tuple[str, ...], j: int) -> bool:
        if i == len(compiled):
            return j == len(path)
        pattern = compiled[i]
        if pattern is None:  # `**`: any number of components, none included
            return any(match(i + 1, path, k) for k in range(j, len(path) + 1))
        return j < len(path) and pattern.match(path[j]) is not None and match(i + 1, path, j + 1)

    return lambda path: match(0, path, 0)


@functools.lru_cache(maxsize=4096)
def path_matcher(globs: tuple[str, ...]) -> Callable[[str], bool]:
    """A test for one module path (not the root's): ``*`` stays within a dotted
    component, ``**`` spans any number of them, as in ``PurePath.full_match``."""
    matchers = [_component_matcher(g) for g in globs]

    @functools.lru_cache(maxsize=None)
    def matches(path: str) -> bool:
        parts = split_path(path)
        return bool(parts) and any(m(parts) for m in matchers)

    return matches


@functools.lru_cache(maxsize=4096)
def name_matcher(globs: tuple[str, ...]) -> Callable[[str], bool]:
    """A test for a plain name (an op, a proxy, a class): `fnmatch.fnmatchcase` against any of the globs.

    One regex per glob list; cached, since big specs repeat their lists.
    """
    pattern = re.compile("|".join(f"(?:{fnmatch.translate(g)})" for g in globs))
    return lambda name: pattern.match(name) is not None


@functools.lru_cache(maxsize=4096)
def source_matcher(file: str) -> Callable[[str], bool]:
    """A test for a recorded source filename: `file` is a glob for the whole
    filename or for its tail after any ``/`` (``model.py`` matches ``/src/model.py``)."""
    return name_matcher((file, "*/" + file))
