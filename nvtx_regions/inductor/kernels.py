"""The view of one Inductor graph's kernel calls that selection works on (`selection.view.View`).

Promises:
- One op per kernel call of the generated wrapper, in the order the wrapper
  calls them: C++/Triton kernels (``cpp_fused_add_0``), extern kernels
  (``extern_kernels.addmm``), fallbacks (``aten._scaled_dot_product_...``).
- A kernel goes by its own name, by its last component (``addmm``) and by
  the aten ops it was generated from (``native_layer_norm``, ``mm``): what
  ``op in <...>`` matches.
- A kernel belongs to the deepest module call that contains every origin
  that decides (below) and has a module (`core.calls.common_chain`): a
  kernel whose origins span two modules belongs to their common parent, as
  a thunder fusion does. A kernel none of whose deciding origins has a
  module (a backward's gradient accumulation, the loss's backward) belongs
  to no module, so it neither opens nor closes a module's range: it lies
  inside the range around it.
- Which origins decide: those that compute something from the graph's
  inputs. A *static* origin (`internals.inductor.Origin.static`: a constant;
  in a backward, a node no incoming gradient reaches) computes the same
  whichever step runs, and Inductor shares it across the graph (one
  ``full`` for every zero of the backward, attributed to the module that
  first made it), so it does not decide the module of a kernel that has
  other origins. An extern kernel's origins are its own FX node alone
  (`internals.inductor._kernel`), not the inputs inlined into it.
- A backward kernel has the modules of the forward nodes it is the
  gradient of (AOTAutograd's ``fwd_nn_module_stack``).
- A kernel also keeps the module calls just below its own whose work its
  deciding origins do (`Kernel.parts`): a fusion of a gated MLP's mul with
  the gate's sigmoid backward belongs to the MLP, and does gate's work, so a
  range of `down` that it lies inside is cut around it
  (`selection.selectors.call_parts`).
- A kernel all of whose origins are static (a backward kernel computed from
  saved forward values alone, a forward kernel of constants) is *hoisted*
  (`View.parameter_only`, as in thunder traces): it keeps the module of its
  origins, but does not stretch its module call's range. Inductor may
  schedule it anywhere (a block's attention inputs, re-laid out, first of
  all).
- A kernel is inside each of the user's markers that was open around any
  origin that decides (`internals.compiled_markers` carries them from
  Dynamo's graph): a fused kernel does the work of every marker its parts
  were in (Inductor fuses a norm with the activation after it), so a
  marker's range spans every kernel that does some of its work, and no
  marker whose ops all fused into kernels of other ops is left without one.
  A hoisted kernel (below) is inside no marker.
  (Thunder's fusions differ: they are inside only the markers open around
  all their parts.) A backward kernel has the markers of the forward nodes
  it is the gradient of.
- Nothing else is recorded: no proxies, no source lines.
  `inductor.check` refuses the rules that would need them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import ClassVar, Sequence

from ..core.calls import Chain, ModuleCall, common_chain, parts_below
from ..core.markers import Marker, MarkerStack
from ..internals.inductor import WrapperKernel, called_module
from ..selection.view import ChainView, Phase

__all__ = ["Kernel", "KernelView", "kernel_view", "view_literal", "view_from_literal", "rebase", "inside_call"]


@dataclass(frozen=True)
class Kernel:
    """One kernel call, as an op of the view."""

    index: int  # its position among the graph's kernel calls
    name: str
    names: tuple[str, ...]  # every name it goes by (see the module doc)
    chain: Chain | None
    first_line: int  # its lines in the wrapper
    last_line: int
    hoisted: bool = False  # see the module doc
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    is_fusion: bool = False
    markers: MarkerStack = ()  # the user's markers it is inside (see the module doc)
    parts: tuple[ModuleCall, ...] = ()  # the calls just below `chain` whose work it does (see the module doc)

    @property
    def text(self) -> str:
        return self.name


@dataclass
class KernelView(ChainView):
    """The kernel calls of one compiled graph (forward or backward), in order."""

    program: ClassVar[str] = "graph"
    units: ClassVar[str] = "kernels"
    ops: Sequence[Kernel]
    phase: Phase
    name: str  # the graph's name in reports: "graph 0 (forward)"
    classes: dict[str, str] = field(default_factory=dict)  # module path -> class name, from the origins

    @functools.cached_property
    def by_name(self) -> dict[str, int]:
        masks: dict[str, int] = {}
        for position, op in enumerate(self.ops):
            for name in op.names:
                masks[name] = masks.get(name, 0) | (1 << position)
        return masks

    @functools.cached_property
    def marker_stacks(self) -> list[MarkerStack]:
        return [op.markers for op in self.ops]

    @functools.cached_property
    def parameter_only(self) -> int:
        mask = 0
        for position, op in enumerate(self.ops):
            if op.hoisted:
                mask |= 1 << position
        return mask


def kernel_view(
    kernels: list[WrapperKernel], phase: Phase, name: str, calls: dict[tuple[str, str], int], paths: dict[str, str] | None = None
) -> KernelView:
    """The view of a wrapper's `kernels`. `calls` numbers module calls by Dynamo's key, across the
    graphs of one backend (a key seen first gets the next number). `paths`: the compiled model's
    module paths by the module part of Dynamo's call key (`internals.inductor.module_paths`), which name
    a module the same wherever Dynamo's frame starts; a module not in it keeps the path its
    source names."""
    ops = []
    classes: dict[str, str] = {}
    for position, kernel in enumerate(kernels):
        chains = []
        names = dict.fromkeys([kernel.name, kernel.name.rsplit(".", 1)[-1]])
        hoisted = bool(kernel.origins) and all(origin.static for origin in kernel.origins)
        # A hoisted kernel is inside no marker: Inductor may schedule it anywhere, and it would
        # stretch the marker's range there.
        deciding = [] if hoisted else [origin.markers for origin in kernel.origins if not origin.static]
        for origin in kernel.origins:
            if origin.op:
                names[origin.op] = None
            if origin.modules:
                chain = []
                for key, path, cls in origin.modules:
                    # A module shared by two parents has one key: its calls differ by the path Dynamo reached it by.
                    call = calls.setdefault((key, path), len(calls))
                    if paths is not None:
                        path = paths.get(called_module(key), path)
                    classes.setdefault(path, cls)
                    chain.append(ModuleCall(path, cls, call))
                if hoisted or not origin.static:
                    chains.append(tuple(chain))
        markers = tuple(sorted({m for found in deciding for m in found}, key=lambda m: m.occurrence))
        chain = common_chain(chains)
        ops.append(
            Kernel(position, kernel.name, tuple(names), chain, kernel.first, kernel.last, hoisted, markers=markers,
                   parts=parts_below(chain, chains))
        )  # fmt: skip
    return KernelView(ops, phase, name, classes)


def view_literal(view: KernelView) -> tuple:
    """`view` as a Python literal (tuples, strings, ints) for a wrapper's header: what
    `view_from_literal` rebuilds in a process where Inductor's cache served the wrapper."""
    chains: dict[Chain, int] = {}
    markers: dict[Marker, int] = {}
    ops = []
    for op in view.ops:
        chain = None if op.chain is None else chains.setdefault(op.chain, len(chains))
        inside = tuple(markers.setdefault(marker, len(markers)) for marker in op.markers)
        parts = tuple((call.path, call.cls, call.call) for call in op.parts)
        ops.append((op.name, op.names, chain, op.first_line, op.last_line, op.hoisted, inside, parts))
    table = tuple(tuple((call.path, call.cls, call.call) for call in chain) for chain in chains)
    marker_table = tuple((m.domain, m.message, m.color, m.form, m.occurrence, m.where) for m in markers)
    return (view.phase, view.name, tuple(sorted(view.classes.items())), table, tuple(ops), marker_table)


