"""Run-time behaviour of transformed traces, checked on the NVTX calls they make:
rank and step gates (decided per call from the rank and the step clock, without
recompiling), recovery of the NVTX stack as a call raises, and calls from
several threads at once.

Each test runs a real model in a child process under `capture_subprocess`;
the expected ranges come from the plan (`regions_kit.one_call`) and from the
gates as the test itself spells them out.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from nvtx_regions.testing import unavailable_reason

_KIT_DIR = str(Path(__file__).resolve().parent / "workers")
if _KIT_DIR not in sys.path:
    sys.path.insert(0, _KIT_DIR)  # regions_kit, shared with the child processes
import regions_kit as kit  # noqa: E402

UNAVAILABLE = unavailable_reason()
pytestmark = [pytest.mark.thunder, pytest.mark.skipif(UNAVAILABLE is not None, reason=f"NVTX capture tool unavailable: {UNAVAILABLE}")]


run = kit.run_captured


# ---------------------------------------------------------------- step and rank gates

STEPS = """
import thunder, torch
import nvtx_regions
from nvtx_regions import NvtxProfileTransform
from regions_kit import emit, mlp, reports

t = NvtxProfileTransform('''
mlp: steps 1..2 and between first(op in <linear>)..last(op in <linear>)
op in <linear>
steps 1..1 and op in <matmul>
steps 3.. and op in <matmul>
''', domain="steps")
jm = thunder.jit(mlp(), transforms=[t])
x = torch.randn(3, 8)
for step in nvtx_regions.steps(range(5), domain="clock"):
    y = jm(x)
    if step != 1:  # no backward in step 1
        y.sum().backward()
emit(reports=reports(t), cache_misses=thunder.cache_misses(jm), cache_hits=thunder.cache_hits(jm))
"""


def test_step_gates_read_the_step_clock_forward_and_backward_alike():
    out, process = run(STEPS)
    # One compilation: gates open and close at run time.
    assert (out["cache_misses"], out["cache_hits"]) == (1, 4)
    forward, backward = out["reports"]
    assert (forward["phase"], backward["phase"]) == ("forward", "backward")
    assert [r["rules"] for r in forward["emitted"]] == [[0], [1], [1]]
    assert [r["rules"] for r in backward["emitted"]] == [[2, 3]] * 3  # one range per matmul, two gates

    def forward_call(step: int) -> kit.Call:
        return kit.one_call(forward, lambda rule: rule == 1 or step in (1, 2))

    def backward_call(step: int) -> kit.Call:
        return kit.one_call(backward, lambda rule: (rule == 2 and step == 1) or (rule == 3 and step >= 3))

    # Steps 0..4, each a forward call; the backward, in the same step, reads the same step.
    expected = (
        forward_call(0) + backward_call(0)
        + forward_call(1)
        + forward_call(2) + backward_call(2)
        + forward_call(3) + backward_call(3)
        + forward_call(4) + backward_call(4)
    )  # fmt: skip
    # That is: the mlp region (one level above the linears) in steps 1 and 2; the matmuls in
    # steps 3 and 4 (step 1, where `steps 1..1` opens them, has no backward).
    linears, with_mlp, matmuls = forward_call(0), kit.planned(forward), kit.planned(backward)
    assert [d for d, _ in linears] == [0, 0] and with_mlp == [(0, "mlp")] + kit.shifted(linears, 1)
    assert expected == linears + with_mlp + with_mlp + linears + matmuls + linears + matmuls
    assert kit.captured(process, "steps") == {out["tid"]: expected}


@pytest.mark.slow
def test_rank_gates_differ_between_torchrun_ranks():
    outs, ranks = kit.torchrun_workers()  # shared with test_entry_points.py
    # Same compiled traces on both ranks, compiled once: the rank is read at run time.
    assert outs[0]["gates"] == outs[1]["gates"]
    assert outs[0]["gates_cache_misses"] == outs[1]["gates_cache_misses"] == 1
    forward, backward = outs[0]["gates"]
    # Spec (workers/distributed_worker.py GATES_SPEC):
    #   0 rank0: rank in <0> and between first(op in <linear>)..last(op in <linear>)
    #   1 op in <linear>
    #   2 rank in <1> and steps 1.. and op in <matmul>
    assert [r["rules"] for r in forward["emitted"]] == [[0], [1], [1]]
    assert [r["rules"] for r in backward["emitted"]] == [[2]] * 3

    def step(rank: int, s: int) -> kit.Call:
        fw = kit.one_call(forward, lambda rule: rule == 1 or (rule == 0 and rank == 0))
        bw = kit.one_call(backward, lambda rule: rule == 2 and rank == 1 and s >= 1)
        return fw + bw

    linears = kit.one_call(forward, lambda rule: rule == 1)
    assert step(0, 0) == kit.planned(forward) == [(0, "rank0")] + kit.shifted(linears, 1)
    assert step(1, 0) == linears
    assert step(1, 1) == linears + kit.planned(backward)
    for rank in (0, 1):
        expected = step(rank, 0) + step(rank, 1) + step(rank, 2)
        assert kit.captured(ranks[rank], "gates") == {outs[rank]["tid"]: expected}


# ---------------------------------------------------------------- recovery after a call raised

RAISES = """
import nvtx, thunder, torch
import nvtx_regions
from nvtx_regions import NvtxProfileTransform
from regions_kit import embed_net, emit, reports

