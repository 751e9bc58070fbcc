"""Spec text to spec tree: `parse` (text), `load` (a ``.nvtx`` file), `spec_from_arguments` (both, as a transform
takes them), `given_spec` (those or a backend's default, with the one warning for a spec without rules).

Every error in a spec's text is raised here, as `SelectorSyntaxError`, with the
file, line, column and the line as written; `syntax_messages` words it. The
parser is built from the installed grammar (`grammar.grammar_text`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import threading
import warnings
from pathlib import Path
from typing import Iterator

import lark
from lark import Token, Transformer, v_args

from ..core.errors import NvtxRegionsWarning, SelectorError
from .grammar import grammar_resource, grammar_text
from .syntax_messages import SpecTextError, describe_char, syntax_error_at, syntax_error_for
from .tree import (
    All,
    And,
    Backward,
    BackwardOf,
    Between,
    ClassIn,
    EachClass,
    EachMarker,
    EachModule,
    First,
    Forward,
    Last,
    MarkerIn,
    ModuleIn,
    Not,
    OpIn,
    Or,
    Proxy,
    RankIn,
    Reads,
    Rule,
    Source,
    Spec,
    Steps,
    depth,
)

__all__ = ["parse", "parse_bytes", "load", "spec_from_arguments", "given_spec", "NO_RULES", "MAX_NESTING", "grammar_text", "grammar_resource"]

# How many levels deep a rule may nest (`tree.depth`). The passes over the tree
# recurse (render takes about three Python frames a level); under pytest and a
# thunder transform, rendering failed between 300 and 400 levels. 100 leaves
# room for deeper callers, and is far more than any spec needs.
MAX_NESTING = 100


class BracketNewlines:
    """Lark post-lexer: a newline inside ``( )`` or ``< >`` continues the rule.

    It also records each rule's span in the spec text (start, end, line), since
    lark gives no positions to a transformer that runs inside the LALR parser.
    """

    always_accept = ("_NL",)
    _OPEN = {"LPAR", "LESSTHAN"}
    _CLOSE = {"RPAR", "MORETHAN"}

    def __init__(self) -> None:
        self._local = threading.local()

    def spans(self) -> list[list[int]]:
        """The [start, end, line] of each rule of the text this thread last parsed."""
        return self._local.spans

    def process(self, stream: Iterator[Token]) -> Iterator[Token]:
        depth = 0
        spans: list[list[int]] = []
        self._local.spans = spans
        in_rule = False
        for token in stream:
            if token.type in self._OPEN:
                depth += 1
            elif token.type in self._CLOSE:
                depth = max(0, depth - 1)
            elif token.type == "_NL" and depth:
                continue
            if token.type in ("_NL", "SEMICOLON"):
                in_rule = False
            elif not in_rule:
                spans.append([token.start_pos, token.end_pos, token.line])
                in_rule = True
            else:
                spans[-1][1] = token.end_pos
            yield token


def _string(token: Token) -> str:
    try:
        text = json.loads(token)
    except json.JSONDecodeError as error:
        raise SpecTextError(
            f"bad escape in string ({error.msg.lower()}); use \\\" \\\\ \\n \\t or \\uXXXX", token
        ) from None
    bad = _UNCARRIED.search(text)
    if bad is not None:
        raise SpecTextError(f"this escape gives {describe_char(bad.group())}; remove it", _escape_of(token, bad.start()))
    return text


# Text that NVTX cannot carry exactly: a NUL (NVTX messages are C strings, cut
# at the first NUL) and lone surrogates (no UTF-8 encoding: the nvtx package
# raises at the first call). An op name never holds a control character, so a
# pattern may not hold one either.
_UNCARRIED = re.compile("[\x00\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_STRING_PIECE = re.compile(r'\\u[0-9a-fA-F]{4}|\\.|[^\\]')


def _escape_of(token: Token, index: int) -> Token:
    """The piece of `token` (for a STRING, an escape or a character) that gives character `index` of its text."""
    if token.type != "STRING":
        return Token(token.type, str(token)[index], start_pos=token.start_pos + index)
    body = str(token)[1:-1]
    for piece in _STRING_PIECE.finditer(body):
        if len(json.loads('"' + body[: piece.end()] + '"')) > index:
            return Token(token.type, piece.group(), start_pos=token.start_pos + 1 + piece.start())
    return token


def _refuse_uncarried(text: str) -> None:
    """Raise `SpecTextError` at the first NUL or lone surrogate in the spec text (see above)."""
    bad = _UNCARRIED.search(text)
    if bad is not None:
        raise SpecTextError(
            f"spec text cannot contain {describe_char(bad.group())}; remove it",
            Token("CHAR", bad.group(), start_pos=bad.start()),
        )


def _text(token: Token) -> str:
    return _string(token) if token.type == "STRING" else str(token)


def _patterns(tokens: list[Token]) -> tuple[str, ...]:
    patterns = []
    for token in tokens:
        text = _text(token)
        if not text:
            raise SpecTextError("an empty pattern matches nothing; remove it or write a name", token)
        control = _CONTROL.search(text)
        if control is not None:
            raise SpecTextError(
                f"a pattern cannot contain {describe_char(control.group())}; remove it",
                _escape_of(token, control.start()),
            )
        patterns.append(text)
    return tuple(patterns)


# The pattern of a `source <file.py:52>` or `source <file.py:52..60>` filter.
_FILE_LINES = re.compile(r"(?P<file>.+):(?P<first>[0-9]+)(?:\.\.(?P<last>[0-9]+))?\Z", re.DOTALL)


@v_args(inline=False)
class _ToTree(Transformer):
    """Builds `tree` dataclasses straight from the LALR parser (no parse tree kept)."""

    def start(self, rules: list[Rule]) -> list[Rule]:
        return rules

    def rule(self, children) -> Rule:
        label = children[0] if len(children) == 2 else None
        return Rule(children[-1], label)

    def label(self, children: list[Token]) -> str:
        (token,) = children
        text = _text(token)
        if not text:
            raise SpecTextError("a label cannot be empty; write a name or drop the label", token)
        return text

    def or_expr(self, children) -> Or:
        return Or(tuple(children))

    def and_expr(self, children) -> And:
        return And(tuple(children))

    def not_expr(self, children) -> Not:
        return Not(children[0])

    def op_in(self, children) -> OpIn:
        return OpIn(_patterns(children))

    def reads(self, children) -> Reads:
        return Reads(_patterns(children))

    def module_in(self, children) -> ModuleIn:
        return ModuleIn(_patterns(children))

    def class_in(self, children) -> ClassIn:
        return ClassIn(_patterns(children))

    def each_module(self, children) -> EachModule:
        return EachModule(_patterns(children))

    def each_class(self, children) -> EachClass:
        return EachClass(_patterns(children))

    def marker_in(self, children) -> MarkerIn:
        return MarkerIn(_patterns(children))

    def each_marker(self, children) -> EachMarker:
        return EachMarker(_patterns(children))

    def source(self, children) -> Source:  # the `source <file:lines>` filter
        (token,) = children
        (text,) = _patterns(children)
        found = _FILE_LINES.match(text)
        if found is None:
            raise SpecTextError(
                f"source <{text}> names no line; write source <file.py:52> or source <file.py:52..60>", token
            )
        first = int(found["first"])
        last = int(found["last"]) if found["last"] is not None else first
        if first < 1:
            raise SpecTextError("source lines count from 1", token)
        if last < first:
            raise SpecTextError(
                f"source lines {first}..{last} end before they start; write {found['file']}:{last}..{first}", token
            )
        return Source(found["file"], first, last)

    def between(self, children) -> Between:
        return Between(children[0], children[1])

    def forward(self, _) -> Forward:
        return Forward()

    def backward(self, _) -> Backward:
        return Backward()

    def backward_of(self, children) -> BackwardOf:
        return BackwardOf(children[0])

    def all(self, _) -> All:
        return All()

    def rank_in(self, children: list[Token]) -> RankIn:
        return RankIn(tuple(int(t) for t in children))

    def steps(self, children: list[Token]) -> Steps:
        first = int(children[0])
        last = int(children[1]) if len(children) > 1 else None
        if last is not None and last < first:
            raise SpecTextError(
                f"steps {first}..{last} ends before it starts; write steps {last}..{first}", children[1]
            )
        return Steps(first, last)

    def proxy(self, children: list[Token]) -> Proxy:
        (token,) = children
        name = _text(token)
        if not name:
            raise SpecTextError("a proxy name cannot be empty", token)
        return Proxy(name)

    def first(self, children) -> First:
        return First(children[0])

    def last(self, children) -> Last:
        return Last(children[0])


@functools.lru_cache(maxsize=1)
def _parser() -> lark.Lark:
    return lark.Lark(
        grammar_text(),
        parser="lalr",
        lexer="contextual",
        postlex=BracketNewlines(),
        maybe_placeholders=False,
        transformer=_ToTree(),
    )


def parse(text: str, *, filename: str = "<select>") -> Spec:
    """Parse spec text into a `Spec` tree.

    Raises `SelectorSyntaxError` (also a `SyntaxError` and a `SelectorError`)
    for any text that is not a spec, and `TypeError` if `text` is not a str.
    """
    if not isinstance(text, str):
        raise TypeError(f"a spec is text (str), not {type(text).__name__}")
    parser = _parser()
    try:
        _refuse_uncarried(text)
        rules = parser.parse(text)
    except (lark.exceptions.LarkError, SpecTextError) as error:
        raise syntax_error_for(error, text, filename) from None
    spans = parser.options.postlex.spans()
    for rule, (start, _, _) in zip(rules, spans):
        levels = depth(rule.expr)
        if levels > MAX_NESTING:
            raise syntax_error_at(
                f"this rule nests {levels} levels deep, over the limit of {MAX_NESTING}; "
                "simplify it (not not X is X; a and (b and c) is a and b and c)",
                text=text, filename=filename, pos=start,
            )  # fmt: skip
    rules = tuple(
        dataclasses.replace(rule, line=line, text=text[start:end]) for rule, (start, end, line) in zip(rules, spans)
    )
    return Spec(rules, filename=filename)


def parse_bytes(data: bytes, filename: str) -> Spec:
    """Decode and parse the bytes of a spec (a file's, or standard input's).

    Like Python for source files, a leading UTF-8 byte order mark is dropped.
    Raises `SelectorError` naming `filename` for data that is not UTF-8 text
    (with the byte offset) or is binary (holds a NUL byte), and
    `SelectorSyntaxError` when the text does not parse.
    """
    nul = data.find(b"\x00")
    if nul != -1:
        raise SelectorError(f"{filename}: binary data, not spec text (a NUL byte at offset {nul}); a spec is UTF-8 text")
    try:
        text = data.removeprefix(b"\xef\xbb\xbf").decode("utf-8")
    except UnicodeDecodeError as error:
        bom = 3 if data.startswith(b"\xef\xbb\xbf") else 0
        at = error.start + bom
        line = data.count(b"\n", 0, at) + 1
        raise SelectorError(
            f"{filename}: not UTF-8 text (byte {at} is 0x{data[at]:02X}, on line {line}: {error.reason}); save it as UTF-8"
        ) from None
    return parse(text, filename=filename)


def load(path: str | os.PathLike[str]) -> Spec:
    """Read and parse a ``.nvtx`` file (decoded as `parse_bytes` does).

    Raises `SelectorError` naming the path when it is missing, a directory,
    unreadable, binary or not UTF-8, and `SelectorSyntaxError` (with the path
    as its filename) when its text does not parse.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SelectorError(f"{path}: no such spec file; check the path (working directory is {os.getcwd()})") from None
    except IsADirectoryError:
        raise SelectorError(f"{path}: is a directory; name a .nvtx file inside it") from None
    except OSError as error:
        raise SelectorError(f"{path}: cannot read the spec file: {error.strerror}") from None
    return parse_bytes(data, str(path))


