"""Ranges for the module calls that run outside every graph Inductor compiled.

After a graph break inside a module, that module's call is in no graph: it
runs in Python, with Dynamo compiling its code on its own, a graph before the
break and one after. After a break inside a loop, Dynamo runs the frame as it
is, and the ``torch.nn`` modules it calls run uncompiled. Such a call gets
its ``each module``/``each class`` range from hooks on the module, as eager
gives it.

Promises:
- Hooks go only on the modules that need them (`need`), as the backend finds
  them: the modules whose code Dynamo compiled on its own, with every module
  above them, when such a graph loads; the selected modules that no graph
  holds, after the first step. A model without graph breaks gets no hook and
  costs what it cost. The calls before a module got its hooks (the step that
  compiled) have no range of it.
- The hooks act only when the call runs in Python: traced into a graph, they
  do nothing (``torch.compiler.is_compiling()``), and add no graph break.
  Dynamo never compiles the hooks themselves
  (`internals.dynamo.run_outside_dynamo`).
- A call's forward range opens before its code runs and closes after it
  returns or raises; its backward range opens when the gradient of its
  outputs arrives and closes once the gradients of its inputs are computed (at
  the end of the backward when no input needs one), as eager's do
  (`emission.backward_hooks`, `runtime.hook_ranges`). The ranges inside it
  (its graphs' kernels, its submodules' calls) nest inside.
- The messages, colours, categories, gates and domain are those the spec gives
  the same module under eager and in a wrapper: the module's path, and its
  path with `` (backward)``.
- One set of hooks per model: a new `OutsideCalls` on the same model removes
  the last one's. A module reachable under several paths is hooked once, under
  the first that needs it.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

from ..core.naming import rule_category, rule_color
from ..emission.backward_hooks import BACKWARD_HOOK_FUNCTIONS, BackwardCall
from ..emission.eager_view import module_views
from ..internals.dynamo import run_outside_dynamo
from ..internals.module_hooks import HookIds, register_hooks
from ..runtime.clock import current_rank, current_step
from ..runtime.domain import Domain, calls_of
from ..runtime.hook_ranges import CALL, MODULE, PUSHED, HookRanges
from ..selection.compile import CompiledSpec, EachRule
from ..selection.plan import make_plan

__all__ = ["OutsideCalls", "EveryModel"]

_installed: "weakref.WeakKeyDictionary[Any, OutsideCalls]" = weakref.WeakKeyDictionary()


class OutsideCalls:
    """The hooks that give a module call outside every graph its ranges (see the module doc)."""

    def __init__(self, compiled: CompiledSpec, model: Any, domain: str | None, sinks: tuple[str, ...], ids: HookIds) -> None:
        self.domain = Domain(domain, sinks)
        self._hook_ids = ids  # shared by every model of the backend (`EveryModel`)
        self._ranges = HookRanges(calls_of(self.domain))
        self._handles: list[Any] = []
        self._ids: list[int] = []
        self.ran: dict[str, set[int]] = {}  # module path -> the rules that gave one of its calls here a range
        # Per module: (module, weakly; path, forward ranges, backward ranges), each range (rule, gate, attributes).
        targets: dict[int, tuple[Any, str, list[tuple[int, Any, Any]], list[tuple[int, Any, Any]]]] = {}
        for view in module_views(model):
            for planned in make_plan(compiled, view, domain).ranges:
                rule = compiled.rules[planned.rules[0]]
                if planned.kind != "region" or not isinstance(rule, EachRule):
                    continue
                op = view.ops[planned.start]
                attributes = self.domain.attributes(planned.label, color=rule_color(rule.number), category=rule_category(rule.rule))
                target = targets.setdefault(op.index, (weakref.ref(op.module), op.path, [], []))
                target[2 if view.phase == "forward" else 3].append((rule.number, planned.gate, attributes))
        self._targets = {path: (module, path, forward, backward) for module, path, forward, backward in targets.values()}
        self.hooked: set[str] = set()
        self.selected = list(self._targets)  # the paths the spec gives a range
        previous = _installed.get(model)
        if previous is not None:
            previous.remove()
        _installed[model] = self

    def need(self, paths: Any) -> None:
        """Put the hooks on the modules of `paths` that the spec gives a range and that have none yet."""
        for path in paths:
            target = self._targets.get(path)
            if target is None or path in self.hooked:
                continue
            module = target[0]()
            if module is None or id(module) in self._ids:  # gone, or hooked under another path already
                continue
            self.hooked.add(path)
            for function in (_pre_hook, _post_hook, *BACKWARD_HOOK_FUNCTIONS):
                run_outside_dynamo(function)
            # Plain functions, the same for every module, that find the module's ranges by its id; one hook
            # id per kind for all, so that Dynamo's guards on them pass from one layer to the next.
            _targets[id(module)] = (self, *target[1:])
            self._handles += register_hooks(module, _pre_hook, _post_hook, with_kwargs=False, ids=self._hook_ids)
            self._ids.append(id(module))

    def remove(self) -> None:
        """Take the hooks off."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for key in self._ids:
            if _targets.get(key, (None,))[0] is self:
                del _targets[key]
        self._ids.clear()
        self.hooked.clear()
        self._ranges.remove()

    def _open(self, path: str, entries: list[tuple[int, Any, Any]]) -> list[Any]:
        """The attributes of `entries` whose gates are open now; notes their rules as having given
        `path` a range."""
        rules = self.ran.get(path)
        if rules is None:
            rules = self.ran[path] = set()
        opened = []
        step = rank = None
        for rule, gate, attributes in entries:
            rules.add(rule)
            if gate is not None:
                if step is None:
                    step, rank = current_step(), current_rank()
                if not any(g.is_open(rank, step) for g in gate):
                    continue
            opened.append(attributes)
        return opened


