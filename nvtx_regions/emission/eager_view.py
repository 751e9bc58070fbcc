"""The view of an eager model's module tree that selection works on (`selection.view.View`).

Eager PyTorch has no trace: what the hooks of `emission.eager` can wrap is a
module call. So the view has one op per module of ``model.named_modules()``,
in that order (the root first, each module before the modules inside it), and
each op's module chain is the module with every module above it. An ``each``
rule's span for a module then runs from the module to the last module inside
it, and `make_plan` gives one region per matching module, named and nested as
the thunder and Inductor backends name and nest that module's calls; the
hooks put those ranges around each call of the module.

Promises:
- Module paths, class names and scopes (``and module <...>``,
  ``and class <...>``: the module or one above it matches) are those of
  ``named_modules()``; a module reachable under two paths (shared weights) is
  one op, under its first path, and its calls all get its ranges.
- One view per pass (`module_views`): the same ops, ``phase`` forward or
  backward, so ``forward``/``backward`` and the `` (backward)`` suffix come
  from the plan as for a trace.
- Nothing else is recorded: no op names, proxies, markers or source lines.
  `selection.support` leaves out the rules that would need them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

from ..core.calls import Chain, ModuleCall
from ..core.naming import class_name, module_call_name
from ..internals.inductor_origins import model_modules
from ..selection.view import ChainView, Phase

__all__ = ["ModuleOp", "ModuleView", "module_views"]


@dataclass(frozen=True)
class ModuleOp:
    """One module of the model, as an op of the view."""

    index: int  # its position in named_modules()
    name: str  # its range message in the forward pass: its path, the root's class name
    chain: Chain  # the root, ..., this module
    module: Any = field(compare=False, repr=False)
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    is_fusion: bool = False

    @property
    def path(self) -> str:
        return self.chain[-1].path

    @property
    def text(self) -> str:
        return self.name


@dataclass
class ModuleView(ChainView):
    """The modules of one model in one pass (see the module doc)."""

    program: ClassVar[str] = "model"
    units: ClassVar[str] = "module calls"
    ops: Sequence[ModuleOp]
    phase: Phase
    name: str  # the root's class name
    classes: dict[str, str]  # module path -> class name

    by_name: dict[str, int] = field(default_factory=dict)
    parameter_only: int = 0


def module_views(model: Any) -> tuple[ModuleView, ModuleView]:
    """The forward and the backward view of `model`'s modules (they share their ops)."""
    ops: list[ModuleOp] = []
    classes: dict[str, str] = {}
    chains: dict[str, Chain] = {}
    for index, (path, module) in enumerate(model_modules(model)):
        cls = class_name(type(module))
        classes[path] = cls
        # The nearest module above it: named_modules() lists it first (a shared
        # module's children are listed under its first path only).
        parent = path
        while parent:
            parent = parent.rpartition(".")[0]
            if parent in chains:
                break
        above = chains.get(parent, ()) if path else ()
        chains[path] = chain = (*above, ModuleCall(path, cls, index))
        ops.append(ModuleOp(index, module_call_name(path, cls), chain, module))
    name = class_name(type(model))
    return ModuleView(ops, "forward", name, classes), ModuleView(ops, "backward", name, classes)
