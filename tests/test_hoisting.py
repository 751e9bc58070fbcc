"""Hoisted ops (issue 16): thunder moves ops that need only weights away from
their module (ThunderFX: the causal mask's ``arange``, the norms' weight
reshapes, at the top of the forward, and recomputed forward values at the top
of the backward). `each module <transformer.h.*>` still gives one exact range
per block, forward and backward, on nanoGPT and on litgpt's ``open_llama_3b``
shape (2 layers, shrunk), checked against workers/block_reference.py and in
real NVTX captures. FSDP: test_entry_points.py (the torchrun worker's
``each`` mode).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from support.models import Recorder, gpt_inputs, make_gpt
from nvtx_regions import NvtxProfileTransform
from nvtx_regions.attribution.module_calls import parameter_only
from nvtx_regions.core.bits import anchored_span
from nvtx_regions.attribution.traceview import TraceView
from nvtx_regions.testing import check_balanced, flatten, range_tree

pytestmark = pytest.mark.thunder  # the whole file needs lightning-thunder

_KIT_DIR = str(Path(__file__).resolve().parent / "workers")
if _KIT_DIR not in sys.path:
    sys.path.insert(0, _KIT_DIR)
import block_reference as ref  # noqa: E402
from regions_kit import open_llama, open_llama_inputs  # noqa: E402


def run_step(compiled, model_name: str) -> None:
    if model_name == "gpt":
        _, loss = compiled(*gpt_inputs())
    else:
        loss = compiled(*open_llama_inputs()).sum()
    loss.backward()


def block_ranges(report, view) -> dict[str, tuple[int, int]]:
    """The each-module ranges the transform planned, as compute positions."""
    return {r.label: (view.position_of(r.start), view.position_of(r.end)) for r in report.plan.ranges if r.kind == "region"}


@pytest.mark.slow  # the default tier stays under 6 minutes; CI runs the slow tier
@pytest.mark.parametrize("model_name", ["gpt", "llama"])
def test_thunderfx_each_module_gives_exact_block_ranges(model_name, nvtx_capture):
    import thunder.dynamo

    recorder = Recorder()
    domain = f"fx_{model_name}"
    transform = NvtxProfileTransform("each module <transformer.h.*>", domain=domain, messages="module")
    model = make_gpt(2) if model_name == "gpt" else open_llama()
    compiled = torch.compile(model, backend=thunder.dynamo.ThunderCompiler(transforms=[recorder, transform]))
    run_step(compiled, model_name)  # compiles: no SelectorError
    with nvtx_capture() as events:
        run_step(compiled, model_name)

    forward_trace, backward_trace = recorder.traces
    forward, backward = TraceView.from_trace(forward_trace), TraceView.from_trace(backward_trace)
    backward.forward = forward
    cotangents = {p.name for p in backward_trace.args[1]}
    for view, report, suffix in ((forward, transform.reports[0], ""), (backward, transform.reports[1], " (backward)")):
        expected = ref.reference_ranges(view, cotangents)
        assert sorted(expected) == [0, 1]
        assert ref.problems(view, expected, cotangents) == []
        assert block_ranges(report, view) == {f"transformer.h.{i}{suffix}": expected[i] for i in (0, 1)}
    # Without the rule, ops thunder hoisted would stretch the blocks over each other.
    spread = {}
    for position, chain in enumerate(forward.module_chains):
        block = ref.block_of_chain(chain)
        if block is not None:
            spread.setdefault(block, []).append(position)
    assert spread[1][0] < spread[0][-1]

    ours = [e for e in events if e.domain == domain]
    check_balanced(ours)
    (roots,) = range_tree(ours).values()
    assert [(d, m) for d, _, m in flatten(roots)] == [
        (0, "transformer.h.0"), (0, "transformer.h.1"), (0, "transformer.h.1 (backward)"), (0, "transformer.h.0 (backward)"),
    ]  # fmt: skip


def test_parameter_only_follows_the_data_flow():
    """The rule on a hand-made trace: static values spread through ops that read only them."""
    from dataclasses import dataclass

    @dataclass
    class Op:
        name: str
        reads: tuple
        writes: tuple

    @dataclass
    class View:
        ops: list

    view = View([
        Op("arange", (), ("a",)),            # 0: constant
        Op("unsqueeze", ("w",), ("w1",)),    # 1: weight only
        Op("linear", ("x", "w1"), ("y",)),   # 2: reads the input
        Op("add", ("a", "w1"), ("z",)),      # 3: static values only
        Op("mul", ("y", "z"), ("out",)),     # 4
    ])  # fmt: skip
    mask = parameter_only(view, frozenset({"w"}))
    assert [p for p in range(5) if mask >> p & 1] == [0, 1, 3]
    assert anchored_span(0b11011, mask) == (4, 4)  # ops 0, 1, 3, 4 of one call: only op 4 anchors it
    assert anchored_span(0b01011, mask) == (0, 3)  # all parameter-only: all of them