t = NvtxProfileTransform('''
net: between first(op in <linear>)..last(op in <linear>)
op in <linear, embedding, matmul>
late: steps 2.. and between first(op in <linear>)..last(op in <linear>)
''', domain="d")
jm = thunder.jit(embed_net(), transforms=[t])
x = torch.randn(3, 8)
good, bad = torch.tensor([1, 2, 3]), torch.tensor([1, 99, 3])

# A range of the test's own, in the same domain, around all calls: a recovery
# that pops too much closes it early, and one that pops too little nests the
# next calls deeper. Another one where each error is caught: the failed call's
# ranges are closed by then.
d = nvtx.get_domain("d")
d.push_range(d.get_event_attributes(message="session"))
errors = []
for step, ok in zip(nvtx_regions.steps(range(5), domain="clock"), [False, True, False, False, True]):
    try:
        jm(x, good if ok else bad).sum().backward()
    except IndexError as e:
        d.push_range(d.get_event_attributes(message="caught"))
        d.pop_range()
        errors.append((step, str(e)))
d.pop_range()
emit(reports=reports(t), errors=errors, cache_misses=thunder.cache_misses(jm))
"""


def test_a_failed_call_closes_its_ranges_as_the_exception_leaves_it():
    out, process = run(RAISES)
    assert out["errors"] == [[step, "index out of range in self"] for step in (0, 2, 3)]
    assert out["cache_misses"] == 1
    forward, backward = out["reports"]
    assert [r["rules"] for r in forward["emitted"]] == [[0], [2], [1], [1], [1]]  # net, late, fc1, emb, fc2
    raised_at = kit.start_of(forward, "embedding")

    def forward_call(step: int, ok: bool) -> kit.Call:
        return kit.one_call(forward, lambda rule: rule != 2 or step >= 2, until=None if ok else raised_at)

    fc1, emb, fc2 = (m for _, m in kit.one_call(forward, lambda rule: rule == 1))
    # Failed calls leave open the ranges around the embedding: net and emb (step 0), then also late.
    assert forward_call(0, False) == [(0, "net"), (1, fc1), (1, emb)]
    assert forward_call(2, False) == [(0, "net"), (1, "late"), (2, fc1), (2, emb)]
    assert forward_call(4, True) == kit.planned(forward) == [(0, "net"), (1, "late"), (2, fc1), (2, emb), (2, fc2)]
    caught = [(0, "caught")]
    calls = (
        forward_call(0, False) + caught
        + forward_call(1, True) + kit.planned(backward)
        + forward_call(2, False) + caught
        + forward_call(3, False) + caught
        + forward_call(4, True) + kit.planned(backward)
    )  # fmt: skip
    assert kit.captured(process, "d") == {out["tid"]: [(0, "session")] + kit.shifted(calls, 1)}


RAISES_THEN_OTHER_TRACE = """
import nvtx, thunder, torch
from nvtx_regions import NvtxProfileTransform
from regions_kit import embed_net, emit, mlp, reports

