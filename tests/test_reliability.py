"""Reliability under hostile or unlucky use (issue 9): a failed call frees its
tensors, and what NVTX cannot carry, thunder never calls, or a framework
copies is handled with a clear error instead of silently.
"""

from __future__ import annotations

import copy
import gc
import pickle
import subprocess
import sys
import warnings
import weakref
from pathlib import Path

import pytest
import thunder
import torch

from nvtx_regions import NvtxProfileTransform, NvtxRegionsWarning, RegionOrderError, SelectorError, SelectorSyntaxError, parse
from nvtx_regions.testing import unavailable_reason

pytestmark = pytest.mark.thunder  # the whole file needs lightning-thunder

_KIT_DIR = str(Path(__file__).resolve().parent / "workers")
if _KIT_DIR not in sys.path:
    sys.path.insert(0, _KIT_DIR)
import regions_kit as kit  # noqa: E402

needs_capture = pytest.mark.skipif(unavailable_reason() is not None, reason=f"NVTX capture tool unavailable: {unavailable_reason()}")


# ---------------------------------------------------------------- 1. a failed call keeps nothing alive


def _intermediate_of_failed_call(jitted, *args) -> weakref.ref:
    """Call `jitted` (which must raise IndexError inside its computation trace) and
    return a weak reference to a tensor the failed call computed before it raised."""
    try:
        jitted(*args)
    except IndexError as error:
        tb = error.__traceback__
        frames = []
        while tb is not None:
            frames.append(tb.tb_frame)
            tb = tb.tb_next
        (computation,) = [f for f in frames if f.f_code.co_name == "computation"]
        # The first linear ran before the embedding raised.
        produced = [v for v in computation.f_locals.values() if isinstance(v, torch.Tensor) and v.shape == (3, 8)]
        assert produced, "the failed call computed no (3, 8) tensor"
        ref = weakref.ref(produced[-1])
        del error, tb, frames, computation, produced
        return ref
    raise AssertionError("the call did not raise")


@pytest.mark.parametrize("transformed", [False, True], ids=["plain", "transformed"])
def test_failed_call_frees_its_tensors_once_the_exception_is_dropped(transformed):
    model = kit.embed_net()
    spec = "net: between first(op in <linear>)..last(op in <linear>)\nop in <linear, embedding>"
    transforms = [NvtxProfileTransform(spec, domain="reliability")] if transformed else []
    jitted = thunder.jit(model, transforms=transforms)
    x, good, bad = torch.randn(3, 8), torch.tensor([1, 2, 3]), torch.tensor([1, 99, 3])
    jitted(x, good)  # compile with a call that works
    ref = _intermediate_of_failed_call(jitted, x, bad)
    gc.collect()
    assert ref() is None, "a tensor of the failed call is still alive after its exception was dropped"
    jitted(x, good)  # and the next call still works


# ---------------------------------------------------------------- recovery with the first range gated off

GATED_FIRST = """
import nvtx, thunder, torch
import nvtx_regions
from nvtx_regions import NvtxProfileTransform, NvtxRegionsWarning, RegionOrderError, SelectorError, SelectorSyntaxError, parse
from regions_kit import embed_net, emit, reports

# The first range of the trace (the region) is off until step 2.
t = NvtxProfileTransform('''
late: steps 2.. and between first(op in <linear>)..last(op in <linear>)
op in <linear, embedding>
''', domain="d")
jm = thunder.jit(embed_net(), transforms=[t])
x = torch.randn(3, 8)
good, bad = torch.tensor([1, 2, 3]), torch.tensor([1, 99, 3])
d = nvtx.get_domain("d")
d.push_range(d.get_event_attributes(message="session"))
errors = []
for step, ok in zip(nvtx_regions.steps(range(4), domain="clock"), [False, True, False, True]):
    try:
        jm(x, good if ok else bad)
    except IndexError:
        errors.append(step)
d.pop_range()
emit(reports=reports(t), errors=errors)
"""


