"""NvtxProfileTransform on real thunder CPU traces: MLP and GPT, forward and
backward, default executors and torch.compile fusions."""

from __future__ import annotations

import warnings

import pytest
import thunder
import torch

from support.models import CONFIGS, compiled
from nvtx_regions import NvtxProfileTransform, NvtxRegionsWarning, RegionOrderError, SelectorError
from reference import Reference, RefError, in_order, read_annotated

pytestmark = pytest.mark.thunder  # the whole file needs lightning-thunder

SPECS = [
    "all",
    "op in <linear, matmul>",
    "op in <TorchCompile*, nvFusion*>",
    "not op in <add*, mul> and forward",
    "backward and op in <sum, mul, matmul>",
    "span: between first(op in <linear, TorchCompile*>)..last(op in <linear, TorchCompile*>)",
    "between first(all)..last(all) and backward",
    "outer: between first(all)..last(all)\n"
    "inner: between first(op in <linear, TorchCompile*>)..last(op in <linear, TorchCompile*>)\n"
    "op in <linear, TorchCompile*, matmul>",
    "backward of (op in <linear, TorchCompile*>)",
    "reads <t_*weight>",
    "same1: between first(all)..last(all); same2: between first(all)..last(all)",
    "op in <linear> or (between first(op in <add>)..last(op in <mul>) and not op in <add>)",
    "a: between first(op in <linear>)..last(op in <linear>)\nb: between first(all)..last(op in <linear>)",
    # Modules (MLP: 0..3; GPT: transformer.h.0 ...).
    "each module <**>",
    "each module <transformer.h.*, transformer.h.*.attn, 0, 3>\nop in <linear, matmul, TorchCompile*>",
    "module <transformer.h.0, 1> and op in <linear, mul, TorchCompile*>",
    "each class <Linear, Block> and module <transformer.h.1, 3>",
    "class <GELU, CausalSelfAttention> and forward",
    "backward of (module <transformer.h.1, 0>)",
    "source <nanogpt_model.py:52..60>",
]


def proxy_specs(forward) -> list[str]:
    """Region specs named by proxies of this very trace (names differ between configurations)."""
    ref = Reference(forward)
    outs = [n for op in ref.ops for n in ref.writes(op)]
    args = sorted(ref.args)
    specs = [
        f"between {args[0]}..{outs[-1]}",
        f"between {args[0]}..{args[-1]}\nop in <linear>",
        f"r: between {outs[0]}..{outs[-1]}",
    ]
    if len(outs) >= 6:
        specs += [
            f"r: between {outs[1]}..{outs[len(outs) // 2]}",
            f"between {outs[len(outs) // 2]}..{outs[1]}",  # ends before it starts
            f"x: between {outs[0]}..{outs[3]}\ny: between {outs[2]}..{outs[5]}",  # overlap
            f"x: between {outs[0]}..{outs[3]}\ny: between {outs[3]}..{outs[5]}",  # touch at one op: overlap
            f"x: between {outs[0]}..{outs[5]}\ny: between {outs[0]}..{outs[2]}\nop in <*>",  # nest, same start
        ]
    return specs


def check_against_reference(forward, backward, select: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NvtxRegionsWarning)
        transform = NvtxProfileTransform(select)
        ref_forward = Reference(forward)
        for trace, ref in ((forward, ref_forward), (backward, Reference(backward, forward=ref_forward))):
            try:
                expected = ref.expected(transform.spec)
            except RefError as why:
                with pytest.raises(SelectorError) as raised:
                    transform.transform_trace_post_optimization(trace)
                if why.kind == "order":
                    assert isinstance(raised.value, RegionOrderError), raised.value
                else:
                    assert not isinstance(raised.value, RegionOrderError), raised.value
                    assert "overlap without nesting" in str(raised.value)
                continue
            result = transform.transform_trace_post_optimization(trace)
            if not expected.all:
                assert result is trace
                continue
            assert in_order(read_annotated(trace, result)) == in_order(expected.push_order)


# Plain ids: spec text (newlines, brackets) does not survive a pytest node id on the command line.
@pytest.mark.parametrize("select", SPECS, ids=[f"spec{n}" for n in range(len(SPECS))])
def test_selection_matches_reference(config, select):
    *_, forward, backward = compiled(*config)
    check_against_reference(forward, backward, select)


