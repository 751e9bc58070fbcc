"""Hooks inside the user's command, for the runners that leave the script unchanged
(``nvtx-regions explain``; ``nvtx-regions profile --tool torch``).

`with_site(env)` puts ``nvtx_regions/commands/_site`` first on the PYTHONPATH of
`env`. Its ``sitecustomize`` runs at interpreter start in every Python process of
the command (torchrun workers included), calls the ``install()`` of each child
module (`explain_child`, `profiler_child`), which does nothing unless the command
set that module's variables, then runs the sitecustomize it shadows, if any.
`after_import(name, then)` is how a child module acts on a library without
importing it first.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType

__all__ = ["SITE_DIR", "after_import", "with_site"]

SITE_DIR = Path(__file__).with_name("_site")


def with_site(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with `SITE_DIR` first on its ``PYTHONPATH``."""
    path = env.get("PYTHONPATH")
    return {**env, "PYTHONPATH": os.pathsep.join([str(SITE_DIR), *([path] if path else [])])}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when `name` is imported, wraps the real loader to call `then` afterwards."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def patched(module):
            exec_module(module)
            self.then(module)

        spec.loader.exec_module = patched
        return spec


def after_import(name: str, then: Callable[[ModuleType], None]) -> None:
    """Call `then(module)` once, right after the top-level module `name` is first imported
    in this process (at once when it already is); until then nothing of it is imported."""
    if name in sys.modules:
        then(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, then))
