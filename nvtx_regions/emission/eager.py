"""The module rules of a spec, as NVTX ranges on an eager `torch.nn.Module`.

    from nvtx_regions import eager
    with eager.annotate(model, "each module <transformer.h.*>"):
        model(idx, targets)[1].backward()

The ranges have the messages, domain, colours and categories that
`NvtxProfileTransform` gives the same spec under thunder, so an eager profile
and a thunder profile of one model compare range by range
(``nvtx-regions compare``). A forward range is the module's path
(``transformer.h.0``; the root module's class name); its backward range adds
``" (backward)"``.

Supported rules: ``each module <...>`` and ``each class <...>``, joined with
``and`` to ``forward`` / ``backward``, to ``module <...>`` / ``class <...>``
(only modules at or below a matching path in ``model.named_modules()``) and
to the run-time gates ``rank in <...>`` and ``steps a..b``. A step is one call
of the root model's ``forward`` (from 0) and the backward that follows it.
Rules that select ops of a trace raise `SelectorError` here. An
``each marker <...>`` rule adds nothing: in eager PyTorch the user's own
markers run as written, which is what the thunder side re-emits.

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

import difflib
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

from ..selection.compile import CompiledRule, compile_spec
from ..core.errors import NvtxRegionsWarning, SelectorError
from ..core.globs import class_matcher, path_matcher
from ..language.parse import combine, parse
from .runtime import DEFAULT_DOMAIN, Domain, current_rank, rule_color
from ..language.tree import (
    All,
    And,
    BackwardOf,
    Between,
    ClassIn,
    EachClass,
    EachMarker,
    EachModule,
    MarkerIn,
    ModuleIn,
    Not,
    OpIn,
    Or,
    Reads,
    Rule,
    Source,
    Spec,
    render,
    walk,
)

__all__ = ["annotate", "EagerAnnotation"]

_TRACE_ONLY = {
    OpIn: "selects trace ops by name",
    Reads: "selects trace ops by the proxies they read",
    Between: "is a region between trace ops",
    Source: "selects trace ops by the source line that recorded them",
    BackwardOf: "maps backward trace ops to the forward ops that saved their inputs",
    All: "selects every trace op",
    MarkerIn: "selects trace ops by the user's NVTX markers around them",
}

_SUPPORTED = (
    "in annotate() a rule is 'each module <...>' or 'each class <...>', optionally joined with 'and' to "
    "'forward', 'backward', 'module <...>', 'class <...>', 'rank in <...>' and 'steps a..b'"
)


def _conjuncts(expr: Any) -> list[Any]:
    return list(expr.operands) if isinstance(expr, And) else [expr]


@dataclass(frozen=True)
class _EagerRule:
    """One rule in eager form: which modules, which passes, under which scope and gate."""

    compiled: CompiledRule  # of the rule without its module/class scope: gate, each selector
    rule: Rule  # as the user wrote it: its category, colour and errors
    scopes: tuple[Callable[[list[tuple[str, str]]], bool], ...]
    each_globs: tuple[str, ...]

    def selects(self, path: str, cls: str, above: list[tuple[str, str]]) -> bool:
        each = self.compiled.each
        assert each is not None
        if each.never or not each.matches(path if each.by == "module" else cls):
            return False
        return all(scope(above) for scope in self.scopes)

    def passes(self) -> tuple[str, ...]:
        phase = self.compiled.each.phase  # type: ignore[union-attr]
        return ("forward", "backward") if phase is None else (phase,)


def _scope(expr: ModuleIn | ClassIn) -> Callable[[list[tuple[str, str]]], bool]:
    if isinstance(expr, ModuleIn):
        matches = path_matcher(expr.globs)
        return lambda above: any(matches(path) for path, _ in above)
    matches = class_matcher(expr.globs)
    return lambda above: any(matches(cls) for _, cls in above)


def _eager_rules(spec: Spec) -> list[_EagerRule]:
    """Check that every rule has an eager meaning and compile it. Raises `SelectorError` naming the rule."""
    rules = []
    for number, rule in enumerate(spec.rules):
        describe = rule.describe(spec.filename)
        for expr in walk(rule.expr):
            if type(expr) in _TRACE_ONLY:
                raise SelectorError(
                    f"{describe}: {render(expr)!r} {_TRACE_ONLY[type(expr)]}, and eager PyTorch has no trace, "
                    f"only module calls; {_SUPPORTED}. Use NvtxProfileTransform for this rule"
                )
        conjuncts = _conjuncts(rule.expr)
        for expr in conjuncts:
            if isinstance(expr, (Not, Or)):
                raise SelectorError(
                    f"{describe}: {render(expr)!r}: eager rules cannot use 'not' or 'or'; {_SUPPORTED}. "
                    "Write one rule per alternative"
                )
        if any(isinstance(e, EachMarker) for e in conjuncts):
            compile_spec(Spec((rule,), filename=spec.filename))  # its errors, as on the thunder side
            continue  # the user's markers run in eager as written: nothing to add
        if not any(isinstance(e, (EachModule, EachClass)) for e in conjuncts):
            scope = next((e for e in conjuncts if isinstance(e, (ModuleIn, ClassIn))), None)
            if scope is not None:
                keyword = "module" if isinstance(scope, ModuleIn) else "class"
                raise SelectorError(
                    f"{describe}: {render(scope)!r} alone selects the ops inside matching modules, which only a "
                    f"thunder trace has; for one range per module call write 'each {render(scope)}' "
                    f"(or restrict an each rule: 'each class <Linear> and {keyword} <...>')"
                )
            raise SelectorError(f"{describe}: the rule names no module; {_SUPPORTED}")
        scopes = tuple(_scope(e) for e in conjuncts if isinstance(e, (ModuleIn, ClassIn)))
        rest = [e for e in conjuncts if not isinstance(e, (ModuleIn, ClassIn))]
        # Compile the rule without its scope: the gate and the each selector
        # (and their errors) come from compile_spec, as on the thunder side.
        body = rest[0] if len(rest) == 1 else And(tuple(rest))
        reduced = Rule(body, rule.label, rule.line, rule.text)
        try:
            (compiled,) = compile_spec(Spec((reduced,), filename=spec.filename)).rules
        except SelectorError as error:
            raise SelectorError(str(error).replace(reduced.describe(spec.filename), describe, 1)) from None
        compiled = CompiledRule(rule, number, None, None, compiled.gate, spec.filename, compiled.each)
        (found,) = [e for e in conjuncts if isinstance(e, (EachModule, EachClass))][:1]
        rules.append(_EagerRule(compiled, rule, scopes, found.globs))
    return rules


def _above(path: str, classes: dict[str, str]) -> list[tuple[str, str]]:
    """(path, class name) of the module at `path` and of each module above it, the root ("") first."""
    parts = path.split(".") if path else []
    prefixes = ["", *(".".join(parts[:n]) for n in range(1, len(parts) + 1))]
    return [(p, classes[p]) for p in prefixes if p in classes]


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
    """One hooked module: its ranges per pass, as (rule index, prebuilt attributes), in rule order."""

    module: Any
    path: str
    forward: list[tuple[int, Any]] = field(default_factory=list)
    backward: list[tuple[int, Any]] = field(default_factory=list)
    was_full_backward_hook: Any = None


class EagerAnnotation:
    """The hooks `annotate` put on a model. `remove()` takes them off; also a context manager.

    `steps` is how many times the root model's forward has been called.
    """

    def __init__(self, model: Any, rules: list[_EagerRule], domain: str | None, *, strict: bool = False) -> None:
        self.model = model
        self.rules = rules
        self.domain = Domain(domain)
        self.steps = 0
        self._open_rules = [self._is_open(r, 0) for r in rules]
        self._local = threading.local()
        self._handles: list[Any] = []
        self._targets: list[_Target] = []
        self._removed = False
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
            name = target.path or type(target.module).__name__
            out += [("forward", name)] * len(target.forward)
            out += [("backward", name + " (backward)")] * len(target.backward)
        return out

    def remove(self) -> None:
        """Remove every hook and restore each module's hook state; pop ranges left open on this thread."""
        if self._removed:
            return
        self._removed = True
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for target in self._targets:
            target.module._is_full_backward_hook = target.was_full_backward_hook
        self._recover()

    def __enter__(self) -> EagerAnnotation:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    # -- hooks -----------------------------------------------------------------

    def _install(self) -> None:
        import torch

        self._torch = torch
        named = list(self.model.named_modules())
        classes = {path: type(m).__name__ for path, m in named}
        self._selected = [0] * len(self.rules)
        for path, module in named:
            cls = type(module).__name__
            above = _above(path, classes)
            name = path or cls
            target = _Target(module, path, was_full_backward_hook=module._is_full_backward_hook)
            for index, rule in enumerate(self.rules):
                if not rule.selects(path, cls, above):
                    continue
                self._selected[index] += 1
                category = rule.rule.label or rule.rule.text or render(rule.rule)
                color = rule_color(rule.compiled.number)
                for phase in rule.passes():
                    message = name if phase == "forward" else name + " (backward)"
                    attributes = self.domain.attributes(message, color=color, category=category)
                    getattr(target, phase).append((index, attributes))
            if target.forward or target.backward:
                self._targets.append(target)
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
        """Warn (with `strict`, raise `SelectorError`) for each rule that matches no module."""
        paths = [path for path, _ in self.model.named_modules() if path]
        classes = sorted({type(m).__name__ for m in self.model.modules()})
        problems = []
        for rule, count in zip(self.rules, self._selected):
            if count:
                continue
            each = rule.compiled.each
            assert each is not None
            if each.never:
                reason = "'forward and backward' is never true"
            else:
                names = paths if each.by == "module" else classes
                matcher = path_matcher if each.by == "module" else class_matcher
                missing = [g for g in rule.each_globs if not any(map(matcher((g,)), names))]
                if missing:
                    close = difflib.get_close_matches(missing[0], names, n=3, cutoff=0.5)
                    hint = f" (nearest: {', '.join(close)})" if close else ""
                    reason = f"{each.by} {missing[0]!r} matches no module of this {type(self.model).__name__}{hint}"
                else:
                    reason = "its 'module <...>' / 'class <...>' scope excludes every module it matches"
            problems.append(f"{rule.compiled.describe()} selected no module; {reason}")
        if problems and strict:
            raise SelectorError("; ".join(problems))
        for problem in problems:
            warnings.warn(problem, NvtxRegionsWarning, stacklevel=4)

    def _stack(self) -> list[_Open]:
        stack = self._local.__dict__.get("stack")
        if stack is None:
            stack = self._local.stack = []
            self._local.tasks = set()
        return stack

    def _is_open(self, rule: _EagerRule, step: int) -> bool:
        gate = rule.compiled.gate
        return gate is None or gate.is_open(current_rank(), step)

    def _root_pre_hook(self, module: Any, args: Any) -> None:
        if self._torch._C._current_graph_task_id() == -1:
            # Outside any backward nothing of ours is open on this thread,
            # unless a backward raised with ranges open.
            self._recover()
        step, self.steps = self.steps, self.steps + 1
        if any(rule.compiled.gate is not None for rule in self.rules):
            self._open_rules = [self._is_open(r, step) for r in self.rules]

    def _push(self, entries: list[tuple[int, Any]]) -> int:
        handle = self.domain.handle
        pushed = 0
        for index, attributes in entries:
            if self._open_rules[index]:
                handle.push_range(attributes)
                pushed += 1
        return pushed

    def _pop(self, stack: list[_Open], position: int) -> None:
        """Pop the NVTX ranges of `stack[position:]`, innermost first, and drop those entries."""
        handle = self.domain.handle
        for entry in reversed(stack[position:]):
            for _ in range(entry.pushed):
                handle.pop_range()
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
        torch_c = self._torch._C

        def backward_pre_hook(module: Any, grad_output: Any) -> None:
            stack = self._stack()
            task = torch_c._current_graph_task_id()
            if task not in self._local.tasks:
                self._local.tasks.add(task)
                # Closes what is still open when this backward succeeds (e.g. a
                # deferred range, or a module whose inputs' gradients were not asked for).
                self._torch.autograd.Variable._execution_engine.queue_callback(lambda: self._end_task(task))
            stack.append(_Open("backward", key, self._push(entries), task, torch_c._current_autograd_node()))

        return backward_pre_hook

    def _backward_pop(self, target: _Target) -> Callable[..., None]:
        key = id(target.module)
        torch_c = self._torch._C

        def backward_hook(module: Any, grad_input: Any, grad_output: Any) -> None:
            stack = self._stack()
            task = torch_c._current_graph_task_id()
            for position in range(len(stack) - 1, -1, -1):
                entry = stack[position]
                if entry.kind == "backward" and entry.module == key and entry.task == task and not entry.deferred:
                    if entry.node is not None and entry.node is torch_c._current_autograd_node():
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
) -> EagerAnnotation:
    """Put NVTX ranges on the module calls of an eager `model` that the spec selects.

    `select`, `spec` (a ``.nvtx`` file) and `domain` mean what they mean for
    `NvtxProfileTransform`; with neither `select` nor `spec` the spec is
    ``each module <**>`` (every submodule). Returns an `EagerAnnotation`:
    call ``remove()`` or use it as a context manager.

    Raises `SelectorSyntaxError` for text that does not parse and
    `SelectorError` for a rule with no eager meaning, naming the rule. A rule
    that matches no module of `model` gets a `NvtxRegionsWarning` with the
    nearest module names (`strict=True`: `SelectorError`, and no hooks stay).
    """
    if select is not None and not isinstance(select, str):
        raise TypeError(f"select= takes spec text (str), not {type(select).__name__}")
    if domain is not None and not isinstance(domain, str):
        raise TypeError(f"domain= takes a str or None, not {type(domain).__name__}")
    if not hasattr(model, "named_modules") or not hasattr(model, "register_forward_pre_hook"):
        raise TypeError(f"annotate() takes a torch.nn.Module, not {type(model).__name__}")
    parsed = combine(select, spec) or parse("each module <**>")
    return EagerAnnotation(model, _eager_rules(parsed), domain, strict=bool(strict))
