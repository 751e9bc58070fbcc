"""The spec tree: frozen dataclasses, and `render`, their one canonical text form.

Promises:
- Trees compare and hash by value. Source positions (`Rule.line`,
  `Spec.filename`) never take part in equality.
- ``parse(render(tree)) == tree`` for every tree, and ``render`` is stable:
  rendering a parsed rendering gives the same text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterator, Union, get_args

from .grammar import syntax

__all__ = [
    "Spec", "Rule", "Or", "And", "Not", "OpIn", "Reads", "Between", "Forward", "Backward", "BackwardOf", "All",
    "RankIn", "Steps", "ModuleIn", "ClassIn", "EachModule", "EachClass", "MarkerIn", "EachMarker", "Source",
    "Proxy", "First", "Last", "Expr", "Endpoint", "conjuncts", "KEYWORDS", "EXPR_TYPES", "NODE_TYPES",
    "Visitor", "render", "walk", "depth",
]  # fmt: skip

# Words the grammar reserves (derived from it); a label or proxy spelled like
# one must be quoted.
KEYWORDS = syntax().keywords


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
class MarkerIn:
    """True for an op recorded inside one of the user's own NVTX markers
    (``torch.cuda.nvtx``, ``nvtx``, ``record_function``) whose message matches
    one of the globs; in the backward, an op whose forward origins all were."""

    globs: tuple[str, ...]


@dataclass(frozen=True)
class EachMarker:
    """A rule of its own: one range per occurrence of each of the user's markers
    whose message matches, from the first to the last op recorded inside it,
    in the marker's own NVTX domain with its message and colour."""

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
    ModuleIn, ClassIn, EachModule, EachClass, MarkerIn, EachMarker, Source,
]  # fmt: skip


@dataclass(frozen=True)
class Rule:
    """One rule: a filter, optionally labelled. `line` is where it starts in its source."""

    expr: Expr
    label: str | None = None
    line: int | None = field(default=None, compare=False)
    text: str | None = field(default=None, compare=False)

    @property
    def written(self) -> str:
        """The rule's text as the user wrote it, or its canonical text for a rule built in code."""
        return self.text or render(self)

    def describe(self, filename: str | None = None) -> str:
        """A short human name for this rule, for warnings and errors."""
        where = f"{filename or '<select>'}:{self.line}" if self.line else (filename or "<select>")
        return f"rule {render(self)!r} ({where})"


@dataclass(frozen=True)
class Spec:
    rules: tuple[Rule, ...]
    filename: str = field(default="<select>", compare=False)


# Every node type a pass over expressions must handle, and with region endpoints.
EXPR_TYPES: tuple[type, ...] = get_args(Expr)
NODE_TYPES: tuple[type, ...] = EXPR_TYPES + (Proxy, First, Last)


class Visitor:
    """One walk over the tree: ``visit(node, ...)`` calls ``visit_<NodeType>(node, ...)``.

    Each pass over spec trees subclasses this and defines one method per node
    type, so the dispatch on node types is written once. `missing` lists the
    node types a pass does not handle; a test checks it is empty for every pass.
    """

    # The node types this pass is for; a pass over rule bodies only may narrow it.
    handles: tuple[type, ...] = NODE_TYPES

    def visit(self, node: Any, *args: Any, **kwargs: Any) -> Any:
        method = getattr(self, f"visit_{type(node).__name__}", None)
        if method is None:
            raise TypeError(f"{type(self).__name__} cannot visit {node!r}: no visit_{type(node).__name__}")
        return method(node, *args, **kwargs)

    @classmethod
    def missing(cls) -> list[str]:
        """The names of the node types in `handles` that this pass has no method for."""
        return [t.__name__ for t in cls.handles if not hasattr(cls, f"visit_{t.__name__}")]


class _Children(Visitor):
    """The direct sub-expressions (and proxy endpoints) of a node."""

    def _none(self, node: Any) -> tuple:
        return ()

    visit_OpIn = visit_Reads = visit_Forward = visit_Backward = visit_All = visit_RankIn = _none
    visit_Steps = visit_ModuleIn = visit_ClassIn = visit_EachModule = visit_EachClass = _none
    visit_MarkerIn = visit_EachMarker = _none
    visit_Source = visit_Proxy = _none

    def visit_And(self, node: And) -> tuple:
        return node.operands

    visit_Or = visit_And

    def visit_Not(self, node: Not) -> tuple:
        return (node.operand,)

    def visit_BackwardOf(self, node: BackwardOf) -> tuple:
        return (node.expr,)

    visit_First = visit_Last = visit_BackwardOf

    def visit_Between(self, node: Between) -> tuple:
        return (node.start, node.end)


_CHILDREN = _Children()


def conjuncts(expr: Expr) -> list[Expr]:
    """The operands of a top-level `and`, with parenthesized `and`s inside it flattened.

    Every pass that sorts a rule's top-level parts (compile, eager) reads them
    through this one function, so ``(a and b) and c`` means ``a and b and c`` everywhere.
    """
    if not isinstance(expr, And):
        return [expr]
    return [part for operand in expr.operands for part in conjuncts(operand)]


