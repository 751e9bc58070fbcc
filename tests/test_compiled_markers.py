"""The model's own markers under torch.compile with `NvtxInductor`, ``fullgraph=True``: no graph
break, and each marker comes out around its ops' kernels in its own sink, read by the real
consumers (our capture tool, torch.profiler's Chrome trace, Nsight Systems).

One model (tests/workers/compiled_markers.py): two blocks, each with ``record_function("mixer")``
around its Linear, ``torch.cuda.nvtx.range_push("norm-in")``/``range_pop()`` around its
LayerNorm, ``nvtx.annotate("act", domain="user")`` around its GELU and a function decorated with
``nvtx.annotate("head", domain="user")``; 3 training steps in a child process. Each child
compiles with Inductor (30-60 s here), so the tests are few and each checks much.
"""

from __future__ import annotations

import json
import os
import re
import sys
import types
from collections import Counter
from pathlib import Path

import pytest
import torch._dynamo.config

from nvtx_regions.testing import capture_subprocess, range_tree, unavailable_reason

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "workers" / "compiled_markers.py"
STEPS, BLOCKS = 3, 2
# The user's line that pushes the marker the worker's --bad block never pops.
NEVER_POPPED = next(
    n for n, line in enumerate(WORKER.read_text().splitlines(), 1) if 'range_push("never-popped")' in line
)

# torch 2.8's Dynamo drops every record_function from compiled code (no capture_profiler_record_function):
# the worker's "mixer" markers are gone there, with one warning saying so.
KEEPS_RECORD_FUNCTION = hasattr(torch._dynamo.config, "capture_profiler_record_function")


def record_function_dropped(warnings: list[str]) -> list[str]:
    """The warnings of `warnings` that say Dynamo dropped a record_function (`inductor.dynamo_events`)."""
    return [w for w in warnings if "has no torch._dynamo.config.capture_profiler_record_function" in w]


needs_capture = pytest.mark.skipif(bool(unavailable_reason()), reason=f"capture tool unavailable: {unavailable_reason()}")


def run(cache: Path, spec: str, emit: str, *flags: str):
    """The worker under our capture tool: (its JSON result, its one process's NVTX events)."""
    env = {"TORCHINDUCTOR_CACHE_DIR": str(cache), "TORCHINDUCTOR_COMPILE_THREADS": "1", "OMP_NUM_THREADS": "1"}
    result = capture_subprocess([sys.executable, str(WORKER), spec, emit, *flags], env=env, timeout=600).check()
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == "done", result.stdout[-2000:]
    (process,) = result.processes.values()
    return json.loads(lines[-2]), process.events


def pushes(events, message, domain):
    return [e for e in events if e.kind == "push" and e.message == message and e.domain == domain]


def flat(events):
    """Every push/pop range of `events`, whatever its domain: (domain, message, start, end, tid)."""
    found = []

    def walk(ranges):
        for r in ranges:
            found.append((r.domain, r.message, r.start_ns, r.end_ns, r.tid))
            walk(r.children)

    for roots in range_tree(events).values():
        walk(roots)
    return found


