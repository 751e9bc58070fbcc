"""explain(): which ops each rule selects, why a rule selects nothing, and
which forward ops saved what a selected backward op reads."""

from __future__ import annotations

import warnings

import pytest
import thunder

from support.models import compiled, make_mlp
from nvtx_regions import NotRunYetError, NvtxProfileTransform, NvtxRegionsWarning, SelectorError, TraceReport, explain
from reference import Reference, one_line

pytestmark = pytest.mark.thunder  # the whole file needs lightning-thunder

SPEC = "ffn: between first(op in <linear>)..last(op in <linear>) and forward\nbackward of (op in <linear>)\nop in <lineer>"


@pytest.fixture(scope="module")
def explained():
    *_, forward, backward = compiled("mlp", None)
    return forward, backward, explain([forward, backward], SPEC)


def test_region_rule_lists_its_span(explained):
    forward, _, result = explained
    ref = Reference(forward)
    region, in_backward = result.traces[0]
    assert (region.phase, region.ranges, in_backward.ranges) == ("forward", 1, 0)
    assert region.region == (0, len(ref.ops) - 1)
    assert region.lines == tuple(one_line(op) for op in ref.ops)


def test_backward_ops_name_the_forward_ops_they_are_traced_to(explained):
    forward, backward, result = explained
    ref_f = Reference(forward)
    ref_b = Reference(backward, forward=ref_f)
    _, found = result.traces[1]
    expected = [i for i, op in enumerate(ref_b.ops) if ref_b.holds(ref_b_expr(), i)]
    assert list(found.selected) == expected and expected
    for position, origins in zip(found.selected, found.saved_by):
        # The forward ops the reference traces this backward op to (the rule of nvtx_regions.attribution.module_calls).
        expected_origins = [f"#{j} {ref_f.ops[j].sym.name}" for j in sorted(ref_b.origins()[position])]
        if len(expected_origins) > 4:
            expected_origins = expected_origins[:4] + [f"... {len(expected_origins) - 4} more"]
        assert list(origins) == expected_origins and origins


def ref_b_expr():
    from nvtx_regions import parse

    return parse("backward of (op in <linear>)").rules[0].expr


def test_rule_that_selects_nothing_gets_a_reason(explained):
    *_, result = explained
    assert result.reasons == {2: "op 'lineer' matches nothing in these traces (nearest: linear)"}
    text = str(result)
    assert "rule 'op in <lineer>' (<select>:3): one range per op" in text
    assert "nothing selected: op 'lineer' matches nothing in these traces (nearest: linear)" in text
    assert "<- from forward #0 linear" in text and "] t" in text  # origins, and each op's module


def test_explain_a_jitted_function_uses_its_own_transform():
    transform = NvtxProfileTransform("op in <linear>")
    jitted = thunder.jit(make_mlp(), transforms=[transform])
    with pytest.raises(NotRunYetError, match="has not run yet; call it once first") as raised:
        explain(jitted)
    assert not isinstance(raised.value, SelectorError)  # no spec error: the same call works after a run
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NvtxRegionsWarning)
        jitted(torch.randn(5, 8)).sum().backward()
    result = explain(jitted)
    assert [found.ranges for found in result.traces[0]] == [r.ranges for r in transform.reports] == [2, 0]
    assert all(type(report) is TraceReport for report in transform.reports)  # the exported type


def test_explain_needs_a_compiled_function_and_a_spec():
    with pytest.raises(TypeError, match="got object"):
        explain(object())
    jitted_without_ours = compiled("mlp", None)[0]
    with pytest.raises(SelectorError, match="give select= or spec="):
        explain(jitted_without_ours)


# Inductor's compile in the slow tier: test_front_door checks its handle's explain() in the default run.
@pytest.mark.parametrize("backend", ["eager", "thunder", pytest.param("inductor", marks=pytest.mark.slow)])
def test_what_compile_returns_carries_one_handle_on_every_backend(backend, monkeypatch, tmp_path):
    """`nvtx_regions_backend` on what `nvtx_regions.compile` returns is the spec's handle on every
    backend: its explain() is what nvtx_regions.explain says, in the backend's own words."""
    import torch

    import nvtx_regions
    from nvtx_regions.runtime.handle import SpecHandle

    monkeypatch.delenv("NVTX_REGIONS_BACKEND", raising=False)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    result = nvtx_regions.compile(make_mlp(), "each class <Linear>", backend=backend)
    result(torch.randn(5, 8)).sum().backward()
    handle = result.nvtx_regions_backend
    assert isinstance(handle, SpecHandle)
    assert type(handle).__name__ == {"eager": "EagerAnnotation", "thunder": "NvtxProfileTransform", "inductor": "NvtxInductor"}[backend]
    # What every handle holds (`SpecHandle.hold`): its spec, domain and sinks, strictness and tally.
    assert (handle.domain.name, handle.domain.sinks, handle.strict) == ("nvtx_regions", ("nvtx",), False)
    assert handle.compiled.backend == backend and handle.tally.spec is handle.compiled
    assert handle.tally.ranges[0] > 0  # the rule's ranges, counted in what the backend placed
    text = str(handle.explain())
    assert text == str(explain(result)) == str(explain(handle))
    assert "rule 'each class <Linear>' (<select>:1): one range per module call" in text
    for line in ("    0: ", "    3: ", "    0 (backward): ", "    3 (backward): "):  # the two Linears, both ways
        assert line in text, (line, text)
