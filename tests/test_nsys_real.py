"""The ranges as Nsight Systems itself records them: real ``nsys profile`` runs, read back from
``nsys export --type sqlite`` (``NVTX_EVENTS`` with ``StringIds``) here in the test.

Every command run under nsys is one that ``nvtx-regions nsys`` prints (`nsys_command`), for
README's specs and for a few more: each must finish on its own and collect exactly what its
comments say. Each nsys run costs tens of seconds, so one run serves several tests
(module-scoped fixtures).

The default run keeps the short ones (eager ranges, ``nvtx-regions nsys --run``); the rest,
each a run of tens of seconds or a torchrun, are marked ``slow``.

Needs nsys (``.ci/install-nsys`` installs Nsight Systems 2022.4.2 on Debian bookworm):
without it these tests skip, except under ``CI=true``, where they fail.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.nsys import NSYS_LOCK, TIMEOUT, NsysRange, export, nsys_ranges, require_nsys, numbered_reports, run_nsys, run_nsys_collecting
from nvtx_regions import parse
from nvtx_regions.capture.chrome import RangeRecord, iter_items, write_chrome_trace
from nvtx_regions.capture.summary import summarize
from nvtx_regions.commands.nsys import nsys_command
from nvtx_regions.report.reader import read_ranges
from nvtx_regions.report.records import module_rows
from nvtx_regions.language.parse import load
from nvtx_regions.report.compare import compare
from nvtx_regions.testing import capture_subprocess, unavailable_reason

ROOT = Path(__file__).resolve().parents[1]
NSYS = shutil.which("nsys")
PYTHON = sys.executable
# The generated commands name `python`: this interpreter's. torchrun is named by
# its path, as README does (`nvtx-regions nsys` reads its `#!` line).
TORCHRUN = str(Path(PYTHON).parent / "torchrun")


def free_port() -> str:
    """A port for torchrun's rendezvous, so that other torchrun jobs on the machine don't collide."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


@pytest.fixture(autouse=True, scope="module")
def _nsys_installed():
    require_nsys()


def shape(ranges) -> list[tuple]:
    """What both tools must agree on, per range in start order: message, domain, category name, colour, depth."""
    return [(r.message, r.domain, r.category if isinstance(r, NsysRange) else r.category_name, r.color, r.depth)
            for r in sorted(ranges, key=lambda r: (r.start if isinstance(r, NsysRange) else r.start_ns, r.depth))]  # fmt: skip


def spec_file(directory: Path, text: str) -> Path:
    path = directory / "spec.nvtx"
    path.write_text(text + "\n", encoding="utf-8")
    return path


# ------------------------------------------------------------------ the quickstart, under nsys and under our capture


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    """README's quickstart under the command `nvtx-regions nsys examples/regions.nvtx` prints, and under our capture."""
    directory = tmp_path_factory.mktemp("nsys_quickstart")
    command = nsys_command(load(ROOT / "examples/regions.nvtx"), [PYTHON, "examples/quickstart.py"],
                           output=str(directory / "quickstart"))  # fmt: skip
    done = run_nsys(command.argv)
    assert done.returncode == 0, done.output[-3000:]
    if unavailable_reason():
        pytest.skip(f"capture tool unavailable: {unavailable_reason()}")
    ours = capture_subprocess([PYTHON, "examples/quickstart.py"], cwd=ROOT, timeout=TIMEOUT).check()
    (process,) = ours.processes.values()
    records = [i for i in iter_items(process.events) if isinstance(i, RangeRecord)]
    timeline = directory / "capture.json"
    with open(timeline, "w", encoding="utf-8") as stream:
        write_chrome_trace(process, stream)
    (said,) = re.findall(r"(\d+) ranges", ours.stdout)
    return directory / "quickstart.nsys-rep", export(directory / "quickstart.nsys-rep"), records, timeline, int(said)


@pytest.mark.slow
@pytest.mark.thunder
def test_quickstart_ranges_are_the_ones_our_capture_sees(quickstart):
    _, sqlite, records, _, said = quickstart
    seen = nsys_ranges(sqlite)
    assert len(seen) == said == len(records) > 0
    assert shape(seen) == shape(records)
    assert {r.domain for r in seen} == {"nvtx_regions"}
    assert {r.category for r in seen} == {"embed", "blocks", "attn0", "matmuls"}
    assert max(r.depth for r in seen) >= 1  # per-op ranges nest inside the block ranges


