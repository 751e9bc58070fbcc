"""Lark's errors in the user's words: `syntax_error_for` turns what the parser
raised into a `SelectorSyntaxError` with the file, line, column, the line as
written and a caret span.

Messages name what the language reference names ("a name", ``","``, "end of
input"), never lark's terminal names (``RSQB``, ``$END``).
"""

from __future__ import annotations

import difflib
import re

import lark
from lark import Token

from ..core.errors import SelectorSyntaxError
from .grammar import syntax

__all__ = ["SpecTextError", "describe_char", "syntax_error_at", "syntax_error_for"]


class SpecTextError(Exception):
    """A problem at `token` of the spec text, found while building the tree
    (the grammar allows it, the language does not); `syntax_error_for` places it."""

    def __init__(self, message: str, token: Token) -> None:
        super().__init__(message)
        self.message = message
        self.token = token


# Characters that would garble or fail to print in a message.
UNPRINTABLE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\ud800-\udfff]")
# Characters that print as nothing: a word holding one looks right and does not parse.
_INVISIBLE = re.compile("[\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]")
# A message shows at most this many characters of a word, and of the line after the caret:
# a binary or runaway input must not fill the terminal.
_SHOWN_WORD = 40
_SHOWN_AFTER = 80


def describe_char(char: str) -> str:
    """Name a character that NVTX cannot carry or no op name holds."""
    code = f"U+{ord(char):04X}"
    if "\ud800" <= char <= "\udfff":
        return f"{code}, a lone surrogate, which is not text (NVTX takes UTF-8)"
    if char == "\x00":
        return f"{code} (NUL), where NVTX would cut the text short"
    return f"{code}, a control character, which no op name holds"


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

# A word as the user wrote it (a GLOB), and the NAME just before a position.
_WORD_AT = re.compile(syntax().patterns["GLOB"])
_WORD_BEFORE = re.compile(f"({syntax().patterns['NAME']})\\s*$")


def _describe_terminal(name: str) -> str:
    if name in _TERMINAL_WORDS:
        return _TERMINAL_WORDS[name]
    literal = syntax().literals.get(name)
    return f'"{literal}"' if literal is not None else name.lower()


def _alternatives(expected: set[str]) -> str:
    literals = syntax().literals

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


def _found(token: Token) -> str:
    """What the parser found where it expected something else, as the message's "got ..."."""
    if token.type == "$END":
        return "end of input"
    if token.type == "_NL":
        return "end of line"
    word = str(token)
    cut = f"\u2026\" ({len(word)} characters)" if len(word) > _SHOWN_WORD else '"'
    return '"' + UNPRINTABLE.sub(lambda m: f"U+{ord(m.group()):04X}", word[:_SHOWN_WORD]) + cut


def _invisible(char: str) -> str:
    if char == "\ufeff":
        return "unexpected U+FEFF, a byte order mark (invisible in most editors); remove it"
    return f"unexpected U+{ord(char):04X}, an invisible character; remove it"


def _message_for_token(error: lark.exceptions.UnexpectedToken, line: str, column: int) -> tuple[str, int]:
    """The message and 1-based column for an unexpected token on `line`."""
    token = error.token
    # LALR's own `expected` includes look-ahead of reductions; `accepts()` asks
    # the parser state what it would really take next.
    expected = set(error.interactive_parser.accepts()) if error.interactive_parser else set(error.expected)
    before = line[: column - 1]
    word = _WORD_BEFORE.search(before)
    if token.type == "COLON" and word and word.group(1) in syntax().keywords:
        keyword = word.group(1)
        return (f'the label "{keyword}" is a keyword; quote it: "{keyword}":', word.start(1) + 1)
    if expected == {"COLON"} and word:
        name = word.group(1)
        starts = syntax().rule_starts
        close = difflib.get_close_matches(name, starts, n=1)
        hint = f' (did you mean "{close[0]}"?)' if close else ""
        return (
            f'unknown filter "{name}"{hint}; a rule starts with a filter '
            f"({', '.join(starts)}) or a label followed by \":\"",
            word.start(1) + 1,
        )
    return (f"expected {_alternatives(expected)}{_closing_hint(expected)}, got {_found(token)}", column)


