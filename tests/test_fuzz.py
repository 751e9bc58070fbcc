"""Hypothesis: the real grammar as a fuzzer, generated trees round-tripping
through render/parse, and arbitrary text raising nothing but our own error."""

from __future__ import annotations

import re

import lark
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.lark import from_lark

from nvtx_regions import SelectorSyntaxError, parse, render
from nvtx_regions.language import tree as T
from nvtx_regions.language.grammar import grammar_text, syntax
from nvtx_regions.language.syntax_messages import UNPRINTABLE

KEYWORDS = syntax().keywords
GRAMMAR = lark.Lark(grammar_text(), parser="lalr")
_KEYWORD_TERMINALS = {name: word for name, word in syntax().literals.items() if word in KEYWORDS}

_identifier = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True).filter(lambda s: s not in KEYWORDS)

# from_lark puts nothing between adjacent terminals and drops ignored tokens
# (comments) anywhere, even mid-line: give keywords and words their own
# spaces, and keep comments to where they cannot swallow the rest of a rule.
EXPLICIT = {
    **{name: st.just(f" {word} ") for name, word in _KEYWORD_TERMINALS.items()},
    "NAME": _identifier.map(lambda s: f" {s} "),
    "GLOB": st.sampled_from(
        ["linear", "nvFusion*", "TorchCompile?", "torch.ops.aten.add", "[ab]*", "transformer.h.*", "**.attn",
         "nanogpt_model.py:52", "model.py:3..9"]
    ).map(
        lambda s: f" {s} "
    ),
    "INT": st.integers(0, 99).map(lambda n: f" {n} "),
    # Text NVTX can carry (control characters and lone surrogates are errors by
    # design, fuzzed by the arbitrary-text tests below).
    "STRING": st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=5).map(
        lambda s: " " + __import__("json").dumps(s) + " "
    ),
    "COMMENT": st.sampled_from(["", " "]),
    "_NL": st.sampled_from(["\n", "\n\n", "\r\n"]),
}

SPEC_TEXT = from_lark(GRAMMAR, start="start", explicit=EXPLICIT)


def test_grammar_generated_text_parses_or_raises_our_error():
    outcomes: list[bool] = []

    # 100 texts: from_lark makes them slowly (200 took 34 s of the default tier's 6 minutes).
    @settings(max_examples=100, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(SPEC_TEXT)
    def run(text):
        try:
            spec = parse(text)
        except SelectorSyntaxError:
            outcomes.append(False)
            return
        outcomes.append(True)
        assert parse(render(spec)) == spec

    run()
    # A fuzzer that only makes errors tests little. The grammar cannot say three
    # things (no steps a..b with b < a, no keyword as a bare label, a source
    # pattern is file:line): the rest parses.
    assert len(outcomes) >= 50
    assert sum(outcomes) >= 0.7 * len(outcomes), f"only {sum(outcomes)} of {len(outcomes)} texts were valid"


# -- trees -------------------------------------------------------------------

# Text NVTX can carry (no NUL, no lone surrogate; no control character at all, since patterns refuse them).
_text = st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=8)
_globs = st.lists(_text | st.sampled_from(["linear", "nv*", "t_?"]), min_size=1, max_size=3).map(tuple)
_leaves = st.one_of(
    _globs.map(T.OpIn),
    _globs.map(T.Reads),
    st.builds(T.Forward),
    st.builds(T.Backward),
    st.builds(T.All),
    st.lists(st.integers(0, 512), min_size=1, max_size=3).map(lambda r: T.RankIn(tuple(r))),
    st.tuples(st.integers(0, 99), st.integers(0, 99) | st.none()).map(
        lambda t: T.Steps(t[0], None if t[1] is None else t[0] + t[1])
    ),
    _globs.map(T.ModuleIn),
    _globs.map(T.ClassIn),
    _globs.map(T.EachModule),
    _globs.map(T.EachClass),
    _globs.map(T.MarkerIn),
    _globs.map(T.EachMarker),
    st.tuples(_text, st.integers(1, 999), st.integers(0, 99)).map(lambda t: T.Source(t[0], t[1], t[1] + t[2])),
)


