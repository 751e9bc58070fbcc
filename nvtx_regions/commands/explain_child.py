"""The child side of ``nvtx-regions explain``: note what each backend compiles, and explain it at exit.

``nvtx-regions explain`` puts ``nvtx_regions/commands/_site`` first on the
child's ``PYTHONPATH`` (`commands.hooks`); its ``sitecustomize`` calls `install` at interpreter
start, in every Python process of the command (torchrun workers included).
`install` does nothing unless ``NVTX_REGIONS_EXPLAIN_SPEC`` is set. Then each
backend is wrapped where every way to it passes, right after its module is
imported (`hooks.after_import`, so ``from thunder import jit`` gets the wrapper too):

- thunder: ``thunder.jit``. A function jitted without an `NvtxProfileTransform`
  gets ``NvtxProfileTransform(spec=SPEC)`` appended to its transforms; one
  jitted with its own keeps it (``nvtx_regions.compile(backend="thunder")``
  passes its own).
- Inductor: ``torch.compile``. A call with the Inductor backend (torch's
  default) gets ``NvtxInductor(spec=SPEC, model=...)`` as its backend, with
  ``options=`` handed on, as ``nvtx_regions.compile(backend="inductor")`` does;
  a call with an `NvtxInductor` keeps it (``nvtx_regions.compile`` passes
  its own). Other backends are left alone and not explained.
- eager: ``nvtx_regions.emission.eager.annotate``, what
  ``nvtx_regions.compile(backend="eager")`` and ``nvtx_regions.annotate`` call.
- no compile at all: a process that compiled nothing through the three is
  explained per model it called, as eager would place the spec's ranges in
  it. The hook point is the model's first call, the least a script can do
  with a model: a global forward pre-hook
  (``torch.nn.modules.module.register_module_forward_pre_hook``) notes each
  root module (one called outside every other module it noted) and explains it then,
  with `annotate` put on and taken off at once, so no range is added and the model
  is not kept alive. A root the spec selects nothing in is left out of the report when
  another root has a selection (a loss module beside the model). The hook
  comes off at the first compile above, before Dynamo or thunder could trace it,
  and what it noted is then dropped.

At exit (atexit: normal exit, ``sys.exit``, or an uncaught exception; not
``os._exit`` or a fatal signal) each noted object is explained against SPEC
with `nvtx_regions.explain` (the compiled ones hold what their backend placed in
this process), and the report, its range-tree picture, the backend, the model's
class (a function's name), where it was compiled and how go to
``$NVTX_REGIONS_EXPLAIN_OUT/explain-<pid>.json``.
Each one noted also appends a line to ``noted-<pid>.txt`` there at
once, so that a process that compiled and then ended without atexit is named.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import traceback
import warnings
import weakref
from typing import Any

from ..internals.frames import line_outside_package
from .hooks import after_import

ENV_SPEC = "NVTX_REGIONS_EXPLAIN_SPEC"
ENV_OUT = "NVTX_REGIONS_EXPLAIN_OUT"
ENV_MAX_OPS = "NVTX_REGIONS_EXPLAIN_MAX_OPS"
NOTED = "noted-{pid}.txt"

_noted: list[dict[str, Any]] = []  # the compiled objects, with what the report says of them
_called: list[dict[str, Any]] = []  # root modules called without any compile, explained at their first call
_roots: dict[int, weakref.ref] = {}  # id -> module, for every module of a root noted so far
_root_hook: list[Any] = []  # the handle of the global forward pre-hook, while it is on
_dumped: list[bool] = []
_unnoted: dict[str, Any] = {}  # "annotate": nvtx_regions.emission.eager.annotate, before it was wrapped


def _name_of(fn: Any) -> str:
    if hasattr(fn, "forward") and not hasattr(fn, "__qualname__"):  # an nn.Module instance
        return type(fn).__name__
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def _where() -> str:
    filename, line = line_outside_package()
    return f"{os.path.relpath(filename)}:{line}"


def _note(target: Any, backend: str, name: str, how: str) -> None:
    """Note `target` for the report at exit; the root modules noted so far no longer count."""
    _stop_root_hook()
    _called.clear()
    _noted.append({"object": target, "backend": backend, "name": name, "where": _where(), "how": how})
    _note_now(backend, name)


def _note_now(backend: str, name: str) -> None:
    """Append a line to ``noted-<pid>.txt`` now: if the process then ends without atexit
    (``os._exit``, a fatal signal), the parent still knows what it compiled."""
    directory = os.environ.get(ENV_OUT)
    if directory:
        with open(os.path.join(directory, NOTED.format(pid=os.getpid())), "a", encoding="utf-8") as f:
            f.write(f"{name} ({backend})".replace("\n", " ") + "\n")


def _register_dump() -> None:
    # atexit runs handlers last-in first-out: registered after the backend's (and torch's)
    # own, this runs before they tear down what printing a trace needs. `_dump` runs once.
    atexit.register(_dump)


def _patch_thunder(thunder: Any) -> None:
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
        _note(jitted, "thunder", _name_of(fn), "jitted at {where}, " + ("with its own NvtxProfileTransform" if own else "spec added"))
        return jitted

    thunder.jit = jit
    _register_dump()


def _patch_torch(torch: Any) -> None:
    original = torch.compile
    spec = os.environ[ENV_SPEC]

    @functools.wraps(original)
    def compile(model=None, **kwargs):
        if model is None:  # @torch.compile(...): torch returns a decorator
            return lambda fn: compile(fn, **kwargs)
        _stop_root_hook()  # before Dynamo traces, whichever backend compiles
        _called.clear()
        try:
            from ..inductor.backend import NvtxInductor
        except ImportError:  # an installation without nvtx_regions.inductor
            return original(model, **kwargs)
        backend = kwargs.get("backend", "inductor")
        if isinstance(backend, NvtxInductor):
            compiled = original(model, **kwargs)
            _note(backend, "inductor", _name_of(model), "compiled at {where}, with its own NvtxInductor")
            return compiled
        if not isinstance(backend, str) or backend != "inductor" or kwargs.get("disable"):
            return original(model, **kwargs)
        tree = model if isinstance(model, torch.nn.Module) else None
        compiler = NvtxInductor(spec=spec, options=kwargs.pop("options", None), model=tree)
        compiled = original(model, **{**kwargs, "backend": compiler})
        _note(compiler, "inductor", _name_of(model), "compiled at {where}, spec added")
        return compiled

    torch.compile = compile
    from ..internals.dynamo import run_outside_dynamo

    _root_hook.append(torch.nn.modules.module.register_module_forward_pre_hook(run_outside_dynamo(_first_call)))
    _register_dump()


def _patch_eager(eager: Any) -> None:
    original = _unnoted["annotate"] = eager.annotate

    @functools.wraps(original)
    def annotate(model, *args, **kwargs):
        annotation = original(model, *args, **kwargs)
        _note(annotation, "eager", type(model).__name__, "annotated at {where}")
        return annotation

    eager.annotate = annotate


def _stop_root_hook() -> None:
    while _root_hook:
        _root_hook.pop().remove()
    _roots.clear()


def _first_call(module: Any, args: Any) -> None:
    """The global forward pre-hook: explain a root module at its first call (see the module doc)."""
    import torch

    if torch.compiler.is_compiling():  # traced by Dynamo: nothing (its calls run in Python too)
        return
    known = _roots.get(id(module))
    if known is not None and known() is module:
        return
    for sub in module.modules():
        _roots[id(sub)] = weakref.ref(sub)
    from ..core.errors import SelectorError
    from ..emission import eager  # noqa: F401  (imported: `_patch_eager` has kept the unwrapped annotate)

    where = _caller_line()
    record = {"backend": "eager", "name": type(module).__name__, "where": where, "how": "first called at {where}; no compile, no ranges added"}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the explanation says what the warnings would
            annotation = _unnoted["annotate"](module, spec=os.environ[ENV_SPEC])
            annotation.remove()
        explanation = annotation.explain(max_ops=_max_ops())
    except SelectorError as error:
        record.update(text=f"not explained: {error}", tree="", selected=False)
    except Exception as error:  # reported, and the script's own call goes on
        record.update(text=f"not explained: {type(error).__name__}: {error}", tree="", selected=False)
    else:
        selected = any(found.ranges for per_trace in explanation.traces for found in per_trace)
        record.update(_rendered(explanation), selected=selected)
    _called.append(record)
    _note_now("eager", record["name"])


def _caller_line() -> str:
    """Where the script called the model: the innermost frame outside torch and nvtx_regions."""
    import torch

    skip = (os.path.dirname(torch.__file__) + os.sep, os.path.dirname(os.path.dirname(__file__)) + os.sep)
    for frame in reversed(traceback.extract_stack()):
        if not frame.filename.startswith(skip):
            return f"{os.path.relpath(frame.filename)}:{frame.lineno}"
    return "?"


def _max_ops() -> int:
    return int(os.environ.get(ENV_MAX_OPS) or 12)


def _rendered(explanation: Any) -> dict[str, str]:
    from ..report.rangeart import draw_ranges

    return {"text": str(explanation), "tree": draw_ranges(explanation)}


def _report() -> list[dict[str, Any]]:
    from ..core.errors import NotRunYetError, SelectorError
    from ..report.explanation import explain

    spec = os.environ[ENV_SPEC]
    out = []
    for entry in _noted:
        record = {k: v for k, v in entry.items() if k != "object"}
        record["how"] = record["how"].format(where=record["where"])
        try:
            explanation = explain(entry["object"], spec=spec, max_ops=_max_ops())
        except (SelectorError, NotRunYetError) as error:
            record.update(text=f"not explained: {error}", tree="")
        else:
            record.update(_rendered(explanation))
        out.append(record)
    if not out:
        selected = [r for r in _called if r.pop("selected")]
        out = [{**r, "how": r["how"].format(where=r["where"])} for r in (selected or _called)]
    return out


def _dump() -> None:
    directory = os.environ.get(ENV_OUT)
    if _dumped or not directory or not (_noted or _called):
        return
    _dumped.append(True)
    records = _report()
    header = {"pid": os.getpid(), "rank": os.environ.get("RANK"), "explained": records}
    path = os.path.join(directory, f"explain-{os.getpid()}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(header, f)
    os.replace(path + ".tmp", path)


def install() -> None:
    """Arm the wrappers in this process when ``NVTX_REGIONS_EXPLAIN_SPEC`` is set (see the module docstring)."""
    if not os.environ.get(ENV_SPEC):
        return
    after_import("thunder", _patch_thunder)
    after_import("torch", _patch_torch)
    after_import("nvtx_regions.emission.eager", _patch_eager)
