"""A module call's backward range from pre-hooks on autograd nodes (`emission.eager`).

torch's full backward hooks wrap every output of a hooked module in an extra autograd node (they
cost 9 to 14% of a launch-bound GPU step); these hooks add no node. A `BackwardCall` is made per
call that may get a backward range, in the forward pre-hook, with the call's arguments. Its range opens when the node that
computed the call's outputs is about to run (their gradients have arrived) and closes when the
node that computed each of its inputs is about to run (their gradients are complete).

One pre-hook per autograd node serves every call: the node's metadata holds the events ("open
this call", "an input of that call is done") in the order the forward registered them, and the
pre-hook runs them in reverse. The forward nests calls, so the reverse is the order their
backward ranges must take: the call that consumed a tensor closes before the call that produced
it opens; an outer call that shares an output with its last submodule opens before it; a call
that returns its input unchanged opens and closes at once. A tensor of the call's arguments whose
node does not run (``torch.autograd.grad`` with it as ``inputs``) leaves the range open for its
owner to close. `benchmarks/eager_hooks.py` measures the cost against hand-written hooks.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..internals.autograd import autograd_internals

__all__ = ["BACKWARD_HOOK_FUNCTIONS", "BackwardCall", "BackwardOwner"]


class BackwardOwner(Protocol):
    """What a `BackwardCall` asks of the hooks that made it (`runtime.hook_ranges.HookRanges`)."""

    def open_backward(self, attributes: list[Any], task: int) -> Any: ...  # push these ranges; what to hand `close_backward`

    def close_backward(self, opened: Any) -> None: ...  # pop them, and what is still open inside


class BackwardCall:
    """One module call's backward range. A call whose inputs need no gradient keeps its range
    open for its owner to close (with the range around it, or at the end of the backward); so
    does a call whose inputs' nodes do not run (``torch.autograd.grad`` with that input as
    ``inputs``). Each backward through the call's graph (``retain_graph=True``) opens the range
    again. `attributes`: the ranges to push (its owner's, gates already applied)."""

    # The hooks run on every module call of a training step: they stay flat (no frame they can
    # spare), measured in benchmarks/eager_hooks.py against hand-written hooks.
    __slots__ = ("owner", "attributes", "inputs", "waiting", "opened", "task", "leaf_handles")

    def __init__(self, owner: BackwardOwner, attributes: list[Any], args: Any, kwargs: Any = None) -> None:
        """A call about to run with `args` and `kwargs` (from the forward pre-hook): notes the
        nodes that computed its input tensors now, so that an in-place op in the call
        (ReLU(inplace=True)) leaves the input as it came in. A leaf input (no node) gets a tensor
        hook, which is dropped once it has fired: a leaf keeps its hooks."""
        self.owner, self.attributes = owner, attributes
        self.opened: Any = None  # what `open_backward` returned, while the range is open
        self.leaf_handles: list[Any] | None = None
        # One tensor in, one out: the usual call, without the general loop (measured: the
        # general loop alone made benchmarks/eager_hooks.py's forward-and-backward ratio about
        # 0.7% higher). Each Python frame or loop spared here counts: among a step's other code a
        # hook's frame measured about 1 us, far more than alone.
        if not kwargs and len(args) == 1 and isinstance(args[0], _Tensor or _tensor_type()):
            tensor = args[0]
            if tensor.requires_grad:
                node = tensor.grad_fn
                if node is None:
                    self.leaf_handles = [tensor.register_hook(self._leaf_done)]
                else:
                    (node.metadata.get(_EVENTS) or _new_events(node)).append((self, False))
                self.inputs = 1
            else:
                self.inputs = 0
        else:
            self._note_inputs(args, kwargs)

    def _note_inputs(self, args: Any, kwargs: Any) -> None:
        self.inputs = 0
        seen: list[Any] = []
        for tensor in tensors_in(args) + tensors_in(kwargs) if kwargs else tensors_in(args):
            if not tensor.requires_grad:
                continue
            node = tensor.grad_fn
            if node is None:
                if self.leaf_handles is None:
                    self.leaf_handles = []
                self.leaf_handles.append(tensor.register_hook(self._leaf_done))
                self.inputs += 1
            elif node not in seen:
                seen.append(node)
                (node.metadata.get(_EVENTS) or _new_events(node)).append((self, False))
                self.inputs += 1

    def outputs_ready(self, output: Any) -> None:
        """Notes the nodes that computed the call's `output` (from the forward hook)."""
        if isinstance(output, _Tensor or _tensor_type()):  # the usual call
            node = output.grad_fn
            if node is not None:
                metadata = node.metadata
                events = metadata.get(_EVENTS)
                if events is None:  # `_new_events`, inline: the output's node is usually new
                    events = metadata[_EVENTS] = _Events()
                    node.register_prehook(events)
                events.append((self, True))
            elif self.leaf_handles:  # no backward through this call
                self._drop_leaf_hooks()
            return
        seen: list[Any] = []
        for tensor in tensors_in(output):
            node = tensor.grad_fn
            if node is not None and node not in seen:
                seen.append(node)
                (node.metadata.get(_EVENTS) or _new_events(node)).append((self, True))
        if not seen and self.leaf_handles:  # no backward through this call
            self._drop_leaf_hooks()

    def _leaf_done(self, grad: Any) -> None:
        _Events([(self, False)])(None)

    def _drop_leaf_hooks(self) -> None:
        for handle in self.leaf_handles or ():
            handle.remove()
        self.leaf_handles = None


_EVENTS = "nvtx_regions events"  # the key of an autograd node's metadata: what its pre-hook runs


class _Events(list):
    """The events of one autograd node, (call, True) to open a call's range, (call, False) for an
    input of a call done; and the node's pre-hook, which runs them in reverse."""

    __slots__ = ()

    def __call__(self, grad_outputs: Any) -> None:
        task = _graph_task()
        for call, opens in reversed(self):
            if opens:
                if call.opened is None or call.task != task:
                    call.opened, call.task, call.waiting = call.owner.open_backward(call.attributes, task), task, call.inputs
            elif call.opened is not None:
                call.waiting -= 1
                if call.waiting == 0:
                    opened, call.opened = call.opened, None
                    call.owner.close_backward(opened)
                    if call.leaf_handles:
                        call._drop_leaf_hooks()


# The hooks autograd calls, made by `internals.dynamo.run_outside_dynamo` (by `ModuleRanges`, once:
# that imports torch).
BACKWARD_HOOK_FUNCTIONS = (_Events.__call__, BackwardCall._leaf_done)


def _new_events(node: Any) -> _Events:
    """The events of `node`'s pre-hook, registered with its first event (a node's events are
    never empty once made: an empty list here means a new node)."""
    events = node.metadata[_EVENTS] = _Events()
    node.register_prehook(events)
    return events


def _graph_task() -> int:
    global _graph_task
    _graph_task = autograd_internals().graph_task_id  # looked up once
    return _graph_task()


_Tensor: Any = None


def _tensor_type() -> Any:
    global _Tensor
    if _Tensor is None:
        import torch

        _Tensor = torch.Tensor
    return _Tensor


def tensors_in(value: Any) -> list[Any]:
    """The tensors of a hook's arguments or a module's output (nested in tuples, lists and dicts)."""
    if isinstance(value, _tensor_type()):
        return [value]
    found: list[Any] = []
    _collect(value, found)
    return found


def _collect(value: Any, found: list[Any]) -> None:
    if isinstance(value, (tuple, list)):
        items: Any = value
    elif isinstance(value, dict):
        items = value.values()
    else:
        values = getattr(value, "values", None)  # a ModelOutput of transformers
        if not callable(values):
            return
        items = values()
    for item in items:
        if isinstance(item, _Tensor):
            found.append(item)
        elif item is not None and not isinstance(item, (int, float, bool, str)):
            _collect(item, found)
