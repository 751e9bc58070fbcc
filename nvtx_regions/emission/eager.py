"""A spec's ranges on the module calls of an eager `torch.nn.Module`, as hooks.

    import nvtx_regions
    with nvtx_regions.annotate(model, "each module <transformer.h.*>"):
        model(idx, targets)[1].backward()

Which module gets which range comes from the same engine as on the thunder
and Inductor backends: `compile_spec`, then `make_plan` over the view of the
model's module tree (`emission.eager_view`), one view per pass. So the ranges
have the messages, nesting, domain, colours and categories that
`NvtxProfileTransform` and `NvtxInductor` give the same spec, and an eager
profile compares with a thunder or an Inductor one range by range
(``nvtx-regions compare``). A forward range is the module's path
(``transformer.h.0``; the root module's class name); its backward range adds
``" (backward)"``.

Eager runs ``each module <...>`` and ``each class <...>`` rules, joined with
``and`` to ``forward`` / ``backward``, to ``module <...>`` / ``class <...>``
(only modules at or below a matching path in ``model.named_modules()``) and
to the run-time gates ``rank in <...>`` and ``steps a..b``. A step is one call
of the root model's ``forward`` (from 0) and the backward that follows it. An
``each marker <...>`` rule adds nothing: the model's own markers run in eager
as written, which is what the thunder side re-emits. Rules that select ops of
a trace are left out, with one `NvtxRegionsWarning` naming them
(`selection.support`; ``strict=True``: `SelectorError`), and the rest runs.

How the ranges are made, and the promises that follow:
- forward: a forward pre-hook pushes, a forward hook registered with
  ``always_call=True`` pops, so a module that raises still pops its range;
- backward, without torch's full backward hooks (they wrap every output in an
  extra autograd node, and cost 9 to 14% of a launch-bound GPU step): the
  pre-hook puts a hook on each input tensor that needs a gradient, the forward
  hook a pre-hook on the autograd nodes of the outputs. The range opens when
  the gradient of the call's outputs arrives and closes once the gradients of
  all its inputs are computed (autograd runs a node's tensor hooks before its
  pre-hooks, so the range of the call that consumed an output closes before
  the range of the call that produced it opens). A call none of whose inputs
  needs a gradient (an embedding of token ids, usually the root) keeps its
  range open until the range around it closes or the backward ends;
- a module called twice per step (shared weights) gets two ranges each way;
- ranges nest, and the NVTX stack of each thread stays balanced: ranges a
  failed backward left open on a thread are popped at the root's next
  forward call on that thread, at the end of a `nvtx_regions.steps` step, or
  by `remove()`;
- gates (``steps a..b``, ``rank in <...>``) read the one step clock
  (`runtime.clock`), as on every backend;
- `remove()` removes every module hook, and restores each module's hook
  dicts exactly; hooks already on tensors of a graph not yet run backward do
  nothing more than close an empty range.

Limits: on CUDA, autograd runs backward on its own threads: the backward
ranges are pushed and popped there, and ranges a failed backward leaves there
are not recovered.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from ..internals.autograd import autograd_internals
from ..core.naming import DEFAULT_DOMAIN, module_call_name, range_message, rule_category, rule_color
from ..core.profiling import DEFAULT_SELECT
from ..language.parse import given_spec, spec_from_arguments
from ..selection.compile import CompiledRule, CompiledSpec, EachMarkerRule, compile_spec
from ..selection.explanation import Explanation, explain_views
from ..selection.plan import make_plan
from ..selection.support import report_unsupported, restrict
from ..selection.unselected import RuleTally
from .backward_hooks import BackwardCall
from .eager_view import module_views
from ..runtime.clock import current_rank, current_step, watch_step_gates
from ..runtime.domain import Domain, calls_of
from ..runtime.ranges import leave_open
from ..runtime.sinks import NVTX_ONLY, chosen_sinks

__all__ = ["annotate", "EagerAnnotation", "EagerRule", "HANDLE"]

HANDLE = "nvtx_regions_backend"  # the attribute of a model that holds its annotation (see `EagerAnnotation`)


@dataclass(frozen=True)
class EagerRule:
    """One rule of the spec as the hooks gate it (`compiled.gate`); its index is its rule number."""

    compiled: CompiledRule


@dataclass
class _Open:
    """Ranges one hook call pushed, on one thread's stack."""

    kind: str  # "forward" or "backward"
    module: int  # id() of the module, for forward
    pushed: int  # NVTX ranges pushed (gated-off ones are not)
    task: int = -1  # autograd graph task, for backward
    call: Any = None  # a forward's `BackwardCall`, whose backward range its outputs' hooks open