@pytest.mark.slow  # 18 s; the default tier's 6 minutes
@needs_capture
def test_markers_stay_in_their_own_domains_around_their_modules_kernels(tmp_path):
    result, events = run(tmp_path / "cache", "each module <*>", "nvtx", "--plain", "--bad")
    assert result["graph_breaks"] == 0 and result["graphs"] == 1
    # Inductor compiled the graph without the marker nodes: the kernels of a plain torch.compile
    # of the same model without markers, forward and backward.
    assert result["kernels"] == result["plain_kernels"] and len(result["kernels"]) == 2
    # The marker pushed and never popped in the graph, and the one around no kernel, are left out,
    # each named with its line and why; a torch whose Dynamo drops record_function says so once.
    dropped = record_function_dropped(result["warnings"])
    assert len(dropped) == (0 if KEEPS_RECORD_FUNCTION else 1), result["warnings"]
    never, nothing = [w for w in result["warnings"] if w not in dropped]
    assert f"compiled_markers.py:{NEVER_POPPED}" in never and "not popped" in never, never
    assert f"compiled_markers.py:{NEVER_POPPED + 1}" in nothing and "around no kernel" in nothing, nothing
    assert not [e for e in events if e.message in ("never-popped", "around-nothing")]
    # NVTX markers stay NVTX, in their own domain, once per block call; record_function stays out of NVTX.
    assert len(pushes(events, "norm-in", None)) == STEPS * BLOCKS
    assert len(pushes(events, "act", "user")) == len(pushes(events, "head", "user")) == STEPS * BLOCKS
    from nvtx._lib.lib import color_to_hex

    assert {e.color for e in pushes(events, "act", "user")} == {color_to_hex("green")}  # as nvtx pushes it eagerly
    assert not [e for e in events if e.message == "mixer" or (e.message or "").endswith("(backward)") and e.domain != "nvtx_regions"]
    # Each marker lies inside its block's range (same thread, in time), one per block call.
    ranges = flat(events)
    blocks = [r for r in ranges if r[0] == "nvtx_regions" and r[1] in ("0", "1")]
    assert len(blocks) == STEPS * BLOCKS
    for message, domain in (("norm-in", None), ("act", "user"), ("head", "user")):
        inside = Counter()
        for marker in (r for r in ranges if r[:2] == (domain, message)):
            (block,) = [b for b in blocks if b[4] == marker[4] and b[2] <= marker[2] and marker[3] <= b[3]]
            inside[block[1]] += 1
        assert inside == {"0": STEPS, "1": STEPS}, (message, inside)
    # The wrapper reads as code: one call a line, the message in a comment.
    forward = result["codes"][0]
    assert re.search(r"\n +nvtx_regions_push_\d\(nvtx_regions_attr_\d+, nvtx_regions_domain_\d\)  # norm-in\n", forward), forward


@pytest.mark.slow
@needs_capture
def test_each_marker_shows_every_marker_in_both_consumers_also_from_the_cache(tmp_path):
    runs = []
    for number in range(2):  # the second run's wrappers come from the first's Inductor cache
        trace = tmp_path / f"trace{number}.json"
        result, events = run(tmp_path / "cache", "each marker <*>", "both", "--front-door", "--profile", str(trace))
        dropped = 0 if KEEPS_RECORD_FUNCTION else 1  # Dynamo traces again on a hit of Inductor's cache
        assert result["graph_breaks"] == 0 and len(record_function_dropped(result["warnings"])) == len(result["warnings"]) == dropped
        runs.append((result, events, json.loads(trace.read_text())))
    assert runs[0][0]["cache_hits"] == 0 and runs[1][0]["cache_hits"] > 0
    assert runs[0][0]["codes"] == runs[1][0]["codes"]
    for result, events, trace in runs:
        # NVTX: the NVTX markers once each in their own domain (each marker adds none there: the
        # same range, in the same sink); record_function markers re-emitted in the spec's domain.
        assert len(pushes(events, "norm-in", None)) == STEPS * BLOCKS
        assert len(pushes(events, "norm-in (backward)", None)) == STEPS * BLOCKS
        assert len(pushes(events, "act", "user")) == len(pushes(events, "head (backward)", "user")) == STEPS * BLOCKS
        mixers = STEPS * BLOCKS if KEEPS_RECORD_FUNCTION else 0
        assert len(pushes(events, "mixer", "nvtx_regions")) == len(pushes(events, "mixer (backward)", "nvtx_regions")) == mixers
        # torch.profiler: every marker and its backward, once per block call of the 2 profiled steps.
        spans = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
        annotations = [e for e in spans if e.get("cat") == "user_annotation"]
        counts = Counter(e["name"] for e in annotations)
        for name in ("mixer", "norm-in", "act", "head") if KEEPS_RECORD_FUNCTION else ("norm-in", "act", "head"):
            assert counts[name] == counts[f"{name} (backward)"] == 2 * BLOCKS, counts
        if not KEEPS_RECORD_FUNCTION:
            assert not counts["mixer"] and not counts["mixer (backward)"], counts
        # Each record_function marker encloses its Linear's matmul, as it did eagerly.
        matmuls = [e for e in spans if e.get("cat") == "cpu_op" and e["name"] in ("aten::addmm", "aten::mm")]
        for mixer in (e for e in annotations if e["name"] == "mixer"):
            inside = [
                m for m in matmuls
                if m["tid"] == mixer["tid"] and mixer["ts"] <= m["ts"] and m["ts"] + m["dur"] <= mixer["ts"] + mixer["dur"]
            ]  # fmt: skip
            assert [m["name"] for m in inside] == ["aten::addmm"], mixer


