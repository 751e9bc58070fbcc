"""A module call's backward range from pre-hooks on autograd nodes (`emission.eager`).

torch's full backward hooks wrap every input and output of a hooked module in a Python autograd
function (they cost 9 to 14% of a launch-bound GPU step); these hooks add at most one C++ node per
input (an alias, `BackwardCall`). A `BackwardCall` is made per call that may get a backward range, in
the forward pre-hook, with the call's arguments. Its range opens when the node that computed the
call's outputs is about to run (their gradients have arrived) and closes when the call's own
backward is done: when the node of each input's alias is about to run (eager's annotation), or the
node that computed each input (Inductor's calls outside its graphs: their gradients are complete).

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
    again. `attributes`: the ranges to push (its owner's, gates already applied).

    Each tensor argument that needs a gradient (positional, or a keyword's value) reaches the call
    as an alias of itself (``tensor[...]``, `replaced`: what the forward pre-hook returns), whose one
    autograd node runs once this call's backward has given that input every gradient it gives it:
    the range ends where the call's own backward does, whoever else reads the same tensor (siblings
    on a shared input, a residual stream), instead of where the tensor's whole gradient is done. A
    tensor nested deeper (in a tuple, a list or a dict) keeps the node that computed it, or a hook
    where it is a leaf: its range ends where that tensor's gradient is complete."""

    # The hooks run on every module call of a training step: they stay flat (no frame they can
    # spare), measured in benchmarks/eager_hooks.py against hand-written hooks.
    __slots__ = ("owner", "attributes", "inputs", "waiting", "opened", "task", "leaf_handles", "replaced", "aliases")

    def __init__(self, owner: BackwardOwner, attributes: list[Any], args: Any, kwargs: Any = None, alias: bool = False) -> None:
        """A call about to run with `args` and `kwargs` (from the forward pre-hook, registered with
        ``with_kwargs``). With `alias`, `replaced` is what that hook returns: ``(args, kwargs)`` with
        the aliases in, or None where no argument needed one. Without, each input tensor's own node
        (a leaf's hook) ends the range, noted now, so that an in-place op in the call
        (ReLU(inplace=True)) leaves the input as it came in."""
        self.owner, self.attributes = owner, attributes
        self.opened: Any = None  # what `open_backward` returned, while the range is open
        self.leaf_handles: list[Any] | None = None
        self.replaced: tuple[Any, Any] | None = None
        # Per alias: (the alias, its version, the node that computed the tensor); one triple alone in the usual call.
        self.aliases: Any = None
        # One tensor in, one out: the usual call, without the general loop (measured: the
        # general loop alone made benchmarks/eager_hooks.py's forward-and-backward ratio about
        # 0.7% higher). Each Python frame or loop spared here counts: among a step's other code a
        # hook's frame measured about 1 us, far more than alone.
        if not kwargs and len(args) == 1 and isinstance(args[0], _Tensor or _tensor_type()):
            tensor = args[0]
            if not tensor.requires_grad:
                self.inputs = 0
                return
            self.inputs = 1
            node = tensor.grad_fn
            if alias:
                made = tensor[...]
                _new_events(made.grad_fn).append((self, False))
                self.aliases = (made, made._version, node)
                self.replaced = ((made,), kwargs if kwargs is not None else {})
            elif node is None:
                self.leaf_handles = [tensor.register_hook(self._leaf_done)]
            else:
                (node.metadata.get(_EVENTS) or _new_events(node)).append((self, False))
        else:
            self._note_inputs(args, kwargs, alias)

    def _note_inputs(self, args: Any, kwargs: Any, alias: bool) -> None:
        self.inputs = 0
        tensor_type = _tensor_type()
        if alias:
            made: dict[int, Any] = {}  # id of a tensor -> its alias: a tensor passed twice (attn(h, h, h)) stays one

            def alias_of(value: Any) -> Any:
                if not isinstance(value, tensor_type) or not value.requires_grad:
                    return value
                found = made.get(id(value))
                if found is None:
                    found = made[id(value)] = value[...]
                    _new_events(found.grad_fn).append((self, False))
                    self.aliases = self.aliases or []
                    self.aliases.append((found, found._version, value.grad_fn))
                    self.inputs += 1
                return found

            new_args = tuple(alias_of(value) for value in args)
            new_kwargs = {name: alias_of(value) for name, value in kwargs.items()} if kwargs else {}
            if made:
                self.replaced = (new_args, new_kwargs)
            # Tensors nested in the arguments (a tuple, a list, a dict) keep their own nodes.
            values = [value for value in (*args, *(kwargs.values() if kwargs else ())) if not isinstance(value, tensor_type)]
            tensors = tensors_in(values) if values else []
        else:
            tensors = tensors_in(args) + tensors_in(kwargs) if kwargs else tensors_in(args)
        seen: list[Any] = []
        for tensor in tensors:
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

    def _after_in_place(self, alias: Any, version: int, node: Any) -> None:
        """From the forward hook: where an in-place op of the call on `alias` (ReLU(inplace=True)) took
        the alias's node out of the graph, that input is done where the tensor's whole gradient is, at
        the node that computed it before the call (a leaf's alias allows no in-place op)."""
        if alias._version != version and node is not None:
            (node.metadata.get(_EVENTS) or _new_events(node)).append((self, False))

    def outputs_ready(self, output: Any) -> None:
        """Notes the nodes that computed the call's `output` (from the forward hook)."""
        aliases = self.aliases
        if aliases is not None:
            self.aliases = None
            if type(aliases) is tuple:  # the usual call: one alias, no in-place op
                if aliases[0]._version != aliases[1]:
                    self._after_in_place(*aliases)
            else:
                for each in aliases:
                    self._after_in_place(*each)
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