def syntax_error_at(message: str, *, text: str, filename: str, pos: int, width: int = 1) -> SelectorSyntaxError:
    """The error for character offset `pos` of the spec `text` (pos may be len(text))."""
    pos = min(max(pos, 0), len(text))
    line_start = text.rfind("\n", 0, pos) + 1
    line_end = text.find("\n", pos)
    line_end = len(text) if line_end == -1 else line_end
    # Shown, not parsed: what would garble or fail to print becomes U+FFFD, one column each.
    shown = UNPRINTABLE.sub("\ufffd", text[line_start:line_end].rstrip("\r"))
    lineno = text.count("\n", 0, pos) + 1
    offset = pos - line_start + 1
    # Cut on the right only, so that `offset` stays the column in the user's line.
    keep = max(offset + _SHOWN_AFTER, 2 * _SHOWN_AFTER)
    if len(shown) > keep:
        shown = shown[:keep] + "\u2026"
        width = min(width, keep + 1 - offset)
    return SelectorSyntaxError(
        message, filename=filename, lineno=lineno, offset=offset, text=shown, end_offset=offset + max(width, 1)
    )


def syntax_error_for(error: Exception, text: str, filename: str) -> SelectorSyntaxError:
    """The `SelectorSyntaxError` for what parsing the spec `text` raised: a
    `SpecTextError` or one of lark's ``Unexpected*`` errors (anything else is re-raised)."""
    if isinstance(error, SpecTextError):
        token = error.token
        return syntax_error_at(error.message, text=text, filename=filename, pos=token.start_pos, width=len(token))
    if isinstance(error, lark.exceptions.UnexpectedCharacters):
        char = text[error.pos_in_stream]
        if _INVISIBLE.match(char):
            return syntax_error_at(_invisible(char), text=text, filename=filename, pos=error.pos_in_stream)
        if UNPRINTABLE.match(char):
            char = f"U+{ord(char):04X}"
        expected = set(error.allowed or ())
        if char == '"':
            message = 'this string is not closed; end it with " on the same line'
        else:
            message = f'unexpected character "{char}"; expected {_alternatives(expected)}{_closing_hint(expected)}'
        return syntax_error_at(message, text=text, filename=filename, pos=error.pos_in_stream)
    if isinstance(error, lark.exceptions.UnexpectedToken):
        token = error.token
        if token.type == "$END" or token.start_pos is None:
            # At end of input the caret goes after the last character (of the last line).
            pos, width = len(text.rstrip("\r\n")), 1
        else:
            pos, width = token.start_pos, len(token) if token.type != "_NL" else 1
            word = _WORD_AT.match(text, pos)
            if word and word.end() - pos > width:
                # The fallback lexer may have matched only part of the word the user wrote.
                token = Token(token.type, word.group(0), start_pos=pos)
                error.token, width = token, len(token)
            invisible = _INVISIBLE.search(token) if token.type != "STRING" else None
            if invisible is not None:
                return syntax_error_at(
                    _invisible(invisible.group()), text=text, filename=filename, pos=pos + invisible.start()
                )
        line_start = text.rfind("\n", 0, pos) + 1
        line_end = text.find("\n", pos)
        line = text[line_start : len(text) if line_end == -1 else line_end]
        message, column = _message_for_token(error, line, pos - line_start + 1)
        if column != pos - line_start + 1:
            word_pos = line_start + column - 1
            word = _WORD_BEFORE.search(line[: pos - line_start])
            return syntax_error_at(
                message, text=text, filename=filename, pos=word_pos, width=len(word.group(1)) if word else 1
            )
        return syntax_error_at(message, text=text, filename=filename, pos=pos, width=width)
    # No UnexpectedEOF: lark raises it from Earley only; LALR reports the end as an UnexpectedToken "$END".
    raise error
