"""Property: on generated traces (random small compositions of torch ops,
compiled by thunder) and generated specs, the transform keeps its promises and
selects exactly what the plain reference evaluator selects."""

from __future__ import annotations

import warnings

import thunder
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.models import Recorder
from nvtx_regions import NvtxProfileTransform, NvtxRegionsWarning, SelectorError, render
from nvtx_regions.language import tree as T
from reference import Reference, RefError
from test_transform import check_against_reference

import pytest

pytestmark = pytest.mark.thunder  # the whole file needs lightning-thunder

OPS = {
    "add": lambda x, y: x + y,
    "mul": lambda x, y: x * y,
    "sub": lambda x, y: x - y,
    "matmul": lambda x, y: x @ y,
    "sin": lambda x, y: torch.sin(x),
    "exp": lambda x, y: torch.exp(x * 0.1),
    "tanh": lambda x, y: torch.tanh(x),
    "relu": lambda x, y: torch.relu(x),
    "softmax": lambda x, y: torch.softmax(x, dim=-1),
    "transpose": lambda x, y: x.t(),
}

PROGRAMS = st.lists(
    st.tuples(st.sampled_from(sorted(OPS)), st.integers(0, 20), st.integers(0, 20)), min_size=1, max_size=8
)


def program_fn(program):
    def fn(a, b):
        pool = [a, b]
        for name, i, j in program:
            pool.append(OPS[name](pool[i % len(pool)], pool[j % len(pool)]))
        return pool[-1].sum() + pool[len(pool) // 2].sum()

    return fn


def inputs():
    torch.manual_seed(0)
    return torch.randn(3, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)


def run(fn, transforms):
    a, b = inputs()
    jitted = thunder.jit(fn, transforms=transforms)
    out = jitted(a, b)
    out.backward()
    return out, a.grad, b.grad


def specs_for(forward, backward):
    """Specs over the names that exist in these traces (plus one that does not)."""
    ref_f, ref_b = Reference(forward), Reference(backward)
    names = sorted({op.sym.name for op in ref_f.ops + ref_b.ops} | {"no_such_op"})
    proxies = sorted({n for r in (ref_f, ref_b) for op in r.ops for n in r.writes(op)} | ref_f.args | {"t9999"})
    globs = st.sampled_from(names) | st.sampled_from(names).map(lambda n: n[:2] + "*")
    leaves = st.one_of(
        st.lists(globs, min_size=1, max_size=3).map(lambda g: T.OpIn(tuple(g))),
        st.lists(st.sampled_from(proxies), min_size=1, max_size=2).map(lambda g: T.Reads(tuple(g))),
        st.builds(T.Forward),
        st.builds(T.Backward),
        st.builds(T.All),
    )

    def extend(children):
        point = st.one_of(st.sampled_from(proxies).map(T.Proxy), children.map(T.First), children.map(T.Last))
        return st.one_of(
            st.lists(children, min_size=2, max_size=3).map(lambda c: T.And(tuple(c))),
            st.lists(children, min_size=2, max_size=3).map(lambda c: T.Or(tuple(c))),
            children.map(T.Not),
            children.map(T.BackwardOf),
            st.builds(T.Between, point, point),
        )

    exprs = st.recursive(leaves, extend, max_leaves=5)
    rule = st.builds(T.Rule, exprs | st.builds(T.Between, st.sampled_from(proxies).map(T.Proxy),
                                                    st.sampled_from(proxies).map(T.Proxy)),
                     st.none() | st.sampled_from(["r1", "r2"]))
    return st.lists(rule, min_size=1, max_size=3).map(lambda rules: render(T.Spec(tuple(rules))))


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(PROGRAMS, st.data())
def test_generated_traces_and_specs(program, data):
    fn = program_fn(program)
    recorder = Recorder()
    plain = run(fn, [recorder])
    forward, backward = recorder.traces
    select = data.draw(specs_for(forward, backward), label="spec")

    # The planned selection equals the reference's, on both traces.
    check_against_reference(forward, backward, select)

    # End to end: the annotated program computes bit-identical results.
    spec = NvtxProfileTransform(select).spec
    ref_f = Reference(forward)
    try:
        ref_f.expected(spec)
        Reference(backward, forward=ref_f).expected(spec)
        must_raise = False
    except RefError:
        must_raise = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NvtxRegionsWarning)
        try:
            annotated = run(fn, [NvtxProfileTransform(select)])
        except SelectorError:
            assert must_raise
            return
    assert not must_raise
    for got, want in zip(annotated, plain):  # output, then the inputs' grads (None if unused)
        assert (got is None and want is None) or torch.equal(got, want)
