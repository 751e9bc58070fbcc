"""The grammar file is the only copy of the syntax: what the package knows of
it (reserved words, names, globs, the words a rule starts with) is derived from
it, so a change to the grammar reaches every part."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nvtx_regions import SelectorSyntaxError, parse, render
from nvtx_regions.language import tree as T
from nvtx_regions.language.grammar import derive, grammar_text, syntax


def with_filter(text: str, alternative: str) -> str:
    """The grammar `text` with one more alternative for `filter`."""
    anchor = '       | "all"                                             -> all\n'
    assert anchor in text, "the grammar's `filter` rule changed: update this test's anchor"
    return text.replace(anchor, anchor + f"       | {alternative}\n")


def test_a_keyword_added_to_the_grammar_is_derived():
    before = derive(grammar_text())
    after = derive(with_filter(grammar_text(), '"idle" "since" INT -> idle'))
    assert {"idle", "since"} <= after.keywords and not {"idle", "since"} & before.keywords
    assert after.keywords - before.keywords == {"idle", "since"}
    # "idle" starts a rule, "since" does not; the order is the grammar's.
    assert after.rule_starts == before.rule_starts[:7] + ("idle",) + before.rule_starts[7:]
    assert after.literals["IDLE"] == "idle"


def test_a_changed_name_terminal_is_derived():
    changed = derive(grammar_text().replace("NAME: /[A-Za-z_][A-Za-z0-9_]*/", "NAME: /[a-z][a-z0-9-]*/"))
    assert changed.fullmatch("NAME").match("foo-bar") and not changed.fullmatch("NAME").match("Foo")
    assert "op" in changed.keywords and "rank" in changed.keywords


def test_installed_syntax():
    found = syntax()
    assert found.rule_starts == (
        "not", "op", "reads", "between", "forward", "backward", "all", "rank", "steps", "module", "class",
        "each", "source",
    )  # fmt: skip
    assert {"in", "of", "first", "last", "and", "or"} <= found.keywords
    assert set(found.rule_starts) <= found.keywords
    assert found.literals["LESSTHAN"] == "<" and found.literals["__ANON_0"] == ".."
    assert T.KEYWORDS is found.keywords


@pytest.mark.parametrize("word", sorted(syntax().keywords))
def test_every_derived_keyword_is_quoted_as_a_label(word):
    spec = parse(f'"{word}": all')
    assert render(spec) == f'"{word}": all'
    assert parse(render(spec)) == spec
    if word in syntax().rule_starts:
        with pytest.raises(SelectorSyntaxError, match=f'the label "{word}" is a keyword'):
            parse(f"{word}: all")


def test_no_second_copy_of_the_keywords_in_the_package():
    # Four or more reserved words in a row, as string literals: a list of keywords written out again.
    package = Path(T.__file__).resolve().parents[1]
    word = "[\"'](?:%s)[\"']" % "|".join(sorted(syntax().keywords))
    listing = re.compile(rf"{word}(?:\s*,\s*{word}){{3,}}")
    copies = [
        f"{path.relative_to(package)}:{text[: m.start()].count(chr(10)) + 1}"
        for path in sorted(package.rglob("*.py"))
        for text in [path.read_text(encoding="utf-8")]
        for m in listing.finditer(text)
    ]
    assert copies == []


def test_every_kind_of_word_in_the_grammar_has_words_in_messages():
    from nvtx_regions.language.syntax_messages import _TERMINAL_WORDS

    # A terminal defined by a regex (not ignored) needs a description in the user's words.
    ignored = {"COMMENT"} | {name for name in syntax().patterns if name.startswith("__IGNORE")}
    assert set(syntax().patterns) - ignored <= set(_TERMINAL_WORDS)
