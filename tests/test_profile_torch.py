"""``nvtx-regions profile --tool torch``: each backend's run under torch.profiler, no nsys needed.

docs/profile.md's command runs for real on examples/train.py (a 2-block model,
4 steps). Each backend's exported Chrome trace (what Perfetto, TensorBoard and
HTA read) is checked on its own, straight from its JSON: per step range
(``ProfilerStep#N``), each block's forward and backward range once; and HTA
0.5.0's own ``TraceAnalysis`` finds each of the 4 steps as an iteration. The printed table is checked against
the same traces: its title names the time and where it comes from, its rows
are the blocks in both passes, with one range per measured step, and its
medians are those of the traces' ranges (the lower middle one of an even n); the page shows a real run of it.
"""

from __future__ import annotations

import collections
import json
import re
import shlex
import statistics
from pathlib import Path

import pytest

from test_profile import PYTHON, TORCHRUN, doc_block, ns_of, profile, table_cells
from nvtx_regions.core.profiling import PROFILER_STEP
from nvtx_regions.report.backends_table import TORCH_CPU_TIME, TORCH_GPU_TIME, BackendRun, compare_backends
from nvtx_regions.report.reader import read_ranges

SPEC = "each module <transformer.h.*>\n"
BLOCKS = ("transformer.h.0", "transformer.h.1")
NAMES = {*BLOCKS, *(f"{block} (backward)" for block in BLOCKS)}
PASSES = ("forward", "backward")


def annotations(trace: Path) -> list[dict]:
    """The trace's record_function ranges (``user_annotation`` events)."""
    return [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("cat") == "user_annotation"]


def inside(event: dict, outer: dict) -> bool:
    return event["tid"] == outer["tid"] and outer["ts"] <= event["ts"] and event["ts"] + event["dur"] <= outer["ts"] + outer["dur"]


def per_step(trace: Path) -> dict[int, collections.Counter]:
    """Per step range (``ProfilerStep#N``, torch.profiler's name for a step): how many of each block range it holds."""
    found = annotations(trace)
    steps = {int(e["name"][len(PROFILER_STEP) :]): e for e in found if e["name"].startswith(PROFILER_STEP)}
    return {n: collections.Counter(e["name"] for e in found if e["name"] in NAMES and inside(e, s)) for n, s in steps.items()}


def durations_ns(trace: Path, name: str, steps: set[int]) -> list[float]:
    """The durations (ns) of the ranges `name` inside the given steps, from the JSON alone."""
    found = annotations(trace)
    outer = [e for e in found if e["name"] in {f"{PROFILER_STEP}{n}" for n in steps}]
    return [e["dur"] * 1000 for e in found if e["name"] == name and any(inside(e, s) for s in outer)]


