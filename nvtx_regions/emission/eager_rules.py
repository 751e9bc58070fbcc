"""A spec to eager rules: which module calls of an eager model get ranges, in
which passes, under which scope and gate.

Only module rules have an eager meaning: ``each module <...>`` and ``each class
<...>``, joined with ``and`` to ``forward`` / ``backward``, to ``module <...>``
/ ``class <...>`` (a scope: the module or one above it matches) and to the
run-time gates. The gate and the ``each`` selector come from `compile_spec`,
as on the thunder side, so both sides read a rule the same way.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from ..core.errors import SelectorError
from ..core.globs import name_matcher, path_matcher
from ..language.tree import (
    And,
    ClassIn,
    ModuleIn,
    Rule,
    Spec,
    Visitor,
    conjuncts,
    render,
    walk,
)
from ..selection.compile import EachRule, compile_spec

__all__ = ["EagerRule", "eager_rules", "modules_above", "SUPPORTED"]

SUPPORTED = (
    "in annotate() a rule is 'each module <...>' or 'each class <...>', optionally joined with 'and' to "
    "'forward', 'backward', 'module <...>', 'class <...>', 'rank in <...>' and 'steps a..b'"
)

# (path, class name) of a module and of each module above it, the root first.
Above = list[tuple[str, str]]


@dataclass(frozen=True)
class EagerRule:
    """One rule in eager form: which modules, which passes, under which scope and gate."""

    compiled: EachRule  # of the rule without its module/class scope: gate, each selector
    rule: Rule  # as the user wrote it: its category, colour and errors
    scopes: tuple[Callable[[Above], bool], ...]
    each_globs: tuple[str, ...]

    def selects(self, path: str, cls: str, above: Above) -> bool:
        each = self.compiled.each
        if each.never or not each.matches(path if each.by == "module" else cls):
            return False
        return all(scope(above) for scope in self.scopes)

    def passes(self) -> tuple[str, ...]:
        phase = self.compiled.each.phase
        return ("forward", "backward") if phase is None else (phase,)


class _TraceOnly(str):
    """Why a node has no eager meaning: what it selects in a trace."""


class _EagerPart(Visitor):
    """The part a node plays in an eager rule: "each", "scope", "keep" (passes,
    gates, `and`), "alternative" (`not`, `or`), or a `_TraceOnly` reason."""

    def visit_OpIn(self, node: object) -> str:
        return _TraceOnly("selects trace ops by name")

    def visit_Reads(self, node: object) -> str:
        return _TraceOnly("selects trace ops by the proxies they read")

    def visit_Between(self, node: object) -> str:
        return _TraceOnly("is a region between trace ops")

    def visit_Source(self, node: object) -> str:
        return _TraceOnly("selects trace ops by the source line that recorded them")

    def visit_BackwardOf(self, node: object) -> str:
        return _TraceOnly("maps backward trace ops to the forward ops that saved their inputs")

    def visit_All(self, node: object) -> str:
        return _TraceOnly("selects every trace op")

    def _each(self, node: object) -> str:
        return "each"

    def _scope(self, node: object) -> str:
        return "scope"

    def _keep(self, node: object) -> str:
        return "keep"

    def _alternative(self, node: object) -> str:
        return "alternative"

    visit_EachModule = visit_EachClass = _each
    visit_ModuleIn = visit_ClassIn = _scope
    visit_Forward = visit_Backward = visit_RankIn = visit_Steps = visit_And = _keep
    visit_Not = visit_Or = _alternative
    # Region endpoints sit inside a `between`, which is reported first.
    visit_Proxy = visit_First = visit_Last = _keep


_PART = _EagerPart()


def _scope(expr: ModuleIn | ClassIn) -> Callable[[Above], bool]:
    if isinstance(expr, ModuleIn):
        matches = path_matcher(expr.globs)
        return lambda above: any(matches(path) for path, _ in above)
    matches = name_matcher(expr.globs)
    return lambda above: any(matches(cls) for _, cls in above)


def _eager_rule(rule: Rule, number: int, filename: str) -> EagerRule:
    describe = rule.describe(filename)
    for expr in walk(rule.expr):
        part = _PART.visit(expr)
        if isinstance(part, _TraceOnly):
            raise SelectorError(
                f"{describe}: {render(expr)!r} {part}, and eager PyTorch has no trace, "
                f"only module calls; {SUPPORTED}. Use NvtxProfileTransform for this rule"
            )
    found = [(expr, _PART.visit(expr)) for expr in conjuncts(rule.expr)]
    for expr, part in found:
        if part == "alternative":
            raise SelectorError(
                f"{describe}: {render(expr)!r}: eager rules cannot use 'not' or 'or'; {SUPPORTED}. "
                "Write one rule per alternative"
            )
    eaches = [expr for expr, part in found if part == "each"]
    scopes = [expr for expr, part in found if part == "scope"]
    if not eaches:
        if scopes:
            scope = scopes[0]
            keyword = "module" if isinstance(scope, ModuleIn) else "class"
            raise SelectorError(
                f"{describe}: {render(scope)!r} alone selects the ops inside matching modules, which only a "
                f"thunder trace has; for one range per module call write 'each {render(scope)}' "
                f"(or restrict an each rule: 'each class <Linear> and {keyword} <...>')"
            )
        raise SelectorError(f"{describe}: the rule names no module; {SUPPORTED}")
    rest = [expr for expr, part in found if part != "scope"]
    # Compile the rule without its scope: the gate and the each selector
    # (and their errors) come from compile_spec, as on the thunder side.
    body = rest[0] if len(rest) == 1 else And(tuple(rest))
    reduced = Rule(body, rule.label, rule.line, rule.text)
    try:
        (compiled,) = compile_spec(Spec((reduced,), filename=filename)).rules
    except SelectorError as error:
        raise SelectorError(str(error).replace(reduced.describe(filename), describe, 1)) from None
    if not isinstance(compiled, EachRule):
        raise TypeError(f"{describe}: compiled as {type(compiled).__name__}, not as an each rule")
    compiled = dataclasses.replace(compiled, rule=rule, number=number)
    return EagerRule(compiled, rule, tuple(_scope(e) for e in scopes), eaches[0].globs)


def eager_rules(spec: Spec) -> list[EagerRule]:
    """Check that every rule has an eager meaning and compile it. Raises `SelectorError` naming the rule."""
    return [_eager_rule(rule, number, spec.filename) for number, rule in enumerate(spec.rules)]


def modules_above(path: str, classes: dict[str, str]) -> Above:
    """(path, class name) of the module at `path` and of each module above it, the root ("") first."""
    parts = path.split(".") if path else []
    prefixes = ["", *(".".join(parts[:n]) for n in range(1, len(parts) + 1))]
    return [(p, classes[p]) for p in prefixes if p in classes]
