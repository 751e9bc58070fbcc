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
to the run-time gates ``rank in <...>`` and ``steps a..b`` (read at each call of the
root model's ``forward``, for it and the backward that follows it). An
``each marker <...>`` rule adds nothing: the model's own markers run in eager
as written, which is what the thunder side re-emits. Rules that select ops of
a trace are left out, with one `NvtxRegionsWarning` naming them
(`selection.support`; ``strict=True``: `SelectorError`), and the rest runs.

How the ranges are made, and the promises that follow:
- forward: a forward pre-hook pushes, a forward hook registered with
  ``always_call=True`` pops, so a module that raises still pops its range;
- backward, without torch's full backward hooks (they wrap every output in an
  extra autograd node, and cost 9 to 14% of a launch-bound GPU step), from
  pre-hooks on autograd nodes (`runtime.backward_hooks`): the range opens when
  the node that computed the call's outputs is about to run and closes when
  the nodes that computed its inputs are (their gradients are complete), so
  the range of the call that consumed an output closes before the range of the
  call that produced it opens. A call none of whose inputs needs a gradient
  (an embedding of token ids, usually the root) keeps its range open until the
  range around it closes or the backward ends;
- a module called twice per step (shared weights) gets two ranges each way;
- ranges nest, and the NVTX stack of each thread stays balanced: ranges a
  failed backward (or an interrupted forward) left open on a thread are popped
  at the root's next forward call on that thread, at the end of a `nvtx_regions.steps` step, or
  by `remove()`;
- gates (``steps a..b``, ``rank in <...>``) read the one step clock
  (`runtime.clock`), as on every backend;
- `remove()` removes every module hook, and restores each module's hook
  dicts exactly; hooks already on autograd nodes of a graph not yet run
  backward do nothing more than open and close an empty range;