spec = "net: between first(op in <linear>)..last(op in <linear>)\\nop in <linear, embedding, matmul>"
t, t_mlp = NvtxProfileTransform(spec, domain="d"), NvtxProfileTransform(spec, domain="d")
jm, jmlp = thunder.jit(embed_net(), transforms=[t]), thunder.jit(mlp(), transforms=[t_mlp])
x3, x5 = torch.randn(3, 8), torch.randn(5, 8)
good3, good5, bad3 = torch.tensor([1, 2, 3]), torch.tensor([1, 2, 3, 4, 5]), torch.tensor([1, 99, 3])

d = nvtx.get_domain("d")
d.push_range(d.get_event_attributes(message="session"))
errors = []
calls = [
    ("fails", lambda: jm(x3, bad3)),
    ("new trace", lambda: jm(x5, good5)),  # another batch size: a cache miss, a new trace
    ("fails", lambda: jm(x3, bad3)),
    ("other function", lambda: jmlp(x3)),  # another jitted function, same domain
    ("same trace", lambda: jm(x3, good3)),
]
for what, call in calls:
    try:
        call().sum().backward()
    except IndexError:
        errors.append(what)
d.pop_range()
emit(reports=reports(t), mlp=reports(t_mlp), errors=errors, cache_misses=thunder.cache_misses(jm))
"""


def test_a_failed_call_leaves_nothing_open_for_the_next_call_of_any_trace_in_the_domain():
    out, process = run(RAISES_THEN_OTHER_TRACE)
    assert out["errors"] == ["fails", "fails"]
    assert out["cache_misses"] == 2
    fw3, bw3, fw5, bw5 = out["reports"]
    mlp_fw, mlp_bw = out["mlp"]
    assert [r["phase"] for r in out["reports"]] == ["forward", "backward"] * 2
    failed = kit.one_call(fw3, until=kit.start_of(fw3, "embedding"))
    assert [d for d, _ in failed] == [0, 1, 1]  # net, fc1, emb: net and emb left open
    calls = (
        failed
        + kit.planned(fw5) + kit.planned(bw5)
        + failed
        + kit.planned(mlp_fw) + kit.planned(mlp_bw)
        + kit.planned(fw3) + kit.planned(bw3)
    )  # fmt: skip
    assert kit.captured(process, "d") == {out["tid"]: [(0, "session")] + kit.shifted(calls, 1)}


# ---------------------------------------------------------------- threads

THREADS = """
import sys, threading
import thunder, torch
import nvtx_regions
from thunder.executors.custom_op_ex import custom_op_ex
from thunder.torch.custom_op import _register_custom_op
from nvtx_regions import NvtxProfileTransform
from regions_kit import embed_net, emit, reports

PLANS = PLANS_HERE
CLOCKED = CLOCKED_HERE  # the threads that loop over nvtx_regions.steps: the step clock is theirs
meet = None

# An op inside the trace (inside the "net" range) that returns only once the
# other thread has reached it too: the threads' calls overlap for sure.
@torch.library.custom_op("nvtx_regions_tests::rendezvous", mutates_args=())
def rendezvous(idx: torch.Tensor) -> torch.Tensor:
    if meet is not None:
        meet.wait(timeout=60)
    return idx.clone()

rendezvous.register_fake(lambda idx: torch.empty_like(idx))
_register_custom_op(rendezvous)

t = NvtxProfileTransform(SPEC_HERE, domain="threads")
model = embed_net(through=torch.ops.nvtx_regions_tests.rendezvous)
jm = thunder.jit(model, transforms=[t], executors=[custom_op_ex, *thunder.get_default_executors()])
x = torch.randn(3, 8)
good, bad = torch.tensor([1, 2, 3]), torch.tensor([1, 99, 3])
jm(x, good).sum().backward()  # compile here, once

meet = threading.Barrier(len(PLANS))
tids, errors, calls = {}, {}, {}

def work(name):
    tids[name] = threading.get_native_id()
    errors[name] = calls[name] = 0
    plan = PLANS[name]
    for ok in (nvtx_regions.steps(plan, domain="clock") if name in CLOCKED else plan):
        try:
            jm(x, good if ok else bad).sum().backward()
        except IndexError:
            errors[name] += 1
        calls[name] += 1

threads = [threading.Thread(target=work, args=(name,)) for name in PLANS]
for th in threads:
    th.start()
for th in threads:
    th.join()
