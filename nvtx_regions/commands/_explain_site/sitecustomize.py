"""Loaded at interpreter start in the processes of ``nvtx-regions explain -- COMMAND``
(this directory is first on their PYTHONPATH). Arms `nvtx_regions.commands.explain_child`,
then runs the sitecustomize that this one shadows, if there is one."""

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
    from nvtx_regions.commands.explain_child import install

    install()
finally:
    _chain()
