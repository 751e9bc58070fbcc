"""One spec, two sinks: `emit=` sends the same ranges to NVTX, to torch.profiler, or to both.

Each backend runs tests/workers/profiler_sink.py in a child process under the capture
tool and torch.profiler at once. The exported Chrome trace (what TensorBoard, Perfetto
and HTA read) is checked on its own: names, counts per step, forward and backward, the
``steps 1..2`` gate, and that each module range encloses its module's ops; and against
the NVTX capture of the same run, which must hold the same ranges in the same order.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import nvtx_regions
from nvtx_regions.core.profiling import PROFILER_STEP
from nvtx_regions.testing import capture_subprocess, unavailable_reason

WORKER = Path(__file__).parent / "workers" / "profiler_sink.py"
BACKENDS = ["eager", pytest.param("inductor", marks=pytest.mark.slow), pytest.param("thunder", marks=pytest.mark.thunder)]
OURS = {"blocks.0", "blocks.1", "blocks.0 (backward)", "blocks.1 (backward)", "blocks.0.fc", "blocks.1.fc"}


def annotations(trace: Path) -> list[dict]:
    """The trace's user_annotation events (record_function's), in time order."""
    events = json.loads(trace.read_text())["traceEvents"]
    return sorted((e for e in events if e.get("cat") == "user_annotation"), key=lambda e: e["ts"])


def ops(trace: Path) -> list[dict]:
    return [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("cat") == "cpu_op"]


def inside(event: dict, outer: dict) -> bool:
    return event["tid"] == outer["tid"] and outer["ts"] <= event["ts"] and event["ts"] + event["dur"] <= outer["ts"] + outer["dur"]


def per_step(trace: Path) -> dict[int, collections.Counter]:
    """Per step range (``ProfilerStep#N`` in torch.profiler): how many of each of our ranges it holds."""
    found = annotations(trace)
    steps = {int(e["name"][len(PROFILER_STEP) :]): e for e in found if e["name"].startswith(PROFILER_STEP)}
    return {n: collections.Counter(e["name"] for e in found if e["name"] in OURS and inside(e, s)) for n, s in steps.items()}


def run(backend: str, emit: str, tmp_path: Path, *, capture: bool):
    trace = tmp_path / "trace.json"
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "TORCHINDUCTOR_COMPILE_THREADS": "1", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(WORKER), backend, emit, str(trace)]
    if not capture:
        done = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0 and "done" in done.stdout, done.stderr[-3000:]
        return trace, None
    result = capture_subprocess(command, env=env, timeout=600).check()
    assert "done" in result.stdout
    (process,) = result.processes.values()
    assert [e.message for e in process.events if e.domain == "worker" and e.kind == "push"] == ["worker done"]
    return trace, [e for e in process.events if e.domain == "nvtx_regions"]


EXPECTED = {
    0: {"blocks.0": 1, "blocks.1": 1, "blocks.0 (backward)": 1, "blocks.1 (backward)": 1},
    1: {"blocks.0": 1, "blocks.1": 1, "blocks.0 (backward)": 1, "blocks.1 (backward)": 1, "blocks.0.fc": 1, "blocks.1.fc": 1},
}
EXPECTED[2] = EXPECTED[1]


@pytest.mark.skipif(bool(unavailable_reason()), reason=f"capture tool unavailable: {unavailable_reason()}")
@pytest.mark.parametrize("backend", BACKENDS)
def test_both_sinks_give_the_same_ranges(backend, tmp_path):
    trace, nvtx_events = run(backend, "nvtx,record_function", tmp_path, capture=True)
    # torch.profiler's trace, on its own: per step, each module once each way; the gate's ranges in steps 1 and 2.
    assert per_step(trace) == {n: collections.Counter(c) for n, c in EXPECTED.items()}
    # Each module range encloses its module's matmul (forward: addmm; backward: mm), on its thread.
    matmuls = [e for e in ops(trace) if e["name"] in ("aten::addmm", "aten::mm")]
    for event in annotations(trace):
        if event["name"] in ("blocks.0", "blocks.1", "blocks.0 (backward)", "blocks.1 (backward)"):
            assert any(inside(op, event) for op in matmuls), f"{event['name']} at {event['ts']} holds no matmul"
    # The NVTX capture of the same run: the same ranges, in the same order.
    pushed = [e.message for e in nvtx_events if e.kind in ("push", "start") and e.message in OURS | {f"step {n}" for n in range(3)}]
    in_trace = [e["name"].replace(PROFILER_STEP, "step ") for e in annotations(trace) if e["name"] in OURS or e["name"].startswith(PROFILER_STEP)]
    assert pushed == in_trace


@pytest.mark.slow
def test_record_function_alone_leaves_nvtx_empty(tmp_path):
    if unavailable_reason():
        pytest.skip(f"capture tool unavailable: {unavailable_reason()}")
    trace, nvtx_events = run("inductor", "record_function", tmp_path, capture=True)
    assert per_step(trace)[2] == collections.Counter(EXPECTED[2])
    assert nvtx_events == []