@needs_capture
def test_failed_call_whose_first_range_is_gated_off_pops_only_what_it_pushed():
    out, process = kit.run_captured(GATED_FIRST)
    assert out["errors"] == [0, 2]
    forward, _backward = out["reports"]
    assert [r["rules"] for r in forward["emitted"]] == [[0], [1], [1], [1]]  # late, fc1, emb, fc2
    raised_at = kit.start_of(forward, "embedding")

    def call(step: int, ok: bool) -> kit.Call:
        return kit.one_call(forward, lambda rule: rule != 0 or step >= 2, until=None if ok else raised_at)

    fc1, emb, fc2 = (m for _, m in kit.one_call(forward, lambda rule: rule == 1))
    assert call(0, False) == [(0, fc1), (0, emb)]  # the gated region is not pushed; emb is left open
    assert call(2, False) == [(0, "late"), (1, fc1), (1, emb)]
    calls = call(0, False) + call(1, True) + call(2, False) + call(3, True)
    # A recovery that pops one too many closes "session" early.
    assert kit.captured(process, "d") == {out["tid"]: [(0, "session")] + kit.shifted(calls, 1)}


# ---------------------------------------------------------------- 2. text NVTX cannot carry

# Raw characters (the escaped ones are rows of tests/corpus/syntax_errors.json):
# (text, column, message). The shown source line has U+FFFD in their place.
RAW = [
    ("op in <lin\x00ear>", 11, "spec text cannot contain U+0000 (NUL), where NVTX would cut the text short; remove it"),
    ("op in <lin\x01ear>", 11, "a pattern cannot contain U+0001, a control character, which no op name holds; remove it"),
    ("reads <t\x1b>", 9, "a pattern cannot contain U+001B, a control character, which no op name holds; remove it"),
    ("all  # \ud800", 8, "spec text cannot contain U+D800, a lone surrogate, which is not text (NVTX takes UTF-8); remove it"),
    ('"x\udc80": all', 3, "spec text cannot contain U+DC80, a lone surrogate, which is not text (NVTX takes UTF-8); remove it"),
    ("all \x01", 5, 'expected "and", "or" or the end of the rule, got "U+0001"'),
]


@pytest.mark.parametrize("text,column,message", RAW, ids=[ascii(r[0]) for r in RAW])
def test_raw_text_nvtx_cannot_carry_is_a_syntax_error_at_its_place(text, column, message):
    with pytest.raises(SelectorSyntaxError) as info:
        parse(text)
    error = info.value
    assert (error.lineno, error.offset, error.msg) == (1, column, message)
    assert error.text == text.replace(text[column - 1], "\ufffd")
    str(error).encode("utf-8")  # the error itself prints


@pytest.mark.parametrize("select", ['"\\ud800": all', '"a\\u0000b": between first(all)..last(all)', "op in <lin\x00ear>"])
def test_transform_refuses_text_nvtx_cannot_carry_when_created(select):
    with pytest.raises(SelectorSyntaxError):
        NvtxProfileTransform(select)


# ---------------------------------------------------------------- 3. silent nothing

MISATTACHED = """
import thunder, torch
from nvtx_regions import NvtxProfileTransform
m = torch.nn.Linear(4, 4)
used = NvtxProfileTransform("op in <linear>", domain="used")
wrong = NvtxProfileTransform("op in <linear>", domain="wrong")
thunder.jit(m, transforms=[used])(torch.randn(2, 4))
jitted = thunder.jit(m, post_optimization_transforms=[wrong])  # thunder 0.2.6 ignores this keyword
jitted(torch.randn(2, 4))
print("ran")
"""


def _python(code: str, *, stdin: str | None = None, args: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    argv = [sys.executable, *(("-c", code) if code else ()), *args]
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=300)


def test_transform_thunder_never_called_is_named_at_exit_with_the_fix():
    proc = _python(MISATTACHED)
    assert proc.returncode == 0 and "ran" in proc.stdout, proc.stderr[-3000:]
    warning = [line for line in proc.stderr.splitlines() if "NvtxRegionsWarning" in line]
    assert len(warning) == 1, proc.stderr[-3000:]
    (line,) = warning
    assert "NvtxProfileTransform('op in <linear>', domain='wrong') (passed to thunder.jit(Linear) as post_optimization_transforms=" in line
    assert "transforms=[t]" in line
    assert "domain='used'" not in line


