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


# ---------------------------------------------------------------- input people really give (issue 17)

from nvtx_regions.language.parse import MAX_NESTING, parse_bytes  # noqa: E402
from nvtx_regions.language.syntax_messages import UNPRINTABLE  # noqa: E402


def nested(levels: int) -> str:
    """A rule `levels` deep: `not` inside `not`, and a parenthesized `and` at the bottom."""
    return "not " * (levels - 2) + "(op in <linear> and forward)"


@pytest.mark.parametrize(
    "text,lineno,depth",
    [
        ("all\n" + "not " * 500 + "all", 2, 501),
        ("not (" * 500 + "all" + ")" * 500, 1, 501),
        ("# deep\nx: " + "backward of (" * 300 + "all" + ")" * 300, 2, 301),
        ("between first(" * 150 + "all" + ")..t1" * 150, 1, 301),
        (nested(MAX_NESTING + 1), 1, MAX_NESTING + 1),
    ],
    ids=["not", "not-parens", "backward-of", "first", "limit+1"],
)
def test_deep_nesting_is_our_error_naming_the_line_and_the_limit(text, lineno, depth):
    with pytest.raises(SelectorSyntaxError) as info:
        parse(text, filename="deep.nvtx")
    error = info.value
    assert (error.filename, error.lineno) == ("deep.nvtx", lineno)
    assert error.msg == (
        f"this rule nests {depth} levels deep, over the limit of {MAX_NESTING}; "
        "simplify it (not not X is X; a and (b and c) is a and b and c)"
    )
    assert error.offset == 1  # where the rule starts


def test_nesting_at_the_limit_parses_renders_and_compiles():
    from nvtx_regions.selection.compile import compile_spec

    spec = parse(nested(MAX_NESTING))
    assert parse(render(spec)) == spec and hash(spec) == hash(parse(render(spec)))
    compile_spec(spec)
    # Parentheses alone nest nothing in the tree: no limit applies to them.
    assert parse("(" * 5000 + "all" + ")" * 5000) == parse("all")


def test_check_command_reports_deep_nesting_in_one_line(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "deep.nvtx"
    path.write_text("all\n" + "not " * 500 + "all\n", encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "nvtx_regions", "check", str(path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2  # a spec error (commands.status)
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith(f"{path}:2:1: this rule nests 501 levels deep, over the limit of {MAX_NESTING}")


def test_load_accepts_a_utf8_byte_order_mark(tmp_path):
    # As Python does for source files: editors on Windows write one.
    path = tmp_path / "bom.nvtx"
    path.write_bytes(b"\xef\xbb\xbfop in <linear>\nall\n")
    spec = load(path)
    assert spec == Spec((Rule(OpIn(("linear",))), Rule(All())))
    assert [(r.line, r.text) for r in spec.rules] == [(1, "op in <linear>"), (2, "all")]


@pytest.mark.parametrize(
    "text,column,message",
    [
        ("\ufeffop in <linear>", 1, "unexpected U+FEFF, a byte order mark (invisible in most editors); remove it"),
        ("all\nop in <x> and \ufeffforward", 15, "unexpected U+FEFF, a byte order mark (invisible in most editors); remove it"),
        ("all \u200b", 5, "unexpected U+200B, an invisible character; remove it"),
    ],
)
def test_invisible_characters_are_named(text, column, message):
    with pytest.raises(SelectorSyntaxError) as info:
        parse(text)
    assert (info.value.lineno, info.value.offset, info.value.msg) == (text.count("\n") + 1, column, message)


@pytest.mark.parametrize(
    "data,message",
    [
        (
            "op in <caf\xe9>".encode("latin-1"),
            "<stdin>: not UTF-8 text (byte 10 is 0xE9, on line 1: invalid continuation byte); save it as UTF-8",
        ),
        (
            b"all\nop in <x>\n\xff",
            "<stdin>: not UTF-8 text (byte 14 is 0xFF, on line 3: invalid start byte); save it as UTF-8",
        ),
        (bytes(range(256)) * 16, "<stdin>: binary data, not spec text (a NUL byte at offset 0); a spec is UTF-8 text"),
        (
            b"all\n" + b"\x07" * 4000 + b"\x00",
            "<stdin>: binary data, not spec text (a NUL byte at offset 4004); a spec is UTF-8 text",
        ),
        (
            b"\xef\xbb\xbfall \xe9",
            "<stdin>: not UTF-8 text (byte 7 is 0xE9, on line 1: unexpected end of data); save it as UTF-8",
        ),
    ],
    ids=["latin-1", "latin-1-line-3", "binary", "binary-ascii", "after-bom"],
)
def test_parse_bytes_names_what_is_not_text(data, message):
    with pytest.raises(SelectorError) as info:
        parse_bytes(data, "<stdin>")
    assert not isinstance(info.value, SelectorSyntaxError)
    assert str(info.value) == message


def test_parse_bytes_decodes_and_names_the_input():
    spec = parse_bytes('\ufeff"café": op in <x>\n'.encode("utf-8"), "<stdin>")
    assert spec == Spec((Rule(OpIn(("x",)), "café"),)) and spec.filename == "<stdin>"


def test_load_names_the_byte_that_is_not_utf8(tmp_path):
    path = _latin1_file(tmp_path)
    with pytest.raises(SelectorError) as info:
        load(path)
    assert str(info.value) == f"{path}: not UTF-8 text (byte 10 is 0xE9, on line 1: invalid continuation byte); save it as UTF-8"


@pytest.mark.parametrize(
    "text,caret",
    [
        ("op in <" + "\x01" * 4000 + ">", 7),
        ("all " + "\u00e9" * 4000, 4),  # the word found is cut short too
        ("x" * 300 + " \x00" + "y" * 4000, 301),  # the line is cut after the caret only
    ],
    ids=["control", "long-word", "far-right"],
)
def test_errors_on_long_lines_stay_short(text, caret):
    with pytest.raises(SelectorSyntaxError) as info:
        parse(text)
    error = info.value
    assert error.offset == caret + 1  # the column in the user's line
    assert len(str(error)) < 2 * caret + 500, str(error)
    shown = UNPRINTABLE.sub("\ufffd", text)
    assert error.text.endswith("\u2026") and shown.startswith(error.text[:-1])
    assert error.text[error.offset - 1] == shown[caret]