def spec_from_arguments(select: str | None, spec: str | os.PathLike[str] | None) -> Spec | None:
    """The spec given as text and/or a ``.nvtx`` file: the file's rules first,
    then `select`'s, as if appended to the file. None when neither is given."""
    if select is None and spec is None:
        return None
    rules: tuple[Rule, ...] = ()
    filename = "<select>"
    if spec is not None:
        loaded = load(spec)
        rules, filename = loaded.rules, loaded.filename
    if select is not None:
        rules += parse(select).rules
    return Spec(rules, filename=filename)


# What a spec without rules is, in every message that says so (`given_spec`, ``nvtx-regions check``).
NO_RULES = "no rules (only blank lines and comments), so it selects nothing"


def given_spec(
    select: str | None, spec: str | os.PathLike[str] | None, *, default: str, where: str, strict: bool, stacklevel: int = 1
) -> Spec:
    """The spec of `select` and/or `spec` (`spec_from_arguments`); with neither, `default` parsed.

    A spec given with no rules (blank lines and comments only) emits no range. Every backend's entry
    point (`annotate`, `NvtxProfileTransform`, `NvtxInductor`; `nvtx_regions.compile` through them)
    calls this, so that such a spec gives one `NvtxRegionsWarning` with one text on every backend,
    naming `where` (the entry point), what was given, and the way out; `strict=True` raises
    `SelectorError` with that text instead. `stacklevel` counts from the caller of this function,
    as for `warnings.warn`.
    """
    given = spec_from_arguments(select, spec)
    if given is None:
        return parse(default)
    if not given.rules:
        named = ", ".join(
            f"{name}={value!r}" for name, value in (("select", select), ("spec", spec and os.fspath(spec))) if value is not None
        )
        message = (
            f"{where}({named}): the spec has {NO_RULES}, and no range will be emitted; "
            f"write a rule, or leave select and spec out for the default spec, {default!r}"
        )
        if strict:
            raise SelectorError(message)
        warnings.warn(message, NvtxRegionsWarning, stacklevel=stacklevel + 1)
    return given
