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
- backward: ``register_full_backward_pre_hook`` pushes when the gradient of
  the module's outputs arrives, ``register_full_backward_hook`` pops once the
  gradient of its inputs is computed. A module none of whose inputs needs a
  gradient (an embedding of token ids, usually the root) gets its backward
  hook from torch right after the pre-hook; its range then stays open until
  the range around it closes or the backward ends (torch also warns once
  about that hook);
- a module called twice per step (shared weights) gets two ranges each way;
- ranges nest, and the NVTX stack of each thread stays balanced: ranges a
  failed backward left open on a thread are popped at the root's next
  forward call on that thread, or by `remove()`;
- `remove()` removes every hook and restores each module's hook state
  exactly (the hook dicts and ``_is_full_backward_hook``).

Limits: an in-place operation on the output of a module with backward hooks
fails in torch ("... is a view and is being modified inplace"); restrict such
rules with ``and forward``. On CUDA, autograd runs backward on its own
threads, and ranges a failed backward leaves there are not recovered.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from ..internals.autograd import autograd_internals, full_backward_hook_flag, restore_full_backward_hook_flag
from ..core.globs import name_matcher, path_matcher
from ..core.naming import DEFAULT_DOMAIN, module_call_name, range_message, rule_category, rule_color
from ..core.profiling import DEFAULT_SELECT
from ..language.parse import given_spec, spec_from_arguments
from ..language.tree import EachClass, EachModule, conjuncts
from ..selection.compile import CompiledRule, CompiledSpec, EachRule, compile_spec
from ..selection.explanation import Explanation, explain_views
from ..selection.plan import make_plan
from ..selection.support import report_unsupported, restrict
from ..selection.unselected import nearest, report_unselected
from .eager_view import module_views
from ..runtime.clock import current_rank, current_step, watch_step_gates
from ..runtime.domain import Domain, calls_of
from ..runtime.ranges import leave_open
from ..runtime.sinks import NVTX_ONLY, chosen_sinks

__all__ = ["annotate", "EagerAnnotation", "EagerRule"]


@dataclass(frozen=True)
class EagerRule:
    """One rule of the spec as the hooks gate it (`compiled.gate`); its index is its rule number."""

    compiled: CompiledRule


@dataclass
class _Open:
    """Ranges one hook call pushed, on one thread's stack."""

    kind: str  # "forward" or "backward"
    module: int  # id() of the module
    pushed: int  # NVTX ranges pushed (gated-off ones are not)
    task: int = -1  # autograd graph task, for backward
    node: Any = None  # the autograd node whose hook pushed, for backward
    deferred: bool = False  # torch called the backward hook early: close with the enclosing range


@dataclass
class _Target:
    """One hooked module: its ranges per pass, as (rule index, prebuilt attributes), in push order."""

    module: Any
    path: str
    forward: list[tuple[int, Any]] = field(default_factory=list)
    backward: list[tuple[int, Any]] = field(default_factory=list)
    was_full_backward_hook: Any = None


