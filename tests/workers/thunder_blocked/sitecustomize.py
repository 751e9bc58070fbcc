"""On PYTHONPATH, this makes every ``import thunder`` of the process fail as where lightning-thunder
is not installed, and writes where each attempt came from to ``$NVTX_REGIONS_TESTS_THUNDER_LOG``.

tests/test_without_thunder.py puts this folder first on PYTHONPATH, so the processes that
nvtx_regions' commands start (the user's script under capture, nsys or profile) carry it too.
"""

import importlib.abc
import os
import sys
import traceback


class _ThunderIsNotHere(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "thunder" and not name.startswith("thunder."):
            return None
        log = os.environ.get("NVTX_REGIONS_TESTS_THUNDER_LOG")
        if log:
            ours = [f"{f.filename}:{f.lineno}" for f in traceback.extract_stack() if "nvtx_regions" in f.filename]
            with open(log, "a", encoding="utf-8") as out:
                out.write(f"{os.getpid()} import {name} from {' < '.join(reversed(ours[-4:])) or 'outside nvtx_regions'}\n")
        raise ModuleNotFoundError(f"No module named {name!r} (blocked by tests/workers/thunder_blocked)", name=name)


sys.meta_path.insert(0, _ThunderIsNotHere())