@dataclass
class _Target:
    """One hooked module: its ranges per pass, as (rule index, prebuilt attributes), in push order."""

    module: Any
    path: str
    forward: list[tuple[int, Any]] = field(default_factory=list)
    backward: list[tuple[int, Any]] = field(default_factory=list)


class EagerAnnotation:
    """The hooks `annotate` put on a model. `remove()` takes them off; also a context manager.

    `explain()` says what each rule selected; `messages` lists the ranges of a step.
    One annotation per model: it is the model's ``nvtx_regions_backend`` (what
    `nvtx_regions.explain(model)` reads, as on an Inductor-compiled model), and a new one on the
    same model removes the last one first, so a notebook cell run again does not stack hooks.
    """

    def __init__(
        self, model: Any, compiled: CompiledSpec, domain: str | None, *, strict: bool = False, sinks: tuple[str, ...] = NVTX_ONLY
    ) -> None:
        self.model = model
        self.compiled = restrict(compiled, "eager")
        self.rules = [EagerRule(rule) for rule in self.compiled.rules]
        self.domain_name = domain
        self.domain = Domain(domain, sinks)
        self._calls = calls_of(self.domain)
        watch_step_gates(self.compiled.rules)
        self._gated = any(rule.gate is not None for rule in self.compiled.rules)
        self._open_rules = [self._is_open(r, 0) for r in self.rules]
        self._local = threading.local()
        self._handles: list[Any] = []
        self._targets: list[_Target] = []
        self._removed = False
        report_unsupported(self.compiled, strict=strict, stacklevel=3)
        previous = vars(model).get(HANDLE)
        if isinstance(previous, EagerAnnotation) and previous.model is model:  # not a copy's
            previous.remove()
        try:
            self._install()
            self._report_unselected(strict)
        except BaseException:
            self.remove()
            raise
        setattr(model, HANDLE, self)

    # -- public ----------------------------------------------------------------

    @property
    def messages(self) -> list[tuple[str, str]]:
        """(pass, message) of every range a step emits per module call, in module order."""
        out = []
        for target in self._targets:
            name = module_call_name(target.path, type(target.module).__name__)
            out += [("forward", range_message(name, "forward"))] * len(target.forward)
            out += [("backward", range_message(name, "backward"))] * len(target.backward)
        return out

    def explain(
        self, select: str | None = None, *, spec: str | os.PathLike[str] | None = None, max_ops: int = 12
    ) -> Explanation:
        """What each rule of this annotation's spec (or of `select`/`spec`) selects in the model's module tree."""
        given = spec_from_arguments(select, spec)
        compiled = self.compiled if given is None else restrict(compile_spec(given), "eager")
        plans = self._plans if given is None else None
        modules = len(self.views[0].ops)
        header = f"annotate({type(self.model).__name__}): {modules} module{'s' * (modules != 1)}, forward and backward"
        return explain_views(
            compiled, self.views, unit="module", plans=plans, header=header, max_ops=max_ops, domain=self.domain_name
        )

    def remove(self) -> None:
        """Remove every hook and restore each module's hook state; pop ranges left open on this thread."""
        if self._removed:
            return
        self._removed = True
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if vars(self.model).get(HANDLE) is self:
            delattr(self.model, HANDLE)
        self._recover()

    def __deepcopy__(self, memo: Any) -> EagerAnnotation:
        # A deep copy of the model (an EMA copy, say) copies its hook dicts, whose hooks are bound
        # to this annotation (a thread-local stack cannot be copied). They do nothing on the copy's
        # modules: the copy has no range until it is annotated or compiled itself.
        return self

    def __enter__(self) -> EagerAnnotation:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    # -- which modules get which ranges ---------------------------------------

    def _install(self) -> None:
        import torch

        self._autograd = autograd_internals()
        self._grad_enabled = torch.is_grad_enabled
        self.views = module_views(self.model)
        self._plans = [make_plan(self.compiled, view, self.domain_name) for view in self.views]
        targets: dict[int, _Target] = {}
        for view, plan in zip(self.views, self._plans):
            for planned in plan.ranges:
                op = view.ops[planned.start]
                target = targets.get(op.index)
                if target is None:
                    target = targets[op.index] = _Target(op.module, op.path)
                rule = self.compiled.rules[planned.rules[0]]
                color, category = rule_color(rule.number), rule_category(rule.rule)
                attributes = self.domain.attributes(planned.label, color=color, category=category)
                getattr(target, view.phase).append((rule.number, attributes))
        self._targets = [targets[index] for index in sorted(targets)]
        # The root's pre-hook runs first, before any range of the root is pushed.
        self._handles.append(self.model.register_forward_pre_hook(self._root_pre_hook, prepend=True))
        for target in self._targets:
            module = target.module
            self._handles.append(module.register_forward_pre_hook(self._pre_hook(target), with_kwargs=True))
            self._handles.append(module.register_forward_hook(self._post_hook(target), with_kwargs=True, always_call=True))

    def _report_unselected(self, strict: bool) -> None:
        """Warn (with `strict`, raise `SelectorError`) for each rule that selected no module call, as
        every backend does (`RuleTally`); `each marker` rules add nothing in eager, by design."""
        tally = RuleTally(self.compiled)
        for view, plan in zip(self.views, self._plans):
            tally.add(plan, view)
        tally.report(strict=strict, where=f"the module calls of this {type(self.model).__name__}", skip=(EachMarkerRule,), stacklevel=4)

    # -- hooks -----------------------------------------------------------------

    def _stack(self) -> list[_Open]:
        stack = self._local.__dict__.get("stack")
        if stack is None:
            stack = self._local.stack = []
            self._local.tasks = set()
        return stack

    def _is_open(self, rule: EagerRule, step: int) -> bool:
        gate = rule.compiled.gate
        return gate is None or gate.is_open(current_rank(), step)

    def _root_pre_hook(self, module: Any, args: Any) -> None:
        if module is not self.model:  # a deep copy's
            return
        if self._autograd.graph_task_id() == -1:
            # Outside any backward nothing of ours is open on this thread,
            # unless a backward raised with ranges open.
            self._recover()
        if self._gated:
            step = current_step()
            self._open_rules = [self._is_open(r, step) for r in self.rules]

    def _push(self, entries: list[tuple[int, Any]]) -> int:
        push, domain = self._calls.push, self._calls.domain_argument
        pushed = 0
        for index, attributes in entries:
            if self._open_rules[index]:
                push(attributes, domain)
                pushed += 1
        return pushed

    def _pop(self, stack: list[_Open], position: int) -> None:
        """Pop the NVTX ranges of `stack[position:]`, innermost first, and drop those entries."""
        pop = self._calls.pop
        for entry in reversed(stack[position:]):
            for _ in range(entry.pushed):
                pop()
        del stack[position:]

    # -- what a `BackwardCall` asks of its owner ---------------------------------

    def graph_task(self) -> int:
        return self._autograd.graph_task_id()

    def open_backward(self, entries: list[tuple[int, Any]]) -> _Open:
        stack = self._stack()
        task = self._autograd.graph_task_id()
        if task not in self._local.tasks:
            self._local.tasks.add(task)
            leave_open(self._recover)  # a backward that raises calls no hook of ours
            # Closes what is still open when this backward succeeds (a call none of whose
            # inputs needs a gradient, or whose inputs' gradients were not all computed).
            self._autograd.queue_callback(lambda: self._end_task(task))
        entry = _Open("backward", -1, self._push(entries), task)
        stack.append(entry)
        return entry

    def close_backward(self, entry: _Open) -> None:
        stack = self._stack()
        for position in range(len(stack) - 1, -1, -1):
            if stack[position] is entry:
                self._pop(stack, position)
                return

    def _recover(self) -> None:
        stack = self._stack()
        self._pop(stack, 0)
        self._local.tasks.clear()

    def _pre_hook(self, target: _Target) -> Callable[..., None]:
        forward, backward, owner = target.forward, target.backward, target.module
        grad_enabled, key = self._grad_enabled, id(owner)

        def forward_pre_hook(module: Any, args: Any, kwargs: Any) -> None:
            if module is not owner:  # a deep copy's module, which has a copy of this hook
                return
            call = BackwardCall.before(self, backward, (args, kwargs)) if backward and grad_enabled() else None
            self._stack().append(_Open("forward", key, self._push(forward) if forward else 0, call=call))

        return forward_pre_hook

    def _post_hook(self, target: _Target) -> Callable[..., None]:
        key = id(target.module)

        def forward_hook(module: Any, args: Any, kwargs: Any, output: Any) -> None:
            if id(module) != key:  # a deep copy's module
                return
            stack = self._stack()
            for position in range(len(stack) - 1, -1, -1):
                entry = stack[position]
                if entry.kind == "forward" and entry.module == key:
                    self._pop(stack, position)
                    if entry.call is not None:
                        entry.call.outputs_ready(output)
                    return

        return forward_hook

    def _end_task(self, task: int) -> None:
        stack = self._stack()
        self._local.tasks.discard(task)
        position = len(stack)
        while position and stack[position - 1].task == task:
            position -= 1
        self._pop(stack, position)