class EagerAnnotation:
    """The hooks `annotate` put on a model. `remove()` takes them off; also a context manager.

    `steps` is how many times the root model's forward has been called (gates read the step
    clock, `runtime.clock`, as on every backend);
    `explain()` says what each rule selected; `messages` lists the ranges of a step.
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
        self.steps = 0
        self._open_rules = [self._is_open(r, 0) for r in self.rules]
        self._local = threading.local()
        self._handles: list[Any] = []
        self._targets: list[_Target] = []
        self._removed = False
        report_unsupported(self.compiled, strict=strict, stacklevel=3)
        try:
            self._install()
            self._report_unselected(strict)
        except BaseException:
            self.remove()
            raise

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
        for target in self._targets:
            restore_full_backward_hook_flag(target.module, target.was_full_backward_hook)
        self._recover()

    def __enter__(self) -> EagerAnnotation:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    # -- which modules get which ranges ---------------------------------------

    def _install(self) -> None:
        self._autograd = autograd_internals()
        self.views = module_views(self.model)
        self._plans = [make_plan(self.compiled, view, self.domain_name) for view in self.views]
        targets: dict[int, _Target] = {}
        for view, plan in zip(self.views, self._plans):
            for planned in plan.ranges:
                op = view.ops[planned.start]
                target = targets.get(op.index)
                if target is None:
                    was = full_backward_hook_flag(op.module)
                    target = targets[op.index] = _Target(op.module, op.path, was_full_backward_hook=was)
                rule = self.compiled.rules[planned.rules[0]]
                color, category = rule_color(rule.number), rule_category(rule.rule)
                attributes = self.domain.attributes(planned.label, color=color, category=category)
                getattr(target, view.phase).append((rule.number, attributes))
        self._targets = [targets[index] for index in sorted(targets)]
        # The step counter runs first, before any range of the root is pushed.
        self._handles.append(self.model.register_forward_pre_hook(self._root_pre_hook, prepend=True))
        for target in self._targets:
            module = target.module
            if target.forward:
                self._handles.append(module.register_forward_pre_hook(self._forward_push(target)))
                self._handles.append(module.register_forward_hook(self._forward_pop(target), always_call=True))
            if target.backward:
                try:
                    self._handles.append(module.register_full_backward_pre_hook(self._backward_push(target)))
                    self._handles.append(module.register_full_backward_hook(self._backward_pop(target)))
                except RuntimeError as error:
                    raise RuntimeError(
                        f"annotate(): module {target.path or type(module).__name__!r} has a backward hook "
                        f"from register_backward_hook, and torch allows no full backward hook next to it ({error}); "
                        "remove that hook, or restrict the rule with 'and forward'"
                    ) from None

    def _report_unselected(self, strict: bool) -> None:
        """Warn (with `strict`, raise `SelectorError`) for each each-module/class rule that matches no module."""
        model = self.model
        paths = [path for path, _ in model.named_modules() if path]
        classes = sorted({type(m).__name__ for m in model.modules()})
        problems = []
        for rule in self.compiled.rules:
            if not isinstance(rule, EachRule) or any(plan.per_rule[rule.number].ranges for plan in self._plans):
                continue  # `each marker` rules add nothing in eager, by design
            each = rule.each
            if each.never:
                reason = "'forward and backward' is never true"
            else:
                (written,) = [e for e in conjuncts(rule.rule.expr) if isinstance(e, (EachModule, EachClass))]
                names = paths if each.by == "module" else classes
                matcher = path_matcher if each.by == "module" else name_matcher
                missing = [g for g in written.globs if not any(map(matcher((g,)), names))]
                if missing:
                    hint = nearest(missing[0], names)
                    reason = f"{each.by} {missing[0]!r} matches no module of this {type(model).__name__}{hint}"
                else:
                    reason = "its 'module <...>' / 'class <...>' scope excludes every module it matches"
            problems.append(f"{rule.describe()} selected no module; {reason}")
        report_unselected(problems, strict=strict, stacklevel=4)

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
        if self._autograd.graph_task_id() == -1:
            # Outside any backward nothing of ours is open on this thread,
            # unless a backward raised with ranges open.
            self._recover()
        self.steps += 1
        if any(rule.compiled.gate is not None for rule in self.rules):
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

    def _recover(self) -> None:
        stack = self._stack()
        self._pop(stack, 0)
        self._local.tasks.clear()

    def _forward_push(self, target: _Target) -> Callable[..., None]:
        entries, key = target.forward, id(target.module)

        def forward_pre_hook(module: Any, args: Any) -> None:
            self._stack().append(_Open("forward", key, self._push(entries)))

        return forward_pre_hook

    def _forward_pop(self, target: _Target) -> Callable[..., None]:
        key = id(target.module)

        def forward_hook(module: Any, args: Any, output: Any) -> None:
            stack = self._stack()
            for position in range(len(stack) - 1, -1, -1):
                if stack[position].kind == "forward" and stack[position].module == key:
                    self._pop(stack, position)
                    return

        return forward_hook

    def _backward_push(self, target: _Target) -> Callable[..., None]:
        entries, key = target.backward, id(target.module)
        autograd = self._autograd

        def backward_pre_hook(module: Any, grad_output: Any) -> None:
            stack = self._stack()
            task = autograd.graph_task_id()
            if task not in self._local.tasks:
                self._local.tasks.add(task)
                leave_open(self._recover)  # a backward that raises calls no hook of ours
                # Closes what is still open when this backward succeeds (e.g. a
                # deferred range, or a module whose inputs' gradients were not asked for).
                autograd.queue_callback(lambda: self._end_task(task))
            stack.append(_Open("backward", key, self._push(entries), task, autograd.autograd_node()))

        return backward_pre_hook

    def _backward_pop(self, target: _Target) -> Callable[..., None]:
        key = id(target.module)
        autograd = self._autograd

        def backward_hook(module: Any, grad_input: Any, grad_output: Any) -> None:
            stack = self._stack()
            task = autograd.graph_task_id()
            for position in range(len(stack) - 1, -1, -1):
                entry = stack[position]
                if entry.kind == "backward" and entry.module == key and entry.task == task and not entry.deferred:
                    if entry.node is not None and entry.node is autograd.autograd_node():
                        # No input needs a gradient: torch calls this hook from the
                        # pre-hook's node, before the module's backward has run.
                        entry.deferred = True
                    else:
                        self._pop(stack, position)
                    return

        return backward_hook

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
