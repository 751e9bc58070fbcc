"""The child side of ``nvtx-regions explain``: wrap ``thunder.jit``, and explain every jitted function at exit.

``nvtx-regions explain`` puts ``nvtx_regions/commands/_site`` first on the
child's ``PYTHONPATH`` (`commands.hooks`); its ``sitecustomize`` calls `install` at interpreter
start, in every Python process of the command (torchrun workers included).
`install` does nothing unless ``NVTX_REGIONS_EXPLAIN_SPEC`` is set. Right
after ``thunder`` is imported (`hooks.after_import`), it replaces
``thunder.jit`` (so ``from thunder import jit`` gets the wrapper too):

- a function jitted without an `NvtxProfileTransform` gets
  ``NvtxProfileTransform(spec=SPEC)`` appended to its transforms;
- one jitted with its own transform keeps it.

At exit (atexit: normal exit, ``sys.exit``, or an uncaught exception; not
``os._exit`` or a fatal signal) each jitted function that ran is explained
against SPEC, and the report, its range-tree picture, the function's name
and where it was jitted go to ``$NVTX_REGIONS_EXPLAIN_OUT/explain-<pid>.json``.
Each jit also appends the function's name to ``jitted-<pid>.txt`` there at
once, so that a process that jitted and then ended without atexit is named.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
from typing import Any

from ..internals.frames import line_outside_package
from .hooks import after_import

ENV_SPEC = "NVTX_REGIONS_EXPLAIN_SPEC"
ENV_OUT = "NVTX_REGIONS_EXPLAIN_OUT"
ENV_MAX_OPS = "NVTX_REGIONS_EXPLAIN_MAX_OPS"

_jitted: list[dict[str, Any]] = []


def _name_of(fn: Any) -> str:
    if hasattr(fn, "forward") and not hasattr(fn, "__qualname__"):  # an nn.Module instance
        return type(fn).__name__
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def _patch(thunder: Any) -> None:
    original = thunder.jit
    spec = os.environ[ENV_SPEC]

    @functools.wraps(original)
    def jit(fn, *args, **kwargs):
        from ..emission.transform import NvtxProfileTransform

        transforms = list(kwargs.get("transforms") or [])
        own = any(isinstance(t, NvtxProfileTransform) for t in transforms)
        if not own:
            transforms.append(NvtxProfileTransform(spec=spec))
        kwargs["transforms"] = transforms
        jitted = original(fn, *args, **kwargs)
        filename, line = line_outside_package()
        _jitted.append(
            {
                "function": jitted,
                "name": _name_of(fn),
                "where": f"{os.path.relpath(filename)}:{line}",
                "own_transform": own,
            }
        )
        _note_jitted(_jitted[-1]["name"])
        return jitted

    thunder.jit = jit
    # atexit runs handlers last-in first-out: registered after thunder's (and
    # torch's) own, this runs before they tear down what printing a trace needs.
    atexit.register(_dump)


def _note_jitted(name: str) -> None:
    """Append `name` to ``jitted-<pid>.txt`` now: if the process then ends without atexit
    (``os._exit``, a fatal signal), the parent still knows it jitted something."""
    directory = os.environ.get(ENV_OUT)
    if directory:
        with open(os.path.join(directory, f"jitted-{os.getpid()}.txt"), "a", encoding="utf-8") as f:
            f.write(name.replace("\n", " ") + "\n")


def _report() -> list[dict[str, Any]]:
    from ..core.errors import NotRunYetError, SelectorError
    from ..report.explanation import explain
    from ..report.rangeart import draw_ranges

    spec = os.environ[ENV_SPEC]
    max_ops = int(os.environ.get(ENV_MAX_OPS) or 12)
    out = []
    for entry in _jitted:
        record = {k: v for k, v in entry.items() if k != "function"}
        try:
            explanation = explain(entry["function"], spec=spec, max_ops=max_ops)
        except (SelectorError, NotRunYetError) as error:
            record.update(text=f"not explained: {error}", tree="")
        else:
            record.update(text=str(explanation), tree=draw_ranges(explanation))
        out.append(record)
    return out


def _dump() -> None:
    directory = os.environ.get(ENV_OUT)
    if not directory or not _jitted:
        return
    records = _report()
    header = {"pid": os.getpid(), "rank": os.environ.get("RANK"), "functions": records}
    path = os.path.join(directory, f"explain-{os.getpid()}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(header, f)
    os.replace(path + ".tmp", path)


def install() -> None:
    """Arm the wrapper in this process when ``NVTX_REGIONS_EXPLAIN_SPEC`` is set (see the module docstring)."""
    if not os.environ.get(ENV_SPEC):
        return
    after_import("thunder", _patch)
