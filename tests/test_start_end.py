"""Module-call ranges that thunder interleaved, and calls that cross a region (issues 16 and 49).

Where thunder interleaves the ops of two module calls, each call's range comes in parts, each
holding the call's ops and no other module's: ``a``, then ``b``, then ``a (continued)``. Thunder's
own passes do this where they reorder (FSDP's, the executors'); here a small transform placed
before ours moves an op of one branch of the model between the ops of the other, as such a pass
would (the move keeps the data flow valid). A call that crosses a region the user wrote
(``between``) cannot nest with it: it becomes an NVTX start/end range. Checked in real NVTX
captures: start/end ranges in the same domain, with the same message, colour and category as a
push/pop range of the rule; a failed call leaves none open; gates cover them; two `between`
regions that cross still raise.
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
from nvtx_regions.testing import check_balanced, continues, flatten, range_tree, start_end_ranges

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


def jitted(spec: str, domain: str, interleave: bool = True, **options):
    torch.manual_seed(0)
    transform = NvtxProfileTransform(spec, domain=domain, messages="module", **options)
    return thunder.jit(TwoBranches(), transforms=[*([Interleave()] if interleave else []), transform]), transform


def test_interleaved_calls_come_in_parts(nvtx_capture):
    model, transform = jitted("each module <a, b>\nop in <linear>", "se_cross")
    model(*inputs()).sum().backward()  # compile: no SelectorError
    forward, backward = transform.reports
    assert [(r.label, r.style) for r in forward.plan.ranges if r.kind == "region"] == [
        ("a", "PushPop"), ("b", "PushPop"), ("a (continued)", "PushPop"), ("b (continued)", "PushPop"),
    ]  # fmt: skip
    # The backward is not interleaved: one range per call.
    assert [(r.label, r.style) for r in backward.plan.ranges if r.kind == "region"] == [
        ("b (backward)", "PushPop"), ("a (backward)", "PushPop")
    ]  # fmt: skip
    with nvtx_capture() as events:
        model(*inputs()).sum().backward()
    ours = [e for e in events if e.domain == "se_cross"]
    check_balanced(ours)
    assert start_end_ranges(ours) == []
    tid = threading.get_native_id()
    got = [(d, m) for d, _, m in flatten(range_tree(ours)[tid])]
    assert got == [
        (0, "a"), (1, "a.fc1: linear"), (0, "b"), (0, "a (continued)"), (1, "a.fc2: linear"),
        (0, "b (continued)"), (1, "b.fc: linear"), (0, "b (backward)"), (0, "a (backward)"),
    ]  # fmt: skip
    assert [m for _, m in got if not continues(m)] == ["a", "a.fc1: linear", "b", "a.fc2: linear", "b.fc: linear", "b (backward)", "a (backward)"]
    text = str(nvtx_regions.explain(model))
    assert "    a: ops #0..#0 (1 op)\n    b: ops #1..#1 (1 op)\n    a (continued): ops #2..#7 (6 ops)\n" in text, text
    art = draw_ranges(nvtx_regions.explain(model))
    assert "── a (continued)  #2..#7" in art, art


# Without the interleave: a's ops, then b's. The region starts inside a and ends inside b.
CROSSING = "each module <a, b>\nr: between first(op in <erf>)..first(op in <embedding>) and forward"


def test_calls_that_cross_a_region_become_start_end_ranges(nvtx_capture):
    model, transform = jitted(CROSSING, "se_region", interleave=False)
    model(*inputs()).sum().backward()
    styles = {r.label: (r.style, r.why) for r in transform.reports[0].plan.ranges}
    assert styles["r"] == ("PushPop", None)
    assert styles["a"][0] == styles["b"][0] == "StartEnd"
    assert styles["a"][1].startswith("crosses 'r' (bound symbols ") and styles["b"][1].startswith("crosses 'r' (")
    with nvtx_capture() as events:
        model(*inputs()).sum().backward()
    ours = [e for e in events if e.domain == "se_region"]
    check_balanced(ours)
    a, b = start_end_ranges(ours)
    assert (a.message, b.message) == ("a", "b")
    (region,) = [r for r in range_tree(ours)[threading.get_native_id()] if r.message == "r"]
    assert a.start_ns < region.start_ns < a.end_ns <= b.start_ns < region.end_ns < b.end_ns
    # Same colour and category as the rule's push/pop ranges.
    starts = [e for e in ours if e.kind == "start"]
    pushed = next(e for e in ours if e.kind == "push" and e.message == "a (backward)")
    assert {(e.color, e.category) for e in starts} == {(pushed.color, pushed.category)}
    text = str(nvtx_regions.explain(model))
    assert "a: ops #" in text and "; start/end range: crosses 'r' (bound symbols " in text
    art = draw_ranges(nvtx_regions.explain(model))
    assert "\nstart/end: a  #" in art and "\nstart/end: b  #" in art and "── b (backward)  #" in art


def test_a_failed_call_leaves_no_start_end_range_open(nvtx_capture):
    """The embedding raises inside b's start/end range; the failed call ends it as it raises."""
    model, transform = jitted(CROSSING, "se_fail", interleave=False)
    model(*inputs()).sum().backward()
    assert {r.label: r.style for r in transform.reports[0].plan.ranges} == {"a": "StartEnd", "r": "PushPop", "b": "StartEnd"}
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
    assert good[0].start_ns < good[0].end_ns <= good[1].start_ns < good[1].end_ns


def test_gates_cover_start_end_ranges(nvtx_capture):
    model, _ = jitted(CROSSING.replace("<a, b>", "<a, b> and steps 1..1 and forward"), "se_gate", interleave=False)
    with nvtx_capture() as events:
        for _ in nvtx_regions.steps(range(3), domain="se_gate_clock"):
            model(*inputs()).sum().backward()
    ours = [e for e in events if e.domain == "se_gate"]
    check_balanced(ours)
    assert [r.message for r in start_end_ranges(ours)] == ["a", "b"]  # step 1 only


def test_a_region_that_crosses_a_call_stays_push_pop_and_two_regions_still_raise():
    # Interleaved: a's parts are #0 (fc1) and #2..#7 (gelu, in ops, then fc2), b's embedding #1 between them.
    model, transform = jitted("each module <a>\nr: between first(op in <embedding>)..first(op in <erf>) and forward", "se_mix")
    model(*inputs()).sum().backward()
    styles = {r.label: r.style for r in transform.reports[0].plan.ranges}
    assert styles == {"a": "PushPop", "a (continued)": "StartEnd", "r": "PushPop"}
    model, _ = jitted(
        "r1: between first(op in <linear>)..first(op in <embedding>) and forward\n"
        "r2: between first(op in <embedding>)..last(op in <linear>) and forward", "se_raise",
    )  # fmt: skip
    with pytest.raises(SelectorError, match=r"rule 'r1: .* and rule 'r2: .* overlap without nesting"):
        model(*inputs())