def walk(expr: Expr) -> Iterator[Expr | Proxy]:
    """Every sub-expression of `expr`, itself first, and the proxy endpoints of its regions."""
    stack: list[Any] = [expr]
    while stack:
        node = stack.pop()
        if not isinstance(node, (First, Last)):
            yield node
        stack.extend(reversed(_CHILDREN.visit(node)))


def depth(expr: Expr) -> int:
    """How many nodes deep `expr` nests (a filter alone is 1, ``not all`` is 2).

    Iterative, so that it answers for any depth; the recursive passes
    (`render`, compile, equality) rely on `parse` refusing deep trees.
    """
    deepest = 0
    stack: list[tuple[Any, int]] = [(expr, 1)]
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in _CHILDREN.visit(node))
    return deepest


# What may be written unquoted: the grammar's own NAME and GLOB terminals.
_NAME = syntax().fullmatch("NAME")
_GLOB = syntax().fullmatch("GLOB")

_PRECEDENCE = {Or: 1, And: 2, Not: 3}


def _quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _name(text: str) -> str:
    return text if _NAME.match(text) and text not in KEYWORDS else _quote(text)


def _pattern(text: str) -> str:
    return text if _GLOB.match(text) else _quote(text)


class _Renderer(Visitor):
    """The canonical text of each node type."""

    def operand(self, expr: Expr, parent_level: int) -> str:
        # Parenthesize anything that binds no tighter than its parent, so that
        # nesting the parser would flatten (`a or (b or c)`) survives a round trip.
        text = self.visit(expr)
        level = _PRECEDENCE.get(type(expr), 4)
        return f"({text})" if level <= parent_level else text

    @staticmethod
    def globs(keyword: str, globs: tuple[str, ...]) -> str:
        return f"{keyword}<{', '.join(map(_pattern, globs))}>"

    def visit_Or(self, expr: Or) -> str:
        return " or ".join(self.operand(e, 1) for e in expr.operands)

    def visit_And(self, expr: And) -> str:
        return " and ".join(self.operand(e, 2) for e in expr.operands)

    def visit_Not(self, expr: Not) -> str:
        return f"not {self.operand(expr.operand, 2)}"

    def visit_OpIn(self, expr: OpIn) -> str:
        return self.globs("op in ", expr.globs)

    def visit_Reads(self, expr: Reads) -> str:
        return self.globs("reads ", expr.globs)

    def visit_Between(self, expr: Between) -> str:
        return f"between {self.visit(expr.start)}..{self.visit(expr.end)}"

    def visit_Proxy(self, point: Proxy) -> str:
        return _name(point.name)

    def visit_First(self, point: First) -> str:
        return f"first({self.visit(point.expr)})"

    def visit_Last(self, point: Last) -> str:
        return f"last({self.visit(point.expr)})"

    def visit_Forward(self, expr: Forward) -> str:
        return "forward"

    def visit_Backward(self, expr: Backward) -> str:
        return "backward"

    def visit_BackwardOf(self, expr: BackwardOf) -> str:
        return f"backward of ({self.visit(expr.expr)})"

    def visit_All(self, expr: All) -> str:
        return "all"

    def visit_RankIn(self, expr: RankIn) -> str:
        return f"rank in <{', '.join(map(str, expr.ranks))}>"

    def visit_Steps(self, expr: Steps) -> str:
        return f"steps {expr.first}..{'' if expr.last is None else expr.last}"

    def visit_ModuleIn(self, expr: ModuleIn) -> str:
        return self.globs("module ", expr.globs)

    def visit_ClassIn(self, expr: ClassIn) -> str:
        return self.globs("class ", expr.globs)

    def visit_EachModule(self, expr: EachModule) -> str:
        return self.globs("each module ", expr.globs)

    def visit_EachClass(self, expr: EachClass) -> str:
        return self.globs("each class ", expr.globs)

    def visit_MarkerIn(self, expr: MarkerIn) -> str:
        return self.globs("marker ", expr.globs)

    def visit_EachMarker(self, expr: EachMarker) -> str:
        return self.globs("each marker ", expr.globs)

    def visit_Source(self, expr: Source) -> str:
        return f"source <{_pattern(expr.text())}>"


_RENDERER = _Renderer()


def render(tree: Spec | Rule | Expr) -> str:
    """Return the canonical text of a spec, a rule or an expression.

    A spec renders as one rule per line.
    """
    if isinstance(tree, Spec):
        return "\n".join(render(rule) for rule in tree.rules)
    if isinstance(tree, Rule):
        body = _RENDERER.visit(tree.expr)
        return body if tree.label is None else f"{_name(tree.label)}: {body}"
    if not isinstance(tree, EXPR_TYPES):
        raise TypeError(f"not a spec expression: {tree!r}")
    return _RENDERER.visit(tree)
