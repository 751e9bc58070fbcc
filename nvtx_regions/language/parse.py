"""Text to spec tree: `parse`, `load`, and the grammar loader.

Every error in a spec's text is raised here, as `SelectorSyntaxError`, with the
file, line, column and source line, in the user's words (never lark's terminal
names). The grammar is read from the installed package (`grammar_text`).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import os
import re
import threading
from importlib import resources
from pathlib import Path
from typing import Iterator

import lark
from lark import Token, Transformer, v_args

from ..core.errors import SelectorError, SelectorSyntaxError
from .tree import (
    KEYWORDS,
    All,
    And,
    Backward,
    BackwardOf,
    Between,
    ClassIn,
    EachClass,
    EachModule,
    First,
    Forward,
    Last,
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
)

__all__ = ["parse", "load", "spec_from_arguments", "grammar_text", "grammar_resource"]

GRAMMAR_PACKAGE = "nvtx_regions"
GRAMMAR_FILE = "grammar/nvtx_regions.lark"


def grammar_resource() -> resources.abc.Traversable:
    """The grammar file as installed with the package (shipped from `grammar/`)."""
    return resources.files(GRAMMAR_PACKAGE).joinpath(GRAMMAR_FILE)


def grammar_text() -> str:
    """The text of `grammar_resource`."""
    return grammar_resource().read_text(encoding="utf-8")


class BracketNewlines:
    """Lark post-lexer: a newline inside ``( )`` or ``< >`` continues the rule.

    It also records each rule's source span (start, end, line), since lark
    gives no positions to a transformer that runs inside the LALR parser.
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


class _SourceError(Exception):
    """Raised inside the tree builder; turned into SelectorSyntaxError by `parse`."""

    def __init__(self, message: str, token: Token) -> None:
        super().__init__(message)
        self.message = message
        self.token = token


def _string(token: Token) -> str:
    try:
        text = json.loads(token)
    except json.JSONDecodeError as error:
        raise _SourceError(
            f"bad escape in string ({error.msg.lower()}); use \\\" \\\\ \\n \\t or \\uXXXX", token
        ) from None
    bad = _UNCARRIED.search(text)
    if bad is not None:
        raise _SourceError(f"this escape gives {_describe_char(bad.group())}; remove it", _escape_of(token, bad.start()))
    return text


# Text that NVTX cannot carry exactly: a NUL (NVTX messages are C strings, cut
# at the first NUL) and lone surrogates (no UTF-8 encoding: the nvtx package
# raises at the first call). An op name never holds a control character, so a
# pattern may not hold one either.
_UNCARRIED = re.compile("[\x00\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_UNPRINTABLE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\ud800-\udfff]")
_STRING_PIECE = re.compile(r'\\u[0-9a-fA-F]{4}|\\.|[^\\]')


def _describe_char(char: str) -> str:
    code = f"U+{ord(char):04X}"
    if "\ud800" <= char <= "\udfff":
        return f"{code}, a lone surrogate, which is not text (NVTX takes UTF-8)"
    if char == "\x00":
        return f"{code} (NUL), where NVTX would cut the text short"
    return f"{code}, a control character, which no op name holds"


def _escape_of(token: Token, index: int) -> Token:
    """The piece of `token` (for a STRING, an escape or a character) that gives character `index` of its text."""
    if token.type != "STRING":
        return Token(token.type, str(token)[index], start_pos=token.start_pos + index)
    body = str(token)[1:-1]
    for piece in _STRING_PIECE.finditer(body):
        if len(json.loads('"' + body[: piece.end()] + '"')) > index:
            return Token(token.type, piece.group(), start_pos=token.start_pos + 1 + piece.start())
    return token


def _check_source(text: str) -> None:
    """Raise `_SourceError` at the first NUL or lone surrogate in the raw text (see above)."""
    bad = _UNCARRIED.search(text)
    if bad is not None:
        raise _SourceError(
            f"spec text cannot contain {_describe_char(bad.group())}; remove it",
            Token("CHAR", bad.group(), start_pos=bad.start()),
        )


def _text(token: Token) -> str:
    return _string(token) if token.type == "STRING" else str(token)


def _patterns(tokens: list[Token]) -> tuple[str, ...]:
    patterns = []
    for token in tokens:
        text = _text(token)
        if not text:
            raise _SourceError("an empty pattern matches nothing; remove it or write a name", token)
        control = _CONTROL.search(text)
        if control is not None:
            raise _SourceError(
                f"a pattern cannot contain {_describe_char(control.group())}; remove it",
                _escape_of(token, control.start()),
            )
        patterns.append(text)
    return tuple(patterns)


