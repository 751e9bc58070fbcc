"""The grammar file, and what the rest of the package knows of the syntax.

``grammar/nvtx_regions.lark`` is the one definition of the selector language.
It is read from the installed package (`grammar_text`), and everything else
that depends on the syntax (the reserved words, the shape of a name or a glob,
the words a rule can start with) is derived from it by `derive`, never
written out a second time.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import resources
from typing import Mapping

from lark.lexer import PatternStr
from lark.load_grammar import load_grammar

__all__ = ["GRAMMAR_PACKAGE", "GRAMMAR_FILE", "grammar_resource", "grammar_text", "Syntax", "derive", "syntax"]

GRAMMAR_PACKAGE = "nvtx_regions"
GRAMMAR_FILE = "grammar/nvtx_regions.lark"


def grammar_resource() -> resources.abc.Traversable:
    """The grammar file as installed with the package (shipped from `grammar/`)."""
    return resources.files(GRAMMAR_PACKAGE).joinpath(GRAMMAR_FILE)


def grammar_text() -> str:
    """The text of `grammar_resource`."""
    return grammar_resource().read_text(encoding="utf-8")


@dataclass(frozen=True)
class Syntax:
    """Facts about the syntax, derived from a grammar's text by `derive`."""

    # Terminal name -> the exact text it stands for ("LESSTHAN" -> "<", "OP" -> "op").
    literals: Mapping[str, str]
    # Terminal name -> regular expression, for the terminals defined by one ("NAME", "GLOB", ...).
    patterns: Mapping[str, str]
    # Every literal spelled like a NAME: a label or proxy spelled like one must be quoted.
    keywords: frozenset[str]
    # The keywords a rule can start with, in the order the grammar first writes them.
    rule_starts: tuple[str, ...]

    def fullmatch(self, terminal: str) -> re.Pattern[str]:
        """A compiled regex that matches a whole string the named terminal would lex as."""
        return re.compile(f"(?:{self.patterns[terminal]})\\Z")


def _first_terminals(rules, origin: str) -> set[str]:
    """The terminals that can begin a derivation of `origin` (its FIRST set)."""
    nullable: set[str] = set()
    first: dict[str, set[str]] = {rule.origin.name: set() for rule in rules}
    changed = True
    while changed:
        changed = False
        for rule in rules:
            name = rule.origin.name
            before = (len(first[name]), name in nullable)
            for symbol in rule.expansion:
                if symbol.is_term:
                    first[name].add(symbol.name)
                    break
                first[name] |= first[symbol.name]
                if symbol.name not in nullable:
                    break
            else:
                nullable.add(name)
            changed |= before != (len(first[name]), name in nullable)
    return first[origin]


def derive(text: str) -> Syntax:
    """Derive the `Syntax` of the grammar `text` (lark's grammar language).

    Only lark's grammar loader runs (no parse tables are built), so this is
    cheap enough to run at import.
    """
    grammar, _ = load_grammar(text, "<grammar>", [], False)
    terminals, rules, _ = grammar.compile(["start"], set())
    literals = {t.name: t.pattern.value for t in terminals if isinstance(t.pattern, PatternStr)}
    patterns = {t.name: t.pattern.value for t in terminals if not isinstance(t.pattern, PatternStr)}
    name = re.compile(f"(?:{patterns['NAME']})\\Z")
    keywords = {term: word for term, word in literals.items() if name.match(word)}
    starts = _first_terminals(rules, "rule")
    # `terminals` lists literals in the order the grammar first writes them.
    rule_starts = tuple(keywords[t.name] for t in terminals if t.name in keywords and t.name in starts)
    return Syntax(literals, patterns, frozenset(keywords.values()), rule_starts)


@functools.lru_cache(maxsize=1)
def syntax() -> Syntax:
    """The `Syntax` of the installed grammar."""
    return derive(grammar_text())