def view_from_literal(literal: tuple) -> KernelView:
    """The `KernelView` that `view_literal` wrote."""
    phase, name, classes, table, ops, marker_table = literal
    chains = [tuple(ModuleCall(*call) for call in chain) for chain in table]
    markers = [Marker(*fields) for fields in marker_table]
    kernels = [
        Kernel(
            position, op_name, tuple(names), None if chain is None else chains[chain], first, last, hoisted,
            markers=tuple(markers[n] for n in inside), parts=tuple(ModuleCall(*call) for call in parts),
        )
        for position, (op_name, names, chain, first, last, hoisted, inside, parts) in enumerate(ops)
    ]
    return KernelView(kernels, phase, name, dict(classes))


def _rebased(path: str, root: str, instance: str) -> str:
    if not root:
        return f"{instance}.{path}" if path else instance
    if path == root:
        return instance
    return instance + path[len(root) :] if path.startswith(root + ".") else path


def rebase(view: KernelView, root: str, instance: str, name: str) -> KernelView:
    """`view` with the module paths under `root` moved under `instance` (another module of the
    same class running the same graph), named `name`."""
    if instance == root:
        return KernelView(view.ops, view.phase, name, view.classes)
    ops = []
    for op in view.ops:
        chain = op.chain
        if chain is not None:
            chain = tuple(ModuleCall(_rebased(c.path, root, instance), c.cls, c.call) for c in chain)
        parts = tuple(ModuleCall(_rebased(c.path, root, instance), c.cls, c.call) for c in op.parts)
        ops.append(Kernel(op.index, op.name, op.names, chain, op.first_line, op.last_line, op.hoisted, markers=op.markers, parts=parts))
    classes = {_rebased(path, root, instance): cls for path, cls in view.classes.items()}
    return KernelView(ops, view.phase, name, classes)


def inside_call(view: KernelView, root: str, cls: str) -> KernelView:
    """`view` with every kernel inside one call of the module at `root` (of class `cls`): the graph is
    that call's whole code, forward or backward (Dynamo compiled the module's call on its own, to its
    return), and Dynamo records no call of the frame's own module."""
    call = ModuleCall(root, cls, 0)
    ops = [
        Kernel(op.index, op.name, op.names, (call, *(op.chain or ())), op.first_line, op.last_line, op.hoisted, markers=op.markers,
               parts=op.parts)
        for op in view.ops
    ]
    return KernelView(ops, view.phase, view.name, {root: cls, **view.classes})
