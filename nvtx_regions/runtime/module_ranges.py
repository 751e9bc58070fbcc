"""A spec's ranges around module calls, from module hooks: the one front end of eager's annotation
(`emission.eager`) and of `NvtxInductor`'s calls outside its graphs (`inductor.outside`).

A `ModuleRanges` holds the `HookTarget` of each module it gives ranges (what `hook_targets` made of
a spec's plans) and one forward pre-hook and one forward hook, the same two functions on each of
its modules, under one hook id per kind (`internals.module_hooks`), which find the module's target
by its id. Both front ends' calls behave alike:

- The pre-hook pushes the call's forward ranges whose gates are open and puts an entry on its
  thread's stack (`runtime.hook_ranges`); the forward hook, registered with ``always_call=True``,
  pops them, with whatever the call left open inside, even when the call raised.
- A call's backward range (`runtime.backward_hooks.BackwardCall`) takes every tensor of its
  arguments as an input, positional or keyword (a module with backward ranges gets its pre-hook
  ``with_kwargs``); it is prepared only where grad mode is on.
- Inside a backward, a forward call is activation checkpointing's recompute: it gets no forward
  range (Inductor's graphs recompute it inside the backward's kernels); a reentrant checkpoint's
  backward runs through it, so its backward range is prepared as usual.
- Gates (``steps a..b``, ``rank in <...>``) are read when the call starts, from the one step
  clock (`runtime.clock`), for the call's forward ranges and the backward ranges that follow it.
- Under Dynamo the hooks do nothing but call `on_traced` (traced into a graph they would break
  it); Dynamo never compiles them, nor what they call, as frames of their own
  (`internals.dynamo.run_outside_dynamo`), so a hook that runs in Python inside a compiled call
  (``fullgraph=True`` too) keeps its range and adds no compile. A module this front end did not
  hook (a deep copy's, which carries copies of the hook dicts) gets nothing from them.
- `recover_at_root()`, called where a root call starts, pops what a failed backward or an
  interrupted forward left open (`HookRanges.recover`).
- A `CallsWait` (Inductor's first step: `inductor.first_step`) may make a call's forward ranges
  wait for the end of a compile, or give it none (its range is in a graph).

The common call (no gate, nothing waiting) takes one path without loops or extra frames: the
hooks run on every module call of a training step (`benchmarks/eager_hooks.py` measures them
against hand-written hooks).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Protocol

from ..core.naming import rule_category, rule_color
from ..internals.dynamo import run_outside_dynamo
from ..internals.module_hooks import HookIds, register_hooks
from .backward_hooks import BACKWARD_HOOK_FUNCTIONS, BackwardCall
from .clock import current_rank, current_step
from .domain import Domain, calls_of
from .hook_ranges import CALL, MODULE, PUSHED, HookRanges

__all__ = ["HookTarget", "ModuleRanges", "CallsWait", "hook_targets", "WHOLE", "WAIT", "NOW", "FLUSH", "DECIDE"]

WHOLE, WAIT, NOW = range(3)  # what a `CallsWait` decides for a call's forward ranges
# A target's `waits`: its calls push what waits (FLUSH), and ask what to do with their own (DECIDE).
FLUSH, DECIDE = 1, 2


class CallsWait(Protocol):
    """Calls whose forward ranges may wait (`inductor.first_step.FirstStep`)."""

    waiting: list[Any]  # the ranges that wait now, if any

    def flush(self) -> None: ...  # push every waiting range now

    def decide(self, module: Any) -> int: ...  # WHOLE (no range), WAIT or NOW

    def wait(self, ranges: HookRanges, stack: list, attributes: list[Any], module: Any, noted: Any) -> None: ...


class HookTarget:
    """One hooked module's ranges: `forward` and `backward`, each (rule number, gate, attributes), in
    push order. `ran`: a call of it got ranges from the hooks (`explain`, the tally); `waits`: 0, or
    what its calls ask of the front end's `CallsWait` (`FLUSH`, `DECIDE`: set by the owner)."""

    __slots__ = ("module", "key", "path", "forward", "backward", "attributes", "backward_attributes", "gated",
                 "plain", "ran", "waits", "__weakref__")  # fmt: skip

    def __init__(self, module: Any, path: str) -> None:
        self.module = weakref.ref(module)
        self.key = id(module)
        self.path = path
        self.forward: list[tuple[int, Any, Any]] = []
        self.backward: list[tuple[int, Any, Any]] = []
        self.ran = False
        self.waits = 0

    def finish(self) -> HookTarget:
        """Prebuild what the hooks read on every call, once its ranges are in."""
        self.attributes = [attributes for _, _, attributes in self.forward]
        self.backward_attributes = [attributes for _, _, attributes in self.backward]
        self.gated = any(gate is not None for _, gate, _ in self.forward + self.backward)
        # The stack entry of a call with no backward range to prepare and no gate: one object,
        # made once, which the forward hook recognises by identity.
        self.plain = (self.key, len(self.forward), -1, None)
        return self

    @property
    def rules(self) -> set[int]:
        return {rule for rule, _, _ in self.forward + self.backward}


