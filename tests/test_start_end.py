"""Module-call ranges that cannot nest become NVTX start/end ranges (issue 16).

Where thunder interleaves the ops of two module calls, their `each` ranges
cross. Thunder's own passes do this where they reorder (FSDP's, the
executors'); here a small transform placed before ours moves an op of one
branch of the model between the ops of the other, as such a pass would (the
move keeps the data flow valid). Checked in real NVTX captures: the calls get
start/end ranges in the same domain, with the same message, colour and
category as a push/pop range of the rule; a failed call leaves none open;
gates cover them; two `between` regions that cross still raise.
"""

from __future__ import annotations

import threading
import time

import pytest
import thunder
import torch
from thunder.core.trace import TraceTag, from_trace
from thunder.core.transform_common import Transform

import nvtx_regions
from nvtx_regions import NvtxProfileTransform, SelectorError
from nvtx_regions.report.rangeart import draw_ranges
from nvtx_regions.testing import check_balanced, flatten, range_tree, start_end_ranges

pytestmark = pytest.mark.thunder  # the whole file needs lightning-thunder


class Branch(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class Lookup(torch.nn.Module):
    """An embedding then a linear: an index of 16 or more raises IndexError at run time."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(16, 8)
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, idx):
        return self.fc(self.emb(idx))


class TwoBranches(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = Branch()
        self.b = Lookup()

    def forward(self, x, idx):
        return self.a(x) + self.b(idx)


class Interleave(Transform):
    """Move the forward's first `moved` op to just after its first `after` op (both read only inputs)."""

    def __init__(self, moved: str = "embedding", after: str = "linear") -> None:
        self.moved, self.after = moved, after

    def transform_trace_post_optimization(self, trace, **kwargs):
        if TraceTag.BACKWARD in trace.tags:
            return trace
        bsyms = list(trace.bound_symbols)
        moved = bsyms.pop(next(i for i, b in enumerate(bsyms) if b.sym.name == self.moved))
        bsyms.insert(next(i for i, b in enumerate(bsyms) if b.sym.name == self.after) + 1, moved)
        new = from_trace(trace)
        new.bound_symbols = bsyms
        return new


def inputs(bad: bool = False):
    torch.manual_seed(1)
    idx = torch.randint(0, 16, (4,))
    if bad:
        idx[2] = 99
    return torch.randn(4, 8), idx


def jitted(spec: str, domain: str, **options):
    torch.manual_seed(0)
    transform = NvtxProfileTransform(spec, domain=domain, messages="module", **options)
    return thunder.jit(TwoBranches(), transforms=[Interleave(), transform]), transform


def test_crossing_calls_become_start_end_ranges(nvtx_capture):
    model, transform = jitted("each module <a, b>\nop in <linear>", "se_cross")
    model(*inputs()).sum().backward()  # compile: no SelectorError
    forward, backward = transform.reports
    styles = {r.label: (r.style, r.why) for r in forward.plan.ranges if r.kind == "region"}
    assert styles["a"][0] == styles["b"][0] == "StartEnd"
    assert styles["a"][1].startswith("crosses 'b' (bound symbols ") and styles["b"][1].startswith("crosses 'a' (")
    # The backward is not interleaved: its calls stay push/pop ranges.
    assert {r.label: r.style for r in backward.plan.ranges if r.kind == "region"} == {
        "b (backward)": "PushPop", "a (backward)": "PushPop"
    }  # fmt: skip
    with nvtx_capture() as events:
        model(*inputs()).sum().backward()
    ours = [e for e in events if e.domain == "se_cross"]
    check_balanced(ours)
    a, b = start_end_ranges(ours)
    assert (a.message, b.message) == ("a", "b")
    assert a.start_ns < b.start_ns < a.end_ns < b.end_ns  # they overlap, as thunder ran the ops
    # Push/pop ranges: the linears, and the backward's calls, nest as before.
    tid = threading.get_native_id()
    got = [(d, m) for d, _, m in flatten(range_tree(ours)[tid])]
    assert got == [
        (0, "a.fc1: linear"), (0, "a.fc2: linear"), (0, "b.fc: linear"), (0, "b (backward)"), (0, "a (backward)"),
    ]  # fmt: skip
    # Same colour and category as the rule's push/pop ranges.
    starts = [e for e in ours if e.kind == "start"]
    pushed = next(e for e in ours if e.kind == "push" and e.message == "a (backward)")
    assert {(e.color, e.category) for e in starts} == {(pushed.color, pushed.category)}

    text = str(nvtx_regions.explain(model))
    assert "a: ops #" in text and "; start/end range: crosses 'b' (bound symbols " in text
    art = draw_ranges(nvtx_regions.explain(model))
    assert "\nstart/end: a  #" in art and "\nstart/end: b  #" in art and "── b (backward)  #" in art


def test_a_failed_call_leaves_no_start_end_range_open(nvtx_capture):
    """The embedding raises inside both start/end ranges; the failed call ends them as it raises."""
    model, transform = jitted("each module <a, b>", "se_fail")
    model(*inputs()).sum().backward()
    assert {r.style for r in transform.reports[0].plan.ranges} == {"StartEnd"}
    with nvtx_capture() as events:
        with pytest.raises(IndexError):
            model(*inputs(bad=True))
        caught = time.monotonic_ns()
        model(*inputs()).sum().backward()
    ours = [e for e in events if e.domain == "se_fail"]
    check_balanced(ours)  # every start ended, every push popped
    ranges = start_end_ranges(ours)
    assert [r.message for r in ranges] == ["a", "b", "a", "b"]
    failed, good = ranges[:2], ranges[2:]
    # The failed call's ranges end before its exception reaches the caller.
    assert all(r.end_ns is not None and r.end_ns <= caught for r in failed)
    assert good[0].start_ns < good[1].start_ns < good[0].end_ns < good[1].end_ns


def test_gates_cover_start_end_ranges(nvtx_capture):
    model, _ = jitted("each module <a, b> and steps 1..1 and forward", "se_gate")
    with nvtx_capture() as events:
        for _ in nvtx_regions.steps(range(3), domain="se_gate_clock"):
            model(*inputs()).sum().backward()
    ours = [e for e in events if e.domain == "se_gate"]
    check_balanced(ours)
    assert [r.message for r in start_end_ranges(ours)] == ["a", "b"]  # step 1 only


def test_a_region_that_crosses_a_call_stays_push_pop_and_two_regions_still_raise():
    model, transform = jitted("each module <a>\nr: between first(op in <embedding>)..last(op in <linear>) and forward", "se_mix")
    model(*inputs()).sum().backward()
    styles = {r.label: r.style for r in transform.reports[0].plan.ranges}
    assert styles == {"a": "StartEnd", "r": "PushPop"}
    model, _ = jitted(
        "r1: between first(op in <linear>)..first(op in <embedding>) and forward\n"
        "r2: between first(op in <embedding>)..last(op in <linear>) and forward", "se_raise",
    )  # fmt: skip
    with pytest.raises(SelectorError, match=r"rule 'r1: .* and rule 'r2: .* overlap without nesting"):
        model(*inputs())
