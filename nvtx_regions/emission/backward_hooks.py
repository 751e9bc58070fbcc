"""A module call's backward range from hooks on tensors and autograd nodes (`emission.eager`).

torch's full backward hooks wrap every output of a hooked module in an extra autograd node (they
cost 9 to 14% of a launch-bound GPU step); these hooks add no node. A `BackwardCall` is made per
call that may get a backward range, in the forward pre-hook: it hooks each input tensor that
needs a gradient then (before an in-place op inside the call could change which node computes its
gradient), and its outputs' autograd nodes once the call returns (`outputs_ready`).
"""

from __future__ import annotations

import functools
from typing import Any, Protocol

__all__ = ["BackwardCall", "BackwardOwner", "tensors_in"]


class BackwardOwner(Protocol):
    """What a `BackwardCall` asks of the hooks that made it (`emission.eager.EagerAnnotation`)."""

    def graph_task(self) -> int: ...  # the backward running on this thread (-1: none)

    def open_backward(self, entries: Any) -> Any: ...  # push the ranges; what to hand `close_backward`

    def close_backward(self, opened: Any) -> None: ...  # pop them, and what is still open inside


class BackwardCall:
    """One module call's backward range: it opens when the gradient of the call's outputs
    arrives (a pre-hook on their autograd nodes) and closes once the gradients of all its
    inputs are computed (tensor hooks, which autograd runs before the pre-hooks of the same
    node: the range of the call that consumed an output closes before the producer's opens).
    A call whose inputs need no gradient keeps its range open for its owner to close (with the
    range around it, or at the end of the backward). Each backward through the call's graph
    (``retain_graph=True``) opens the range again."""

    __slots__ = ("owner", "entries", "inputs", "waiting", "opened", "task", "leaf_handles")

    def __init__(self, owner: BackwardOwner, entries: Any, inputs: int) -> None:
        self.owner, self.entries, self.inputs = owner, entries, inputs
        self.waiting = inputs
        self.opened: Any = None  # what `open_backward` returned, while the range is open
        self.task = -1
        self.leaf_handles: list[Any] = []

    @classmethod
    def before(cls, owner: BackwardOwner, entries: Any, arguments: Any) -> BackwardCall:
        """A call about to run with `arguments` (from the forward pre-hook): hooks its input tensors
        that need a gradient now, so that an in-place op in the call (ReLU(inplace=True)) leaves
        the hook on the gradient of the input as it came in."""
        inputs = [t for t in tensors_in(arguments) if t.requires_grad]
        call = cls(owner, entries, len(inputs))
        for tensor in inputs:
            handle = tensor.register_hook(call.input_done)
            if tensor.grad_fn is None:  # a leaf keeps its hooks: drop ours once it has fired
                call.leaf_handles.append(handle)
        return call

    def outputs_ready(self, output: Any) -> None:
        """Hook the autograd nodes of the call's `output` (from the forward hook)."""
        nodes = {id(t.grad_fn): t.grad_fn for t in tensors_in(output) if t.grad_fn is not None}
        for node in nodes.values():
            # Calls that share an output (a module and its last submodule) share one pre-hook,
            # which opens the outer call's range first: the calls finish inner first.
            calls = node.metadata.get(_CALLS)
            if calls is None:
                calls = node.metadata[_CALLS] = []
                node.register_prehook(functools.partial(_open_backward_ranges, calls))
            calls.append(self)
        if not nodes:  # no backward through this call
            self._drop_leaf_hooks()

    def gradient_arrived(self) -> None:
        task = self.owner.graph_task()
        if self.opened is None or self.task != task:
            self.opened, self.task = self.owner.open_backward(self.entries), task
            self.waiting = self.inputs

    def input_done(self, grad: Any) -> None:
        """A tensor hook on one input of the call (from the forward pre-hook)."""
        opened = self.opened
        if opened is None:
            return
        self.waiting -= 1
        if self.waiting == 0:
            self.opened = None
            self.owner.close_backward(opened)
            self._drop_leaf_hooks()

    def _drop_leaf_hooks(self) -> None:
        for handle in self.leaf_handles:
            handle.remove()
        self.leaf_handles.clear()


_CALLS = "nvtx_regions calls"  # the key of an autograd node's metadata: the calls that output it


def _open_backward_ranges(calls: list[BackwardCall], grad_outputs: Any) -> None:
    for call in reversed(calls):
        call.gradient_arrived()


def tensors_in(value: Any) -> list[Any]:
    """The tensors of a hook's arguments or a module's output (nested in tuples, lists and dicts)."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in tensors_in(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in tensors_in(item)]
    values = getattr(value, "values", None)  # a ModelOutput of transformers
    return [t for item in values() for t in tensors_in(item)] if callable(values) else []