@pytest.mark.slow
@pytest.mark.thunder
def test_report_gives_the_table_of_our_capture(quickstart):
    report, sqlite, records, _, _ = quickstart
    for path in (report, sqlite):
        ranges = read_ranges([str(path)])
        found, (read,) = ranges.records, ranges.files
        assert read.nsys and read.gpu_ns is None  # no GPU here: no CUDA kernels in the report
        for by in ("message", "label"):
            assert summarize(found, by=by).instances() == summarize(records, by=by).instances()
    printed = subprocess.run(
        [PYTHON, "-m", "nvtx_regions", "report", str(sqlite)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert printed.returncode == 0, printed.stderr
    ours_by_label = str(summarize(records, by="label")).splitlines()
    for line in ours_by_label[2:]:  # same rows by name and count (the times differ)
        name, count = line.split()[-1], line.split()[2]
        assert re.search(rf"^\s*\S+\s+\d+\s+{count}\s.*{re.escape(name)}$", printed.stdout, re.M), (line, printed.stdout)
    assert "transformer.h.0" in printed.stdout and "GPU-projected time: none" in printed.stdout


@pytest.mark.slow
@pytest.mark.thunder
def test_compare_takes_nsys_reports(quickstart):
    report, sqlite, _, timeline, said = quickstart
    rows = compare(report, timeline)
    assert sum(r.count_a for r in rows) == sum(r.count_b for r in rows) == said
    assert all(r.count_a == r.count_b for r in rows)
    printed = subprocess.run(
        [PYTHON, "-m", "nvtx_regions", "compare", str(sqlite), str(timeline)], cwd=ROOT, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert printed.returncode == 0, printed.stderr
    assert "transformer.h.0 (backward)" in printed.stdout


# ------------------------------------------------------------------ module ranges and gates on nanoGPT training steps

MODULES_AND_GATE = "blocks: each module <transformer.h.*>\nsteps 2..3 and op in <linear>"


@pytest.fixture(scope="module")
def training(tmp_path_factory):
    """5 training steps of examples/train.py under the printed command (no capture range: the whole run)."""
    directory = tmp_path_factory.mktemp("nsys_training")
    spec = spec_file(directory, MODULES_AND_GATE)
    command = nsys_command(parse(MODULES_AND_GATE), [PYTHON, "examples/train.py", "--steps", "5", "--spec", str(spec), "--backend", "thunder"],
                           output=str(directory / "training"))  # fmt: skip
    assert not any(word.startswith("--capture-range") for word in command.argv)
    done = run_nsys(command.argv)
    assert done.returncode == 0, done.output[-3000:]
    return directory / "training.nsys-rep", nsys_ranges(export(directory / "training.nsys-rep"))


@pytest.mark.slow
@pytest.mark.thunder
def test_each_module_forward_and_backward_in_order(training):
    _, seen = training
    blocks = [r.message for r in seen if r.category == "blocks"]
    step = ["transformer.h.0", "transformer.h.1", "transformer.h.1 (backward)", "transformer.h.0 (backward)"]
    assert blocks == step * 5


@pytest.mark.slow
@pytest.mark.thunder
def test_gated_ranges_only_in_their_steps(training):
    _, seen = training
    starts = [r.start for r in seen if r.message == "transformer.h.0"]  # one per step
    gated = [r for r in seen if r.category not in ("blocks", "nvtx_regions.steps", None)]  # not train.py's step ranges
    per_step = [sum(1 for r in gated if starts[k] <= r.start < (starts[k + 1] if k + 1 < len(starts) else 1 << 62))
                for k in range(len(starts))]  # fmt: skip
    assert len(starts) == 5 and per_step[2] == per_step[3] > 0 and per_step[0] == per_step[1] == per_step[4] == 0
    assert all("linear(" in r.message for r in gated)


@pytest.mark.slow
@pytest.mark.thunder
def test_report_per_module_forward_and_backward(training):
    report, _ = training
    records = read_ranges([str(report)]).records
    rows = {row.module: (len(row.forward), len(row.backward)) for row in module_rows(records)}
    assert rows == {"transformer.h.0": (5, 5), "transformer.h.1": (5, 5)}


# ------------------------------------------------------------------ capture ranges: README's spec, one process and torchrun

STEPS = "examples/profile_steps.nvtx"


def collected(directory: Path, stem: str) -> list[list[NsysRange]]:
    """The ranges of each numbered report ``stem.N.nsys-rep`` in `directory`, in order of N."""
    return [nsys_ranges(export(path)) for path in numbered_reports([f"--output={directory / stem}"])]


def assert_block0_collections(reports: list[list[NsysRange]]) -> None:
    """Three collections, each one `block0` range and the linear ops inside it, as the command's comments say."""
    assert len(reports) == 3
    for ranges in reports:
        (block,) = [r for r in ranges if r.message == "block0"]
        inner = [r for r in ranges if r is not block]
        assert inner and all(block.start <= r.start and r.end <= block.end and r.depth == 1 for r in inner)
        assert all("linear(" in r.message and "transformer_h_0_" in r.message for r in inner)
    assert len({len(r) for r in reports}) == 1


@pytest.mark.slow
@pytest.mark.thunder
def test_readme_steps_spec_one_process(tmp_path):
    command = nsys_command(load(ROOT / STEPS), ["python", "examples/train.py", "--steps", "13", "--spec", STEPS, "--backend", "thunder"],
                           output=str(tmp_path / "steps"))  # fmt: skip
    assert "--capture-range-end=repeat-shutdown:3" in command.argv and "--sample=none" in command.argv
    done = run_nsys_collecting(command.argv, 3)
    # As the comment says: after the third collection nsys ends the script with SIGTERM.
    assert done.returncode == 143, done.output[-3000:]
    assert "13 steps" not in done.output
    assert_block0_collections(collected(tmp_path, "steps"))


@pytest.mark.slow
@pytest.mark.thunder
def test_readme_steps_spec_under_torchrun(tmp_path):
    argv = [TORCHRUN, f"--master_port={free_port()}", *shlex.split(f"--nproc_per_node=2 examples/train.py --steps 13 --spec {STEPS} --backend thunder")]
    command = nsys_command(load(ROOT / STEPS), argv, output=str(tmp_path / "report"))
    assert "--capture-range-end=repeat:3" in command.argv
    done = run_nsys(command.argv)
    assert done.returncode == 0, done.output[-3000:]
    assert done.output.count("13 steps") == 2  # both ranks ran to their end
    assert_block0_collections(collected(tmp_path, "report.rank0"))
    assert not list(tmp_path.glob("report.rank1*"))  # `rank in <0>`: rank 1 never started collecting


@pytest.mark.slow
@pytest.mark.thunder
def test_torchrun_two_ranks_one_report_each(tmp_path):
    text = "blocks: each module <transformer.h.*>\nrank in <1> and op in <linear>"
    spec = spec_file(tmp_path, text)
    argv = [TORCHRUN, f"--master_port={free_port()}", "--nproc_per_node=2", "examples/train.py", "--steps", "2", "--spec", str(spec), "--backend", "thunder"]
    command = nsys_command(parse(text), argv, output=str(tmp_path / "ranks"))
    done = run_nsys(command.argv)  # the ranks' two sessions overlap: nsys's sem_open race is run once more
    assert done.returncode == 0, done.output[-3000:]
    ranks = [nsys_ranges(export(tmp_path / f"ranks.rank{rank}.nsys-rep")) for rank in (0, 1)]
    assert ranks[0][0].pid != ranks[1][0].pid
    step = ["transformer.h.0", "transformer.h.1", "transformer.h.1 (backward)", "transformer.h.0 (backward)"]
    for ranges in ranks:
        assert [r.message for r in ranges if r.category == "blocks"] == step * 2
    # Besides the blocks: examples/train.py's step ranges (category nvtx_regions.steps), and rank 1's linears.
    others = [[r for r in ranges if r.category not in ("blocks", "nvtx_regions.steps")] for ranges in ranks]
    assert not others[0]  # the linears are rank 1's only
    assert others[1] and all("linear(" in r.message for r in others[1])


@pytest.mark.slow
def test_a_run_past_its_timeout_leaves_no_process_behind_and_no_lock_held(tmp_path):
    """A hung nsys run, ended at its timeout, takes its target with it (it runs in a session of its
    own), and nothing but the flock of a running nsys holds the test run's nsys lock: once a hung
    target held it, and every later nsys run of that CI waited for it until its own timeout."""
    probe = f"nvtx_regions_timeout_probe_{os.getpid()}"
    argv = [NSYS, "profile", "--trace=nvtx", "--sample=none", "--cpuctxsw=none", f"--output={tmp_path / 'hung'}",
            PYTHON, "-c", "import time, sys; time.sleep(600)", probe]  # fmt: skip
    with pytest.raises(pytest.fail.Exception, match="did not finish in 20 s"):
        run_nsys(argv, timeout=20)

    def processes() -> dict[int, str]:
        found = {}
        for entry in Path("/proc").iterdir():
            try:
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except (ValueError, OSError):
                continue
        return found

    assert not [cmd for cmd in processes().values() if probe in cmd]
    holders = set()
    for pid, cmd in processes().items():
        try:
            if any(os.readlink(fd) == str(NSYS_LOCK) for fd in Path(f"/proc/{pid}/fd").iterdir()):
                holders.add(cmd.split(" ", 1)[0])
        except OSError:
            continue
    assert holders <= {"flock"}, holders


# ------------------------------------------------------------------ eager module ranges

EAGER = """
import sys, torch
sys.path.insert(0, "examples")
from gpt import small_gpt
from nvtx_regions import eager
model = small_gpt()
idx = torch.randint(0, 64, (2, 16))
with eager.annotate(model, "each module <transformer.h.*>"):
    for _ in range(2):
        model(idx, idx)[1].backward()
"""


def test_eager_ranges_visible(tmp_path):
    command = nsys_command(parse("each module <transformer.h.*>"), [PYTHON, "-c", EAGER], output=str(tmp_path / "eager"))
    done = run_nsys(command.argv)
    assert done.returncode == 0, done.output[-3000:]
    seen = nsys_ranges(export(tmp_path / "eager.nsys-rep"))
    step = ["transformer.h.0", "transformer.h.1", "transformer.h.1 (backward)", "transformer.h.0 (backward)"]
    assert [r.message for r in seen] == step * 2
    assert {r.domain for r in seen} == {"nvtx_regions"}


# ------------------------------------------------------------------ nvtx-regions nsys --run: the spec carried, nothing not silent

NO_SPEC = """
import torch, nvtx_regions
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
compiled = nvtx_regions.compile(model, backend="eager")  # no spec: the command's, from NVTX_REGIONS_SPEC
for _ in range(2):
    compiled(torch.randn(2, 4)).sum().backward()
"""


def test_the_command_carries_the_spec_to_a_script_that_gives_none(tmp_path):
    """`each module <0>`, not compile()'s default `each module <**>` (which would give module 1 too)."""
    spec = spec_file(tmp_path, "each module <0>")
    script = tmp_path / "no_spec.py"
    script.write_text(NO_SPEC, encoding="utf-8")
    done = run_nsys([PYTHON, "-m", "nvtx_regions", "nsys", str(spec), "--run", "-o", str(tmp_path / "carried"), "--", PYTHON, str(script)])
    assert done.returncode == 0, done.output[-3000:]
    assert f"env NVTX_REGIONS_SPEC={spec} nsys profile" in done.output
    seen = nsys_ranges(export(tmp_path / "carried.nsys-rep"))
    assert [r.message for r in seen] == ["0", "0 (backward)"] * 2
    assert {r.domain for r in seen} == {"nvtx_regions"}


def test_a_run_that_collects_no_range_of_the_spec_fails_and_says_so(tmp_path):
    spec = spec_file(tmp_path, "each module <0>")
    done = run_nsys([PYTHON, "-m", "nvtx_regions", "nsys", str(spec), "--run", "-o", str(tmp_path / "none"), "--", PYTHON, "-c", "pass"])
    assert done.returncode == 1, done.output[-3000:]
    assert (tmp_path / "none.nsys-rep").exists()  # nsys itself ran and wrote its report
    assert (
        f"nvtx-regions nsys: {tmp_path / 'none.nsys-rep'} hold no NVTX range of the spec in domain 'nvtx_regions': "
        "the command emitted none. Does the script call nvtx_regions.compile(model)"
    ) in done.output


@pytest.mark.slow
@pytest.mark.thunder
def test_region_in_both_traces_collects_each_step_twice(tmp_path):
    # No `and forward`/`and backward`: the region is in the forward and the backward trace,
    # whose calls are counted apart, so steps 2..3 are 4 ranges and 4 collections.
    text = "layer0: between first(module <transformer.h.0>)..last(module <transformer.h.0>) and steps 2..3"
    spec = spec_file(tmp_path, text)
    command = nsys_command(parse(text), [PYTHON, "examples/train.py", "--steps", "6", "--spec", str(spec), "--backend", "thunder"],
                           output=str(tmp_path / "both"))  # fmt: skip
    assert "--capture-range-end=repeat-shutdown:4" in command.argv
    done = run_nsys_collecting(command.argv, 4)
    assert done.returncode == 143, done.output[-3000:]
    reports = collected(tmp_path, "both")
    assert [[r.message for r in ranges] for ranges in reports] == [["layer0"]] * 4


DEFAULT_DOMAIN_STEPS = """
import sys, thunder, torch
from thunder.tests.nanogpt_model import GPT, GPTConfig
import nvtx_regions
from nvtx_regions import NvtxProfileTransform
torch.manual_seed(0)
model = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32, dropout=0.0))
jitted = thunder.jit(model, transforms=[NvtxProfileTransform(select=sys.argv[1], domain=None)])
idx = torch.randint(0, 64, (2, 16))
for _ in nvtx_regions.steps(range(5), domain="other"):  # the step clock, in a domain nsys leaves out
    jitted(idx, idx)[1].backward()
print("ran to the end")
"""


@pytest.mark.slow
@pytest.mark.thunder
def test_default_domain_and_open_ended_steps(tmp_path):
    # `--nvtx-domain-include=default`, `--nvtx-capture=LABEL` without a domain, `--capture-range-end=repeat`.
    text = "block0: between first(module <transformer.h.0>)..last(module <transformer.h.0>) and forward and steps 3.."
    command = nsys_command(parse(text), [PYTHON, "-c", DEFAULT_DOMAIN_STEPS, text], domain=None,
                           output=str(tmp_path / "open"))  # fmt: skip
    assert {"--nvtx-domain-include=default", "--nvtx-capture=block0", "--capture-range-end=repeat"} <= set(command.argv)
    done = run_nsys(command.argv)
    assert done.returncode == 0 and "ran to the end" in done.output, done.output[-3000:]
    reports = collected(tmp_path, "open")  # steps 3 and 4 of 0..4
    assert [[(r.message, r.domain) for r in ranges] for ranges in reports] == [[("block0", None)]] * 2
    # `report --domain default` selects them: default-domain records carry domain None (was: nothing selected).
    sqlites = sorted(str(p) for p in tmp_path.glob("open.*.sqlite"))
    assert [(r.message, r.domain) for r in read_ranges(sqlites, domain=None).records] == [("block0", None)] * 2
    printed = subprocess.run([PYTHON, "-m", "nvtx_regions", "report", *sqlites, "--domain", "default"], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert printed.returncode == 0, printed.stderr
    assert re.search(r"^\s*[\d.]+\s+\d+\s+2\s.*PushPop\s+:block0$", printed.stdout, re.M), printed.stdout
    other = subprocess.run([PYTHON, "-m", "nvtx_regions", "report", *sqlites, "--domain", "nvtx_regions"], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert other.returncode == 1 and "no NVTX ranges in domain 'nvtx_regions'" in other.stderr


# ------------------------------------------------------------------ the user's own markers (issue 15)


MARKED = """
import sys, nvtx, torch
class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn, self.mlp = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
    def forward(self, x):
        torch.cuda.nvtx.range_push("attn")
        x = self.attn(x).relu()
        torch.cuda.nvtx.range_pop()
        with torch.cuda.nvtx.range("mlp"):
            x = self.mlp(x)
        with nvtx.annotate("norm", domain="mymodel"):
            return x * 2
torch.manual_seed(0)
model = torch.nn.Sequential(Block(), Block())
if sys.argv[1] == "thunder":
    import thunder
    from nvtx_regions import NvtxProfileTransform
    model = thunder.jit(model, transforms=[NvtxProfileTransform(select="each marker <*>")])
with torch.no_grad():
    for _ in range(3):
        model(torch.randn(4, 8))
"""


@pytest.mark.slow
@pytest.mark.thunder
def test_user_markers_line_up_under_nsys_eager_and_thunder(tmp_path):
    seen = {}
    for mode in ("eager", "thunder"):
        command = nsys_command(parse("each marker <*>"), [PYTHON, "-c", MARKED, mode], output=str(tmp_path / mode))
        assert not any(word.startswith("--nvtx-domain-include") for word in command.argv)
        done = run_nsys(command.argv)
        assert done.returncode == 0, done.output[-3000:]
        seen[mode] = [(r.message, r.domain, r.depth) for r in nsys_ranges(export(tmp_path / f"{mode}.nsys-rep"))]
    # torch.cuda.nvtx markers, in the default domain, 2 blocks x 3 calls. The nvtx package's own
    # `annotate` is invisible to nsys 2022.4 in eager code too (nvtx >= 0.2.12 asks nvtxDomainIsEnabled,
    # which this nsys answers "disabled"), so under thunder it is recorded nowhere either: both line up.
    assert seen["eager"] == [("attn", None, 0), ("mlp", None, 0)] * 6
    assert seen["thunder"] == seen["eager"]
