"""Parser: valid specs and their trees, invalid specs with exact positions and
messages, golden renderings of whole errors, and `load`'s file errors."""

from __future__ import annotations

import json
import traceback
from pathlib import Path

import pytest

from nvtx_regions import SelectorError, SelectorSyntaxError, load, parse, render
from nvtx_regions.language.tree import (
    All,
    And,
    Backward,
    BackwardOf,
    Between,
    First,
    Forward,
    Last,
    Not,
    OpIn,
    Or,
    Proxy,
    RankIn,
    Reads,
    Rule,
    Spec,
    Steps,
)

VALID = [
    ("op in <linear, nvFusion*>", [Rule(OpIn(("linear", "nvFusion*")))]),
    ("op in <TorchCompile?>", [Rule(OpIn(("TorchCompile?",)))]),
    ("op in <torch.ops.aten.embedding_backward>", [Rule(OpIn(("torch.ops.aten.embedding_backward",)))]),
    ('op in <"a b", [ab]*>', [Rule(OpIn(("a b", "[ab]*")))]),
    ("attn: between t3..t9", [Rule(Between(Proxy("t3"), Proxy("t9")), "attn")]),
    ("between x..t_fc1_weight", [Rule(Between(Proxy("x"), Proxy("t_fc1_weight")))]),
    ('"forward": forward', [Rule(Forward(), "forward")]),
    ('"a \\"b\\"\\n\\u00e9": all', [Rule(All(), 'a "b"\né')]),
    ("forward; backward", [Rule(Forward()), Rule(Backward())]),
    ("\n\n# c\nall # trailing\n\n;;", [Rule(All())]),
    ("", []),
    ("# only a comment", []),
    ("a or b: all", None),  # "a or b" is no label: error (checked below)
    (
        "not forward and backward or all",
        [Rule(Or((And((Not(Forward()), Backward())), All())))],
    ),
    ("not (forward or all)", [Rule(Not(Or((Forward(), All()))))]),
    ("all and all and all", [Rule(And((All(), All(), All())))]),
    ("(all and all) and all", [Rule(And((And((All(), All())), All())))]),
    ("op in <a,\n  b>", [Rule(OpIn(("a", "b")))]),
    ("(forward\n or backward)", [Rule(Or((Forward(), Backward())))]),
    ("reads <t_*_weight>", [Rule(Reads(("t_*_weight",)))]),
    (
        "between first(op in <linear>)..last(reads <x>)",
        [Rule(Between(First(OpIn(("linear",))), Last(Reads(("x",)))))],
    ),
    ('between "first"..t2', [Rule(Between(Proxy("first"), Proxy("t2")))]),
    ("backward of (op in <linear>)", [Rule(BackwardOf(OpIn(("linear",))))]),
    ("rank in <0, 3> and steps 10..12", [Rule(And((RankIn((0, 3)), Steps(10, 12))))]),
    ("steps 5..", [Rule(Steps(5, None))]),
]


@pytest.mark.parametrize("text,rules", [v for v in VALID if v[1] is not None])
def test_valid_specs_parse_to_trees(text, rules):
    spec = parse(text)
    assert spec == Spec(tuple(rules))
    assert parse(render(spec)) == spec
    assert render(parse(render(spec))) == render(spec)


def test_rules_know_their_line_and_text():
    spec = parse("# header\nattn: between t3..t9\n\nop in <a,\n b>; all", filename="x.nvtx")
    assert [(r.line, r.text) for r in spec.rules] == [
        (2, "attn: between t3..t9"),
        (4, "op in <a,\n b>"),
        (5, "all"),
    ]
    assert spec.filename == "x.nvtx"
    assert spec.rules[0].describe("x.nvtx") == "rule 'attn: between t3..t9' (x.nvtx:2)"


# (text, line, column, message), checked exactly: kept as data any implementation can run.
INVALID = [
    (case["text"], case["line"], case["column"], case["message"])
    for case in json.loads((Path(__file__).parent / "corpus/syntax_errors.json").read_text(encoding="utf-8"))["cases"]
]


@pytest.mark.parametrize("text,line,column,message", INVALID)
def test_invalid_specs_raise_at_the_place(text, line, column, message):
    with pytest.raises(SelectorSyntaxError) as info:
        parse(text, filename="spec.nvtx")
    error = info.value
    assert (error.lineno, error.offset, error.msg) == (line, column, message)
    assert error.filename == "spec.nvtx"
    assert error.text == text.splitlines()[line - 1]
    assert isinstance(error, SyntaxError) and isinstance(error, SelectorError)


def test_caret_at_end_of_input_is_after_the_last_character():
    with pytest.raises(SelectorSyntaxError) as info:
        parse("op in <linear   ")
    # The caret goes at the end of the text, not under the last token.
    assert info.value.offset == len("op in <linear   ") + 1
    with pytest.raises(SelectorSyntaxError) as info:
        parse("all\nop in <linear\n\n")
    assert (info.value.lineno, info.value.offset) == (2, len("op in <linear") + 1)


GOLDEN = [
    (
        "attn: op in <linear",
        "<select>:1:20: expected \",\" or \">\" to close the \"<\" list, got end of input\n"
        "    attn: op in <linear\n"
        "                       ^",
    ),
    (
        "a: all\nforward: between t1..t2",
        "<select>:2:1: the label \"forward\" is a keyword; quote it: \"forward\":\n"
        "    forward: between t1..t2\n"
        "    ^^^^^^^",
    ),
]


@pytest.mark.parametrize("text,rendering", GOLDEN)
def test_golden_error_rendering(text, rendering):
    with pytest.raises(SelectorSyntaxError) as info:
        parse(text)
    assert str(info.value) == rendering


def test_python_prints_file_line_and_caret():
    with pytest.raises(SelectorSyntaxError) as info:
        parse("all\nop in <x", filename="regions.nvtx")
    printed = "".join(traceback.format_exception_only(type(info.value), info.value))
    assert 'File "regions.nvtx", line 2' in printed
    assert "op in <x" in printed and "^" in printed


def test_parse_rejects_non_text():
    with pytest.raises(TypeError, match="a spec is text"):
        parse(b"all")  # type: ignore[arg-type]


def test_load_reads_a_file(tmp_path):
    path = tmp_path / "regions.nvtx"
    path.write_text("# c\nattn: between t3..t9\nop in <linear>\n", encoding="utf-8")
    spec = load(path)
    assert render(spec) == "attn: between t3..t9\nop in <linear>"
    assert spec.filename == str(path)


def test_load_syntax_error_names_the_file(tmp_path):
    path = tmp_path / "bad.nvtx"
    path.write_text("all\nop in <linear\n", encoding="utf-8")
    with pytest.raises(SelectorSyntaxError) as info:
        load(path)
    assert (info.value.filename, info.value.lineno) == (str(path), 2)


def _latin1_file(directory):
    path = directory / "latin1.nvtx"
    path.write_bytes("op in <caf\xe9>".encode("latin-1"))
    return path


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda p: p / "missing.nvtx", "no such spec file"),
        (lambda p: p, "is a directory"),
        (_latin1_file, "not UTF-8"),
    ],
    ids=["missing", "directory", "not-utf8"],
)
def test_load_file_errors_name_the_path(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(SelectorError) as info:
        load(path)
    assert not isinstance(info.value, SelectorSyntaxError)
    assert str(path) in str(info.value) and message in str(info.value)