- under Dynamo the hooks do nothing, so they never break a graph of a plain
  ``torch.compile`` (a layer compiled on its own, say): the module calls
  inside compiled code get no range from them, and one `NvtxRegionsWarning`
  per annotation names the compiled module and the way to their ranges
  (nvtx_regions' backend). Dynamo never compiles a hook as a frame of its
  own (`internals.dynamo.run_outside_dynamo`), so a hook that runs outside
  compiled code, around a compiled module, keeps its range.

On CUDA, autograd runs backward on its own threads: the backward ranges are
pushed and popped there (their gates were read at the forward, by the one
clock), and ranges a failed backward left there are popped there before the
next backward's first range (`runtime.hook_ranges`).
"""

from __future__ import annotations

import functools
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

from ..core.errors import NvtxRegionsWarning
from ..core.handle import HANDLE, SpecHandle
from ..core.naming import DEFAULT_DOMAIN, module_call_name, range_message, rule_category, rule_color
from ..core.profiling import DEFAULT_SELECT
from ..language.parse import given_spec, spec_from_arguments
from ..selection.compile import CompiledRule, CompiledSpec, EachMarkerRule, compile_spec
from ..selection.explanation import Explanation, explain_views
from ..selection.plan import make_plan
from ..selection.support import report_unsupported, restrict
from ..selection.unselected import RuleTally
from ..runtime.backward_hooks import BackwardCall
from .eager_view import module_views
from ..internals.compiled_markers import keeps_markers
from ..internals.dynamo import called_while_traced, run_outside_dynamo, traced_self
from ..internals.inductor_origins import model_modules
from ..internals.module_hooks import HookIds, register_hooks
from ..runtime.clock import current_rank, current_step, watch_step_gates
from ..runtime.domain import Domain, calls_of
from ..runtime.hook_ranges import CALL, MODULE, PUSHED, HookRanges
from ..runtime.sinks import NVTX_ONLY, chosen_sinks

__all__ = ["annotate", "EagerAnnotation"]


@dataclass
class _Target:
    """One hooked module: its ranges per pass, as (rule index, prebuilt attributes), in push order."""

    module: Any
    path: str
    forward: list[tuple[int, Any]] = field(default_factory=list)
    backward: list[tuple[int, Any]] = field(default_factory=list)

    @functools.cached_property
    def plain_entry(self) -> tuple:
        """The stack entry of a call with no backward range to prepare and no gate: one object,
        made once (the hooks run on every call)."""
        return (id(self.module), len(self.forward), -1, None)


class EagerAnnotation(SpecHandle):
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
        self.domain_name = domain
        self.domain = Domain(domain, sinks)
        self._calls = calls_of(self.domain)
        watch_step_gates(self.compiled.rules)
        self._gated = any(rule.gate is not None for rule in self.compiled.rules)
        self._open_rules = [self._is_open(r, 0) for r in self.compiled.rules]
        self._ranges = HookRanges(self._calls)
        self._handles: list[Any] = []
        self._targets: list[_Target] = []
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
        if self._ranges.removed:
            return
        self.removed = True
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if vars(self.model).get(HANDLE) is self:
            delattr(self.model, HANDLE)
        self._ranges.remove()

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

        self._grad_enabled = torch.is_grad_enabled
        self._compiling = torch.compiler.is_compiling
        self._traced_warned = False
        annotation = self

        def traced() -> bool:  # called for real by Dynamo, tracing a hook of this annotation
            annotation._note_traced()
            return True

        self._traced = called_while_traced(traced)
        run_outside_dynamo(EagerAnnotation._root_pre_hook)
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
        ids = HookIds()  # one id per kind for all: Dynamo's guards on hook ids then pass on every layer
        for target in self._targets:
            # Only a backward range needs the keyword arguments (tensors in them are inputs too).
            hooks = (self._pre_hook(target), self._post_hook(target))
            self._handles += register_hooks(target.module, *hooks, with_kwargs=bool(target.backward), ids=ids)

    def _note_traced(self) -> None:
        """Dynamo traces a hook of this annotation: warn once, naming the compiled module, unless the
        trace is for a backend of ours (its graphs hold the spec's ranges)."""
        if self._traced_warned or keeps_markers():
            return
        self._traced_warned = True
        where = "code that calls modules of this model"
        traced = traced_self()
        if traced is not None:
            found = next((path for path, module in model_modules(self.model) if module is traced), None)
            if found is not None:
                where = f"the forward of {found or type(self.model).__name__}"
        warnings.warn(
            f"nvtx_regions.annotate({type(self.model).__name__}): Dynamo (torch.compile) compiles {where} with a "
            "backend that is not nvtx_regions', so the modules called inside what it compiles get no range from this "
            "annotation: its hooks do nothing there, as tracing them would break the graph. For their ranges, "
            "compile with nvtx_regions' backend, backend=nvtx_regions.NvtxInductor(spec, model=model) "
            "(docs/how-to/layer-by-layer.md), or nvtx_regions.compile(model, spec) in place of annotate",
            NvtxRegionsWarning,
            stacklevel=2,
        )

    def _report_unselected(self, strict: bool) -> None:
        """Warn (with `strict`, raise `SelectorError`) for each rule that selected no module call, as
        every backend does (`RuleTally`); `each marker` rules add nothing in eager, by design."""
        tally = RuleTally(self.compiled)
        for view, plan in zip(self.views, self._plans):
            tally.add(plan, view)
        tally.report(strict=strict, where=f"the module calls of this {type(self.model).__name__}", skip=(EachMarkerRule,), stacklevel=4)

    # -- hooks -----------------------------------------------------------------
    # They run on every module call of a training step, so they stay flat: no call they can
    # spare (measured in benchmarks/eager_hooks.py against hand-written hooks).

    def _is_open(self, rule: CompiledRule, step: int) -> bool:
        return rule.gate is None or rule.gate.is_open(current_rank(), step)

    def _root_pre_hook(self, module: Any, args: Any) -> None:
        if self._compiling():  # under Dynamo: nothing (see the module doc)
            self._traced()
            return
        if module is not self.model:  # a deep copy's
            return
        # Outside any backward nothing of ours is open on this thread, unless a backward raised
        # with ranges open (autograd calls no hook of ours then), or a forward was interrupted.
        if self._ranges.autograd.graph_task_id() == -1:
            if self._ranges.stack():
                self._ranges.recover()
            self._ranges.mark_others_stale()
        if self._gated:
            step = current_step()
            self._open_rules = [self._is_open(r, step) for r in self.compiled.rules]

    def _push(self, entries: list[tuple[int, Any]]) -> int:
        """Push the ranges of `entries` whose gates are open this step; how many."""
        push, domain = self._calls.push, self._calls.domain_argument
        pushed = 0
        for index, attributes in entries:
            if self._open_rules[index]:
                push(attributes, domain)
                pushed += 1
        return pushed

    def _pre_hook(self, target: _Target) -> Callable[..., None]:
        forward, backward, owner, key = target.forward, target.backward, target.module, id(target.module)
        ranges, grad_enabled, new_call = self._ranges, self._grad_enabled, BackwardCall
        local, stack_of, push, domain, gated = ranges.local, ranges.stack, ranges.push, ranges.domain_argument, self._gated
        attributes = [attributes for _, attributes in forward]
        backward_attributes = [attributes for _, attributes in backward]
        plain = target.plain_entry
        in_backward = ranges.autograd.graph_task_id
        # One range, the usual case, is pushed without a loop: in a training step, where the
        # hooks run among much other code, a loop measured about 1 us a call (eager_hooks.py).
        one = len(attributes) == 1
        first = attributes[0] if one else None
        compiling, traced = self._compiling, self._traced

        def forward_pre_hook(module: Any, args: Any, kwargs: Any = None) -> None:
            if compiling():  # under Dynamo: nothing (see the module doc); first, so Dynamo reads no more
                traced()
                return
            if module is not owner:  # a deep copy's module, which has a copy of this hook
                return
            try:
                stack = local.stack
            except AttributeError:
                stack = stack_of()
            if gated:
                self._gated_pre_hook(stack, key, forward, backward, args, kwargs)
                return
            if in_backward() != -1:
                # Activation checkpointing recomputes the forward inside the backward: not a forward
                # call (Inductor's graphs recompute it inside the backward's kernels). A reentrant
                # checkpoint's backward runs through this call's graph: its backward range stays.
                call = new_call(ranges, backward_attributes, args, kwargs) if backward and grad_enabled() else None
                stack.append((key, 0, -1, call))
                return
            if one:
                push(first, domain)
            else:
                for each in attributes:
                    push(each, domain)
            if backward and grad_enabled():
                stack.append((key, len(attributes), -1, new_call(ranges, backward_attributes, args, kwargs)))
            else:
                stack.append(plain)

        return run_outside_dynamo(forward_pre_hook)

    def _gated_pre_hook(self, stack: list, key: int, forward: list, backward: list, args: Any, kwargs: Any) -> None:
        """A pre-hook's work where the spec has gates (read at the root's pre-hook, for the
        step's forward and the backward that follows it)."""
        open_rules, call = self._open_rules, None
        if backward and self._grad_enabled():
            call = BackwardCall(self._ranges, [a for index, a in backward if open_rules[index]], args, kwargs)
        recompute = self._ranges.autograd.graph_task_id() != -1  # activation checkpointing (see the pre-hook)
        stack.append((key, 0 if recompute else self._push(forward), -1, call))

    def _post_hook(self, target: _Target) -> Callable[..., None]:
        owner, key, ranges = target.module, id(target.module), self._ranges
        local, stack_of, pop = ranges.local, ranges.stack, ranges.pop
        plain, pops = target.plain_entry, range(len(target.forward))
        one = len(target.forward) == 1  # popped without a loop (see the pre-hook)
        compiling = self._compiling

        def forward_hook(module: Any, args: Any, output: Any) -> None:
            if compiling():  # under Dynamo: nothing, as the pre-hook
                return
            if module is not owner:  # a deep copy's module
                return
            try:
                stack = local.stack
            except AttributeError:
                stack = stack_of()
            entry = stack[-1] if stack else None
            if entry is plain:  # no backward range to prepare, no gate, nothing left open inside
                stack.pop()
                if one:
                    pop()
                else:
                    for _ in pops:
                        pop()
                return
            if entry is not None and entry[MODULE] == key:  # nothing left open inside
                stack.pop()
                pushed = entry[PUSHED]
                if pushed == 1:
                    pop()
                else:
                    for _ in range(pushed):
                        pop()
            else:
                entry = ranges.close_forward(stack, key)
                if entry is None:
                    return
            if entry[CALL] is not None:
                entry[CALL].outputs_ready(output)

        return run_outside_dynamo(forward_hook)


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