COMPILED_BY_THUNDER = """
import sys, warnings, torch, nvtx_regions
warnings.simplefilter("ignore", UserWarning)
warnings.simplefilter("default", nvtx_regions.NvtxRegionsWarning)

class Nonzero(torch.nn.Module):  # thunder 0.2.6 cannot trace nonzero: it raises at the first call
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(x).nonzero()

compiled = nvtx_regions.compile(Nonzero(), "each module <*>", backend="thunder")
if sys.argv[1] == "call":
    try:
        compiled(torch.randn(2, 4))
    except NotImplementedError:
        print("thunder raised")
"""


@pytest.mark.parametrize("call", ["call", "no call"])
def test_a_transform_of_compile_says_thunder_failed_or_the_model_was_never_called(call):
    """Not "pass a transform as thunder.jit(model, transforms=[t])": compile() put it there."""
    proc = _python(COMPILED_BY_THUNDER, args=(call,))
    assert proc.returncode == 0, proc.stderr[-3000:]
    warning = [line for line in proc.stderr.splitlines() if "NvtxRegionsWarning" in line]
    assert len(warning) == 1, proc.stderr[-3000:]
    ours = "nvtx_regions.NvtxProfileTransform('each module <*>') (made by nvtx_regions.compile(backend='thunder'))"
    if call == "call":
        assert "thunder raised" in proc.stdout
        assert warning[0].endswith(
            f"NvtxRegionsWarning: thunder failed to compile the model (1 attempt, each raising its error at the call), "
            f"so {ours} got no trace and no NVTX range was emitted: thunder's failure, not the spec's; "
            "nvtx_regions.compile(model, backend='inductor') gives the same module ranges under torch.compile"
        )
    else:
        assert warning[0].endswith(
            f"NvtxRegionsWarning: {ours} got no trace: the model that compile() returned was never called, "
            "so no NVTX range was emitted; call what compile() returns"
        )
    assert "transforms=[t]" not in proc.stderr


def test_cli_check_of_an_empty_spec_fails_and_says_why(tmp_path):
    empty = tmp_path / "empty.nvtx"
    empty.write_text("# nothing yet\n")
    proc = _python("", args=("-m", "nvtx_regions", "check", str(empty)))
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"{empty}: no rules (only blank lines and comments), so it selects nothing"