@pytest.mark.slow
def test_nsys_sees_the_models_own_markers(tmp_path):
    from support.nsys import export, nsys_ranges, require_nsys, run_nsys

    nsys = require_nsys()
    report = tmp_path / "markers"
    os.environ["TORCHINDUCTOR_CACHE_DIR"], before = str(tmp_path / "cache"), os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    try:
        done = run_nsys(
            [nsys, "profile", "--trace=nvtx", "--sample=none", "--cpuctxsw=none", f"--output={report}",
             sys.executable, str(WORKER), "each module <*>", "nvtx"]
        )  # fmt: skip
    finally:
        if before is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR")
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = before
    assert done.returncode == 0, done.output[-3000:]
    seen = Counter((r.domain, r.message) for r in nsys_ranges(export(report.with_suffix(".nsys-rep"))))
    # ("head" is not there: nvtx >= 0.2.12 asks the tool whether the domain is enabled, Nsight Systems
    # 2022.4 says no, and at import the decorator then returned the function itself, as eagerly.)
    assert seen[(None, "norm-in")] == seen[("user", "act")] == STEPS * BLOCKS, seen
    assert seen[("nvtx_regions", "0")] == seen[("nvtx_regions", "1 (backward)")] == STEPS, seen
    assert not [key for key in seen if key[1] == "mixer"]


@pytest.mark.parametrize("earlier", [False, True], ids=["none-installed", "an-NvtxInductor-installed-them"])
def test_the_stand_ins_replace_no_marker_and_are_put_back(request, earlier):
    """Runs whatever ran before in this process: an NvtxInductor alive (another test's in this
    worker, or one made here, with `earlier`) holds the stand-ins it installed (`internals.installs`);
    the test puts them back first, and at its end leaves them as it found them."""
    import torch
    from torch._dynamo.symbolic_convert import InstructionTranslatorBase

    from nvtx_regions.inductor import NvtxInductor
    from nvtx_regions.internals import compiled_markers

    if compiled_markers.installed():
        request.addfinalizer(compiled_markers.install)
    if earlier:
        backend = NvtxInductor("each module <*>")  # alive, it holds the stand-ins it installed
        assert compiled_markers.installed()
        request.addfinalizer(backend.remove)
    compiled_markers.uninstall()
    config = torch._dynamo.config
    assert not compiled_markers.installed()
    markers, call = _marker_functions(), InstructionTranslatorBase.call_function
    capture = getattr(config, "capture_profiler_record_function", None)  # torch 2.8 lacks it
    compiled_markers.install()
    try:
        # What other code's guards check, and what a user's `from nvtx import push_range` holds: the same.
        assert _marker_functions() == markers
        assert InstructionTranslatorBase.call_function is not call  # the positive control: Dynamo's side changed
        if capture is not None:  # on only while Dynamo traces for an NvtxInductor: off here
            assert config.capture_profiler_record_function is compiled_markers.WHILE_KEPT
            assert not config.capture_profiler_record_function
    finally:
        compiled_markers.uninstall()
    assert _marker_functions() == markers
    assert InstructionTranslatorBase.call_function is call
    assert getattr(config, "capture_profiler_record_function", None) == capture