# id of a hooked module -> (its OutsideCalls, its path, forward ranges, backward ranges)
_targets: dict[int, tuple[OutsideCalls, str, list[tuple[int, Any, Any]], list[tuple[int, Any, Any]]]] = {}


def _compiling() -> bool:
    import torch

    return torch.compiler.is_compiling()


def _pre_hook(module: Any, args: Any) -> None:
    import torch

    if _compiling():
        return
    target = _targets.get(id(module))
    if target is None:
        return
    owner, path, forward, backward = target
    ranges = owner._ranges
    # Inside a backward, a forward call is activation checkpointing's recompute: no forward range,
    # as on eager (`emission.eager`); a reentrant checkpoint's backward still runs through it.
    opened = owner._open(path, forward) if ranges.autograd.graph_task_id() == -1 else []
    for attributes in opened:
        ranges.push(attributes, ranges.domain_argument)
    call = None
    if backward and torch.is_grad_enabled():
        call = BackwardCall(ranges, owner._open(path, backward), args)
    ranges.stack().append((id(module), len(opened), -1, call))


def _post_hook(module: Any, args: Any, output: Any) -> None:
    if _compiling():
        return
    target = _targets.get(id(module))
    if target is None:
        return
    ranges = target[0]._ranges
    stack = ranges.stack()
    # Only what this call's pre-hook opened: hooks put on a module while it runs (the graph break was
    # found compiling its code) get a post-hook call without a pre-hook call.
    if stack and stack[-1][MODULE] == id(module):
        entry = stack.pop()
        for _ in range(entry[PUSHED]):
            ranges.pop()
        if entry[CALL] is not None:
            entry[CALL].outputs_ready(output)


class EveryModel:
    """The `OutsideCalls` of every model one backend compiles (each held weakly, its hooks going with
    it), and the paths whose calls need hooks in all of them: a model added later gets those too."""

    def __init__(self, compiled: CompiledSpec, domain: str | None, sinks: tuple[str, ...]) -> None:
        self._compiled, self._domain, self._sinks = compiled, domain, sinks
        self._calls: weakref.WeakKeyDictionary[Any, OutsideCalls] = weakref.WeakKeyDictionary()
        self._needed: set[str] = set()
        self._hook_ids = HookIds()  # every model's hooks under the same ids
        self._watches: list[Any] = []  # the handles of `watch_first_call`'s hooks

    def add(self, model: Any) -> bool:
        """Hook `model` as the others are; False if it was already."""
        if model in self._calls:
            return False
        calls = OutsideCalls(self._compiled, model, self._domain, self._sinks, self._hook_ids)
        calls.need(self._needed)
        self._calls[model] = calls
        return True

    def need(self, paths: Any) -> None:
        """Hook the calls of `paths` outside every graph, in every model."""
        paths = set(paths)
        self._needed |= paths
        for calls in self.all():
            calls.need(paths)

    def watch_first_call(self, model: Any, compiled_anything: Callable[[], bool], say: Callable[[str], None]) -> None:
        """After the first call of `model` that runs in Python (traced into a graph, the hook does nothing):
        if Dynamo compiled nothing for the backend by then (`compiled_anything()` is false: a graph break
        it could not resume from made it run the whole call uncompiled, or the parts compiled on their
        own compiled nothing), hook every call the spec gives a range, so that from the next call on they
        have them, as on eager, and `say` why, once. Nothing after that call."""

        def after_first_call(module: Any, args: Any, output: Any) -> None:
            if _compiling():
                return
            handle.remove()
            calls = self.all()
            if compiled_anything() or not calls:
                return
            self.need(path for path in calls[0].selected if path)  # the model's own call: as `_complete`
            say(
                "Dynamo compiled no graph in the model's first call, so it ran without torch.compile "
                "(TORCH_LOGS=graph_breaks says why: a graph break it could not resume from, say). Its module "
                "calls get their ranges from hooks from the next call on, as on eager"
            )

        handle = model.register_forward_hook(run_outside_dynamo(after_first_call))
        self._watches.append(handle)

    def ranges_from_hooks(self) -> list[str]:
        """The paths whose calls got a range from the hooks so far, in the order of the model's modules."""
        ran = {path for calls in self.all() for path in calls.ran}
        first = next(iter(self.all()), None)
        return [path for path in (first.selected if first else []) if path in ran]

    def all(self) -> list[OutsideCalls]:
        return list(self._calls.values())

    def remove(self) -> None:
        """Take every model's hooks off."""
        for handle in self._watches:
            handle.remove()
        for calls in self.all():
            calls.remove()
