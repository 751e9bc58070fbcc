"""Ranges for the module calls that run outside every graph Inductor compiled.

After a graph break inside a module, that module's call is in no graph: it
runs in Python, with Dynamo compiling its code on its own, a graph before the
break and one after. After a break inside a loop, Dynamo runs the frame as it
is, and the ``torch.nn`` modules it calls run uncompiled. Such a call gets
its ``each module``/``each class`` range from hooks on the module, as eager
gives it.

Promises:
- In the step that compiles, every module the spec gives a range carries the
  hooks, kept off while Dynamo compiles, so that no graph holds them and no
  guard watches them (`inductor.first_step`): that step's calls get their
  ranges too, none twice. Where ``torch._dynamo.reset()`` cleared Dynamo's
  compile callbacks in that step, a graph compiled then holds the hooks, and
  Dynamo guards them: they stay for good, so that nothing recompiles
  (`EveryModel.compiling`).
- After it, hooks stay only on the modules that need them (`need`), as the
  backend finds them: the modules whose code Dynamo compiled on its own, with
  every module above them, when such a graph loads; the selected modules that
  no graph holds, at the first step's end. A model without graph breaks keeps
  no hook and costs what it cost.
- The hooks act only when the call runs in Python: traced into a graph, they
  do nothing (``torch.compiler.is_compiling()``), and add no graph break.
  Dynamo never compiles the hooks themselves
  (`internals.dynamo.run_outside_dynamo`).
- A call's forward range opens before its code runs and closes after it
  returns or raises; its backward range opens when the gradient of its
  outputs arrives and closes once the gradients of its inputs are computed (at
  the end of the backward when no input needs one), as eager's do
  (`runtime.backward_hooks`, `runtime.hook_ranges`). The ranges inside it
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
from ..runtime.backward_hooks import BACKWARD_HOOK_FUNCTIONS, BackwardCall
from ..emission.eager_view import module_views
from ..internals.dynamo import outside_compiles, run_outside_dynamo
from ..internals.module_hooks import HookIds, register_hooks
from ..runtime.clock import current_rank, current_step
from ..runtime.domain import Domain, calls_of
from ..runtime.hook_ranges import CALL, MODULE, PUSHED, HookRanges
from ..selection.compile import CompiledSpec, EachRule
from ..selection.plan import make_plan
from .first_step import NOW, STEP_FUNCTIONS, WAIT, WHOLE, FirstStep

__all__ = ["OutsideCalls", "EveryModel", "above"]

_installed: "weakref.WeakKeyDictionary[Any, OutsideCalls]" = weakref.WeakKeyDictionary()


class OutsideCalls:
    """The hooks that give a module call outside every graph its ranges (see the module doc)."""

    def __init__(
        self, compiled: CompiledSpec, model: Any, domain: str | None, sinks: tuple[str, ...], ids: HookIds, first_step: FirstStep
    ) -> None:
        self.domain = Domain(domain, sinks)
        self.first_step = first_step  # the backend's (`EveryModel`)
        self._hook_ids = ids  # shared by every model of the backend (`EveryModel`)
        self._ranges = HookRanges(calls_of(self.domain))
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
        self.selected = list(self._targets)  # the paths the spec gives a range
        self.hooked: set[str] = set()  # the paths `need` asked for: hooked for good
        self._wanted: dict[int, Any] = {}  # id of a module that carries the hooks -> the module, weakly
        self._for_first_step: set[int] = set()  # those of them that carry them for the first step only
        self._handles: dict[int, list[Any]] = {}  # id of a module -> its hooks' handles, while they are on
        self._on = True  # False while Dynamo compiles, during the first step
        previous = _installed.get(model)
        if previous is not None:
            previous.remove()
        _installed[model] = self

    def need(self, paths: Any) -> None:
        """Put the hooks on the modules of `paths` that the spec gives a range and that have none yet,
        for good."""
        for path in paths:
            target = self._targets.get(path)
            if target is None or path in self.hooked:
                continue
            module = target[0]()
            if module is None:
                continue
            self.hooked.add(path)
            key = id(module)
            if key in self._for_first_step:  # carries them already: keep them
                self._for_first_step.discard(key)
            elif key not in self._wanted:  # else hooked under another path already
                self._want(module, target)

    def start_first_step(self) -> None:
        """Hook every module the spec gives a range, until `end_first_step` (`EveryModel.add`)."""
        for target in self._targets.values():
            module = target[0]()
            if module is not None and id(module) not in self._wanted:
                self._for_first_step.add(id(module))
                self._want(module, target)

    def end_first_step(self) -> None:
        """Take the first step's hooks off the modules `need` did not ask for, and put the others on."""
        for key in self._for_first_step:
            self._unwant(key)
        self._for_first_step.clear()
        self.put_on()

    def take_off(self) -> None:
        """Take every hook off for now (`put_on` puts them back)."""
        self._on = False
        for handles in self._handles.values():
            for handle in handles:
                handle.remove()
        self._handles.clear()

    def put_on(self) -> None:
        """Put the hooks back on every module that carries them."""
        self._on = True
        for key, module in list(self._wanted.items()):
            self._register(key, module())

    def remove(self) -> None:
        """Take the hooks off."""
        self.take_off()
        for key in list(self._wanted):
            self._unwant(key)
        self._for_first_step.clear()
        self.hooked.clear()
        self._ranges.remove()

    def _want(self, module: Any, target: tuple[Any, ...]) -> None:
        # Plain functions, the same for every module, that find the module's ranges by its id; one hook
        # id per kind for all, so that Dynamo's guards on them pass from one layer to the next.
        _targets[id(module)] = (self, *target[1:])
        self._wanted[id(module)] = weakref.ref(module)
        self._register(id(module), module)

    def _register(self, key: int, module: Any) -> None:
        if self._on and module is not None and key not in self._handles:
            self._handles[key] = register_hooks(module, _pre_hook, _post_hook, with_kwargs=False, ids=self._hook_ids)

    def _unwant(self, key: int) -> None:
        for handle in self._handles.pop(key, ()):
            handle.remove()
        self._wanted.pop(key, None)
        if _targets.get(key, (None,))[0] is self:
            del _targets[key]

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
    ranges, first = owner._ranges, owner.first_step
    if first.waiting:  # a call inside a call whose ranges wait: that one runs in Python
        first.flush()
    decision = first.decide(module) if id(module) in owner._for_first_step else NOW
    if decision == WHOLE:  # its ranges are in its graph (`inductor.first_step`)
        ranges.stack().append((id(module), 0, -1, None))
        return
    noted = decision != WAIT or path in owner.ran  # before `_open` notes it
    # Inside a backward, a forward call is activation checkpointing's recompute: no forward range,
    # as on eager (`emission.eager`); a reentrant checkpoint's backward still runs through it.
    opened = owner._open(path, forward) if ranges.autograd.graph_task_id() == -1 else []
    call = None
    if backward and torch.is_grad_enabled():
        call = BackwardCall(ranges, owner._open(path, backward), args)
    stack = ranges.stack()
    if decision == WAIT and opened:
        first.wait(ranges, stack, opened, module, None if noted else (owner.ran, path))
        opened = []
    for attributes in opened:
        ranges.push(attributes, ranges.domain_argument)
    stack.append((id(module), len(opened), -1, call))