ops = [b.sym.name for b in thunder.last_traces(jm)[-1].bound_symbols]
emit(reports=reports(t), tids=tids, errors=errors, calls=calls, cache_misses=thunder.cache_misses(jm), ops=ops)
"""


UNGATED = "net: between first(op in <linear>)..last(op in <linear>)\nop in <linear, embedding, matmul>"


def _threads(plans: dict[str, list[bool]], spec: str = UNGATED, clocked: tuple[str, ...] = ()):
    """Run the THREADS child: one thread per plan, each making one call per entry (False: a failing call);
    the threads named in `clocked` make their calls in a `nvtx_regions.steps` loop."""
    code = THREADS.replace("PLANS_HERE", repr(plans)).replace("SPEC_HERE", repr(spec)).replace("CLOCKED_HERE", repr(clocked))
    out, process = run(code)
    assert out["calls"] == {name: len(plan) for name, plan in plans.items()}
    assert out["errors"] == {name: plan.count(False) for name, plan in plans.items()}
    assert out["cache_misses"] == 1
    forward, backward = out["reports"]
    tree = kit.captured(process, "threads")
    # Both threads waited for each other inside the "net" range, so their calls overlapped:
    # one pushed while the other had a range open.
    ops = out["ops"]
    first_push = ops.index("nvtx_regions_push")
    last_pop = max(i for i, op in enumerate(ops) if op == "nvtx_regions_pop")
    assert first_push < ops.index("nvtx_regions_tests_rendezvous") < last_pop
    assert kit.overlapping_pushes(process.events, out["tids"].values()) > 0, "the threads' calls never overlapped; the test proves nothing"
    return out, forward, backward, tree


def test_two_threads_one_function_separate_balanced_stacks():
    calls = 12
    out, forward, backward, tree = _threads({"a": [True] * calls, "b": [True] * calls})
    step = kit.planned(forward) + kit.planned(backward)
    assert tree == {out["tid"]: step, out["tids"]["a"]: step * calls, out["tids"]["b"]: step * calls}


def test_failure_on_one_thread_is_recovered_on_that_thread_only():
    calls = 12
    plans = {"calls_only": [True] * calls, "fails_every_other": [False, True] * (calls // 2)}
    out, forward, backward, tree = _threads(plans)
    step = kit.planned(forward) + kit.planned(backward)
    failed = kit.one_call(forward, until=kit.start_of(forward, "embedding"))
    assert tree == {
        out["tid"]: step,
        out["tids"]["calls_only"]: step * calls,
        out["tids"]["fails_every_other"]: (failed + step) * (calls // 2),
    }


def test_two_threads_one_gated_function_each_call_gated_as_a_whole():
    """Step gates open and close while the other thread's call is in flight (both wait for
    each other inside the "net" range; thread a's `steps` loop moves the clock): each call
    emits either all its gated ranges or none, and thread a's calls emit them exactly in the
    gates' steps. Swapping the function's globals at each call's start cut ranges short in
    the call in flight, or left them open."""
    calls = 12
    ops = "op in <linear, embedding, matmul>"
    # Open at steps 1, 3-5 and 9 of thread a's loop.
    spec = f"net: between first(op in <linear>)..last(op in <linear>)\nsteps 1..1 and {ops}\nsteps 3..5 and {ops}\nsteps 9..9 and {ops}"
    out, forward, backward, tree = _threads({"a": [True] * calls, "b": [True] * calls}, spec, clocked=("a",))
    on = kit.planned(forward), kit.planned(backward)
    off = kit.one_call(forward, lambda rule: rule == 0), kit.one_call(backward, lambda rule: rule == 0)
    assert on[0] != off[0] and on[1] != off[1]
    # The compiling call, before any loop or optimizer step, is at step 0: gates closed.
    assert tree[out["tid"]] == off[0] + off[1]
    for name in ("a", "b"):
        events = tree[out["tids"][name]]
        n, opened_in = 0, []
        for call in range(calls):
            for phase, (opened, closed) in enumerate(zip(on, off)):
                if events[n : n + len(opened)] == opened:
                    n += len(opened)
                    opened_in.append((call, phase))
                else:
                    assert events[n : n + len(closed)] == closed, f"thread {name}: a call neither gated on nor off"
                    n += len(closed)
        assert n == len(events)
        if name == "a":  # forward and backward of steps 1, 3, 4, 5 and 9
            assert opened_in == [(step, phase) for step in (1, 3, 4, 5, 9) for phase in (0, 1)]
