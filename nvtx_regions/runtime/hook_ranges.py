"""The ranges that module hooks push, at run time: one stack per thread, backward ranges, recovery.

Two front ends put hooks on modules: eager's annotation (`emission.eager`) and `NvtxInductor`'s
hooks on the calls that run outside its graphs (`inductor.outside`). Each decides which module
call gets which ranges and reads its gates; `HookRanges` keeps what they pushed:

- A forward pre-hook pushes a call's ranges and puts an entry on its thread's stack; the forward
  hook pops the entry and, with it, whatever the call left open inside.
- Backward ranges come from a `runtime.backward_hooks.BackwardCall`, whose owner this is
  (`open_backward`, `close_backward`). The first backward range on a thread registers what closes
  the ranges of that backward still open when it succeeds (a call none of whose inputs needs a
  gradient) and what closes them when it raises (`runtime.ranges.leave_open`: autograd calls no
  hook when a backward raises; the next `nvtx_regions.steps` step boundary closes them).
- `recover()` pops everything on this thread's stack: an eager root's next forward calls it
  outside any backward, and `remove()` does. NVTX pops act on the calling thread's stack, so
  what a failed backward left on another thread (autograd's device thread, on CUDA) is popped
  there: the root's next forward marks the other threads' stacks stale (`mark_others_stale`:
  no backward of this thread runs then), and the next backward on such a thread pops them
  before its first range. A backward that another Python thread runs at that very moment on
  the same device thread would lose its open ranges: training that runs steps of one model
  from several threads at once is not supported.

An entry is a tuple (the hooks run on every module call): (id() of the module, for forward, -1
for backward; NVTX ranges pushed, gated-off ones are not; the autograd graph task, for backward,
-1 for forward; a forward's `BackwardCall` or None; and, for backward, the stack it is on).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from ..internals.autograd import autograd_internals
from ..internals.dynamo import run_outside_dynamo
from .domain import NvtxCalls
from .ranges import forget_left_open, leave_open

__all__ = ["HookRanges", "ThreadStack", "MODULE", "PUSHED", "TASK", "CALL"]

MODULE, PUSHED, TASK, CALL = range(4)  # the fields of an entry
_NO_TASK = -2


class ThreadStack(list):
    """One thread's entries, innermost last; `task`: the backward whose end this thread waits for
    (its first range registered the end's callback), `_NO_TASK` if none. A backward nested in
    another (reentrant checkpointing) registers the callback again: `end_task` is harmless twice."""

    __slots__ = ("task", "stale", "__weakref__")

    def __init__(self) -> None:
        super().__init__()
        self.task = _NO_TASK
        self.stale = False  # what it holds was left by a backward that failed (`mark_others_stale`)


class HookRanges:
    """The stacks of one set of hooks (see the module doc), pushing and popping with `calls`."""

    def __init__(self, calls: NvtxCalls) -> None:
        self.push, self.pop, self.domain_argument = calls.push, calls.pop, calls.domain_argument
        self.local = threading.local()
        self.autograd = autograd_internals()
        self.removed = False  # set by the front end's remove(): a graph recorded before gets no range
        # Every live thread's, for `mark_others_stale`; weakly, as a thread's stack goes with its
        # thread-local data when the thread ends (a thread per request must not grow this).
        self._stacks: list[weakref.ref[ThreadStack]] = []
        self._stacks_lock = threading.Lock()  # two threads' first hooks may run at once

    def stack(self) -> ThreadStack:
        """This thread's stack (hooks read ``local.stack`` first, which is faster where it exists)."""
        try:
            return self.local.stack
        except AttributeError:
            stack = self.local.stack = ThreadStack()
            with self._stacks_lock:
                self._stacks = [ref for ref in self._stacks if ref() is not None] + [weakref.ref(stack)]
            return stack

    def mark_others_stale(self) -> None:
        """What other threads hold was left by a backward that failed there: this thread runs no
        backward now, and its backwards ran on them. Their next backward pops it (see the module doc)."""
        mine = self.stack()
        for ref in self._stacks:
            stack = ref()
            if stack and stack is not mine:
                stack.stale = True

    def pop_from(self, stack: list[tuple], position: int) -> None:
        """Pop the NVTX ranges of `stack[position:]`, innermost first, and drop those entries."""
        pop = self.pop
        for entry in reversed(stack[position:]):
            for _ in range(entry[PUSHED]):
                pop()
        del stack[position:]

    def close_forward(self, stack: list[tuple], key: int) -> tuple | None:
        """Pop the entry of the innermost open forward call of the module `key` and what it left
        open inside; that entry, or None where there is none (a hook put on a module while it ran
        gets a forward hook's call without the pre-hook's)."""
        for position in range(len(stack) - 1, -1, -1):
            entry = stack[position]
            if entry[MODULE] == key:
                self.pop_from(stack, position)
                return entry
        return None

    # -- what a `BackwardCall` asks of its owner ---------------------------------

    def open_backward(self, attributes: list[Any], task: int) -> tuple | None:
        """Push `attributes` (the call's backward ranges, gates applied) for the backward `task`."""
        if self.removed:
            return None
        try:
            stack = self.local.stack
        except AttributeError:  # autograd's own thread (CUDA)
            stack = self.stack()
        if stack.task != task:  # the first range of this backward on this thread
            if stack.stale:
                stack.stale = False
                self.pop_from(stack, 0)
            stack.task = task
            leave_open(self.recover)
            self.autograd.queue_callback(run_outside_dynamo(lambda: self.end_task(task)))
        push, domain = self.push, self.domain_argument
        for each in attributes:
            push(each, domain)
        entry = (-1, len(attributes), task, None, stack)
        stack.append(entry)
        return entry

    def close_backward(self, entry: tuple) -> None:
        """Pop `entry`'s ranges and what is still open inside them."""
        stack = entry[4]
        if stack and stack[-1] is entry:  # nothing left open inside: the usual case
            stack.pop()
            pop = self.pop
            for _ in range(entry[PUSHED]):
                pop()
            return
        for position in range(len(stack) - 1, -1, -1):
            if stack[position] is entry:
                self.pop_from(stack, position)
                return

    def end_task(self, task: int) -> None:
        """The backward `task` succeeded: close what it left open on this thread."""
        stack = self.stack()
        if stack.task == task:
            stack.task = _NO_TASK
            forget_left_open(self.recover)
        position = len(stack)
        while position and stack[position - 1][TASK] == task:
            position -= 1
        self.pop_from(stack, position)

    def recover(self) -> None:
        """Pop everything on this thread's stack (what a failed backward or an interrupted forward
        left open)."""
        stack = self.stack()
        self.pop_from(stack, 0)
        stack.task = _NO_TASK

    def remove(self) -> None:
        """No range from now on (a graph recorded before gets none); pop what is open on this thread."""
        self.removed = True
        self.recover()
        forget_left_open(self.recover)