def _post_hook(module: Any, args: Any, output: Any) -> None:
    if _compiling():
        return
    target = _targets.get(id(module))
    if target is None:
        return
    owner = target[0]
    if owner.first_step.waiting:  # a call that ends with its ranges waiting ran in Python
        owner.first_step.flush()
    ranges = owner._ranges
    stack = ranges.stack()
    # Only what this call's pre-hook opened: hooks put on a module while it runs (the graph break was
    # found compiling its code) get a post-hook call without a pre-hook call.
    if stack and stack[-1][MODULE] == id(module):
        entry = stack.pop()
        for _ in range(entry[PUSHED]):
            ranges.pop()
        if entry[CALL] is not None:
            entry[CALL].outputs_ready(output)


_kept_out: list[bool] = []


def _keep_out_of_dynamo() -> None:
    """Dynamo never compiles the hooks as frames of their own (traced into a graph they do nothing,
    and outside one they run in Python), nor what they call: it would try each as a frame of its own,
    to no graph, in the compile step. Once, when the first backend is made (it imports torch)."""
    if not _kept_out:
        _kept_out.append(True)
        for function in (_pre_hook, _post_hook, *BACKWARD_HOOK_FUNCTIONS, BackwardCall.__init__, BackwardCall.outputs_ready, *STEP_FUNCTIONS):
            run_outside_dynamo(function)


