"""``nvtx-regions profile`` and the one-line API behind it (`nvtx_regions.compile`, `nvtx_regions.steps`).

The tutorial's command (docs/profile.md) runs for real under nsys on
examples/train.py, once per backend; its table and chart are checked
against an independent reading of each run's SQLite export (``NVTX_EVENTS``
with ``StringIds``, read here with sqlite3). The other runs go under our
capture (``--tool capture``): a backend lacking a module, a backend that
fails, torchrun ranks. thunder joins the tutorial run where it is installed.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sqlite3
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from support.environment import THUNDER_INSTALLED
from support.nsys import finish_or_fail, nsys_failed_by_itself, require_nsys
from test_chart import read_chart
from nvtx_regions.core.profiling import ENV_BACKEND, ENV_SPEC
from nvtx_regions.report.backends_table import BackendRun, compare_backends, render_backends
from nvtx_regions.report.chrome_trace import load_chrome_trace
from nvtx_regions.report.reader import read_ranges
from nvtx_regions.testing import capture_subprocess, unavailable_reason

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "profile.md"
PYTHON = sys.executable
TORCHRUN = str(Path(PYTHON).parent / "torchrun")
BLOCKS = ("transformer.h.0", "transformer.h.1")
PASSES = ("forward", "backward")


def child_env(tmp_path: Path, columns: str | None = None) -> dict[str, str]:
    """This environment without the NVTX tool the pytest plugin attached, this checkout first on the path,
    one thread per torch process (2 busy cores: more make each op hundreds of times slower), a private Inductor cache;
    `columns` the only COLUMNS (pytest-xdist's workers set 80, which a printed table would fit)."""
    drop = ("NVTX_INJECTION64_PATH", "NVTX_REGIONS_CAPTURE_DIR", "NVTX_REGIONS_CAPTURE_MODE", ENV_BACKEND, ENV_SPEC, "COLUMNS")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["PATH"] = f"{Path(PYTHON).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env.update(OMP_NUM_THREADS="1", TORCHINDUCTOR_COMPILE_THREADS="1", TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    if columns is not None:
        env["COLUMNS"] = columns
    return env


def profile(argv: list[str], tmp_path: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """`nvtx-regions profile argv`; past `timeout`, support.nsys's `finish_or_fail` ends it and its nsys."""
    argv = [PYTHON, "-m", "nvtx_regions", "profile", *argv]
    process = subprocess.Popen(
        argv, cwd=ROOT, env=child_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    stdout, stderr = finish_or_fail(process, timeout)
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def doc_block(kind: str, after: str) -> str:
    """The first ``kind`` code block of docs/profile.md after the text `after`."""
    text = DOC.read_text()
    match = re.compile(rf"```{kind}\n(.*?)```", re.S).search(text, text.index(after))
    assert match, f"no {kind} block after {after!r} in {DOC}"
    return match[1]


def table_cells(stdout: str) -> tuple[list[str], dict[tuple[str, str], list[str]], list[tuple[str, str]]]:
    """The printed table: its header, the cells per (module, pass), and the rows' order."""
    lines = stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("module ") and " pass " in line)
    head = lines[at].split()
    cells, order = {}, []
    for line in lines[at + 2 :]:
        if not line.strip():
            break
        words = re.split(r"\s{2,}", line.strip())
        cells[(words[0], words[1])] = words[2:]
        order.append((words[0], words[1]))
    return head, cells, order


CELL = re.compile(r"(\S+ \S+) \((\d+)(?:: (\S+ \S+)\.\.(\S+ \S+))?\)")  # 1.23 ms (3: 1.10 ms..1.52 ms), 1.23 ms (1)


def ns_of(cell: str) -> tuple[float, float, int]:
    """A printed cell: (the median's ns, half its last printed digit in ns, n)."""
    match = CELL.fullmatch(cell)
    assert match and (match[3] is None) == (match[2] == "1"), cell  # a spread for n > 1 only
    return (*duration_ns(match[1]), int(match[2]))


def spread_of(cell: str) -> tuple[tuple[float, float], tuple[float, float]]:
    """A printed cell's shortest and longest call: each (ns, half its last printed digit in ns)."""
    match = CELL.fullmatch(cell)
    assert match, cell
    if match[3] is None:  # one call
        return duration_ns(match[1]), duration_ns(match[1])
    return duration_ns(match[3]), duration_ns(match[4])


def duration_ns(text: str) -> tuple[float, float]:
    """A printed duration ``1.23 ms``: (ns, half the last printed digit in ns)."""
    number, unit = text.split(" ")
    scale = {"s": 1e9, "ms": 1e6, "us": 1e3, "ns": 1.0}[unit]
    decimals = len(number.partition(".")[2])
    return float(number) * scale, 0.5 * 10**-decimals * scale


# ------------------------------------------------------------------ an independent reading of an nsys export


def sqlite_ranges(path: Path, domain: str = "nvtx_regions") -> list[tuple[str, int, int]]:
    """(message, start, end) of every push/pop range of `domain`, straight from NVTX_EVENTS and StringIds."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        types = dict(db.execute("SELECT name, id FROM ENUM_NSYS_EVENT_TYPE"))
        (domain_id,) = db.execute(
            "SELECT e.domainId FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
            "WHERE e.eventType = ? AND COALESCE(s.value, e.text) = ?", (types["NvtxDomainCreate"], domain),
        ).fetchone()  # fmt: skip
        return list(db.execute(
            "SELECT COALESCE(s.value, e.text), e.start, e.end FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
            "WHERE e.eventType = ? AND e.domainId = ? ORDER BY e.start", (types["NvtxPushPopRange"], domain_id),
        ))  # fmt: skip
    finally:
        db.close()


def independent_medians(path: Path, first_measured: int) -> tuple[dict[tuple[str, str], list[int]], dict[tuple[str, str], int]]:
    """Per (block, pass): the durations inside steps >= `first_measured`, and how many ranges all steps hold."""
    ranges = sqlite_ranges(path)
    steps = {int(m[5:]): (s, e) for m, s, e in ranges if re.fullmatch(r"step \d+", m)}
    measured: dict[tuple[str, str], list[int]] = {}
    everywhere: dict[tuple[str, str], int] = {}
    for message, start, end in ranges:
        name, _, suffix = message.partition(" (")
        if name not in BLOCKS:
            continue
        key = (name, "backward" if suffix == "backward)" else "forward")
        everywhere[key] = everywhere.get(key, 0) + 1
        (step,) = [n for n, (s, e) in steps.items() if s <= start and end <= e]
        if step >= first_measured:
            measured.setdefault(key, []).append(end - start)
    return measured, everywhere


# ------------------------------------------------------------------ the tutorial, under the real nsys


@pytest.fixture(scope="module")
def tutorial(tmp_path_factory):
    """docs/profile.md's command, run as written (paths aside), under nsys; thunder only where installed."""
    require_nsys()
    tmp_path = tmp_path_factory.mktemp("profile_tutorial")
    command = doc_block("bash", "## 2. Run it once per backend").strip()
    backends = ["eager", "thunder", "inductor"] if THUNDER_INSTALLED else ["eager", "inductor"]
    argv = shlex.split(command)  # no --backends: those installed here
    assert argv[:2] == ["nvtx-regions", "profile"]
    out = tmp_path / "profile_out"
    argv = [str(out) if word == "profile_out" else PYTHON if word == "python" else word for word in argv[2:]]
    done = profile(argv, tmp_path)
    if nsys_failed_by_itself(done.returncode, done.stdout + done.stderr):
        print(f"[nsys failed by itself; the tutorial's command once more]\n{done.stderr[-1000:]}")
        shutil.rmtree(out)  # nsys does not overwrite a report
        done = profile(argv, tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return backends, out, done


@pytest.mark.slow
def test_tutorial_runs_each_backend_under_nsys(tutorial):
    backends, out, done = tutorial
    for number, backend in enumerate(backends, 1):
        assert f"nvtx-regions profile: {backend} ({number}/{len(backends)}) under nsys: " in done.stdout
        assert (out / backend / "report.nsys-rep").is_file()
        assert (out / backend / "stderr.txt").is_file()
    assert (out / "table.txt").read_text().strip() in done.stdout


@pytest.mark.slow
def test_the_tutorial_shows_the_real_output(tutorial):
    # The times differ from run to run, and so does the order of rows that follows them.
    backends, out, done = tutorial
    shown = doc_block("text", "<!-- profile: table -->")
    numbers = re.compile(r"\d+(\.\d+)? (s|ms|us|ns)|\d+\.\d+")

    def masked(text: str) -> list[str]:
        lines = [re.sub(r"\s+", " ", re.sub("-{3,}", "---", numbers.sub("#", line))).rstrip() for line in text.strip().splitlines()]
        return lines[:7] + sorted(lines[7:-2]) + lines[-2:]

    real = done.stdout[done.stdout.index("CPU time per module call") :].replace(str(out), "profile_out")
    if backends == ["eager", "thunder", "inductor"]:
        assert masked(shown) == masked(real)
    else:  # thunder left out: the lines without its "steps measured" line
        assert masked(real)[0] == masked(shown)[0] and len(masked(real)) == len(masked(shown)) - 1


@pytest.mark.slow
def test_every_block_row_for_every_backend_and_warmup_left_out(tutorial):
    backends, out, done = tutorial
    head, cells, _ = table_cells(done.stdout)
    assert head == ["module", "pass", *backends, *(f"{b}/eager" for b in backends[1:])]
    assert set(cells) == {(block, phase) for block in BLOCKS for phase in PASSES}
    for key, row in cells.items():
        # --steps 5, the compile step 0 and --warmup 1 left out: steps 2..4, one range each.
        assert [ns_of(cell)[2] for cell in row[: len(backends)]] == [3] * len(backends), key
    for backend in backends:
        assert f"  {backend}: steps 2..4 measured" in done.stdout
        _, everywhere = independent_medians(out / backend / "report.sqlite", 2)
        assert everywhere == {(block, phase): 5 for block in BLOCKS for phase in PASSES}  # the report has all 5
    assert done.stdout.startswith("nvtx-regions profile: eager (1/")
    assert "CPU time per module call" in done.stdout  # no GPU here: no CUDA kernels in the reports


@pytest.mark.slow
def test_medians_are_those_of_the_sqlite_export(tutorial):
    backends, out, done = tutorial
    _, cells, order = table_cells(done.stdout)
    calls = {b: independent_medians(out / b / "report.sqlite", 2)[0] for b in backends}
    medians = {b: {k: statistics.median(v) for k, v in calls[b].items()} for b in backends}
    for key, row in cells.items():
        for backend, cell in zip(backends, row):
            printed, rounding, _ = ns_of(cell)
            assert abs(printed - medians[backend][key]) <= rounding * 1.0001, (backend, key, cell)
            for (shown, digit), real in zip(spread_of(cell), (min(calls[backend][key]), max(calls[backend][key]))):
                assert abs(shown - real) <= digit * 1.0001, (backend, key, cell)
        for backend, ratio in zip(backends[1:], row[len(backends) :]):
            assert float(ratio) == pytest.approx(medians[backend][key] / medians["eager"][key], rel=0.01, abs=0.006)
    # Largest ratio first.
    largest = [max(medians[b][key] / medians["eager"][key] for b in backends[1:]) for key in order]
    assert largest == sorted(largest, reverse=True)
    # The library gives the same numbers from the same files.
    table = compare_backends(
        [BackendRun(b, read_ranges([str(out / b / "report.sqlite")], domain="nvtx_regions")) for b in backends], warmup=1
    )
    for row in table.rows:
        assert [t.median_ns for t in row.times] == [medians[b][(row.module, row.phase)] for b in backends]


@pytest.mark.slow
def test_chart_bars_and_ratios_are_those_of_the_sqlite_export(tutorial):
    backends, out, done = tutorial
    assert f"the chart in {out / 'profile.png'} and {out / 'profile.svg'}" in done.stdout
    medians = {b: {k: statistics.median(v) for k, v in independent_medians(out / b / "report.sqlite", 2)[0].items()}
               for b in backends}  # fmt: skip
    chart = read_chart(out / "profile")
    assert {"eager (baseline)", *backends[1:]} <= set(chart.texts)
    # One row per block and pass, the largest ratio to eager at the top.
    keys = sorted(medians["eager"], key=lambda k: -max(medians[b][k] / medians["eager"][k] for b in backends[1:]))
    assert chart.labels == [f"{block} ({phase})" for block, phase in keys]
    scale = []
    for key in keys:
        for backend in backends:
            scale.append(chart.bars[(*key, backend)] / medians[backend][key])
        for backend in backends[1:]:
            text = chart.ratios[(*key, backend)]
            assert text.endswith("x")
            assert float(text[:-1]) == pytest.approx(medians[backend][key] / medians["eager"][key], rel=0.01, abs=0.006)
    assert max(scale) == pytest.approx(min(scale), rel=1e-3)  # lengths proportional to the medians
    assert chart.words == {}


@pytest.mark.slow
def test_gpu_projected_time_where_the_report_holds_kernels(tutorial, tmp_path):
    # No GPU here: the eager run's real export, with one CUDA launch and kernel added inside each block
    # range (kernel k lasts 1000 + k ns), as a GPU run records them; the table must show those spans.
    _, out, _ = tutorial
    path = tmp_path / "gpu.sqlite"
    shutil.copy(out / "eager" / "report.sqlite", path)
    db = sqlite3.connect(path)
    (push_pop,) = db.execute("SELECT id FROM ENUM_NSYS_EVENT_TYPE WHERE name = 'NvtxPushPopRange'").fetchone()
    ranges = db.execute(
        "SELECT e.start, e.end, e.globalTid, COALESCE(s.value, e.text) FROM NVTX_EVENTS e "
        "LEFT JOIN StringIds s ON s.id = e.textId WHERE e.eventType = ? ORDER BY e.start", (push_pop,),
    ).fetchall()  # fmt: skip
    db.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INT, end INT, globalTid INT, correlationId INT)")
    db.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, correlationId INT)")
    spans: dict[tuple[str, str], list[int]] = {}
    for k, (start, end, tid, message) in enumerate(r for r in ranges if r[3].partition(" (")[0] in BLOCKS):
        db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?)", (start + 1, start + 2, tid, k))
        db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?)", (end + 50, end + 50 + 1000 + k, k))
        key = (message.partition(" (")[0], "backward" if message.endswith("(backward)") else "forward")
        spans.setdefault(key, []).append(1000 + k)
    db.commit()
    db.close()
    table = compare_backends([BackendRun("eager", read_ranges([str(path)], domain="nvtx_regions"))], warmup=1)
    assert table.time == "GPU-projected time"
    # 5 steps, one range each per block and pass: the last 3 are the measured ones.
    assert {(r.module, r.phase): r.times[0].median_ns for r in table.rows} == {
        key: statistics.median(found[2:]) for key, found in spans.items()
    }
    assert render_backends(table).startswith("GPU-projected time per module call")


