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
  candidates' own (`FrameRoot.instance`). A call whose tensor belongs to no
  candidate gets no range (never a wrong name), and so does every call of a
  graph that takes no parameter or buffer of its root (`FrameRoot.why_not`).
- The backward of a call is named after the instance its forward ran for
  (`runtime.ranges.set_instance`, through the autograd node of the call,
  `internals.dynamo.on_backward`).
- The module calls that span the break (the root's and its ancestors') are in
  no one graph: `inductor.outside` gives them their ranges.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from ..internals.inductor import called_module, graph_module_stacks

__all__ = ["FrameRoot", "frame_root", "same_class"]


@dataclass(frozen=True)
class FrameRoot:
    """The module a graph's paths start at, and the modules that may run the same graph."""

    root: str  # its path in the compiled model, for the instance the graph was compiled for
    cls: str  # its class name
    candidates: tuple[str, ...]  # every module of the model of that class (root among them)
    input_index: int | None = None  # the graph input that says which instance runs (a parameter or buffer)
    by_tensor: dict[int, str] = field(default_factory=dict)  # id of that input's tensor in each candidate -> candidate
    why_not: str | None = None  # why no call can be named, when so

    @property
    def fixed(self) -> bool:
        """Whether every call runs for the instance it was compiled for."""
        return self.candidates == (self.root,)

    def instance(self, args: Sequence[Any]) -> str | None:
        """The candidate a call with graph inputs `args` runs for; None if none is known."""
        return self.by_tensor.get(id(args[self.input_index])) if self.input_index is not None else None


def same_class(modules: dict[str, Any], root: str) -> tuple[str, ...]:
    """The paths of the modules of `modules` (``dict(model.named_modules())``) of `root`'s class: the
    modules that can run a graph compiled for `root` (empty when `root` is none of them)."""
    if root not in modules:
        return ()
    cls = type(modules[root])
    return tuple(path for path, module in modules.items() if type(module) is cls)


def frame_root(gm: Any, example_inputs: Sequence[Any], model: Any, paths: dict[str, str]) -> FrameRoot | None:
    """The root of `gm`'s paths when it is a submodule of `model` (see the module doc); None when the
    graph's paths start at the model itself, or it records no module call. `paths`: the model's
    module paths by Dynamo's module key (`internals.inductor.module_paths`)."""
    roots: dict[str, None] = {}
    for key, relative in graph_module_stacks(gm):
        full = paths.get(called_module(key))
        if full is None:
            continue
        if not relative:
            roots[full] = None
        elif full == relative or full.endswith("." + relative):
            roots[full[: len(full) - len(relative)].rstrip(".")] = None
        else:
            roots["?"] = None
    if not roots or list(roots) == [""]:
        return None
    modules = dict(model.named_modules())
    if len(roots) > 1 or "?" in roots:
        return FrameRoot("?", "?", (), why_not="its module paths do not start at one module of the compiled model")
    (root,) = roots
    cls = type(modules[root])
    candidates = same_class(modules, root)
    if candidates == (root,):
        return FrameRoot(root, cls.__name__, candidates)
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    names = {id(tensor): name for name, tensor in tensors.items()}
    for index, example in enumerate(example_inputs):
        name = names.get(id(example))
        if name is None or not name.startswith(root + "."):
            continue
        own = name[len(root) + 1 :]
        by_tensor = {id(tensors[f"{c}.{own}"]): c for c in candidates if f"{c}.{own}" in tensors}
        return FrameRoot(root, cls.__name__, candidates, index, by_tensor)
    return FrameRoot(
        root, cls.__name__, candidates,
        why_not=f"the graph takes no parameter or buffer of {root!r} that would say which {cls.__name__} runs it",
    )  # fmt: skip