def run_doc_command(tmp_path: Path, backends: str):
    """docs/profile.md's command, with `backends`; (its output folder, the finished process)."""
    argv = shlex.split(doc_block("bash", "<!-- profile: torch command -->").strip())
    assert argv[:2] == ["nvtx-regions", "profile"] and "--backends" in argv
    out = tmp_path / "profile_torch"
    argv = [str(out) if word == "profile_torch" else PYTHON if word == "python" else word for word in argv[2:]]
    argv[argv.index("--backends") + 1] = backends
    done = profile(argv, tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out, done


def hta_iterations(trace: Path) -> list[int]:
    """The iterations Holistic Trace Analysis finds in the folder of `trace` (its last one too: ours
    ends with the loop, where torch's own last step is cut short by the profiler's stop)."""
    from hta.trace_analysis import TraceAnalysis

    return [int(n) for n in TraceAnalysis(trace_dir=str(trace.parent), include_last_profiler_step=True).t.get_iterations()]


def check(out: Path, done, backends: list[str]) -> None:
    for number, backend in enumerate(backends, 1):
        assert f"nvtx-regions profile: {backend} ({number}/{len(backends)}) under torch.profiler: " in done.stdout
        # --steps 4: steps 0..3, each block once each way in every one of them.
        expected = collections.Counter(NAMES)
        assert per_step(out / backend / "rank0.pt.trace.json") == {n: expected for n in range(4)}, backend
        # HTA, the real one, finds each step as an iteration.
        assert hta_iterations(out / backend / "rank0.pt.trace.json") == [0, 1, 2, 3], backend
    assert done.stdout.count(f"{TORCH_CPU_TIME} per module call: median over the measured steps") == 1  # no GPU here
    head, cells, _ = table_cells(done.stdout)
    assert head[: 2 + len(backends)] == ["module", "pass", *backends]
    assert set(cells) == {(block, phase) for block in BLOCKS for phase in PASSES}
    for b, backend in enumerate(backends):
        assert f"  {backend}: steps 2..3 measured" in done.stdout  # the compile step 0 and --warmup 1 left out
        trace = out / backend / "rank0.pt.trace.json"
        for (block, phase), row in cells.items():
            ns, half_digit, n = ns_of(row[b])
            assert n == 2, (backend, block, phase)
            name = block if phase == "forward" else f"{block} (backward)"
            # Two calls: the lower of them (summary.Timing), never their mean, which one spike would lead.
            assert ns == pytest.approx(statistics.median_low(durations_ns(trace, name, {2, 3})), abs=half_digit + 1)


@pytest.mark.slow
def test_the_pages_command_on_eager_and_inductor(tmp_path):
    out, done = run_doc_command(tmp_path, "eager,inductor")
    check(out, done, ["eager", "inductor"])
    # The positive control: the same trace with its steps named as nvtx_regions once named them there,
    # ``step N``, gives HTA no iteration.
    old = tmp_path / "old_names" / "rank0.pt.trace.json"
    old.parent.mkdir()
    old.write_text((out / "eager" / "rank0.pt.trace.json").read_text().replace(f'"{PROFILER_STEP}', '"step '))
    assert hta_iterations(old) == []
    # The page shows a real run of it (times vary, and the order of rows with them).
    numbers = re.compile(r"\d+(\.\d+)? (s|ms|us|ns)|\d+\.\d+")

    def masked(text: str) -> list[str]:
        lines = [re.sub(r"\s+", " ", re.sub("-{3,}", "---", numbers.sub("#", line))).rstrip() for line in text.strip().splitlines()]
        return lines[:6] + sorted(lines[6:-2]) + lines[-2:]

    real = done.stdout[done.stdout.index(TORCH_CPU_TIME) :].replace(str(out), "profile_torch")
    assert masked(doc_block("text", "<!-- profile: torch table -->")) == masked(real)


@pytest.mark.slow
@pytest.mark.thunder
def test_the_pages_command_on_thunder(tmp_path):
    out, done = run_doc_command(tmp_path, "thunder")
    check(out, done, ["thunder"])


RANKED = """\
import os

import torch

import nvtx_regions

rank = int(os.environ["RANK"])


class Net(torch.nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.layers = torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(layers)))

    def forward(self, x):
        return self.layers(x)


# Rank 1's model has a third layer: the table of --rank 1 shows it.
model = nvtx_regions.compile(Net(2 + rank))
x = torch.randn(2, 4, requires_grad=True)
for _ in nvtx_regions.steps(range(3)):
    model(x).sum().backward()
"""


@pytest.mark.slow
def test_under_torchrun_one_trace_per_rank(tmp_path):
    (tmp_path / "ranked.py").write_text(RANKED)
    (tmp_path / "all.nvtx").write_text("each module <layers.*>\n")
    out = tmp_path / "out"
    argv = [str(tmp_path / "all.nvtx"), "--tool", "torch", "--backends", "eager", "--rank", "1", "-o", str(out), "--",
            TORCHRUN, "--nproc_per_node=2", "--master_port=0", str(tmp_path / "ranked.py")]  # fmt: skip
    done = profile(argv, tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # One trace per worker; torchrun's own process, which ran no range, wrote none.
    assert sorted(path.name for path in (out / "eager").glob("*.json")) == ["rank0.pt.trace.json", "rank1.pt.trace.json"]
    names = {rank: {e["name"] for e in annotations(out / "eager" / f"rank{rank}.pt.trace.json")} for rank in (0, 1)}
    assert "layers.2" in names[1] and "layers.2" not in names[0] and {"layers.1", "layers.1 (backward)", "ProfilerStep#2"} <= names[0]
    _, cells, _ = table_cells(done.stdout)
    assert set(cells) == {(f"layers.{layer}", phase) for layer in range(3) for phase in PASSES}


def test_the_table_reads_regions_and_gpu_times_of_torch_traces(tmp_path):
    """A region's range (torch.profiler keeps no category: it is known by its label), and the GPU time of
    a trace with ``gpu_user_annotation`` events, tied to their CPU ranges by External id."""
    from nvtx_regions import parse
    from nvtx_regions.selection.compile import compile_spec

    def event(cat, name, ts, dur, ext, pid=7, tid=7):
        return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": {"External id": ext}}

    events = []
    for step in range(3):
        at = step * 100.0
        events += [event("user_annotation", f"ProfilerStep#{step}", at, 90, 10 * step), event("user_annotation", "ffn", at + 10, 50, 10 * step + 1),
                   event("user_annotation", "blocks.0", at + 12, 20, 10 * step + 2),
                   event("gpu_user_annotation", "ffn", at + 20, 4.0 + step, 10 * step + 1, pid=0, tid=9),
                   event("kernel", "gemm", at + 20, 1, None, pid=0, tid=9)]  # fmt: skip
    trace = tmp_path / "rank0.pt.trace.json"
    trace.write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": 0}}))
    spec = compile_spec(parse("ffn: between first(op in <linear>)..last(op in <linear>)\neach module <blocks.*>"))
    table = compare_backends([BackendRun("inductor", read_ranges([trace]))], warmup=0, spec=spec)
    assert table.time == TORCH_GPU_TIME
    ffn = table.row("ffn", "both")
    assert ffn.region and ffn.times[0].n == 2 and ffn.times[0].median_ns == 5000  # steps 1, 2: 5 and 6 µs, the lower
    assert [(row.module, row.phase) for row in table.rows] == [("ffn", "both")]  # blocks.0 launched no GPU work
    cpu = compare_backends([BackendRun("eager", read_ranges([trace]))], warmup=0, spec=spec)
    assert cpu.time == TORCH_GPU_TIME  # the file holds kernels: GPU times, whichever backend
    trace.write_text(json.dumps({"traceEvents": [e for e in events if e["cat"] == "user_annotation"]}))
    cpu = compare_backends([BackendRun("eager", read_ranges([trace]))], warmup=0, spec=spec)
    assert cpu.time == TORCH_CPU_TIME and cpu.row("blocks.0", "forward").times[0].median_ns == 20_000
    assert cpu.row("ffn", "both").not_applicable == (True,)  # eager cannot express `between`: n/a, not missing


@pytest.mark.parametrize("command", ["profile", "nsys"])
def test_emit_usage_errors_before_any_run(tmp_path, capsys, command):
    from nvtx_regions.commands.main import main

    spec = tmp_path / "modules.nvtx"
    spec.write_text(SPEC)
    out = tmp_path / "never"
    child = ["-o", str(out), "--", PYTHON, "-c", "raise SystemExit(9)"]
    with pytest.raises(SystemExit) as bad:
        main([command, str(spec), "--emit", "tpu", *child])
    assert bad.value.code == 2
    assert "argument --emit: 'tpu' is not a place for ranges; choose 'nvtx', 'record_function', or both" in capsys.readouterr().err
    tool = ["--tool", "capture"] if command == "profile" else ["--run"]
    assert main([command, str(spec), *tool, "--emit", "record_function", *child]) == 2
    reader = "nvtx-regions capture" if command == "profile" else "nsys"
    assert f"--emit record_function: {reader} records NVTX ranges only; add nvtx" in capsys.readouterr().err
    assert not out.exists()


def test_auto_is_torch_without_nsys_and_torch_always_records(monkeypatch, tmp_path):
    from nvtx_regions.commands.profile import choose_tool, tool_sinks
    from nvtx_regions.commands.status import UsageError

    monkeypatch.setenv("PATH", str(tmp_path))  # nothing there
    assert choose_tool("auto") == "torch" and choose_tool("capture") == "capture"
    with pytest.raises(UsageError, match="--tool nsys: nsys is not on PATH"):
        choose_tool("nsys")
    assert tool_sinks("torch", None) == tool_sinks("torch", ("record_function",)) == ("record_function",)
    assert tool_sinks("torch", ("nvtx",)) == ("nvtx", "record_function")
    assert tool_sinks("nsys", None) == ("nvtx",) and tool_sinks("nsys", ("nvtx", "record_function")) == ("nvtx", "record_function")