def hook_targets(compiled: Any, views: Any, plans: Any, domain: Domain, keep: Callable[[Any, Any], bool] | None = None) -> list[HookTarget]:
    """The target of each module the `plans` (one per view of `views`, `emission.eager_view`) give a
    range, in module order; `keep(planned, rule)` chooses the planned ranges (all by default). Each
    range has the message of its plan and the colour and category of its rule, as on every backend."""
    targets: dict[int, HookTarget] = {}
    for view, plan in zip(views, plans):
        for planned in plan.ranges:
            rule = compiled.rules[planned.rules[0]]
            if keep is not None and not keep(planned, rule):
                continue
            op = view.ops[planned.start]
            target = targets.get(op.index)
            if target is None:
                target = targets[op.index] = HookTarget(op.module, op.path)
            attributes = domain.attributes(planned.label, color=rule_color(rule.number), category=rule_category(rule.rule))
            (target.forward if view.phase == "forward" else target.backward).append((rule.number, rule.gate, attributes))
    return [targets[index].finish() for index in sorted(targets)]


def _nothing() -> None:
    return None


class ModuleRanges:
    """The hooks of one owner (an annotation, a backend) on the modules it gives ranges (see the module doc)."""

    def __init__(self, domain: Domain, *, on_traced: Callable[[], Any] = _nothing, alias_inputs: bool = False) -> None:
        for function in BACKWARD_HOOK_FUNCTIONS:  # idempotent, and cheap: per front end, never per call
            run_outside_dynamo(function)
        self.domain = domain
        self.alias_inputs = alias_inputs  # a call's backward range ends with its own backward (`BackwardCall`)
        self.ranges = HookRanges(calls_of(domain))
        self.targets: dict[int, HookTarget] = {}  # id of a module -> its target
        self.waits: CallsWait | None = None
        self._ids = HookIds()  # one id per kind for all: Dynamo's guards on hook ids then pass on every layer
        self._handles: dict[int, list[Any]] = {}  # id of a module -> its hooks' handles, while they are on
        self.pre_hook, self.post_hook = self._hooks(on_traced)

    # -- which modules carry the hooks -----------------------------------------

    def add(self, target: HookTarget) -> None:
        """Give the calls of `target`'s module its ranges, once it is hooked (`hook`). Nothing of it
        stays here once the module is gone (a new module may have its id)."""
        module = target.module()
        if module is None or self.targets.get(target.key) is target:
            return
        front, key = weakref.ref(self), target.key

        def gone(ref: Any) -> None:
            found = front()
            if found is not None and getattr(found.targets.get(key), "module", None) is ref:
                del found.targets[key]
                found._handles.pop(key, None)

        target.module = weakref.ref(module, gone)
        self.targets[key] = target

    def hook(self, target: HookTarget) -> None:
        """Put the hooks on `target`'s module, unless they are on (or it is gone)."""
        self.add(target)
        module = target.module()
        if module is not None and target.key not in self._handles:
            self._handles[target.key] = register_hooks(
                module, self.pre_hook, self.post_hook, with_kwargs=bool(target.backward), ids=self._ids
            )

    def unhook(self, key: int) -> None:
        """Take the hooks off the module of id `key` (its target stays: `hook` puts them back)."""
        for handle in self._handles.pop(key, ()):
            handle.remove()

    def forget(self, key: int) -> None:
        """Take the hooks off the module of id `key` and drop its target."""
        self.unhook(key)
        self.targets.pop(key, None)

    def remove(self) -> None:
        """Take every hook off; no range from now on (a graph recorded before gets none); pop what is
        open on this thread."""
        for key in list(self._handles):
            self.unhook(key)
        self.ranges.remove()

    def recover_at_root(self) -> None:
        """A root call starts: outside any backward nothing of ours is open on this thread, unless a
        backward raised with ranges open (autograd calls no hook of ours then) or a forward was
        interrupted; pop that, and mark other threads' leftovers (`HookRanges.mark_others_stale`)."""
        ranges = self.ranges
        if ranges.autograd.graph_task_id() == -1:
            if ranges.stack():
                ranges.recover()
            ranges.mark_others_stale()

    # -- the hooks -------------------------------------------------------------

    def _hooks(self, on_traced: Callable[[], Any]) -> tuple[Callable[..., None], Callable[..., None]]:
        import torch

        targets, ranges, front = self.targets, self.ranges, self
        local, stack_of, push, pop, domain = ranges.local, ranges.stack, ranges.push, ranges.pop, ranges.domain_argument
        in_backward, grad_enabled, compiling, new_call = ranges.autograd.graph_task_id, torch.is_grad_enabled, torch.compiler.is_compiling, BackwardCall
        alias = self.alias_inputs

        def forward_pre_hook(module: Any, args: Any, kwargs: Any = None) -> tuple[Any, Any] | None:
            if compiling():  # under Dynamo: nothing; first, so Dynamo reads no more
                on_traced()
                return
            target = targets.get(id(module))
            if target is None or target.module() is not module:  # a module not hooked here (a deep copy's)
                return
            try:
                stack = local.stack
            except AttributeError:
                stack = stack_of()
            if target.gated or target.waits:
                return front._pre(target, module, stack, args, kwargs)
            target.ran = True
            if in_backward() != -1:  # activation checkpointing's recompute (see the module doc)
                call = new_call(ranges, target.backward_attributes, args, kwargs, alias) if target.backward and grad_enabled() else None
                stack.append((target.key, 0, -1, call))
                return None if call is None else call.replaced
            attributes = target.attributes
            # Before the push: the inputs' aliases are the caller's work, not the call's.
            call = new_call(ranges, target.backward_attributes, args, kwargs, alias) if target.backward and grad_enabled() else None
            # One range, the usual case, is pushed without a loop: in a training step, where the
            # hooks run among much other code, a loop measured about 1 us a call (eager_hooks.py).
            if len(attributes) == 1:
                push(attributes[0], domain)
            else:
                for each in attributes:
                    push(each, domain)
            if call is None:
                stack.append(target.plain)
                return None
            stack.append((target.key, len(attributes), -1, call))
            return call.replaced  # the arguments with their aliases (`BackwardCall`)

        def forward_hook(module: Any, args: Any, output: Any) -> None:
            if compiling():
                return
            target = targets.get(id(module))
            if target is None or target.module() is not module:
                return
            if target.waits and front.waits is not None and front.waits.waiting:
                front.waits.flush()  # a call that ends with its ranges waiting ran in Python
            try:
                stack = local.stack
            except AttributeError:
                stack = stack_of()
            entry = stack[-1] if stack else None
            if entry is target.plain:  # no backward range to prepare, no gate, nothing left open inside
                stack.pop()
                if entry[PUSHED] == 1:
                    pop()
                else:
                    for _ in range(entry[PUSHED]):
                        pop()
                return
            if entry is not None and entry[MODULE] == target.key:  # nothing left open inside
                stack.pop()
                for _ in range(entry[PUSHED]):
                    pop()
            else:
                # What the call left open inside goes with it; a hook put on a module while it ran
                # gets a forward hook's call without the pre-hook's: nothing to pop.
                entry = ranges.close_forward(stack, target.key)
                if entry is None:
                    return
            if entry[CALL] is not None:
                entry[CALL].outputs_ready(output)

        return run_outside_dynamo(forward_pre_hook), run_outside_dynamo(forward_hook)

    def _pre(self, target: HookTarget, module: Any, stack: list, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        """A pre-hook's work where the target has gates or its calls may wait; what the pre-hook returns."""
        import torch

        waits, decision = self.waits if target.waits else None, NOW
        if waits is not None:
            if waits.waiting:  # a call inside a call whose ranges wait: that one runs in Python
                waits.flush()
            decision = waits.decide(module) if target.waits == DECIDE else NOW
            if decision == WHOLE:  # its ranges are in its graph
                stack.append((target.key, 0, -1, None))
                return None
        noted = target.ran
        target.ran = True
        recompute = self.ranges.autograd.graph_task_id() != -1  # activation checkpointing (see the module doc)
        opened = [] if recompute else _open(target.forward)
        call = None
        if target.backward and torch.is_grad_enabled():
            call = BackwardCall(self.ranges, _open(target.backward), args, kwargs, self.alias_inputs)
        if waits is not None and decision == WAIT and opened:
            waits.wait(self.ranges, stack, opened, module, None if noted else target)
            opened = []
        push, domain = self.ranges.push, self.ranges.domain_argument
        for attributes in opened:
            push(attributes, domain)
        stack.append((target.key, len(opened), -1, call))
        return None if call is None else call.replaced


def _open(entries: list[tuple[int, Any, Any]]) -> list[Any]:
    """The attributes of `entries` whose gates are open now."""
    opened = []
    step = rank = None
    for _, gate, attributes in entries:
        if gate is not None:
            if step is None:
                step, rank = current_step(), current_rank()
            if not gate.is_open(rank, step):
                continue
        opened.append(attributes)
    return opened