def annotate(
    model: Any,
    select: str | None = None,
    *,
    spec: Any = None,
    domain: str | None = DEFAULT_DOMAIN,
    strict: bool = False,
    emit: Any = None,
) -> EagerAnnotation:
    """Put NVTX ranges on the module calls of an eager `model` that the spec selects.

    `select`, `spec` (a ``.nvtx`` file) and `domain` mean what they mean for
    `NvtxProfileTransform`; with neither `select` nor `spec` the spec is
    ``each module <**>`` (every module). `emit`: where the ranges go, ``"nvtx"``,
    ``"record_function"`` (torch.profiler) or both (None: ``$NVTX_REGIONS_EMIT``, else
    NVTX). Returns an `EagerAnnotation`:
    call ``remove()`` or use it as a context manager.

    Raises `SelectorSyntaxError` for text that does not parse and
    `SelectorError` for a spec error (as every backend does). Rules that eager
    cannot express (they select ops of a trace) are left out with one
    `NvtxRegionsWarning` naming them; a rule that matches no module of
    `model` gets a `NvtxRegionsWarning` with the nearest module names.
    `strict=True` makes both a `SelectorError`, and no hooks stay.
    """
    if select is not None and not isinstance(select, str):
        raise TypeError(f"select= takes spec text (str), not {type(select).__name__}")
    if domain is not None and not isinstance(domain, str):
        raise TypeError(f"domain= takes a str or None, not {type(domain).__name__}")
    if not hasattr(model, "named_modules") or not hasattr(model, "register_forward_pre_hook"):
        raise TypeError(f"annotate() takes a torch.nn.Module, not {type(model).__name__}")
    sinks = chosen_sinks(emit, where="annotate")
    parsed = given_spec(select, spec, default=DEFAULT_SELECT, where="annotate", strict=bool(strict), stacklevel=2)
    return EagerAnnotation(model, compile_spec(parsed), domain, strict=bool(strict), sinks=sinks)
