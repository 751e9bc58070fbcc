"""Tests for the claims the benchmarks rest on, and a smoke run of the benchmarks.

No timing is asserted here: timings on shared CI machines are not stable enough.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import thunder
import torch
from thunder.common import transform_to_torch_types
from thunder.tests.nanogpt_model import GPT, GPTConfig

from nvtx_regions import NvtxProfileTransform

pytestmark = pytest.mark.thunder  # the whole file needs lightning-thunder

REPO = Path(__file__).resolve().parents[1]
OURS = "nvtx_regions_"


class Recording(NvtxProfileTransform):
    """Our transform, keeping each (trace given, trace returned) pair."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pairs = []

    def transform_trace_post_optimization(self, trace, **kwargs):
        result = super().transform_trace_post_optimization(trace, **kwargs)
        self.pairs.append((trace, result))
        return result


@pytest.fixture(scope="module")
def gpt_linear():
    """A 1-layer nanoGPT compiled with `op in <linear>`, one training step run."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=1, n_head=2, n_embd=16, dropout=0.0))
    x, y = torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))
    transform = Recording(select="op in <linear>")
    jitted = thunder.jit(model, transforms=[transform])
    _, loss = jitted(x, y)
    loss.backward()
    return transform, jitted


def check_two_per_op(before, after, selected: set[int]) -> None:
    """`after` is `before`'s bound symbols, the very objects in order, plus exactly a push
    right before and a pop right after each bound symbol at the `selected` indexes, and nothing
    else (no gate is in the spec: no gates line)."""
    old, new = before.bound_symbols, after.bound_symbols
    mine = [i for i, b in enumerate(new) if b.sym.name.startswith(OURS)]
    rest = [b for b in new if not b.sym.name.startswith(OURS)]
    assert len(rest) == len(old) and all(a is b for a, b in zip(rest, old)), "original bound symbols changed"
    assert len(new) == len(old) + 2 * len(selected)
    position = {id(b): i for i, b in enumerate(new)}
    expected = set()
    for index in selected:
        at = position[id(old[index])]
        expected |= {at - 1, at + 1}
        assert "push" in new[at - 1].sym.name, (index, new[at - 1].sym.name)
        assert "pop" in new[at + 1].sym.name, (index, new[at + 1].sym.name)
    assert set(mine) == expected, "bound symbols inserted away from the selected ops"


def test_linear_adds_exactly_two_bsyms_per_linear(gpt_linear):
    transform, jitted = gpt_linear
    phases = [report.phase for report in transform.reports]
    assert phases == ["forward", "backward"]
    for (before, after), report in zip(transform.pairs, transform.reports):
        linears = {i for i, b in enumerate(before.bound_symbols) if b.sym.name == "linear"}
        planned = {r.start for r in report.plan.ranges}
        assert all(r.start == r.end and r.kind == "op" for r in report.plan.ranges)
        assert planned == linears
        check_two_per_op(before, after, linears)
    # 4 linears per block, plus lm_head, all in the forward trace.
    assert transform.reports[0].ranges == 5
    assert thunder.last_traces(jitted)[-1] is transform.pairs[0][1]


def wrapped_by_thunders_transform(trace) -> set[int]:
    """The indexes of the bound symbols of `trace` that thunder's own NvtxProfileTransform puts in a range."""
    from thunder.dev_utils.nvtx_profile_transform import NvtxProfileTransform as ThundersTransform

    new = ThundersTransform().transform_trace_post_optimization(trace).bound_symbols
    wrapped = {id(b) for before, b in zip(new, new[1:]) if before.sym.name == "nvtx_range_push"}
    return {i for i, b in enumerate(trace.bound_symbols) if id(b) in wrapped}


def test_all_adds_exactly_two_bsyms_per_compute_op(gpt_linear):
    """The benchmark's `all` against thunder's transform: the same ops get a range, but for the
    saved-tensor clean-ups of the backward (`clear_mutable_collection`), which thunder's wraps too."""
    recorded, _ = gpt_linear
    transform = NvtxProfileTransform()
    for before, _ in recorded.pairs:
        after = transform.transform_trace_post_optimization(before)
        selected = {r.start for r in transform.reports[-1].plan.ranges}
        theirs = wrapped_by_thunders_transform(before)
        cleanups = {i for i in theirs if before.bound_symbols[i].sym.name == "clear_mutable_collection"}
        assert selected == theirs - cleanups, sorted(before.bound_symbols[i].sym.name for i in selected ^ (theirs - cleanups))
        check_two_per_op(before, after, selected)
    # Both traces checked, and every op is more than the linears of the test above.
    assert [r.phase for r in transform.reports] == ["forward", "backward"]
    assert all(every.ranges > linears.ranges for every, linears in zip(transform.reports, recorded.reports))


