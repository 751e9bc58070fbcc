"""The spec tree: frozen dataclasses, and `render`, their one canonical text form.

Promises:
- Trees compare and hash by value. Source positions (`Rule.line`,
  `Spec.filename`) never take part in equality.
- ``parse(render(tree)) == tree`` for every tree, and ``render`` is stable:
  rendering a parsed rendering gives the same text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Iterator, Union

__all__ = [
    "Spec",
    "Rule",
    "Or",
    "And",
    "Not",
    "OpIn",
    "Reads",
    "Between",
    "Forward",
    "Backward",
    "BackwardOf",
    "All",
    "RankIn",
    "Steps",
    "ModuleIn",
    "ClassIn",
    "EachModule",
    "EachClass",
    "Source",
    "Proxy",
    "First",
    "Last",
    "Expr",
    "Endpoint",
    "KEYWORDS",
    "render",
    "walk",
]

# Words the grammar reserves at the start of a rule; a label spelled like one
# must be quoted.
KEYWORDS = frozenset(
    {"op", "in", "reads", "between", "forward", "backward", "all", "rank", "steps",
     "first", "last", "and", "or", "not", "of", "module", "class", "each", "source"}
)


@dataclass(frozen=True)
class OpIn:
    """True for a bound symbol whose ``sym.name`` matches one of the globs."""

    globs: tuple[str, ...]


@dataclass(frozen=True)
class Reads:
    """True for a bound symbol that reads a proxy whose name matches one of the globs."""

    globs: tuple[str, ...]


@dataclass(frozen=True)
class Proxy:
    """A region endpoint named by a proxy, as printed in the trace (``t3``, ``x``)."""

    name: str


@dataclass(frozen=True)
class First:
    """A region endpoint: the first compute bound symbol for which `expr` is true."""

    expr: Expr


@dataclass(frozen=True)
class Last:
    """A region endpoint: the last compute bound symbol for which `expr` is true."""

    expr: Expr


Endpoint = Union[Proxy, First, Last]


@dataclass(frozen=True)
class Between:
    """A contiguous region of the trace, from `start` to `end`, both included."""

    start: Endpoint
    end: Endpoint


@dataclass(frozen=True)
class Forward:
    """True for every bound symbol of a forward trace."""


@dataclass(frozen=True)
class Backward:
    """True for every bound symbol of a backward trace."""


@dataclass(frozen=True)
class BackwardOf:
    """True for a backward bound symbol that the attribution rule
    (`modules.backward_origins`) traces to a forward bound symbol selected by
    `expr`, in the forward trace of the same compilation."""

    expr: Expr


@dataclass(frozen=True)
class All:
    """True for every bound symbol."""


@dataclass(frozen=True)
class RankIn:
    """Run-time gate: true on the listed distributed ranks."""

    ranks: tuple[int, ...]


@dataclass(frozen=True)
class Steps:
    """Run-time gate: true on calls `first` to `last` (both included, counted from 0)
    of each compiled function; `last` None means no end."""

    first: int
    last: int | None = None


@dataclass(frozen=True)
class ModuleIn:
    """True for an op attributed to a module whose path, or an ancestor's path,
    matches one of the globs (``*`` within one dotted component, ``**`` any number)."""

    globs: tuple[str, ...]


@dataclass(frozen=True)
class ClassIn:
    """True for an op attributed to a module, or a module's ancestor, whose class
    name (``type(m).__name__``) matches one of the globs."""

    globs: tuple[str, ...]


@dataclass(frozen=True)
class EachModule:
    """A rule of its own: one range per call of each module whose path matches,
    from the first to the last op attributed to that call."""

    globs: tuple[str, ...]


@dataclass(frozen=True)
class EachClass:
    """Like `EachModule`, for modules whose class name matches."""

    globs: tuple[str, ...]


@dataclass(frozen=True)
class Source:
    """True for a forward op recorded at a source line `first`..`last` (both
    included) of a file whose path ends with `file` (a glob)."""

    file: str
    first: int
    last: int

    def text(self) -> str:
        lines = str(self.first) if self.first == self.last else f"{self.first}..{self.last}"
        return f"{self.file}:{lines}"


@dataclass(frozen=True)
class Not:
    operand: Expr


@dataclass(frozen=True)
class And:
    operands: tuple[Expr, ...]


@dataclass(frozen=True)
class Or:
    operands: tuple[Expr, ...]


Expr = Union[
    Or, And, Not, OpIn, Reads, Between, Forward, Backward, BackwardOf, All, RankIn, Steps,
    ModuleIn, ClassIn, EachModule, EachClass, Source,
]  # fmt: skip


@dataclass(frozen=True)
class Rule:
    """One rule: a filter, optionally labelled. `line` is where it starts in its source."""

    expr: Expr
    label: str | None = None
    line: int | None = field(default=None, compare=False)
    text: str | None = field(default=None, compare=False)

    def describe(self, filename: str | None = None) -> str:
        """A short human name for this rule, for warnings and errors."""
        where = f"{filename or '<select>'}:{self.line}" if self.line else (filename or "<select>")
        return f"rule {render(self)!r} ({where})"


@dataclass(frozen=True)
class Spec:
    rules: tuple[Rule, ...]
    filename: str = field(default="<select>", compare=False)


def walk(expr: Expr) -> Iterator[Expr | Proxy]:
    """Every sub-expression of `expr`, itself first, and the proxy endpoints of its regions."""
    yield expr
    if isinstance(expr, (And, Or)):
        for operand in expr.operands:
            yield from walk(operand)
    elif isinstance(expr, Not):
        yield from walk(expr.operand)
    elif isinstance(expr, BackwardOf):
        yield from walk(expr.expr)
    elif isinstance(expr, Between):
        for point in (expr.start, expr.end):
            yield from (walk(point.expr) if isinstance(point, (First, Last)) else (point,))


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_GLOB = re.compile(r'[^\s,<>"#;()]+\Z')

_PRECEDENCE = {Or: 1, And: 2, Not: 3}


def _quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _name(text: str) -> str:
    return text if _NAME.match(text) and text not in KEYWORDS else _quote(text)


def _pattern(text: str) -> str:
    return text if _GLOB.match(text) else _quote(text)


def _operand(expr: Expr, parent_level: int) -> str:
    # Parenthesize anything that binds no tighter than its parent, so that
    # nesting the parser would flatten (`a or (b or c)`) survives a round trip.
    text = _expr(expr)
    level = _PRECEDENCE.get(type(expr), 4)
    return f"({text})" if level <= parent_level else text


def _endpoint(point: Endpoint) -> str:
    if isinstance(point, Proxy):
        return _name(point.name)
    keyword = "first" if isinstance(point, First) else "last"
    return f"{keyword}({_expr(point.expr)})"


def _expr(expr: Expr) -> str:
    if isinstance(expr, Or):
        return " or ".join(_operand(e, 1) for e in expr.operands)
    if isinstance(expr, And):
        return " and ".join(_operand(e, 2) for e in expr.operands)
    if isinstance(expr, Not):
        return f"not {_operand(expr.operand, 2)}"
    if isinstance(expr, OpIn):
        return f"op in <{', '.join(map(_pattern, expr.globs))}>"
    if isinstance(expr, Reads):
        return f"reads <{', '.join(map(_pattern, expr.globs))}>"
    if isinstance(expr, Between):
        return f"between {_endpoint(expr.start)}..{_endpoint(expr.end)}"
    if isinstance(expr, Forward):
        return "forward"
    if isinstance(expr, Backward):
        return "backward"
    if isinstance(expr, BackwardOf):
        return f"backward of ({_expr(expr.expr)})"
    if isinstance(expr, All):
        return "all"
    if isinstance(expr, RankIn):
        return f"rank in <{', '.join(map(str, expr.ranks))}>"
    if isinstance(expr, Steps):
        return f"steps {expr.first}..{'' if expr.last is None else expr.last}"
    if isinstance(expr, ModuleIn):
        return f"module <{', '.join(map(_pattern, expr.globs))}>"
    if isinstance(expr, ClassIn):
        return f"class <{', '.join(map(_pattern, expr.globs))}>"
    if isinstance(expr, EachModule):
        return f"each module <{', '.join(map(_pattern, expr.globs))}>"
    if isinstance(expr, EachClass):
        return f"each class <{', '.join(map(_pattern, expr.globs))}>"
    if isinstance(expr, Source):
        return f"source <{_pattern(expr.text())}>"
    raise TypeError(f"not a spec expression: {expr!r}")


def render(tree: Spec | Rule | Expr) -> str:
    """Return the canonical text of a spec, a rule or an expression.

    A spec renders as one rule per line.
    """
    if isinstance(tree, Spec):
        return "\n".join(render(rule) for rule in tree.rules)
    if isinstance(tree, Rule):
        body = _expr(tree.expr)
        return body if tree.label is None else f"{_name(tree.label)}: {body}"
    return _expr(tree)