def test_proxy_regions_match_reference(config):
    *_, forward, backward = compiled(*config)
    for select in proxy_specs(forward):
        check_against_reference(forward, backward, select)


RUNTIME_SPEC = "whole: between first(all)..last(all)\nall"


def test_outputs_identical_ranges_kept_and_cache_hit(config, nvtx_capture):
    plain = compiled(*config)
    jitted, transform, out, grads, forward, backward = compiled(*config, RUNTIME_SPEC)
    for got, want in zip(out if isinstance(out, tuple) else (out,), plain[2] if isinstance(plain[2], tuple) else (plain[2],)):
        assert torch.equal(got, want)
    assert all(torch.equal(g, w) for g, w in zip(grads, plain[3]))
    # thunder's later passes kept every push and pop.
    reports = {r.phase: r for r in transform.reports}
    for trace, phase in ((forward, "forward"), (backward, "backward")):
        ours = [b for b in trace.bound_symbols if b.sym.name.startswith("nvtx_regions_")]
        assert len(ours) == 2 * reports[phase].ranges > 1  # a push and a pop per range, nothing else
    # A second call hits the cache, does not transform again, and emits the planned ranges.
    seen = len(transform.reports)
    make, inputs = CONFIGS[config]
    with nvtx_capture() as events:
        again = jitted(*inputs())
        (again[1] if isinstance(again, tuple) else again.sum()).backward()
    assert thunder.cache_hits(jitted) == 1 and len(transform.reports) == seen
    from nvtx_regions.testing import check_balanced, flatten, range_tree

    ours = [e for e in events if e.domain == "nvtx_regions"]
    check_balanced(ours)
    (roots,) = range_tree(ours).values()
    expected = [(d, "nvtx_regions", m) for d, m in reports["forward"].ranges_emitted + reports["backward"].ranges_emitted]
    assert flatten(roots) == expected


def test_nothing_selected_returns_the_same_trace():
    *_, forward, backward = compiled("mlp", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NvtxRegionsWarning)
        transform = NvtxProfileTransform("op in <no_such_op>")
        assert transform.transform_trace_post_optimization(forward) is forward
        assert transform.transform_trace_post_optimization(backward) is backward


def test_provenance_records_spec_ranges_and_time():
    *_, forward, _ = compiled("mlp", None)
    transform = NvtxProfileTransform("op in <linear>")
    result = transform.transform_trace_post_optimization(forward)
    text = str(result.get_provenance())
    assert '2 NVTX ranges for spec "op in <linear>"' in text and "milliseconds" in text


def test_printed_trace_shows_each_push_message():
    *_, forward, _ = compiled("mlp", None)
    transform = NvtxProfileTransform("lin: between first(op in <linear>)..last(op in <linear>)\nop in <linear>")
    text = str(transform.transform_trace_post_optimization(forward))
    push_lines = [line for line in text.splitlines() if "_push" in line]
    assert len(push_lines) == 3
    assert push_lines[0].endswith('# "lin"')
    assert all("torch.nn.functional.linear(" in line for line in push_lines[1:])


def test_repr_shows_arguments():
    t = NvtxProfileTransform("op in <linear>", domain=None, strict=True)
    assert repr(t) == "nvtx_regions.NvtxProfileTransform('op in <linear>', domain=None, strict=True)"
    assert repr(NvtxProfileTransform()) == "nvtx_regions.NvtxProfileTransform()"


def test_each_rule_has_its_colour_and_a_category_named_after_it(nvtx_capture):
    from nvtx_regions.core.naming import rule_color

    # Labels no other test uses: NVTX names a category once per process and domain.
    transform = NvtxProfileTransform("colour_lin: op in <linear>\nop in <erf> or op in <no_such_op>")
    make, inputs = CONFIGS[("mlp", None)]
    with nvtx_capture() as events:
        jitted = thunder.jit(make(), transforms=[transform])
        jitted(*inputs())
    names = {e.category: e.message for e in events if e.kind == "name_category" and e.domain == "nvtx_regions"}
    pushes = [e for e in events if e.kind == "push" and e.domain == "nvtx_regions"]
    assert [(e.message.split("(")[0].split(".")[-1], e.color, names[e.category]) for e in pushes] == [
        ("linear", rule_color(0), "colour_lin"),
        ("erf", rule_color(1), "op in <erf> or op in <no_such_op>"),
        ("linear", rule_color(0), "colour_lin"),
    ]