@pytest.mark.parametrize("variant", ["ours", "thunder"])
def test_replayed_variant_is_the_real_compilation(variant):
    """benchmarks/workload.py replays the end of a compilation per variant; it must
    generate the code a real compilation with that transform generates."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import workload
    finally:
        sys.path.remove(str(REPO / "benchmarks"))

    base = workload.compile_base(0)
    replayed = workload.build_variant(base, variant)
    real = thunder.jit(base.model, transforms=[workload.make_transform(variant)])
    _, loss = real(base.x, base.y)
    loss.backward()

    def code(trace):
        text = re.sub(r"^# Constructed by .*\n", "", str(trace))  # provenance, with a duration
        return re.sub(r"nvtx_regions_\d+_", "nvtx_regions_N_", text)  # per-process serial numbers

    forward, backward = thunder.last_traces(real)[-1], thunder.last_backward_traces(real)[-1]
    assert code(replayed.forward) == code(forward)
    assert code(replayed.backward) == code(backward)
    # What the callables are built from.
    assert code(transform_to_torch_types(replayed.forward)) == code(transform_to_torch_types(forward))
    assert replayed.ranges[0] > 0 and replayed.ranges[1] > 0


@pytest.mark.slow
def test_benchmark_smoke(tmp_path):
    """`benchmarks/run.py --smoke` runs every section and reports finite ratios (no timing checked)."""
    from nvtx_regions.testing import unavailable_reason

    out = tmp_path / "smoke.json"
    argv = [sys.executable, str(REPO / "benchmarks" / "run.py"), "--smoke", "--json", str(out)]
    no_tool = unavailable_reason()
    if no_tool:
        argv += ["--skip", "tool", "verify"]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    text = proc.stdout
    sections = [
        "## 1. Run-time cost per NVTX range",
        "### no NVTX tool",
        "### Stack depth sweep, no NVTX tool",
        "## 2. Ops not selected cost nothing",
        "## 3. Transform (compile-time) cost",
        "## 4. Language cost",
        "## 5. Fixed cost per call of a trace",
    ]
    if not no_tool:
        sections += ["### capture tool attached, count mode", "### Messages", "### Stack depth sweep, tool attached"]
    for section in sections:
        assert section in text, section
    summary = json.loads(out.read_text())["summary"]["targets"]
    numbers = {k: v for k, v in summary.items() if not isinstance(v, bool)}
    assert numbers and all(math.isfinite(v) for v in numbers.values()), numbers
    assert "range_ratio_plain_0" in numbers and "transform_ratio_0" in numbers and "plan_us_per_bsym_rule" in numbers
    assert "fixed_ratio_plain" in numbers and (no_tool or "fixed_ratio_tool" in numbers)
    if not no_tool:
        checks = {k: v for k, v in summary.items() if isinstance(v, bool)}
        assert checks and all(checks.values()), checks
    # The same report again from the raw numbers, nothing measured.
    again = subprocess.run([sys.executable, str(REPO / "benchmarks" / "run.py"), "--from-json", str(out)],
                           cwd=REPO, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and again.stdout == text, again.stderr[-4000:]


@pytest.mark.slow
def test_footprint_smoke():
    """`benchmarks/footprint.py` builds each changed copy and reports a finite ratio for each (no timing checked)."""
    from nvtx_regions.testing import unavailable_reason

    if unavailable_reason():
        pytest.skip(unavailable_reason())
    argv = [sys.executable, str(REPO / "benchmarks" / "footprint.py"), "--layers", "0", "--rounds", "2"]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [line.split("|")[1:4] for line in proc.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    labels = [row[0].strip() for row in rows[1:]]
    assert labels[0] == "the real calls" and len(labels) == 6, labels
    assert all(math.isfinite(float(row[2])) for row in rows[1:]), rows


@pytest.mark.slow
def test_compile_time_smoke():
    """`benchmarks/compile_time.py` compiles models of one class with a plain torch.compile and with
    nvtx_regions.compile, and both compile the class's code once (no timing checked)."""
    argv = [sys.executable, str(REPO / "benchmarks" / "compile_time.py"), "--models", "2", "--rounds", "1", "--graph-break"]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    graphs = re.findall(r"; (\d+) graphs compiled", proc.stdout)
    assert len(graphs) == 2 and graphs[0] == graphs[1], proc.stdout
    assert math.isfinite(float(re.search(r"ratio nvtx_regions / plain: ([0-9.]+)", proc.stdout).group(1)))


@pytest.mark.slow
def test_nsys_cost_smoke():
    """`benchmarks/nsys_cost.py` runs its child under the real nsys, which recorded every range the
    steps and the floor loop pushed (the script checks it), and reports finite figures (no timing checked)."""
    from support.nsys import require_nsys

    require_nsys()
    argv = [sys.executable, str(REPO / "benchmarks" / "nsys_cost.py"), "--layers", "0", "--rounds", "2", "--pairs", "100"]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    rows = {line.split("|")[1].strip(): line.split("|")[2:5] for line in proc.stdout.splitlines() if line.startswith("| ") and "---" not in line}
    for variant in ("ours", "thunder's transform"):
        recorded, pushed = (int(n) for n in rows[variant][1].split("/"))
        assert recorded == pushed > 0, rows
    ratio = re.search(r"ours / thunder's: (\S+)", proc.stdout).group(1)
    assert math.isfinite(float(ratio)), proc.stdout
