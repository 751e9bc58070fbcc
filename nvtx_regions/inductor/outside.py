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
- The hooks are eager's: one module-hook front end (`runtime.module_ranges`),
  one per backend, whose two hook functions every model of the backend
  carries. A call's forward range opens before its code runs and closes after
  it returns or raises; its backward range opens when the gradient of its
  outputs arrives and closes once the gradients of its inputs (positional or
  keyword) are computed, at the end of the backward when no input needs one.
  The ranges inside it (its graphs' kernels, its submodules' calls) nest
  inside.
- The messages, colours, categories, gates and domain are those the spec gives
  the same module under eager and in a wrapper: the module's path, and its
  path with `` (backward)``.
- One set of hooks per model: backends made alike (a backend per layer) share
  one `EveryModel` (`EveryModel.of`), and a new `OutsideCalls` on the same
  model, another backend's, removes the last one's. A module reachable under
  several paths is hooked once, under the first that needs it.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

from ..emission.eager_view import module_views
from ..internals.dynamo import outside_compiles, run_outside_dynamo
from ..internals.frames import outside_package
from ..runtime.handle import take_model
from ..runtime.domain import Domain
from ..runtime.module_ranges import DECIDE, FLUSH, HookTarget, ModuleRanges, hook_targets
from ..selection.compile import CompiledSpec, EachRule
from ..selection.plan import make_plan
from . import state
from .first_step import FirstStep

__all__ = ["OutsideCalls", "EveryModel", "above"]


def _each_range(planned: Any, rule: Any) -> bool:
    """The planned ranges that hooks give: an ``each module``/``each class`` rule's."""
    return planned.kind == "region" and isinstance(rule, EachRule)


class OutsideCalls:
    """Which modules of one model carry the hooks (see the module doc); the hooks are its backend's
    (`EveryModel.front`, the module-hook front end `runtime.module_ranges`)."""

    def __init__(self, compiled: CompiledSpec, model: Any, domain: str | None, front: ModuleRanges) -> None:
        self.front = front
        views = module_views(model)
        plans = [make_plan(compiled, view, domain) for view in views]
        targets = hook_targets(compiled, views, plans, front.domain, keep=_each_range)
        self._targets: dict[str, HookTarget] = {}
        for target in targets:
            self._targets.setdefault(target.path, target)
        self.selected = list(self._targets)  # the paths the spec gives a range
        self.hooked: set[str] = set()  # the paths `need` asked for: hooked for good
        self._wanted: dict[int, HookTarget] = {}  # id of a module that carries the hooks -> its target
        self._for_first_step: set[int] = set()  # those of them that carry them for the first step only
        self._in_first_step = False
        self._on = True  # False while Dynamo compiles, during the first step
        previous = state.hooked.get(model)
        if previous is not None:
            previous.remove()
        state.hooked[model] = self

    def need(self, paths: Any) -> None:
        """Put the hooks on the modules of `paths` that the spec gives a range and that have none yet,
        for good."""
        for path in paths:
            target = self._targets.get(path)
            if target is None or path in self.hooked or target.module() is None:
                continue
            self.hooked.add(path)
            if target.key in self._for_first_step:  # carries them already: keep them
                self._for_first_step.discard(target.key)
                self._wanted[target.key].waits = FLUSH
            elif target.key not in self._wanted:  # else hooked under another path already
                self._want(target, FLUSH if self._in_first_step else 0)

    def start_first_step(self) -> None:
        """Hook every module the spec gives a range, until `end_first_step` (`EveryModel.add`); their
        calls' ranges may wait (`inductor.first_step`)."""
        self._in_first_step = True
        for target in self._targets.values():
            if target.module() is not None and target.key not in self._wanted:
                self._for_first_step.add(target.key)
                self._want(target, DECIDE)

    def end_first_step(self) -> None:
        """Take the first step's hooks off the modules `need` did not ask for, and put the others on."""
        self._in_first_step = False
        for key in self._for_first_step:
            self._unwant(key)
        self._for_first_step.clear()
        for target in self._wanted.values():
            target.waits = 0
        self.put_on()

    def take_off(self) -> None:
        """Take every hook off for now (`put_on` puts them back)."""
        self._on = False
        for key in self._wanted:
            self.front.unhook(key)

    def put_on(self) -> None:
        """Put the hooks back on every module that carries them."""
        self._on = True
        for target in self._wanted.values():
            self.front.hook(target)

    def remove(self) -> None:
        """Take the hooks off."""
        for key in list(self._wanted):
            self._unwant(key)
        self._for_first_step.clear()
        self.hooked.clear()

    def ran(self) -> list[HookTarget]:
        """The targets whose calls got ranges from the hooks so far."""
        return [target for target in self._targets.values() if target.ran]

    def _want(self, target: HookTarget, waits: int) -> None:
        target.waits = waits
        self._wanted[target.key] = target
        self.front.add(target)
        if self._on:
            self.front.hook(target)

    def _unwant(self, key: int) -> None:
        self._wanted.pop(key, None)
        self.front.forget(key)