def test_nvtx_alone_leaves_the_profiler_trace_without_ours(tmp_path):
    trace, _ = run("eager", "nvtx", tmp_path, capture=False)
    ours = lambda path: {e["name"] for e in annotations(path)} & (OURS | {f"{PROFILER_STEP}{n}" for n in range(3)})  # noqa: E731
    # Not an empty trace: the profiler recorded the 3 steps' ops (each step, 2 Linear forwards
    # and their 4 backward matmuls), where our ranges would be.
    matmuls = collections.Counter(e["name"] for e in ops(trace) if e["name"] in ("aten::addmm", "aten::mm"))
    assert matmuls == {"aten::addmm": 2 * 3, "aten::mm": 4 * 3}, matmuls
    assert ours(trace) == set()
    # The positive control: the same check on this trace with one of our ranges planted around a
    # forward matmul, as record_function would have put it, finds it.
    planted = json.loads(trace.read_text())
    addmm = next(e for e in planted["traceEvents"] if e.get("cat") == "cpu_op" and e["name"] == "aten::addmm")
    planted["traceEvents"].append({**addmm, "cat": "user_annotation", "name": "blocks.0", "args": {}})
    (tmp_path / "planted.json").write_text(json.dumps(planted))
    assert ours(tmp_path / "planted.json") == {"blocks.0"}


def _crossings(trace: Path) -> int:
    """How many (backward range, autograd ``evaluate_function`` event) pairs of one thread overlap
    without one holding the other."""
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]
    backward = [e for e in events if e.get("cat") == "user_annotation" and e["name"].endswith(" (backward)")]
    engine = [e for e in events if e["name"].startswith("autograd::engine::evaluate_function")]
    assert backward and engine
    ends = lambda e: (e["ts"], e["ts"] + e["dur"])  # noqa: E731
    return sum(
        a["tid"] == b["tid"] and (ends(a)[0] < ends(b)[0] < ends(a)[1] < ends(b)[1] or ends(b)[0] < ends(a)[0] < ends(b)[1] < ends(a)[1])
        for a in backward for b in engine
    )  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_ranges_in_the_call_tree_as_docs_say(backend, tmp_path):
    """docs/how-to/torch-profiler.md: on eager a backward range opens in the autograd hook of one node
    and closes in another's, so it crosses autograd's evaluate_function events; Inductor's and
    thunder's sit inside the compiled backward and nest."""
    trace, _ = run(backend, "record_function", tmp_path, capture=False)
    crossings = _crossings(trace)
    assert (crossings > 0) if backend == "eager" else (crossings == 0), crossings


class _Raising(__import__("torch").nn.Linear):
    """A linear that raises while `fail` is set."""

    fail = False

    def forward(self, x):
        if self.fail:
            raise RuntimeError("planned failure")
        return super().forward(x)


def test_a_failed_call_closes_its_profiler_ranges(tmp_path):
    """Recovery holds for the record_function sink: the range a raising module opened ends with
    the call, and the next call's ranges are not inside it."""
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), _Raising(4, 4))
    compiled = nvtx_regions.compile(model, "each module <*>", backend="eager", emit="record_function")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        model[1].fail = True
        with pytest.raises(RuntimeError, match="planned failure"):
            compiled(torch.randn(2, 4))
        model[1].fail = False
        compiled(torch.randn(2, 4))
    profiler.export_chrome_trace(str(tmp_path / "trace.json"))
    found = [e for e in annotations(tmp_path / "trace.json") if e["name"] in ("0", "1")]
    assert [e["name"] for e in found] == ["0", "1", "0", "1"]
    failed, after = found[1], found[2]
    assert failed["ts"] + failed["dur"] <= after["ts"]


@pytest.mark.parametrize(
    "make",
    [
        lambda emit: nvtx_regions.compile(__import__("torch").nn.Linear(2, 2), backend="eager", emit=emit),
        lambda emit: nvtx_regions.NvtxInductor(emit=emit),
        lambda emit: next(iter(nvtx_regions.steps(range(1), emit=emit))),
    ],
    ids=["compile", "NvtxInductor", "steps"],
)
def test_bad_emit_names_the_accepted_values(make, monkeypatch):
    monkeypatch.delenv("NVTX_REGIONS_EMIT", raising=False)
    with pytest.raises(ValueError, match=r"emit='bogus' is not a place for ranges; choose 'nvtx', 'record_function', or both"):
        make("bogus")
    monkeypatch.setenv("NVTX_REGIONS_EMIT", "bogus")
    with pytest.raises(ValueError, match=r"\$NVTX_REGIONS_EMIT='bogus' is not a place for ranges"):
        make(None)
    monkeypatch.setenv("NVTX_REGIONS_EMIT", "record_function")
    with pytest.raises(ValueError, match=r"emit='nvtx', but \$NVTX_REGIONS_EMIT asks for 'record_function'.*leave emit= unset"):
        make("nvtx")


@pytest.mark.thunder
def test_bad_emit_on_the_thunder_transform():
    from nvtx_regions import NvtxProfileTransform

    with pytest.raises(ValueError, match=r"NvtxProfileTransform\(\): emit='perfetto' is not a place"):
        NvtxProfileTransform("all", emit=("nvtx", "perfetto"))
    assert "emit=('record_function',)" in repr(NvtxProfileTransform("all", emit="record_function"))
