"""The long run (issue 9): fuzzing at scale and the mutation pass. Not part of
the default test run (``-m "not long"`` in pyproject.toml); run it with

    python -m pytest -m long tests/test_long.py -s          # fuzzing, about 10 min
    NVTX_REGIONS_MUTATION=1 python -m pytest -m long tests/test_long.py -s -k mutation   # pip install mutmut

Fuzzing feeds 10,000 texts generated from the grammar (with the trace's own
op and proxy names, so that many select something) and 10,000 arbitrary
texts (with NUL, control characters and lone surrogates mixed in) to
`parse`, `compile_spec` and `make_plan` on the forward and backward traces of
a real model. Only our own errors may escape, and every plan must keep the
plan's promises and agree with the reference evaluator (tests/reference.py),
push order included. Counts are printed (``-s``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import lark
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.lark import from_lark

from support.models import compiled
from nvtx_regions import RegionOrderError, SelectorError, SelectorSyntaxError, parse
from nvtx_regions.selection.compile import compile_spec
from nvtx_regions.language.parse import grammar_text
from nvtx_regions.selection.plan import make_plan
from nvtx_regions.attribution.traceview import TraceView
from nvtx_regions.language.tree import KEYWORDS
from reference import Reference, RefError

pytestmark = [pytest.mark.thunder, pytest.mark.long]

EXAMPLES = int(os.environ.get("NVTX_REGIONS_FUZZ_EXAMPLES", "10000"))
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def traces():
    *_, forward, backward = compiled("mlp", None)
    return forward, backward


def check_plans(text: str, traces, outcomes: Counter) -> None:
    """parse -> compile -> plan on both traces: our errors only, and the promises of a plan."""
    try:
        spec = parse(text)
        compiled_spec = compile_spec(spec)
    except SelectorSyntaxError:
        outcomes["syntax error"] += 1
        return
    except SelectorError:
        outcomes["compile error"] += 1
        return
    forward, backward = traces
    ref_forward = Reference(forward)
    forward_view = TraceView.from_trace(forward)
    for trace, ref, view in (
        (forward, ref_forward, forward_view),
        (backward, Reference(backward, forward=ref_forward), None),
    ):
        if view is None:
            view = TraceView.from_trace(trace)
            view.forward = forward_view
        try:
            expected = ref.expected(spec)
        except RefError as why:
            with pytest.raises(SelectorError) as raised:
                make_plan(compiled_spec, view)
            assert isinstance(raised.value, RegionOrderError) == (why.kind == "order"), (text, raised.value)
            outcomes[f"plan error: {why.kind}"] += 1
            continue
        plan = make_plan(compiled_spec, view)
        check_promises(plan, view)
        index = {id(b): i for i, b in enumerate(trace.bound_symbols)}
        got = [(r.start, r.end, r.label) for r in plan.ranges]
        op_ranges = {id(item) for item in expected.op_ranges}  # push_order holds the same tuples
        want = [(index[id(item[0])], index[id(item[1])], None if id(item) in op_ranges else item[2])
                for item in expected.push_order]
        assert [(s, e) for s, e, _ in got] == [(s, e) for s, e, _ in want], text
        assert [label for *_, label in got] == [m for *_, m in want], text
        outcomes["plans with ranges" if plan.ranges else "empty plans"] += 1


def check_promises(plan, view) -> None:
    """What plan.py promises, checked on the plan alone."""
    compute = {op.index for op in view.ops}
    open_ends: list[int] = []
    previous = None
    op_starts = set()
    for r in plan.ranges:
        assert r.start in compute and r.end in compute and r.start <= r.end
        assert r.rules and all(0 <= n < len(plan.ranges_per_rule) for n in r.rules)
        if r.kind == "op":
            assert r.start == r.end and r.label is None and r.start not in op_starts
            op_starts.add(r.start)
        while open_ends and open_ends[-1] < r.start:
            open_ends.pop()
        assert not open_ends or r.end <= open_ends[-1], "ranges overlap without nesting"
        open_ends.append(r.end)
        key = (r.start, r.kind == "op", -r.end)
        assert previous is None or previous <= key, "ranges out of push order"
        previous = key
    assert sum(plan.ranges_per_rule) >= len(plan.ranges)


def _grammar_texts(forward, backward):
    grammar = lark.Lark(grammar_text(), parser="lalr")
    refs = [Reference(forward), Reference(backward)]
    ops = sorted({op.sym.name for r in refs for op in r.ops})
    proxies = sorted({n for r in refs for op in r.ops for n in r.writes(op)} | refs[0].args)
    keywords = {t.name: t.pattern.value for t in grammar.terminals if t.pattern.value in KEYWORDS}
    explicit = {
        **{name: st.just(f" {word} ") for name, word in keywords.items()},
        "NAME": st.sampled_from(proxies).map(lambda s: f" {s} "),
        "GLOB": (st.sampled_from(ops) | st.sampled_from(ops).map(lambda n: n[:2] + "*") | st.just("*")).map(
            lambda s: f" {s} "
        ),
        "INT": st.integers(0, 9).map(lambda n: f" {n} "),
        "STRING": (st.sampled_from(proxies + ops) | st.text(max_size=4)).map(lambda s: " " + json.dumps(s) + " "),
        "COMMENT": st.sampled_from(["", " "]),
        "_NL": st.sampled_from(["\n", ";"]),
    }
    return from_lark(grammar, start="start", explicit=explicit)


HOSTILE = st.text(
    st.characters(blacklist_categories=()) | st.sampled_from(["\x00", "\x01", "\x7f", "\x85", "\ud800", "\udfff"])
) | st.lists(
    st.sampled_from(["op in <", ">", "linear", "*", ",", "between ", "first(", "last(", ")", "..", "t_0_weight",
                     "input", " and ", " or ", "not ", '"', "\\u0000", "\\ud800", ":", "\n", "all", "steps 1..", "rank in <0>"]),
    max_size=14,
).map("".join)


def _fuzz(strategy, traces, label: str) -> Counter:
    outcomes: Counter = Counter()

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
    @given(strategy)
    def run(text):
        outcomes["texts"] += 1
        check_plans(text, traces, outcomes)

    run()
    print(f"\n{label}: {dict(outcomes)}")
    return outcomes


def test_fuzz_grammar_generated_texts(traces):
    outcomes = _fuzz(_grammar_texts(*traces), traces, "grammar-generated")
    assert outcomes["texts"] >= EXAMPLES * 0.9
    assert outcomes["plans with ranges"] >= outcomes["texts"] // 10, "too few texts selected anything"


def test_fuzz_arbitrary_texts(traces):
    outcomes = _fuzz(HOSTILE, traces, "arbitrary")
    assert outcomes["texts"] >= EXAMPLES * 0.9


def test_property_at_length():
    """The property test over generated thunder programs, with 300 examples instead of 30."""
    from test_property import PROGRAMS, test_generated_traces_and_specs

    inner = test_generated_traces_and_specs.hypothesis.inner_test
    examples = int(os.environ.get("NVTX_REGIONS_PROPERTY_EXAMPLES", "300"))
    settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))(
        given(PROGRAMS, st.data())(inner)
    )()


@pytest.mark.skipif(not os.environ.get("NVTX_REGIONS_MUTATION"), reason="set NVTX_REGIONS_MUTATION=1 (about 30 min)")
def test_mutation_pass():
    """mutmut (configured in pyproject.toml) over the planner; prints what survives."""
    env = {
        **os.environ,
        # benchmarks/mutation/sitecustomize.py points `import nvtx_regions` at the mutated copy.
        "PYTHONPATH": str(REPO / "benchmarks" / "mutation"),
        "NVTX_REGIONS_MUTANTS": str(REPO / "mutants"),
    }
    run = subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", "1"], cwd=REPO, env=env,
                         text=True, capture_output=True)
    results = subprocess.run([sys.executable, "-m", "mutmut", "results"], cwd=REPO, env=env, text=True,
                             capture_output=True)
    print(results.stdout)
    assert run.returncode == 0, run.stderr[-3000:]


# ------------------------------------------------------------------ the commands (issue 17)

COMMAND_EXAMPLES = int(os.environ.get("NVTX_REGIONS_COMMAND_FUZZ_EXAMPLES", str(EXAMPLES)))

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.sampled_from([10**400, -(10**400)]) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)
EVENT_KEYS = ["name", "ph", "ts", "dur", "args", "cat", "pid", "tid"]
EVENTS = st.dictionaries(
    st.sampled_from(EVENT_KEYS),
    st.sampled_from(["X", "M", "i", "B", "E"]) | JSON_VALUES | st.dictionaries(st.sampled_from(["domain", "depth"]), JSON_VALUES),
    max_size=8,
) | JSON_VALUES
CHROME_LIKE = st.lists(EVENTS, max_size=6).flatmap(lambda events: st.sampled_from([events, {"traceEvents": events}]))
ARBITRARY_JSON_TEXT = (CHROME_LIKE | JSON_VALUES).map(lambda value: json.dumps(value, allow_nan=True))
ARBITRARY_BYTES = st.binary(max_size=200) | ARBITRARY_JSON_TEXT.map(str.encode).flatmap(
    lambda data: st.integers(0, len(data)).map(lambda cut: data[:cut])  # torn files
)


def _run_main(argv: list[str], stdin: bytes | None = None) -> tuple[int, str, str]:
    """`main(argv)` in this process: (status, stdout, stderr). Any exception is a failure of the fuzz test."""
    import contextlib
    import io

    from nvtx_regions.commands.main import main

    out, err = io.StringIO(), io.StringIO()
    saved = sys.stdin
    try:
        if stdin is not None:
            sys.stdin = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8")
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(argv)
    finally:
        sys.stdin = saved
    return status, out.getvalue(), err.getvalue()


def _fuzz_command(strategy, label: str, run_one) -> Counter:
    outcomes: Counter = Counter()

    @settings(max_examples=COMMAND_EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(strategy)
    def run(data):
        outcomes["inputs"] += 1
        outcomes[run_one(data)] += 1

    run()
    print(f"\n{label}: {dict(outcomes)}")
    return outcomes


@pytest.mark.parametrize("inputs", ["bytes", "json"])
def test_fuzz_compare(tmp_path, inputs):
    good = tmp_path / "good.json"
    good.write_text('[{"name": "a", "ph": "X", "ts": 0, "dur": 1}]')
    path = tmp_path / "fuzzed.json"

    def run_one(data) -> str:
        path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass"))
        status, out, err = _run_main(["compare", str(path), str(good)])
        if status == 0:
            assert err == "" and out.startswith("range"), (data, out, err)
            return "compared"
        assert status == 1 and out == "", (data, out, err)
        assert err.startswith("nvtx-regions compare: ") and err.count("\n") == 1, (data, err)  # one line, ours
        return "our error"

    outcomes = _fuzz_command(ARBITRARY_BYTES if inputs == "bytes" else ARBITRARY_JSON_TEXT, f"compare, arbitrary {inputs}", run_one)
    assert outcomes["inputs"] >= COMMAND_EXAMPLES * 0.9
    assert outcomes["our error"] and (inputs == "bytes" or outcomes["compared"])


@pytest.mark.parametrize("how", ["file", "stdin"])
@pytest.mark.parametrize("inputs", ["bytes", "json"])
def test_fuzz_check(tmp_path, inputs, how):
    path = tmp_path / "fuzzed.nvtx"

    def run_one(data) -> str:
        data = data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass")
        if how == "file":
            path.write_bytes(data)
            status, out, err = _run_main(["check", str(path)])
            ours = (str(path), "nvtx-regions check: ")
        else:
            status, out, err = _run_main(["check", "-"], stdin=data)
            ours = ("<stdin>", "nvtx-regions check: ")
        if status == 0:
            assert err == "" and out, (data, out, err)
            return "checked"
        assert status in (1, 2) and out == "", (data, out, err)
        assert err.startswith(ours), (data, err)  # a spec error (file:line:col ...) or a command error
        return "our error"

    outcomes = _fuzz_command(ARBITRARY_BYTES if inputs == "bytes" else ARBITRARY_JSON_TEXT, f"check ({how}), arbitrary {inputs}", run_one)
    assert outcomes["inputs"] >= COMMAND_EXAMPLES * 0.9
