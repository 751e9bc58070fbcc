"""Loaded at interpreter start in the processes of the commands that hook into the user's
command (this directory is first on their PYTHONPATH: `commands.hooks`). Arms each child
module whose variables the command set, then runs the sitecustomize that this one shadows,
if there is one."""

import os
import sys


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if entry and os.path.abspath(entry) != here:
            candidate = os.path.join(entry, "sitecustomize.py")
            if os.path.isfile(candidate):
                with open(candidate, encoding="utf-8") as f:
                    code = compile(f.read(), candidate, "exec")
                exec(code, {"__name__": "sitecustomize", "__file__": candidate})
                return


try:
    from nvtx_regions.commands import explain_child, profiler_child

    explain_child.install()
    profiler_child.install()
finally:
    _chain()