class EveryModel:
    """The `OutsideCalls` of every model the backends of one key compile (each model held weakly, its
    hooks going with it), and the paths whose calls need hooks in all of them: a model added later
    gets those too. Backends of one key (a backend per layer, made alike) share one (`of`): one set
    of hooks on a model, which knows what every one of their graphs holds, taken off with the last
    of them (`release`)."""

    @classmethod
    def of(cls, key: str, backend: Any, compiled: CompiledSpec, domain: str | None, sinks: tuple[str, ...]) -> EveryModel:
        """The `EveryModel` of the backends of `key`, `backend` among them."""
        found = state.every_model.get(key)
        if found is None or found.removed:
            found = state.every_model[key] = cls(compiled, domain, sinks)
        found._backends.add(backend)
        return found

    def __init__(self, compiled: CompiledSpec, domain: str | None, sinks: tuple[str, ...]) -> None:
        self._compiled, self._domain = compiled, domain
        self._backends: weakref.WeakSet[Any] = weakref.WeakSet()
        self.removed = False
        self.in_graphs: set[str] = set()  # the module paths whose calls a graph of a backend of the key holds
        self.loaded_any = False  # a backend of the key loaded a graph
        self._calls: weakref.WeakKeyDictionary[Any, OutsideCalls] = weakref.WeakKeyDictionary()
        self._needed: set[str] = set()
        self._watches: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()  # model -> its `watch_first_call` hook's handle
        self.first_step = FirstStep()
        # Every model's modules carry the same two hooks, under the same ids: Dynamo's guards on them
        # pass from one model to the next.
        self.front = ModuleRanges(Domain(domain, sinks))
        self.front.waits = self.first_step
        self._listening: list[Callable[[], None]] = []  # stops `outside_compiles`, in the first step
        weakref.finalize(self, run_outside_dynamo(_stop), self._listening)  # Dynamo's callbacks go with the backend
        self._first_step_over = False
        self._traced = False  # a graph was compiled with the first step's hooks on (`compiling`)
        self.compiles_started = 0  # Dynamo's compiles begun in the first step (for any backend)

    def add(self, model: Any) -> bool:
        """Hook `model` as the others are; False if it was already."""
        if model in self._calls:
            return False
        calls = OutsideCalls(self._compiled, model, self._domain, self.front)
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

    def take(self, model: Any, owner: Any, say: Callable[[str], None]) -> None:
        """Hook `model` (`add`) for `owner`, its backend, which becomes the model's owner (one owner per
        model: `runtime.handle.take_model`); a first call that runs in Python with no graph compiled
        is said (`say`) and named by hooks (`watch_first_call`)."""
        take_model(model, owner, stacklevel=outside_package())
        if self.add(model):
            self.watch_first_call(model, lambda: self.loaded_any, say)

    def discard(self, model: Any) -> None:
        """Take `model`'s hooks off (another handle took it: `runtime.handle.take_model`); `add` puts them
        back."""
        calls = self._calls.pop(model, None)
        if calls is not None:
            calls.remove()
        watch = self._watches.pop(model, None)
        if watch is not None:
            watch.remove()

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
        import torch

        def after_first_call(module: Any, args: Any, output: Any) -> None:
            if torch.compiler.is_compiling():
                return
            handle.remove()
            calls = self.all()
            if compiled_anything() or not calls:
                return
            self.need(path for path in calls[0].selected if path)  # the model's own call: as `Tracker.complete`
            self.first_step_over()  # no graph's backward will end it
            if self.compiles_started:
                why = ("Dynamo compiled no graph in the model's first call, so it ran without torch.compile "
                       "(TORCH_LOGS=graph_breaks says why: a graph break it could not resume from, say)")  # fmt: skip
            else:  # a backend made with model= and never given to torch.compile, or the model called directly
                why = ("the model's first call ran without torch.compile: Dynamo compiled nothing in it, for this "
                       "backend or any other. Call what torch.compile(model, backend=...) returned")  # fmt: skip
            say(f"{why}. Its module calls get their ranges from hooks, as on eager")

        handle = model.register_forward_hook(run_outside_dynamo(after_first_call))
        self._watches[model] = handle

    def ranges_from_hooks(self) -> dict[str, set[int]]:
        """The paths whose calls got a range from the hooks so far, in the order of the model's modules,
        each with the numbers of the rules whose ranges they got."""
        ran: dict[str, set[int]] = {}
        for calls in self.all():
            for target in calls.ran():
                ran.setdefault(target.path, set()).update(target.rules)
        first = next(iter(self.all()), None)
        return {path: ran[path] for path in (first.selected if first else []) if path in ran}

    def all(self) -> list[OutsideCalls]:
        return list(self._calls.values())

    def held(self, paths: Any) -> None:
        """A backend of the key loaded a graph that holds the calls of `paths`."""
        self.loaded_any = True
        self.in_graphs.update(paths)

    def release(self, backend: Any) -> None:
        """`backend` is removed: take every hook off unless another backend of the key, alive and not
        removed, still uses them."""
        self._backends.discard(backend)
        if not any(not other.removed for other in self._backends):
            self.remove()

    def remove(self) -> None:
        """Take every model's hooks off."""
        self.removed = True
        if self._listening:
            _stop(self._listening)
            self.first_step.flush()
        for handle in list(self._watches.values()):
            handle.remove()
        for calls in self.all():
            calls.remove()
        self.front.remove()


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
        found.compiles_started += 1
        for calls in found.all():
            calls.take_off()


def _stop(listening: list[Callable[[], None]]) -> None:
    """Stop listening to Dynamo's compiles (`internals.dynamo.outside_compiles`)."""
    while listening:
        listening.pop()()