class EveryModel:
    """The `OutsideCalls` of every model one backend compiles (each held weakly, its hooks going with
    it), and the paths whose calls need hooks in all of them: a model added later gets those too."""

    def __init__(self, compiled: CompiledSpec, domain: str | None, sinks: tuple[str, ...]) -> None:
        self._compiled, self._domain, self._sinks = compiled, domain, sinks
        _keep_out_of_dynamo()
        self._calls: weakref.WeakKeyDictionary[Any, OutsideCalls] = weakref.WeakKeyDictionary()
        self._needed: set[str] = set()
        self._hook_ids = HookIds()  # every model's hooks under the same ids
        self._watches: list[Any] = []  # the handles of `watch_first_call`'s hooks
        self.first_step = FirstStep()
        self._listening: list[Callable[[], None]] = []  # stops `outside_compiles`, in the first step
        weakref.finalize(self, _stop, self._listening)  # Dynamo's callbacks go with the backend
        self._first_step_over = False
        self._traced = False  # a graph was compiled with the first step's hooks on (`compiling`)

    def add(self, model: Any) -> bool:
        """Hook `model` as the others are; False if it was already."""
        if model in self._calls:
            return False
        calls = OutsideCalls(self._compiled, model, self._domain, self._sinks, self._hook_ids, self.first_step)
        calls.need(self._needed)
        self._calls[model] = calls
        if not self._first_step_over:
            # Until the first step ends, every module the spec gives a range carries the hooks, so that
            # the calls of the step that compiles which run in Python (across a graph break, or
            # uncompiled) have their ranges, as on eager. The hooks are off while Dynamo compiles
            # (`internals.dynamo.outside_compiles`): no graph holds them and no guard watches them, so
            # taking them off after that step costs no recompile, and a graph costs what it cost.
            if not self._listening:
                self.first_step.add(model)
                self._listen()
            calls.start_first_step()
        return True

    def need(self, paths: Any) -> None:
        """Hook the calls of `paths` outside every graph, in every model."""
        paths = set(paths)
        self._needed |= paths
        for calls in self.all():
            calls.need(paths)

    def compiling(self, module: Any, whole: bool) -> None:
        """Dynamo compiles a graph for the backend now, of `module`'s forward, `whole` or not
        (`first_step.FirstStep.compiled`). In the first step the hooks are off while it does, unless
        ``torch._dynamo.reset()`` cleared Dynamo's compile callbacks (`outside_compiles`): then the
        hooks on now were traced into this graph, and Dynamo guards them. So they stay as they are in
        the first step, for good (the first step never ends), and the callbacks are registered again."""
        self.first_step.compiled(module, whole)
        if self._listening and not self._traced and any(calls._on for calls in self.all()):
            self._traced = True
            _stop(self._listening)
            self._listen()

    def _listen(self) -> None:
        every = weakref.ref(self)  # Dynamo's callbacks keep no backend alive
        self._listening.append(outside_compiles(lambda: _put_on(every), lambda: _take_off(every)))

    def first_step_over(self) -> None:
        """The first step ended (its backward, or the next call): the hooks stay only where `need` put them
        (unless a graph holds them: `compiling`)."""
        self._first_step_over = True
        if self._listening and not self._traced:
            _stop(self._listening)
            self.first_step.flush()
            for calls in self.all():
                calls.end_first_step()

    def watch_first_call(self, model: Any, compiled_anything: Callable[[], bool], say: Callable[[str], None]) -> None:
        """After the first call of `model` that runs in Python (traced into a graph, the hook does nothing):
        if Dynamo compiled nothing for the backend by then (`compiled_anything()` is false: a graph break
        it could not resume from made it run the whole call uncompiled, or the parts compiled on their
        own compiled nothing), keep the hooks of the first step on every call the spec gives a range, as
        on eager, and `say` why, once. Nothing after that call."""

        def after_first_call(module: Any, args: Any, output: Any) -> None:
            if _compiling():
                return
            handle.remove()
            calls = self.all()
            if compiled_anything() or not calls:
                return
            self.need(path for path in calls[0].selected if path)  # the model's own call: as `_complete`
            self.first_step_over()  # no graph's backward will end it
            say(
                "Dynamo compiled no graph in the model's first call, so it ran without torch.compile "
                "(TORCH_LOGS=graph_breaks says why: a graph break it could not resume from, say). Its module "
                "calls get their ranges from hooks, as on eager"
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
        if self._listening:
            _stop(self._listening)
            self.first_step.flush()
        for handle in self._watches:
            handle.remove()
        for calls in self.all():
            calls.remove()


def above(path: str) -> list[str]:
    """`path` and the path of every module above it, but the model's own (``""``)."""
    parts = path.split(".") if path else []
    return [".".join(parts[:depth]) for depth in range(1, len(parts) + 1)]


def _put_on(every: "weakref.ref[EveryModel]") -> None:
    """At the end of a Dynamo compile, in the first step: the hooks back on, and the ranges that wait
    pushed or dropped (`first_step`)."""
    found = every()
    if found is not None:
        for calls in found.all():
            calls.put_on()
        found.first_step.resolve()


def _take_off(every: "weakref.ref[EveryModel]") -> None:
    found = every()
    if found is not None:
        for calls in found.all():
            calls.take_off()


def _stop(listening: list[Callable[[], None]]) -> None:
    """Stop listening to Dynamo's compiles (`internals.dynamo.outside_compiles`)."""
    while listening:
        listening.pop()()