def _marker_functions() -> dict[str, int]:
    """Every marker function of torch.cuda.nvtx and the nvtx package, by identity."""
    import nvtx
    import nvtx.nvtx as module
    import torch.cuda.nvtx as torch_nvtx

    owners = {"torch.cuda.nvtx": torch_nvtx, "nvtx": nvtx, "nvtx.nvtx": module, "nvtx.annotate": module.annotate}
    return {f"{name}.{key}": id(value) for name, owner in owners.items() for key, value in vars(owner).items() if callable(value)}


class _KeepsMarkers:
    """A backend that keeps the user's markers (as `NvtxInductor` does), recording its graphs."""

    keeps_user_markers = True

    def __init__(self) -> None:
        self.graphs: list = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


class _Plain(_KeepsMarkers):
    keeps_user_markers = False


def test_dynamo_traces_the_nvtx_packages_markers_as_ours_only_for_a_backend_that_keeps_them(request):
    """Every form of the nvtx package's markers, a reference to one taken before the install too: one
    marker node each in the graph of a backend that keeps markers, under ``fullgraph=True``; the same
    code for a plain backend is what it is without us (the control: Dynamo's graph break)."""
    import nvtx
    import torch
    from nvtx import pop_range as early_pop, push_range as early_push  # taken before the install

    from nvtx_regions.internals import compiled_markers

    @nvtx.annotate("decorated", domain="dd", color="red")
    def decorated(x):
        return x * 2

    def marked(x):
        x = x.sin()
        nvtx.push_range("pushed", color="green", domain="dp")
        x = x.cos()
        nvtx.pop_range(domain="dp")
        with nvtx.annotate("annotated", color=0xFF0000):
            x = x.tan()
        early_push("early")
        x = x + 1
        early_pop()
        return decorated(x)

    if not compiled_markers.installed():
        compiled_markers.install()
        request.addfinalizer(compiled_markers.uninstall)
    torch._dynamo.reset()
    keeps = _KeepsMarkers()
    torch.compile(marked, backend=keeps, fullgraph=True)(torch.ones(2))
    found = [node.args for gm in keeps.graphs for node in gm.graph.nodes if node.target is compiled_markers.marker_op()]
    decorator = [("push", "nvtx", "decorated", "dd", "red"), ("pop", "nvtx", None, "dd", None)]
    assert found == [
        ("push", "nvtx", "pushed", "dp", "green"),
        ("pop", "nvtx", None, "dp", None),
        ("push", "nvtx", "annotated", None, str(0xFF0000)),
        ("pop", "nvtx", None, None, None),
        ("push", "nvtx", "early", None, "blue"),
        ("pop", "nvtx", None, None, None),
    ] + (decorator if hasattr(decorated, "__wrapped__") else []), found  # NVTX without a tool decorates nothing
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported):
        torch.compile(marked, backend=_Plain(), fullgraph=True)(torch.ones(2))
    torch._dynamo.reset()


def test_undo_puts_back_exactly_what_was_there():
    # The one way every patch of another library is made and put back (internals.installs.Undo).
    import torch

    from nvtx_regions.internals.installs import Undo

    class Base:
        def method(self):
            return "base"

    class Child(Base):
        pass

    module = types.ModuleType("patched")
    module.present = "before"
    mapping = {"kept": 1}
    config = torch._dynamo.config  # a config module: its options do not live in vars()
    option = config.suppress_errors
    undo = Undo()
    assert not undo
    undo.setattr(module, "present", "after")
    undo.setattr(module, "absent", "after")
    undo.setattr(Child, "method", lambda self: "child")
    undo.setattr(config, "suppress_errors", not option)
    undo.setitem(mapping, "kept", 2)
    undo.setitem(mapping, "new", 3)
    assert undo and (module.present, module.absent, Child().method()) == ("after", "after", "child")
    assert config.suppress_errors is (not option) and mapping == {"kept": 2, "new": 3}
    undo.restore()
    assert not undo
    assert module.present == "before" and not hasattr(module, "absent")
    assert "method" not in vars(Child) and Child().method() == "base"
    assert config.suppress_errors is option and mapping == {"kept": 1}