_SOURCE = re.compile(r"(?P<file>.+):(?P<first>[0-9]+)(?:\.\.(?P<last>[0-9]+))?\Z", re.DOTALL)


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
            raise _SourceError("a label cannot be empty; write a name or drop the label", token)
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

    def source(self, children) -> Source:
        (token,) = children
        (text,) = _patterns(children)
        found = _SOURCE.match(text)
        if found is None:
            raise _SourceError(
                f"source <{text}> names no line; write source <file.py:52> or source <file.py:52..60>", token
            )
        first = int(found["first"])
        last = int(found["last"]) if found["last"] is not None else first
        if first < 1:
            raise _SourceError("source lines count from 1", token)
        if last < first:
            raise _SourceError(
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
            raise _SourceError(
                f"steps {first}..{last} ends before it starts; write steps {last}..{first}", children[1]
            )
        return Steps(first, last)

    def proxy(self, children: list[Token]) -> Proxy:
        (token,) = children
        name = _text(token)
        if not name:
            raise _SourceError("a proxy name cannot be empty", token)
        return Proxy(name)

    def first(self, children) -> First:
        return First(children[0])

    def last(self, children) -> Last:
        return Last(children[0])


# What each terminal is, in the words of the language reference.
_TERMINAL_WORDS = {
    "NAME": "a name",
    "GLOB": "an op name or glob",
    "STRING": 'a "quoted string"',
    "INT": "a number",
    "_NL": "end of line",
    "$END": "end of input",
}
# Order in which alternatives are listed in a message: keywords, punctuation, then kinds of word.
_ORDER = ["COMMA", "MORETHAN", "RPAR", "COLON", "LPAR", "LESSTHAN"]


@functools.lru_cache(maxsize=None)
def _literal_terminals() -> dict[str, str]:
    parser = lark.Lark(grammar_text(), parser="lalr")
    return {t.name: t.pattern.value for t in parser.terminals if isinstance(t.pattern, lark.lexer.PatternStr)}


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


def _describe_terminal(name: str) -> str:
    if name in _TERMINAL_WORDS:
        return _TERMINAL_WORDS[name]
    literal = _literal_terminals().get(name)
    return f'"{literal}"' if literal is not None else name.lower()


def _alternatives(expected: set[str]) -> str:
    literals = _literal_terminals()

    def order(name: str) -> tuple[int, str]:
        if name in _TERMINAL_WORDS:
            return (3, name)
        if name in _ORDER:
            return (2, str(_ORDER.index(name)))
        return (1, literals.get(name, name))

    names = sorted(expected - {"_NL", "$END", "SEMICOLON"}, key=order)
    words = [_describe_terminal(n) for n in names]
    if expected & {"_NL", "$END", "SEMICOLON"}:
        words.append("the end of the rule")
    if not words:
        return "nothing more"
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def _closing_hint(expected: set[str]) -> str:
    if "MORETHAN" in expected:
        return ' to close the "<" list'
    if "RPAR" in expected:
        return ' to close "("'
    return ""


def _got(token: Token) -> str:
    if token.type == "$END":
        return "end of input"
    if token.type == "_NL":
        return "end of line"
    return '"' + _UNPRINTABLE.sub(lambda m: f"U+{ord(m.group()):04X}", str(token)) + '"'


_WORD_AT = re.compile(r'[^\s,<>()";#]+')
_WORD_BEFORE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*$")
_FILTER_WORDS = [
    "op", "reads", "between", "forward", "backward", "all", "rank", "steps", "not",
    "module", "class", "each", "source",
]  # fmt: skip


def _message_for_token(error: lark.exceptions.UnexpectedToken, source_line: str, column: int) -> tuple[str, int]:
    """The message and 1-based column for an unexpected token."""
    token = error.token
    # LALR's own `expected` includes look-ahead of reductions; `accepts()` asks
    # the parser state what it would really take next.
    expected = set(error.interactive_parser.accepts()) if error.interactive_parser else set(error.expected)
    before = source_line[: column - 1]
    word = _WORD_BEFORE.search(before)
    if token.type == "COLON" and word and word.group(1) in KEYWORDS:
        keyword = word.group(1)
        return (f'the label "{keyword}" is a keyword; quote it: "{keyword}":', word.start(1) + 1)
    if expected == {"COLON"} and word:
        name = word.group(1)
        close = difflib.get_close_matches(name, _FILTER_WORDS, n=1)
        hint = f' (did you mean "{close[0]}"?)' if close else ""
        return (
            f'unknown filter "{name}"{hint}; a rule starts with a filter '
            f"({', '.join(_FILTER_WORDS)}) or a label followed by \":\"",
            word.start(1) + 1,
        )
    return (f"expected {_alternatives(expected)}{_closing_hint(expected)}, got {_got(token)}", column)


def _syntax_error(message: str, *, source: str, filename: str, pos: int, width: int = 1) -> SelectorSyntaxError:
    """Build the error for character offset `pos` of `source` (pos may be len(source))."""
    pos = min(max(pos, 0), len(source))
    line_start = source.rfind("\n", 0, pos) + 1
    line_end = source.find("\n", pos)
    line_end = len(source) if line_end == -1 else line_end
    # Shown, not parsed: what would garble or fail to print becomes U+FFFD, one column each.
    text = _UNPRINTABLE.sub("\ufffd", source[line_start:line_end].rstrip("\r"))
    lineno = source.count("\n", 0, pos) + 1
    offset = pos - line_start + 1
    return SelectorSyntaxError(
        message, filename=filename, lineno=lineno, offset=offset, text=text, end_offset=offset + max(width, 1)
    )


def _convert(error: Exception, source: str, filename: str) -> SelectorSyntaxError:
    if isinstance(error, _SourceError):
        token = error.token
        return _syntax_error(
            error.message, source=source, filename=filename, pos=token.start_pos, width=len(token)
        )
    if isinstance(error, lark.exceptions.UnexpectedCharacters):
        char = source[error.pos_in_stream]
        if _UNPRINTABLE.match(char):
            char = f"U+{ord(char):04X}"
        expected = set(error.allowed or ())
        if char == '"':
            message = 'this string is not closed; end it with " on the same line'
        else:
            message = f'unexpected character "{char}"; expected {_alternatives(expected)}{_closing_hint(expected)}'
        return _syntax_error(message, source=source, filename=filename, pos=error.pos_in_stream)
    if isinstance(error, lark.exceptions.UnexpectedToken):
        token = error.token
        if token.type == "$END" or token.start_pos is None:
            # At end of input the caret goes after the last character (of the last line).
            pos, width = len(source.rstrip("\r\n")), 1
        else:
            pos, width = token.start_pos, len(token) if token.type != "_NL" else 1
            word = _WORD_AT.match(source, pos)
            if word and word.end() - pos > width:
                # The fallback lexer may have matched only part of the word the user wrote.
                token = Token(token.type, word.group(0), start_pos=pos)
                error.token, width = token, len(token)
        line_start = source.rfind("\n", 0, pos) + 1
        line_end = source.find("\n", pos)
        line = source[line_start : len(source) if line_end == -1 else line_end]
        message, column = _message_for_token(error, line, pos - line_start + 1)
        if column != pos - line_start + 1:
            word_pos = line_start + column - 1
            word = _WORD_BEFORE.search(line[: pos - line_start])
            return _syntax_error(
                message, source=source, filename=filename, pos=word_pos, width=len(word.group(1)) if word else 1
            )
        return _syntax_error(message, source=source, filename=filename, pos=pos, width=width)
    # No UnexpectedEOF: lark raises it from Earley only; LALR reports the end as an UnexpectedToken "$END".
    raise error


def parse(text: str, *, filename: str = "<select>") -> Spec:
    """Parse spec text into a `Spec` tree.

    Raises `SelectorSyntaxError` (also a `SyntaxError` and a `SelectorError`)
    for any text that is not a spec, and `TypeError` if `text` is not a str.
    """
    if not isinstance(text, str):
        raise TypeError(f"a spec is text (str), not {type(text).__name__}")
    parser = _parser()
    try:
        _check_source(text)
        rules = parser.parse(text)
    except (lark.exceptions.LarkError, _SourceError) as error:
        raise _convert(error, text, filename) from None
    spans = parser.options.postlex.spans()
    rules = tuple(
        dataclasses.replace(rule, line=line, text=text[start:end]) for rule, (start, end, line) in zip(rules, spans)
    )
    return Spec(rules, filename=filename)


def load(path: str | os.PathLike[str]) -> Spec:
    """Read and parse a ``.nvtx`` file.

    Raises `SelectorError` naming the path when it is missing, a directory, or
    not UTF-8, and `SelectorSyntaxError` (with the path as its filename) when
    its text does not parse.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SelectorError(f"{path}: no such spec file; check the path (working directory is {os.getcwd()})") from None
    except IsADirectoryError:
        raise SelectorError(f"{path}: is a directory; name a .nvtx file inside it") from None
    except UnicodeDecodeError as error:
        raise SelectorError(
            f"{path}: not UTF-8 text (byte {error.start}: {error.reason}); save the file as UTF-8"
        ) from None
    except OSError as error:
        raise SelectorError(f"{path}: cannot read the spec file: {error.strerror}") from None
    return parse(text, filename=str(path))


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
