"""Where a failed call stopped, by either path (emission/runtime.py, unwind_watch.py).

On Python 3.12+ ``sys.monitoring`` locates it and the trace's lines store
nothing; on 3.11 the lines store their points, only the last one before an
op that may raise. Both are checked against the trace text (an independent
count of its push and pop lines) and, in real NVTX captures, by a call that
fails after hundreds of points inside nested ranges, followed by a good call:
the failed call's ranges must be popped exactly.
"""

from __future__ import annotations

import re
import sys
import threading

import pytest
import thunder
import torch

from nvtx_regions import NvtxProfileTransform
from nvtx_regions.emission import unwind_watch
from nvtx_regions.testing import check_balanced, range_tree

HAS_MONITORING = sys.version_info >= (3, 12)
PATHS = ["stores", pytest.param("interpreter", marks=pytest.mark.skipif(not HAS_MONITORING, reason="sys.monitoring: Python 3.12+"))]


@pytest.fixture
def path(request, monkeypatch):
    """Build traces for one path: ``stores`` forces the position stores on any Python."""
    if request.param == "stores":
        monkeypatch.setattr(unwind_watch, "enabled", lambda: False)
    else:
        assert unwind_watch.enabled(), "sys.monitoring had no free tool id in the test session"
    return request.param


class Chain(torch.nn.Module):
    """150 linears, then an embedding of ``idx`` that depends on them (so it stays last):
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


def forward_source(layers: int, domain: str) -> str:
    torch.manual_seed(0)
    model = thunder.jit(Chain(layers), transforms=[NvtxProfileTransform("all\nr: between first(all)..last(all)", domain=domain)])
    model(*inputs())
    return thunder.last_traces(model)[-1].python()


def test_python_picks_its_path():
    """3.12+: the interpreter locates failed calls; 3.11: it cannot, and the lines store."""
    assert unwind_watch.enabled() == HAS_MONITORING
    source = forward_source(3, "uw_pick")
    assert ("_at[0] = " in source) != HAS_MONITORING


@pytest.mark.parametrize("path", ["stores"], indirect=True)
def test_the_last_line_before_each_op_that_may_raise_stores_its_point(path):
    """Reference: the point of a push/pop line is its number among those lines
    (enter's is 0). Each store must write the point of its own line, and between
    two ops (``del`` lines aside) exactly the last pointed line stores."""
    lines = forward_source(150, "uw_stores").splitlines()
    ours = re.compile(r"^(nvtx_regions_\d+_open = )?nvtx_regions_\d+_(push_\d+|pop_\d+|push_enter)\(")
    cell: list[int] = [0, 0]
    point = -1
    pointed_since_op = False  # a pointed line ran since the last op, and no store followed it
    stored = 0
    for line in lines:
        code = line.split("  #")[0].strip()
        if ours.match(code) and "calls.remove" not in code:
            point += 1
            for index, value in re.findall(r"_at\[(\d)\] = (\d+)", code):
                cell[int(index)] = int(value)
            if "_at[0]" in code:
                assert cell[1] * 256 + cell[0] == point, line
                stored += 1
                pointed_since_op = False
            else:
                pointed_since_op = point > 0
        elif code and not code.startswith(("del ", "#", "def ", "@", "nvtx_regions")) and "calls.remove" not in code:
            assert not pointed_since_op, f"an op that may raise runs before the last point was stored: {line}"
    assert point > 256 and cell[1] >= 1  # the high part was written on the way
    assert 150 <= stored < point  # about one store per range, not two


@pytest.mark.parametrize("path", PATHS, indirect=True)
def test_a_call_that_fails_after_hundreds_of_points_pops_exactly_what_it_pushed(path, nvtx_capture):
    torch.manual_seed(0)
    domain = f"uw_fail_{path}"
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
    # own range, each closed -- by the recovery, for `late`, the embedding and `r`.
    assert [c.message for c in failed.children[-1:]] == ["late"]
    assert len(failed.children[-1].children) == 1 and "embedding" in failed.children[-1].children[0].message
    assert len(failed.children) == len(good.children)


@pytest.mark.parametrize(("value", "expected"), [("0", "False"), ("1", str(HAS_MONITORING)), ("no", "ValueError")])
def test_the_environment_switch_turns_sys_monitoring_off_and_refuses_other_values(value, expected):
    import os
    import subprocess

    code = (
        "from nvtx_regions.emission import unwind_watch\n"
        "try:\n    print(unwind_watch.enabled())\n"
        "except ValueError as e:\n    print('ValueError', e)\n"
    )
    env = {**os.environ, unwind_watch.ENV_SWITCH: value}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120).stdout
    assert out.split()[0] == expected, out
    if expected == "ValueError":
        assert "set it to 0" in out and "'no'" in out