def test_cli_check_reads_standard_input():
    proc = _python("", args=("-m", "nvtx_regions", "check", "-"), stdin="a: op in <linear>\nall\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["<stdin>:1: a: op in <linear>", "<stdin>:2: all"]
    bad = _python("", args=("-m", "nvtx_regions", "check", "-"), stdin="op in <linear\n")
    assert bad.returncode == 2 and bad.stderr.startswith("<stdin>:1:14: ")


def test_hints_for_the_printed_callable_name_and_for_a_decomposed_op():
    jitted = thunder.jit(
        kit.embed_net(), transforms=[NvtxProfileTransform("op in <torch.nn.functional.linear>\nop in <gelu>")]
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", NvtxRegionsWarning)
        jitted(torch.randn(3, 8), torch.tensor([1, 2, 3]))
    messages = [str(w.message) for w in caught if issubclass(w.category, NvtxRegionsWarning)]
    assert len(messages) == 2, messages
    linear, gelu = messages
    assert linear.endswith("ops go by their symbol's name, not the callable the trace prints: write 'linear'")
    assert gelu.endswith("thunder decomposes gelu into erf, mul, add, so no op is named 'gelu': select those ops, or write class <GELU> (the GELU modules' ops)")


# ---------------------------------------------------------------- 6. a transform is configuration


def _emitted(transform: NvtxProfileTransform) -> list:
    jitted = thunder.jit(kit.embed_net(), transforms=[transform])
    jitted(torch.randn(3, 8), torch.tensor([1, 2, 3])).sum().backward()
    return [(r.phase, r.ranges_emitted) for r in transform.reports]


def test_deepcopy_and_pickle_round_trip_before_and_after_use(tmp_path):
    path = tmp_path / "spec.nvtx"
    path.write_text("net: between first(op in <linear>)..last(op in <linear>)\n")
    original = NvtxProfileTransform("op in <linear, embedding>", spec=path, domain="copies", strict=True)
    before = [copy.deepcopy(original), pickle.loads(pickle.dumps(original))]
    path.unlink()  # a copy carries the parsed spec, it does not read the file again
    expected = _emitted(original)
    assert [phase for phase, _ in expected] == ["forward", "backward"] and expected[0][1]
    after = [copy.deepcopy(original), pickle.loads(pickle.dumps(original))]
    for made in before + after:
        assert repr(made) == repr(original)
        assert not made.reports and made.domain is not original.domain
        assert _emitted(made) == expected
    assert len(original.reports) == 2  # the copies' calls are theirs


# ---------------------------------------------------------------- 7. rough edges


def test_parenthesized_and_of_gates_is_a_gate():
    from nvtx_regions.selection.compile import compile_spec

    (nested,) = compile_spec(parse("op in <linear> and (steps 1..2 and rank in <0>)")).rules
    (flat,) = compile_spec(parse("op in <linear> and steps 1..2 and rank in <0>")).rules
    assert nested.gate == flat.gate and nested.gate.text() == "rank in <0> and steps 1..2"


def test_gate_in_a_place_decided_per_op_names_the_place():
    from nvtx_regions.selection.compile import compile_spec

    with pytest.raises(SelectorError, match=r"not under 'not', 'or', 'backward of' or first\(\)/last\(\)"):
        compile_spec(parse("backward of (steps 1..2)"))


def test_package_exports_and_lists_every_public_name():
    import nvtx_regions
    from nvtx_regions.selection.compile import RegionOrderError

    assert nvtx_regions.RegionOrderError is RegionOrderError and "RegionOrderError" in nvtx_regions.__all__
    # Each name of __all__ resolves in a fresh interpreter (`dir()` would list it either way: __dir__ adds __all__).
    code = (
        "import inspect, nvtx_regions\n"
        "for name in nvtx_regions.__all__:\n"
        "    value = getattr(nvtx_regions, name)\n"
        "    assert not inspect.ismodule(value) and getattr(value, '__name__', name) == name, name\n"
        "print(len(nvtx_regions.__all__))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == str(len(nvtx_regions.__all__)), done.stderr[-3000:]


# ---------------------------------------------------------------- 4. two transforms on one domain

TWO_TRANSFORMS = """
import nvtx, thunder, torch
from nvtx_regions import NvtxProfileTransform
from regions_kit import embed_net, emit, reports

# Their calls interleave without nesting: `head` (the first transform) ends
# before the second transform's last range, and the embedding raises after
# `head` ended, with two ranges of the second transform open.
first = NvtxProfileTransform("head: between first(op in <linear>)..last(op in <erf>)", domain="d")
second = NvtxProfileTransform("tail: between first(op in <embedding>)..last(op in <linear>)\\nop in <linear, embedding>", domain="d")
jm = thunder.jit(embed_net(), transforms=[first, second])
x = torch.randn(3, 8)
good, bad = torch.tensor([1, 2, 3]), torch.tensor([1, 99, 3])
d = nvtx.get_domain("d")
d.push_range(d.get_event_attributes(message="session"))
errors = []
for step, ok in enumerate([False, True, False, True]):
    try:
        jm(x, good if ok else bad)
    except IndexError:
        errors.append(step)
d.pop_range()
emit(first=reports(first), second=reports(second), errors=errors)
"""


@needs_capture
def test_two_transforms_on_one_domain_recover_each_its_own_ranges():
    out, process = kit.run_captured(TWO_TRANSFORMS)
    assert out["errors"] == [0, 2]
    head = [m for _, m in kit.planned(out["first"][0])]
    fc1, tail, emb, fc2 = (m for _, m in kit.planned(out["second"][0]))
    assert (head, tail) == (["head"], "tail")
    failed = [(0, "head"), (1, fc1), (0, "tail"), (1, emb)]
    ok = failed + [(1, fc2)]
    assert kit.captured(process, "d") == {out["tid"]: [(0, "session")] + kit.shifted(failed + ok + failed + ok, 1)}


# ---------------------------------------------------------------- 5. bounded memory


def _retained_bytes_per_compilation(transform: NvtxProfileTransform, forward, backward, first: int, last: int) -> float:
    """Bytes that stay allocated per compilation between compilation `first` and `last`.

    A compilation here is what thunder does at the end of each one: it hands
    the transform the forward trace, then the backward. The traces it returns
    are dropped, as thunder drops them with the compiled function, so what
    stays is what the transform itself keeps.
    """
    import tracemalloc

    def compile_once() -> None:
        transform.transform_trace_post_optimization(forward)
        transform.transform_trace_post_optimization(backward)

    # Traced from the start: what is freed in the window must have been counted when allocated.
    tracemalloc.start()
    try:
        for _ in range(first):
            compile_once()
        gc.collect()
        start = tracemalloc.get_traced_memory()[0]
        for _ in range(last - first):
            compile_once()
        gc.collect()
        end = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return (end - start) / (last - first)


@pytest.mark.slow
def test_memory_stays_bounded_over_a_thousand_recompilations():
    from support.models import compiled

    *_, forward, backward = compiled("mlp", None)
    transform = NvtxProfileTransform("net: between first(op in <linear>)..last(op in <linear>)\nop in <linear>")
    # Caches of thunder and nvtx fill during the first few hundred; then 1,000 recompilations.
    per_compilation = _retained_bytes_per_compilation(transform, forward, backward, first=500, last=1500)
    assert per_compilation < 64, f"{per_compilation:.0f} bytes kept per compilation"
    assert len(transform.reports) == 100 and transform.reports[-1].phase == "backward"
    # check() still counts every trace seen.
    assert transform._traces_seen == 3000
    transform.check()  # every rule selected something: no warning, no error


# ---------------------------------------------------------------- 9. found by the long run's fuzzing


@pytest.mark.parametrize(
    "select",
    ["forward or between last(forward)..input", "forward and not forward and between last(forward)..input"],
)
def test_reversed_region_raises_wherever_it_stands(select):
    from support.models import compiled

    *_, forward, _backward = compiled("mlp", None)
    with pytest.raises(RegionOrderError, match="ends at input .* before it starts at last\\(forward\\)"):
        NvtxProfileTransform(select).transform_trace_post_optimization(forward)


# The functional form of each op in the hint table, called with gradients needed.
_DECOMPOSED_CALLS = {
    "gelu": torch.nn.functional.gelu,
    "relu": torch.nn.functional.relu,
    "leaky_relu": torch.nn.functional.leaky_relu,
    "relu6": torch.nn.functional.relu6,
    "hardtanh": torch.nn.functional.hardtanh,
    "sigmoid": torch.sigmoid,
    "dropout": lambda x: torch.nn.functional.dropout(x, 0.1),
}


def test_decomposed_ops_table_matches_thunder():
    from nvtx_regions.attribution.traceview import TraceView
    from nvtx_regions.selection.unselected import DECOMPOSED

    assert set(DECOMPOSED) == set(_DECOMPOSED_CALLS)
    for name, call in _DECOMPOSED_CALLS.items():
        jitted = thunder.jit(call)
        jitted(torch.randn(4, 8, requires_grad=True))
        ops = {op.name for op in TraceView.from_trace(thunder.last_traces(jitted)[-1]).ops}
        assert name not in ops and set(DECOMPOSED[name]) <= ops, (name, sorted(ops))


def test_relu_gets_the_decomposition_hint():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    jitted = thunder.jit(model, transforms=[NvtxProfileTransform("op in <relu>")])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", NvtxRegionsWarning)
        jitted(torch.randn(3, 8, requires_grad=True))
    (message,) = [str(w.message) for w in caught if issubclass(w.category, NvtxRegionsWarning)]
    assert message.endswith(
        "thunder decomposes relu into gt, where, so no op is named 'relu': select those ops, "
        "or write class <ReLU> (the ReLU modules' ops)"
    )