# ------------------------------------------------------------------ a spec beyond `each module`: regions, op rules, n/a


@pytest.mark.slow
def test_rules_a_backend_cannot_express_read_n_a_and_the_run_succeeds(tmp_path):
    """docs/profile.md's command with examples/regions.nvtx (op rules and a region): eager leaves
    those rules out with one warning and runs the rest; its cells read n/a, never failed."""
    if unavailable_reason():
        pytest.skip(unavailable_reason())
    spec = (ROOT / "examples" / "regions.nvtx").read_text(encoding="utf-8").splitlines()
    assert doc_block("text", "<!-- profile: regions spec -->").splitlines() == [
        line.rstrip() for line in spec if line.strip() and not line.lstrip().startswith("#")
    ]
    argv = shlex.split(doc_block("bash", "<!-- profile: regions command -->").strip())
    out = tmp_path / "profile_regions"
    argv = [str(out) if word == "profile_regions" else PYTHON if word == "python" else word for word in argv[2:]]
    done = profile(argv, tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    stderr = (out / "eager" / "stderr.txt").read_text()
    assert stderr.count("NvtxRegionsWarning: 3 rules of the spec are left out under eager PyTorch") == 1
    assert "rule 'attn0: between first(module <transformer.h.0.attn>)" in stderr and "thunder and Inductor can run it" in stderr
    assert "left out under Inductor" not in (out / "inductor" / "stderr.txt").read_text()
    head, cells, _ = table_cells(done.stdout)
    assert head == ["module", "pass", "eager", "inductor", "inductor/eager"]
    assert set(cells) == {(block, phase) for block in BLOCKS for phase in PASSES} | {("attn0", "forward")}
    eager, inductor, ratio = cells[("attn0", "forward")]
    assert eager == "n/a" and ns_of(inductor)[2] == 1 and ratio == "-"
    assert "note: rules with one range per op have no rows (their ranges are named after ops): embed, matmuls" in done.stdout
    assert "note: eager cannot express attn0, embed, matmuls: n/a in their rows" in done.stdout
    chart = read_chart(out / "profile")
    assert chart.words == {("attn0", "forward", "eager"): "n/a"}
    # The docs show a real run of it (times vary, and the order of rows with them).
    numbers = re.compile(r"\d+(\.\d+)? (s|ms|us|ns)|\d+\.\d+")

    def masked(text: str) -> list[str]:
        lines = [re.sub(r"\s+", " ", re.sub("-{3,}", "---", numbers.sub("#", line))).rstrip() for line in text.strip().splitlines()]
        return lines[:6] + sorted(lines[6:-5]) + lines[-5:]

    real = done.stdout[done.stdout.index("CPU time per module call and region") :].replace(str(out), "profile_regions")
    assert masked(doc_block("text", "<!-- profile: regions table -->")) == masked(real)


def test_rows_from_the_spec_regions_per_op_rules_and_n_a():
    """The table's rows without a run: module rows, region rows by label and pass, per-op ranges (even
    one named like a module path, as an Inductor kernel is) never, and n/a where a backend cannot express the rule."""
    from nvtx_regions import parse
    from nvtx_regions.capture.chrome import RangeRecord
    from nvtx_regions.report.reader import RangeFile, Ranges
    from nvtx_regions.selection.compile import compile_spec

    spec = compile_spec(parse("blocks: each module <h.*>\nattn: between first(op in <mm>)..last(op in <mm>)\nmm: op in <mm>"))
    at = iter(range(0, 10**6, 100))

    def step(number: int, *ranges: tuple[str, str]) -> list[RangeRecord]:
        start = next(at)
        inner = [RangeRecord(0, 0, "nvtx_regions", m, next(at), next(at), 1, category_name=c) for m, c in ranges]
        return [RangeRecord(0, 0, "nvtx_regions", f"step {number}", start, next(at), 0, category_name="nvtx_regions.steps"), *inner]

    def run(backend: str, *ranges: tuple[str, str]) -> BackendRun:
        records = [r for n in range(3) for r in step(n, *ranges)]
        return BackendRun(backend, Ranges((RangeFile("x", False, tuple(records)),)))

    module = [("h.0", "blocks"), ("h.0 (backward)", "blocks")]
    table = compare_backends(
        [run("eager", *module), run("inductor", *module, ("attn", "attn"), ("extern_kernels.mm", "mm"))],
        warmup=1, spec=spec,
    )  # fmt: skip
    assert {(row.module, row.phase) for row in table.rows} == {("h.0", "forward"), ("h.0", "backward"), ("attn", "both")}
    (attn,) = [row for row in table.rows if row.module == "attn"]
    assert attn.region and attn.not_applicable == (True, False) and attn.times[0] is None and attn.times[1].n == 1
    text = render_backends(table)
    assert text.startswith("CPU time per module call and region:")
    assert re.search(r"^attn +both +n/a +100 ns \(1\) +-$", text, flags=re.M), text
    assert "note: rules with one range per op have no rows (their ranges are named after ops): mm" in text
    assert "note: eager cannot express attn, mm: n/a in their rows" in text
    # Without the spec: module rows only, as the ranges alone tell (the kernel's range looks like a module's).
    plain = compare_backends([run("eager", *module), run("inductor", *module, ("attn", "attn"), ("extern_kernels.mm", "mm"))])
    assert {row.module for row in plain.rows} == {"h.0", "extern_kernels.mm"}


def test_a_run_with_no_step_after_the_warm_up_says_so():
    """A script run for fewer steps than the warm-up leaves out: the table says that no step is left
    to measure (it said that the spec needed an `each module` rule, which it has)."""
    from nvtx_regions.capture.chrome import RangeRecord
    from nvtx_regions.report.reader import RangeFile, Ranges

    records = (
        RangeRecord(0, 0, "nvtx_regions", "step 0", 0, 1000, 0, category_name="nvtx_regions.steps"),
        RangeRecord(0, 0, "nvtx_regions", "encoder", 100, 200, 1, category_name="each module <*>"),
    )
    table = compare_backends([BackendRun("eager", Ranges((RangeFile("x", False, records),)))], warmup=1)
    text = render_backends(table)
    assert not table.rows
    assert "(no step left to measure: every module range is in the compile step or the warm-up steps)" in text
    assert "note: eager: no step left to measure: its steps are 0..0, and step 0 (compile) and 1 warm-up step are left out" in text
    assert "needs an `each module`" not in text


# ------------------------------------------------------------------ under our capture: missing, failed, ranks

TINY = """
import os, sys
import torch
import nvtx_regions

backend = os.environ["NVTX_REGIONS_BACKEND"]
if backend == "inductor" and "--fail-inductor" in sys.argv:
    print("inductor: failing on purpose", file=sys.stderr)
    sys.exit(3)
rank = int(os.environ.get("RANK", "0"))


class Last(torch.nn.Linear):
    step = 0

    def forward(self, x):
        if "--crash-in-last" in sys.argv and Last.step == 3:
            os._exit(5)  # a crash inside the module's range: no exit handler runs
        return super().forward(x)


class Net(torch.nn.Module):
    def __init__(self, extra):
        super().__init__()
        self.first = torch.nn.Linear(4, 4)
        self.extra = torch.nn.Linear(4, 4) if extra else None
        self.last = Last(4, 1)

    def forward(self, x):
        x = self.first(x)
        if self.extra is not None:
            x = self.extra(x)
        return self.last(x)


# eager's model has a module thunder's lacks; under torchrun, only rank 1's has it.
model = Net(extra=(rank == 1) if "RANK" in os.environ else backend == "eager")
compiled = nvtx_regions.compile(model)
x = torch.randn(2, 4, requires_grad=True)
for Last.step in nvtx_regions.steps(range(4)):
    compiled(x).sum().backward()
"""

MODULES = "each module <*>\n"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    if unavailable_reason():
        pytest.skip(unavailable_reason())
    directory = tmp_path_factory.mktemp("profile_tiny")
    (directory / "tiny.py").write_text(TINY)
    (directory / "modules.nvtx").write_text(MODULES)
    return directory


@pytest.mark.slow
@pytest.mark.thunder
def test_a_module_one_backend_lacks_is_missing_and_a_failed_backend_is_reported(tiny, tmp_path):
    out = tmp_path / "out"
    # The failing run is in the middle: the one after it still runs.
    argv = [str(tiny / "modules.nvtx"), "--tool", "capture", "--backends", "eager,inductor,thunder", "-o", str(out), "--",
            PYTHON, str(tiny / "tiny.py"), "--fail-inductor"]  # fmt: skip
    done = profile(argv, tmp_path)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "under nvtx-regions capture (CPU times of the NVTX ranges only)" in done.stdout
    assert "nvtx-regions profile: thunder (3/3) under" in done.stdout
    assert "inductor: failing on purpose" in done.stderr  # shown as it came
    assert "inductor failed: " in done.stdout and "exited with status 3; its stderr ended with:" in done.stdout
    assert "    inductor: failing on purpose" in done.stdout  # the tail of its stderr
    head, cells, _ = table_cells(done.stdout)
    assert head == ["module", "pass", "eager", "inductor", "thunder", "inductor/eager", "thunder/eager"]
    assert set(cells) == {(m, p) for m in ("first", "extra", "last") for p in PASSES}
    for phase in PASSES:
        eager, inductor, thunder, _, ratio = cells[("extra", phase)]
        assert ns_of(eager)[2] == 2 and inductor == "failed" and thunder == "missing" and ratio == "-"
        eager, inductor, thunder, _, ratio = cells[("first", phase)]
        assert [ns_of(eager)[2], ns_of(thunder)[2]] == [2, 2] and inductor == "failed"  # steps 2..3 of 0..3
        assert float(ratio) == pytest.approx(ns_of(thunder)[0] / ns_of(eager)[0], rel=0.05, abs=0.01)
    # The rows without a ratio come last.
    assert {key[0] for key in list(cells)[-2:]} == {"extra"}
    chart = read_chart(out / "profile")
    assert {label.rpartition(" (")[0] for label in chart.labels} == {"first", "extra", "last"}
    assert {label.rpartition(" (")[0] for label in chart.labels[-2:]} == {"extra"}  # no ratio: last, as in the table
    failed = {(module, phase, "inductor"): "failed" for module in ("first", "extra", "last") for phase in PASSES}
    assert chart.words == {**failed, **{("extra", phase, "thunder"): "missing" for phase in PASSES}}
    assert "inductor (failed)" in chart.texts
    # Our capture's timeline holds the step ranges the table used.
    steps = [r.message for r in load_chrome_trace(out / "eager" / "timeline.json") if r.message.startswith("step")]
    assert steps == ["step 0", "step 1", "step 2", "step 3"]

    again = profile([str(tiny / "modules.nvtx"), "--tool", "capture", "-o", str(out), "--", PYTHON, "-c", "pass"], tmp_path)
    assert again.returncode == 2 and "the folder exists; add --force-overwrite" in again.stderr
    assert (out / "eager" / "timeline.json").is_file()  # nothing was touched


def test_a_range_a_crash_left_open_is_no_call(tiny, tmp_path):
    """The process dies inside ``last``'s forward in step 3: that range never ends. It is left out
    (its end is only the process's last event), the note says so, and the calls that ended stay."""
    out = tmp_path / "out"
    argv = [str(tiny / "modules.nvtx"), "--tool", "capture", "--backends", "eager", "-o", str(out), "--",
            PYTHON, str(tiny / "tiny.py"), "--crash-in-last"]  # fmt: skip
    done = profile(argv, tmp_path)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    records = load_chrome_trace(str(out / "eager" / "timeline.json"))
    assert {r.message for r in records if r.unclosed} == {"step 3", "last"}  # the capture kept them, open
    _, cells, _ = table_cells(done.stdout)
    # Steps 2..3 measured: step 3 ends at the crash, after first's forward and before last's ended.
    counts = {key: ns_of(row[0])[2] for key, row in cells.items()}
    ended = {"forward": 2, "backward": 1}  # eager's model has extra
    assert counts == {**{(m, p): n for m in ("first", "extra") for p, n in ended.items()}, ("last", "forward"): 1, ("last", "backward"): 1}
    assert "note: eager: 1 module range never ended (the process crashed or was stopped inside it), left out" in done.stdout
    assert "exited with status 5" in done.stdout


@pytest.mark.slow  # torchrun: a whole-system run
def test_torchrun_one_rank_at_a_time(tiny, tmp_path):
    out = tmp_path / "out"
    argv = [str(tiny / "modules.nvtx"), "--tool", "capture", "--backends", "eager", "--rank", "1", "-o", str(out), "--",
            TORCHRUN, "--nproc_per_node=2", "--master_port=0", str(tiny / "tiny.py")]  # fmt: skip
    done = profile(argv, tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    _, cells, _ = table_cells(done.stdout)
    assert ("extra", "forward") in cells  # rank 1's model has it
    timeline = str(out / "eager" / "timeline.json")
    ranks = {r.rank for r in load_chrome_trace(timeline)}
    assert ranks == {0, 1}
    rank0 = compare_backends([BackendRun("eager", read_ranges([timeline], domain="nvtx_regions", rank=0))], warmup=1)
    assert rank0.modules == ("first", "last")


# ------------------------------------------------------------------ the command's checks before any run


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--backends", "eager,tpu"], "--backends eager,tpu: choose from eager, thunder, inductor"),
        (["--backends", "eager,eager"], "a backend is named twice"),
        (["--backends", "eager,inductor", "--baseline", "thunder"], "--baseline thunder: not among --backends eager,inductor"),
        (["--warmup", "-1"], "--warmup -1: give a number of steps >= 0"),
    ],
)
def test_usage_errors_before_any_run(tmp_path, capsys, options, message):
    from nvtx_regions.commands.main import main

    spec = tmp_path / "modules.nvtx"
    spec.write_text(MODULES)
    out = tmp_path / "never"
    assert main(["profile", str(spec), *options, "-o", str(out), "--", PYTHON, "-c", "raise SystemExit(9)"]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_usage_error_messages(tmp_path, capsys):
    from nvtx_regions.commands.main import main

    spec = tmp_path / "modules.nvtx"
    spec.write_text(MODULES)
    assert main(["profile", str(spec), "--backends", "eager,tpu", "--", PYTHON]) == 2
    assert "nvtx-regions profile: --backends eager,tpu: choose from eager, thunder, inductor" in capsys.readouterr().err
    spec.write_text("each module <\n")
    assert main(["profile", str(spec), "-o", str(tmp_path / "never"), "--", PYTHON]) == 2
    assert "modules.nvtx" in capsys.readouterr().err and not (tmp_path / "never").exists()


# ------------------------------------------------------------------ the one-line API


@pytest.mark.parametrize("backend", ["eager", pytest.param("inductor", marks=pytest.mark.slow), pytest.param("thunder", marks=pytest.mark.thunder)])
def test_doc_script_runs_on_each_backend(tmp_path, backend):
    if unavailable_reason():
        pytest.skip(unavailable_reason())
    code = doc_block("python", "## 1. One line picks the backend")
    env = {**child_env(tmp_path), ENV_BACKEND: backend}
    result = capture_subprocess([PYTHON, "-c", code], env=env).check()
    messages = [e.message for e in result.events if e.kind == "push" and e.domain == "nvtx_regions"]
    steps = [m for m in messages if m.startswith("step ")]
    assert steps == ["step 0", "step 1", "step 2"], backend
    for name in ("encoder", "head", "head (backward)", "encoder (backward)"):
        assert messages.count(name) == 3, (backend, name, messages)


def test_thunder_named_where_it_is_not_installed_is_a_usage_error(tmp_path, capsys, monkeypatch):
    from nvtx_regions.commands import profile as command
    from nvtx_regions.commands.main import main

    monkeypatch.setattr(command, "thunder_installed", lambda: False)
    spec = tmp_path / "modules.nvtx"
    spec.write_text(MODULES)
    out = tmp_path / "never"
    assert main(["profile", str(spec), "--backends", "eager,thunder", "-o", str(out), "--", PYTHON, "-c", "pass"]) == 2
    assert "--backends eager,thunder: thunder is not installed here (pip install 'nvtx_regions[thunder]')" in capsys.readouterr().err
    assert not out.exists()
    assert command._backends(None, None) == (["eager", "inductor"], "eager")  # the default: the backends installed


def test_compile_refuses_a_backend_the_command_did_not_ask_for(monkeypatch):
    import torch

    import nvtx_regions

    model = torch.nn.Linear(2, 2)
    monkeypatch.setenv(ENV_BACKEND, "eager")
    with pytest.raises(ValueError, match=r"backend='thunder', but \$NVTX_REGIONS_BACKEND asks for 'eager'"):
        nvtx_regions.compile(model, "each module <**>", backend="thunder")
    monkeypatch.setenv(ENV_BACKEND, "tpu")
    with pytest.raises(ValueError, match=r"\$NVTX_REGIONS_BACKEND='tpu' is not a backend; choose one of eager, thunder, inductor"):
        nvtx_regions.compile(model)
    monkeypatch.delenv(ENV_BACKEND)
    with pytest.raises(ValueError, match=r"backend='jax' is not a backend"):
        nvtx_regions.compile(model, backend="jax")


def test_steps_pop_on_break_and_on_error(nvtx_capture):
    import nvtx_regions

    def run(stop):
        for number in nvtx_regions.steps(range(5), domain="steps_test"):
            if number == stop:
                if stop == 1:
                    break
                raise KeyError(stop)

    with nvtx_capture() as events:
        run(1)
        with pytest.raises(KeyError):
            run(2)
    seen = [(e.kind, e.message) for e in events if e.domain == "steps_test" and e.kind in ("push", "pop")]
    assert seen == [("push", "step 0"), ("pop", None), ("push", "step 1"), ("pop", None),
                    ("push", "step 0"), ("pop", None), ("push", "step 1"), ("pop", None),
                    ("push", "step 2"), ("pop", None)]  # fmt: skip