def _extend(children):
    endpoint = st.one_of((_text | _identifier).map(T.Proxy), children.map(T.First), children.map(T.Last))
    return st.one_of(
        st.lists(children, min_size=2, max_size=3).map(lambda c: T.And(tuple(c))),
        st.lists(children, min_size=2, max_size=3).map(lambda c: T.Or(tuple(c))),
        children.map(T.Not),
        children.map(T.BackwardOf),
        st.builds(T.Between, endpoint, endpoint),
    )


EXPRS = st.recursive(_leaves, _extend, max_leaves=8)
RULES = st.builds(T.Rule, EXPRS, st.none() | _text | _identifier | st.sampled_from(sorted(KEYWORDS)))
SPECS = st.lists(RULES, max_size=4).map(lambda rules: T.Spec(tuple(rules)))


@settings(max_examples=300)
@given(SPECS)
def test_generated_trees_round_trip(spec):
    text = render(spec)
    assert parse(text) == spec
    assert render(parse(text)) == text


# Arbitrary text, with what NVTX cannot carry mixed in: NUL and other control
# characters, lone surrogates, and escapes that decode to them.
HOSTILE = st.text(
    st.characters(blacklist_categories=()) | st.sampled_from(["\x00", "\x01", "\x7f", "\x85", "\ud800", "\udfff"])
) | st.lists(
    st.sampled_from(['"', "\\u0000", "\\ud800", "\\u0007", "\\n", "a", "op in <", ">", ":", " all", "\x00", "\ud800"]),
    max_size=10,
).map("".join)


@settings(max_examples=500)
@given(HOSTILE)
def test_arbitrary_text_raises_only_selector_syntax_error(text):
    try:
        spec = parse(text)
    except SelectorSyntaxError as error:
        assert error.lineno >= 1 and error.offset >= 1
        line = (text.split("\n")[error.lineno - 1] if text else "").rstrip("\r")
        shown = UNPRINTABLE.sub("\ufffd", line)
        # A long line is cut after the caret (and marked so); what is shown is the line as written.
        assert error.text == shown or (error.text.endswith("\u2026") and shown.startswith(error.text[:-1]))
        assert len(error.text) <= max(error.offset + 80, 160) + 1
        str(error).encode("utf-8")  # printable, whatever the input held
        return
    for rule in spec.rules:  # what parsed can be carried by NVTX
        for part in T.walk(rule.expr):
            for name in getattr(part, "globs", ()) + ((part.name,) if isinstance(part, T.Proxy) else ()):
                assert "\x00" not in name
                name.encode("utf-8")
        if rule.label is not None:
            assert "\x00" not in rule.label
            rule.label.encode("utf-8")


# The grammar's terminal names (lark's words: MORETHAN, _NL, $END), which no message may show.
LARK_WORDS = re.compile(r"(?<![\w$])(?:%s)(?!\w)" % "|".join(map(re.escape, sorted({*syntax().literals, *syntax().patterns, "$END"}))))
SOUP = st.lists(st.sampled_from(["op", "in", "<", ">", ",", "(", ")", "not", "and", "or", "between", "..",
                                 "t3", "x", ":", ";", "\n", "#c\n", "all", "first", "last", "of", "backward",
                                 "steps", "1", "rank", '"q"', "reads", "forward"]), max_size=12)  # fmt: skip


def test_token_soup_parses_or_raises_our_error_in_the_users_words():
    outcomes: list[bool] = []

    @settings(max_examples=300, database=None)
    @given(SOUP)
    def run(words):
        text = " ".join(words)
        try:
            spec = parse(text)
        except SelectorSyntaxError as error:
            outcomes.append(False)
            lines = text.split("\n")
            assert 1 <= error.lineno <= len(lines) and 1 <= error.offset <= len(lines[error.lineno - 1]) + 1, error
            assert not LARK_WORDS.search(error.msg), error.msg
            return
        outcomes.append(True)
        assert parse(render(spec)) == spec

    run()
    # Both outcomes came: the checks of each ran (the empty list, "all", "forward" parse).
    assert len(outcomes) >= 100 and 0 < sum(outcomes) < len(outcomes), f"{sum(outcomes)} of {len(outcomes)} parsed"
