"""A range is one push line and one pop line, and a failed call closes what it opened
(runtime/ranges.py): the line it stopped at, in the traceback, says which ranges were open.

Checked against the trace text (an independent count of its push and pop lines) and, in
real NVTX captures, by a call that fails after hundreds of lines inside nested ranges,
followed by a good call: the failed call's ranges must be popped exactly.
"""

from __future__ import annotations

import re
import threading

import pytest
import thunder
import torch

from nvtx_regions import NvtxProfileTransform
from nvtx_regions.testing import check_balanced, range_tree

pytestmark = pytest.mark.thunder  # the whole file needs lightning-thunder


class Chain(torch.nn.Module):
    """`layers` linears, then an embedding of ``idx`` that depends on them (so it stays last):
    an index of 16 or more raises there, after more than 256 points."""

    def __init__(self, layers: int = 150) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(layers))
        self.emb = torch.nn.Embedding(16, 8)

    def forward(self, x, idx):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x.sum() + self.emb(idx + (x.sum() > 1e9).long()).sum()


def inputs():
    torch.manual_seed(1)
    return torch.randn(4, 8), torch.randint(0, 16, (4,))


def forward_source(layers: int, spec: str, domain: str, messages: str = "python") -> str:
    torch.manual_seed(0)
    model = thunder.jit(Chain(layers), transforms=[NvtxProfileTransform(spec, domain=domain, messages=messages)])
    model(*inputs())
    return thunder.last_traces(model)[-1].python()


PUSH = re.compile(r"^(nvtx_push|nvtx_gates\.g\d+_push)\((nvtx_range_\d+), nvtx_domain\)")
POP = re.compile(r"^(nvtx_pop|nvtx_gates\.g\d+_pop)\(\)$")


def test_a_range_is_one_push_line_and_one_pop_line():
    """Reference: the trace's NVTX lines are its pushes and pops, balanced, one per range, and one
    line that decides the call's gates, before them all; nothing else (no stores)."""
    spec = "op in <linear>\nr: between first(all)..last(all)\nsteps 1.. and op in <tanh>"
    lines = [line.strip().split("  #")[0] for line in forward_source(40, spec, "uw_lines").splitlines()]
    ours = [line for line in lines if line.startswith("nvtx")]
    assert ours[0] == "nvtx_gates = nvtx_enter()"
    depth = pushes = 0
    for line in ours[1:]:
        if PUSH.match(line):
            depth, pushes = depth + 1, pushes + 1
        else:
            assert POP.match(line), line
            depth -= 1
            assert depth >= 0
    assert pushes == 40 + 40 + 1 and depth == 0  # linears', tanhs' and r's ranges
    assert sum(line.startswith("nvtx_gates.g1_push(") for line in ours) == 40  # the gated tanhs count too


EXPECTED_LINES = """\
nvtx_gates = nvtx_enter()
nvtx_push(nvtx_range_0, nvtx_domain)  # "chain"
nvtx_push(nvtx_range_1, nvtx_domain)  # "layers.0: linear"
nvtx_pop()
nvtx_gates.g1_push(nvtx_range_2, nvtx_domain)  # "Chain: tanh"
nvtx_gates.g1_pop()
nvtx_pop()"""


def test_the_lines_read_one_statement_each_the_same_on_every_python():
    """The NVTX lines of a small trace, exactly: CI runs this on 3.11 and 3.12."""
    spec = "chain: between first(all)..last(op in <tanh>)\nop in <linear>\ntanh: steps 1.. and op in <tanh>"
    source = forward_source(1, spec, "uw_text", messages="module")
    ours = [line.strip() for line in source.splitlines() if line.strip().startswith("nvtx")]
    assert "\n".join(ours) == EXPECTED_LINES
    assert not any(";" in line.split("  #")[0] for line in ours)


@pytest.mark.slow
def test_a_call_that_fails_after_hundreds_of_points_pops_exactly_what_it_pushed(nvtx_capture):
    torch.manual_seed(0)
    domain = "uw_fail"
    spec = "all\nr: between first(all)..last(all) and forward\nlate: between first(op in <embedding>)..last(all) and forward"
    transform = NvtxProfileTransform(spec, domain=domain)
    model = thunder.jit(Chain(), transforms=[transform])
    x, idx = inputs()
    model(x, idx).backward()
    assert transform.reports[0].ranges * 2 > 300  # the failing op comes after point 256
    with nvtx_capture() as events:
        with pytest.raises(IndexError):
            model(x, idx + 99)
        model(x, idx).backward()
    ours = [e for e in events if e.domain == domain]
    check_balanced(ours)
    roots = range_tree(ours)[threading.get_native_id()]
    failed, good = roots[0], next(r for r in roots[1:] if r.message == "r")
    assert failed.message == "r" and failed.end_ns is not None  # the failed call's region, popped
    assert failed.end_ns <= good.start_ns
    # Inside the failed call's region: the ops that ran, then `late` holding the embedding's
    # own range, each closed -- as the call raised, for `late`, the embedding and `r`.
    assert [c.message for c in failed.children[-1:]] == ["late"]
    assert len(failed.children[-1].children) == 1 and "embedding" in failed.children[-1].children[0].message
    assert len(failed.children) == len(good.children)
