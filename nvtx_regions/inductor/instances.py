"""Which module instance a graph's code runs for, when Dynamo compiled a submodule's code on its own.

After a graph break inside a module's ``forward``, Dynamo compiles that
``forward`` (and its resume functions) as frames of their own, whose module
paths start at the frame's ``self``: ``L['self'].fc1``. One compiled graph then
serves every instance of the class (Dynamo guards on the type, and the
parameters are graph inputs), so ``blocks.0``'s graph also runs for
``blocks.1`` and ``blocks.2``. A name fixed when the graph was compiled would
be wrong for all but one of them.

Promises:
- `frame_root` finds, from the module calls Dynamo recorded and the
  compiled model's paths, the module the graph's paths start at (its *root*),
  and the other modules of the model that can run the same graph (same class).
  A graph whose root is the model itself, or a module no other module shares a
  class with, is named as compiled (`FrameRoot.fixed`).
- Otherwise the instance is found per call, by identity: a parameter or buffer
  of the root that the graph takes as an input is looked up among the
  candidates' own (`FrameRoot.instance`), as each holds it at that moment: a
  tensor put in place after the model was compiled (FSDP2 gathers a sharded
  module's parameters into tensors of their own for its call) names its
  module too. A call whose tensor belongs to no candidate gets no range (never
  a wrong name), and so does every call of a graph that takes no parameter or
  buffer of its root (`FrameRoot.why_not`).
- The backward of a call is named after the instance its forward ran for,
  which the call's autograd node holds (`runtime.ranges.name_backward`,
  `internals.dynamo.backward_node`).
- The module calls that span the break (the root's and its ancestors') are in
  no one graph: `inductor.outside` gives them their ranges.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Sequence

from ..core.naming import class_name
from ..internals.dynamo import run_outside_dynamo
from ..internals.inductor import called_module, graph_module_stacks, model_modules, model_tensors, module_paths
from .kernels import KernelView, rebase

__all__ = ["FrameRoot", "Models", "frame_root", "instance_views", "same_class", "structure"]


class Models:
    """The models one backend compiles (several of one structure, when `nvtx_regions.compile` shares
    its backend), each held weakly: their module paths by Dynamo's module key, and their modules by
    path, for every model alive."""

    def __init__(self) -> None:
        self._models: weakref.WeakSet[Any] = weakref.WeakSet()
        # Per model: its modules by path, weakly (`owner`).
        self._modules: weakref.WeakKeyDictionary[Any, weakref.WeakValueDictionary[str, Any]] = weakref.WeakKeyDictionary()
        # What `owner` found: (the tensor's id, its name in its module) -> the module's path (None: none
        # of the candidates looked among), the tensor (checked at each use), and those candidates.
        self._found: dict[tuple[int, str], tuple[str | None, weakref.ref[Any], tuple[str, ...]]] = {}
        self.paths: dict[str, str] = {}  # Dynamo's module key -> path (`internals.inductor.module_paths`)
        self.aliases: dict[str, tuple[str, ...]] = {}  # Dynamo's module key -> every path of a shared module

    def add(self, model: Any) -> None:
        if model in self._models:
            return
        self._models.add(model)
        self._modules[model] = weakref.WeakValueDictionary(model_modules(model))
        self._found.clear()
        paths, aliases = _names(model)
        self.paths.update(paths)
        self.aliases.update(aliases)
        weakref.finalize(model, run_outside_dynamo(self._forget), paths)

    def _forget(self, paths: dict[str, str]) -> None:
        # A dead model's ids may be reused: keep only what a model alive says.
        for key in paths:
            self.paths.pop(key, None)
            self.aliases.pop(key, None)
        for model in self._models:
            paths, aliases = _names(model)
            self.paths.update(paths)
            self.aliases.update(aliases)

    def any(self) -> Any:
        """A model alive (they share one structure), or None."""
        return next(iter(self._models), None)

    def owner(self, tensor: Any, own: str, candidates: tuple[str, ...]) -> str | None:
        """The path of the module of `candidates` (in whichever model) whose `own` (``fc.weight``) is
        `tensor` now, or None. What it finds is kept while that tensor lives: a
        module's tensors change only when something puts others in place (FSDP2, for each call, reusing
        them from its second step on), and a tensor of one module does not move to another."""
        path, found, among = self._found.get((id(tensor), own), ("", _NOTHING, ()))
        if found() is tensor and (path in candidates if path is not None else among is candidates):
            return path
        path = self._walk(tensor, own, candidates)
        if len(self._found) >= _FOUND_KEPT:
            self._found.clear()
        self._found[id(tensor), own] = (path, weakref.ref(tensor), candidates)  # None too: a model not added yet (`add` forgets)
        return path

    def _walk(self, tensor: Any, own: str, candidates: tuple[str, ...]) -> str | None:
        for modules in list(self._modules.values()):
            for path in candidates:
                module = modules.get(path)
                if module is not None and _attribute(module, own) is tensor:
                    return path
        return None


_FOUND_KEPT = 4096  # bounds `Models._found`, for a model whose tensors are new at every call


def _NOTHING() -> None:
    return None


def _attribute(module: Any, dotted: str) -> Any:
    """``module.a.b`` for ``"a.b"`` (a wrapper's attributes reach what it wraps), or None."""
    for part in dotted.split("."):
        module = getattr(module, part, None)
    return module


def _names(model: Any) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    """`model`'s module paths and shared modules' paths by Dynamo's module key."""
    return module_paths(model), _aliases(model)


@dataclass(frozen=True)
class FrameRoot:
    """The module a graph's paths start at, and the modules that may run the same graph."""

    root: str  # its path in the compiled model, for the instance the graph was compiled for
    cls: str  # its class name
    candidates: tuple[str, ...]  # every module of the model of that class (root among them)
    input_index: int | None = None  # the graph input that says which instance runs (a parameter or buffer)
    own: str = ""  # that input's name in the root module
    models: Models | None = None  # the models alive, whose modules hold the tensors
    why_not: str | None = None  # why no call can be named, when so

    @property
    def fixed(self) -> bool:
        """Whether every call runs for the instance it was compiled for."""
        return self.candidates == (self.root,)

    def instance(self, args: Sequence[Any]) -> str | None:
        """The candidate a call with graph inputs `args` runs for (in whichever model it is); None if
        none is known."""
        if self.input_index is None or self.models is None:
            return None
        return self.models.owner(args[self.input_index], self.own, self.candidates)


def _aliases(model: Any) -> dict[str, tuple[str, ...]]:
    """Every path of each module reachable under several, by Dynamo's module key."""
    found: dict[str, list[str]] = {}
    for path, module in model_modules(model, every_path=True):
        found.setdefault(str(id(module)), []).append(path)
    return {key: tuple(paths) for key, paths in found.items() if len(paths) > 1}


def structure(model: Any) -> str:
    """`model`'s module paths and classes, one ``path:Class`` a line: what two models must share to
    share compiled code and names."""
    return "\n".join(f"{p}:{class_name(type(m))}" for p, m in model_modules(model))


def same_class(modules: dict[str, Any], root: str) -> tuple[str, ...]:
    """The paths of the modules of `modules` (``dict(model.named_modules())``) of `root`'s class: the
    modules that can run a graph compiled for `root` (empty when `root` is none of them)."""
    if root not in modules:
        return ()
    cls = type(modules[root])
    return tuple(path for path, module in modules.items() if type(module) is cls)


def frame_root(gm: Any, example_inputs: Sequence[Any], models: Models) -> FrameRoot | None:
    """The root of `gm`'s paths when it is a submodule of the compiled models (see the module doc);
    None when the graph's paths start at a model itself, or it records no module call."""
    model = models.any()
    if model is None:
        return None
    roots: dict[str, None] = {}
    for key, relative in graph_module_stacks(gm):
        module = called_module(key)
        full = models.paths.get(module)
        if full is None:
            continue
        if not relative:
            roots[full] = None
            continue
        # A module shared by two parents is reached under either path (named by its first, as eager does).
        found = [p for p in models.aliases.get(module, (full,)) if p == relative or p.endswith("." + relative)]
        roots[found[0][: len(found[0]) - len(relative)].rstrip(".") if found else "?"] = None
    if not roots or list(roots) == [""]:
        return None
    modules = dict(model_modules(model))
    if len(roots) > 1 or "?" in roots:
        return FrameRoot("?", "?", (), why_not="its module paths do not start at one module of the compiled model")
    (root,) = roots
    cls = type(modules[root])
    candidates = same_class(modules, root)
    if candidates == (root,):
        return FrameRoot(root, class_name(cls), candidates)
    # The root's tensors as it holds them now (FSDP2 puts gathered ones in place for its call).
    own = {id(t): name for name, t in model_tensors(modules[root])}
    for index, example in enumerate(example_inputs):
        if id(example) in own:
            return FrameRoot(root, class_name(cls), candidates, index, own[id(example)], models)
    return FrameRoot(
        root, class_name(cls), candidates,
        why_not=f"the graph takes no parameter or buffer of {root!r} that would say which {class_name(cls)} runs it",
    )  # fmt: skip


def instance_views(view: KernelView, frame: FrameRoot) -> list[KernelView]:
    """`view` as each module instance that runs its graph sees it, ``graph 0 (forward) as blocks.1``
    (`view` itself where every call runs for one; none where no call can be named)."""
    if frame.fixed:
        return [view]
    if frame.why_not is not None:
        return []
    return [rebase(view, frame.root, instance, f"{view.name} as {instance}") for instance in frame.candidates]
