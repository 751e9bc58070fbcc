"""The step that compiles: every module call that runs in Python has its ranges there too, none twice.

`inductor.outside` hooks the module calls that run outside every graph once the compile step has
shown which (a graph break found, a module that no graph holds). For that step itself, every module
the spec gives a range carries the same hooks until the step ends (`outside.EveryModel.add`), kept off
while Dynamo compiles (`internals.dynamo.outside_compiles`): no graph holds them and no guard watches
them, so taking them off after the step costs no recompile.

Promises:
- A call that runs in Python in the compile step (across a graph break, in a frame Dynamo skipped,
  or uncompiled) gets its ranges, forward and backward, as eager gives them, and as the hooks give
  them from the next step on.
- A call whose range is in a graph gets no second one. A module whose forward Dynamo compiles as a
  frame of its own, to its return (``layer.compile()``, or a module called from a frame Dynamo
  skipped), runs its hooks in Python, but its range is in that graph (`inductor.backend`). Its
  pre-hook cannot know that before Dynamo compiles that forward, so its ranges wait (`wait`) for
  the end of the next compile (`resolve`): a forward compiled whole drops them; anything else pushes
  them then, before any kernel of the call runs (the forward broke, or what Dynamo compiled was
  inside it). A call that starts inside a waiting one, or the waiting call's end, pushes them too.
  Once a forward compiled whole, its next calls get none at once (`decide`). A forward of
  ``torch``'s own modules never waits: Dynamo does not compile it as a frame of its own.
"""

from __future__ import annotations

from typing import Any

from ..runtime.hook_ranges import CALL
from ..runtime.module_ranges import NOW, WAIT, WHOLE
from . import state

__all__ = ["FirstStep"]


def _forward_of(module: Any) -> Any:
    forward = module.forward
    return getattr(forward, "__func__", forward)


class FirstStep:
    """The compile step's bookkeeping of one backend's hooks (see the module doc)."""

    def __init__(self) -> None:
        self.whole: set[Any] | None = None  # the forward functions compiled whole in its first model, once added
        # The ranges that wait: (the hooks' ranges, the thread's stack, the call's entry's index, its
        # forward ranges' attributes, its forward function, and what to forget if they are dropped).
        self.waiting: list[tuple[Any, Any, int, list[Any], Any, Any]] = []

    def add(self, model: Any) -> None:
        """A model of the backend: the first one's forwards compiled whole are the backend's."""
        if self.whole is None:
            self.whole = state.whole_forwards.setdefault(model, set())

    def decide(self, module: Any) -> int:
        """What the pre-hook of `module`'s call, in the compile step, does with its ranges."""
        forward = _forward_of(module)
        if self.whole and forward in self.whole:
            return WHOLE
        return NOW if getattr(forward, "__module__", "").startswith("torch.") else WAIT

    def compiled(self, module: Any, whole: bool) -> None:
        """The backend compiled a graph of `module`'s forward (the frame Dynamo traces); `whole`: the
        graph is its whole call."""
        if self.whole is not None and whole and module is not None:
            self.whole.add(_forward_of(module))

    def wait(self, ranges: Any, stack: Any, attributes: list[Any], module: Any, noted: Any) -> None:
        """The call's ranges wait; its entry goes on `stack` next. `noted`: the call's hook target, whose
        `ran` said that its calls had ranges from hooks (`explain`), taken back if they are dropped."""
        self.waiting.append((ranges, stack, len(stack), attributes, _forward_of(module), noted))

    def resolve(self) -> None:
        """At the end of a compile: drop the waiting ranges of a forward compiled whole, push the others."""
        waiting, self.waiting = self.waiting, []
        for ranges, stack, index, attributes, forward, noted in waiting:
            if self.whole and forward in self.whole:
                call = stack[index][CALL] if index < len(stack) else None
                if call is not None:
                    call.attributes = []  # its backward range is in the graph's backward
                if noted is not None:
                    noted.ran = False
            else:
                _push(ranges, stack, index, attributes)

    def flush(self) -> None:
        """Push every waiting range now (a call starts inside, or a waiting call ends)."""
        waiting, self.waiting = self.waiting, []
        for ranges, stack, index, attributes, _, _ in waiting:
            _push(ranges, stack, index, attributes)


def _push(ranges: Any, stack: Any, index: int, attributes: list[Any]) -> None:
    for attribute in attributes:
        ranges.push(attribute, ranges.domain_argument)
    if index < len(stack):
        entry = stack[index]
        stack[index] = (entry[0], len(attributes), *entry[2:])
