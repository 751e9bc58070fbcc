"""Steady and transient slowness over ranks, each named: a rank slow in one module at every step, and
another rank stalled once, in one step (`report.summary`, `report.ranks_table`, `report.ranks_chart`).

Synthetic timings check the outlier rule, the table at the width it is given, and the chart. Real
torchrun jobs on CPU (gloo) check them end to end, with docs/how-to/find-the-slow-rank.md's script
(rank 2 30 ms late in ``blocks.1`` at every step, rank 1 200 ms late in ``blocks.0`` in step 3):
on eager under our capture in the default tier; in the slow tier the page's own command (eager
and Inductor) at ``COLUMNS=120``, whose table and chart the page shows (``python
tests/test_stragglers.py --write`` writes them again from a new run), and the job under nsys and
under torch.profiler.
"""

from __future__ import annotations

import csv
import re
import shlex
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from support.nsys import finish_or_fail, require_nsys
from test_profile import PYTHON, TORCHRUN, child_env
from nvtx_regions.core.table import terminal_width, wrap_name
from nvtx_regions.report.ranks_chart import OUTLIER_COLOR, RANK_COLOR, SLOWEST_COLOR, write_ranks_chart
from nvtx_regions.report.ranks_table import (CSV_COLUMNS, OUTLIERS_SHOWN, BackendRanks, compare_ranks, render_ranks,
                                             slowest_text, write_csv)  # fmt: skip
from nvtx_regions.report.summary import RankSummary, RowKinds, Timing, is_outlier, summarize
from nvtx_regions.testing import unavailable_reason

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "how-to" / "find-the-slow-rank.md"
IMAGE = ROOT / "docs" / "images" / "find-the-slow-rank.png"
SVG = "{http://www.w3.org/2000/svg}"
US, MS = 1_000, 1_000_000
STEPS = (2, 3, 4)  # measured: step 0 (compile) and 1 warm-up step left out of 0..4
BLOCKS = ("blocks.0", "blocks.1", "blocks.2")
PASSES = ("forward", "backward")


# ------------------------------------------------------------------ synthetic ranks


def ranks_of(calls: Callable[[int, str, str, int], float], *, ranks=range(3), modules=BLOCKS) -> dict[int, RankSummary]:
    """Each rank's summary: per module and pass, one call per measured step, of `calls(rank, module, pass, step)` ns."""
    found = {}
    for rank in ranks:
        cpu = {(m, p): Timing.of([calls(rank, m, p, s) for s in STEPS], STEPS) for m in modules for p in PASSES}
        found[rank] = RankSummary(rank, cpu, None, {key: "blocks" for key in cpu}, STEPS)
    return found


def job(*, straggler: int | None = 2, stall: int | None = 1, stall_ns: float = 200 * MS, modules=BLOCKS, ranks=range(3)):
    """The page's job in numbers: 100 us + 10 us per block + 1 us per rank a call; rank `straggler` 30 ms
    late in the second module's forward at every step; rank `stall` `stall_ns` late in the first's, in step 3."""

    def calls(rank: int, module: str, phase: str, step: int) -> float:
        ns = 100 * US + 10 * US * modules.index(module) + rank * US
        if rank == straggler and module == modules[1] and phase == "forward":
            ns += 30 * MS
        if rank == stall and module == modules[0] and phase == "forward" and step == 3:
            ns += stall_ns
        return ns

    return ranks_of(calls, modules=modules, ranks=ranks)


def table_of(*backends: str, **options):
    runs = [BackendRanks(backend, job(**options)) for backend in backends or ("eager",)]
    return runs, compare_ranks(runs, warmup=1)


def outlier_lines(text: str) -> list[list[str]]:
    """The cells of each line of the outliers under the table."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("outliers ("))
    at = next(i for i in range(at, len(lines)) if lines[i].startswith("module "))
    found = []
    for line in lines[at + 2 :]:
        if not line.strip() or line.startswith(("and ", "note:")):
            break
        found.append(re.split(r"\s{2,}", line.strip()))
    return found


def first_row(text: str) -> str:
    lines = text.splitlines()
    return lines[next(i for i, line in enumerate(lines) if line.startswith("module ")) + 2]


@pytest.mark.parametrize(
    ("call", "median", "outlier"),
    [(200 * MS + 100 * US, 100 * US, True),  # a stall
     (5 * MS, 50 * US, False),  # 100x its median, a few ms: the OS took the core
     (20.1 * MS, 100 * US, True), (20.0 * MS, 100 * US, False),  # the floor: 20 ms over the median
     (80 * MS, 30 * MS, False), (91 * MS, 30 * MS, True),  # the ratio: over 3x
     (30 * MS, 30 * MS, False)],  # a slow rank's call, as slow as its median
)  # fmt: skip
def test_the_outlier_rule(call, median, outlier):
    assert is_outlier(call, median) is outlier


def test_a_timing_keeps_the_step_of_its_longest_call_and_counts_outliers():
    assert Timing.of([100 * US, 250 * MS, 110 * US], [2, 3, 4]) == Timing(3, 110 * US, 100 * US, 250 * MS, 3, 1)
    assert Timing.of([5, 9, 9], [2, 3, 4]).high_step == 3  # of equal calls, the first
    assert Timing.of([5, 9]).high_step is None  # no step ranges
    # From the records of a run: rank 1's blocks.0 lasts 125 ms in step 3 (tests/test_ranks.py's job).
    from test_ranks import rank_records

    summary = summarize(rank_records(1, slow=None, spike=("blocks.0", 3)), None, rank=1, rows=RowKinds.of(None), warmup=1)
    assert summary.cpu[("blocks.0", "forward")] == Timing(3, 101 * US, 101 * US, 125 * MS, 3, 1)
    assert summary.cpu[("blocks.1", "forward")].outliers == 0


def test_the_steady_rank_and_the_stall_are_told_apart():
    _, table = table_of("eager")
    text = render_ranks(table)
    assert first_row(text).split()[:2] == ["blocks.1", "forward"] and "rank 2, 271.28x" in first_row(text)
    assert table.row("blocks.0", "forward").cells[0].slowest != 1  # the stall leaves rank 1's median alone
    assert outlier_lines(text) == [["blocks.0", "forward", "eager", "1", "3", "200.10 ms", "101.0 us", "1981.20x", "1 of 3"]]
    # Each alone: the straggler has no outlier; the stall, no slow rank.
    _, steady = table_of("eager", stall=None)
    assert steady.outliers() == [] and "\noutliers: none (no call over 3x its rank's median in the row and at least 20 ms longer)" in render_ranks(steady)
    _, once = table_of("eager", straggler=None)
    assert once.rows[0].imbalance < 1.05 and [(r.module, r.phase, b, rank) for r, b, rank in once.outliers()] == [("blocks.0", "forward", 0, 1)]


def test_noise_is_no_outlier():
    """The OS takes a core for 5 ms from a 50 us call (100x), a long module is 2.5x slower once: no line.
    The same calls 200 ms longer are outliers."""

    def calls(extra: float) -> Callable[[int, str, str, int], float]:
        def ns(rank: int, module: str, phase: str, step: int) -> float:
            base = 50 * US if module == "blocks.0" else 30 * MS
            if (rank, step) == (0, 3) and phase == "forward" and module != "blocks.2":
                return base + (extra if module == "blocks.0" else 1.5 * base + extra)
            return base

        return ns

    noisy = compare_ranks([BackendRanks("eager", ranks_of(calls(5 * MS)))])
    assert noisy.outliers() == [] and "outliers: none" in render_ranks(noisy)
    stalled = compare_ranks([BackendRanks("eager", ranks_of(calls(200 * MS)))])
    assert {(row.module, rank) for row, _, rank in stalled.outliers()} == {("blocks.0", 0), ("blocks.1", 0)}


def test_the_rank_furthest_over_is_named_with_the_others():
    """Every rank waits in a collective inside blocks.0 in step 3, rank 0 the longest: one line for the row."""

    def calls(rank: int, module: str, phase: str, step: int) -> float:
        return 100 * US + ((300 - 50 * rank) * MS if (module, phase, step) == ("blocks.0", "forward", 3) else 0)

    text = render_ranks(compare_ranks([BackendRanks("eager", ranks_of(calls))]))
    assert outlier_lines(text) == [["blocks.0", "forward", "eager", "0", "3", "300.10 ms", "100.0 us", "3001.00x", "1 of 3", "1, 2"]]


def test_outliers_are_shown_10_at_most():
    modules = tuple(f"layers.{i}" for i in range(OUTLIERS_SHOWN + 2))

    def calls(rank: int, module: str, phase: str, step: int) -> float:
        return 100 * US + ((100 + modules.index(module)) * MS if (rank, phase, step) == (1, "forward", 3) else 0)

    text = render_ranks(compare_ranks([BackendRanks("eager", ranks_of(calls, modules=modules))]))
    shown = outlier_lines(text)
    assert [cells[0] for cells in shown] == [f"layers.{i}" for i in range(11, 1, -1)]  # the most time over first
    assert "\nand 2 more (profile.csv: each rank's max_us and max_step)" in text


# ------------------------------------------------------------------ the width


LONG = ("model.layers.10.self_attn.q_proj", "model.layers.10.self_attn", "model.layers.10.mlp.down_proj")


@pytest.mark.parametrize("backends", [("eager",), ("eager", "inductor"), ("eager", "thunder", "inductor")])
@pytest.mark.parametrize("width", [120, 160])
@pytest.mark.parametrize("modules", [BLOCKS, LONG])
def test_the_table_fits_the_width_it_is_given(backends, width, modules):
    runs = [BackendRanks(backend, job(modules=modules)) for backend in backends]
    table = compare_ranks(runs, warmup=1)
    full, text = render_ranks(table), render_ranks(table, width)
    assert max(map(len, text.splitlines())) <= width
    if len(first_row(full)) > width:  # the control: the whole table is wider
        assert f"note: to fit {width} columns, left out: each backend's min..max" in text
    # Whole cells, each row on its line: the slowest rank and its ratio, the module's name with its continuations.
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("module "))
    shown: list[list] = []
    for line in lines[at + 2 : lines.index("", at)]:
        if line.startswith("  "):  # the rest of the name above
            assert re.fullmatch(r"  \S+", line), line
            shown[-1][0] += line.strip()
        else:
            name, phase, *cells = re.split(r"\s{2,}", line)
            shown.append([name, phase, cells])
    assert [(name, phase) for name, phase, _ in shown] == [(row.module, row.phase) for row in table.rows]
    for (_, _, cells), row in zip(shown, table.rows):
        assert [slowest_text(cell) for cell in row.cells] == [cell for cell in cells if cell.startswith("rank ")]
    (outlier,) = {tuple(cells[1:5]) for cells in outlier_lines(text) if cells[2] == "eager"}
    assert outlier == ("forward", "eager", "1", "3")


def test_every_column_without_a_width():
    _, table = table_of("eager", "inductor")
    text = render_ranks(table)
    assert re.search(r"^module +pass +eager +eager min\.\.max +eager slowest +inductor +inductor min\.\.max +inductor slowest +inductor/eager$",
                     text, re.M)  # fmt: skip
    assert "note: to fit" not in text and max(map(len, text.splitlines())) > 120


@pytest.mark.parametrize(
    ("name", "width", "lines"),
    [("blocks.1", 12, ["blocks.1"]),
     ("model.layers.10.self_attn.q_proj", 16, ["model.layers.10.", "  self_attn.", "  q_proj"]),
     ("model.layers.10.self_attn.q_proj", 30, ["model.layers.10.self_attn.", "  q_proj"]),
     ("a_very_long_component.b", 12, ["a_very_long_", "  component.", "  b"]),  # a part longer than a line is cut
     ("my region", 8, ["my", "  region"])],
)  # fmt: skip
def test_module_names_break_after_a_dot(name, width, lines):
    assert wrap_name(name, width) == lines
    assert all(len(line) <= width for line in wrap_name(name, width))


def test_the_terminal_width_is_columns_else_the_terminal_else_none(monkeypatch):
    import fcntl
    import os
    import pty
    import struct
    import termios

    monkeypatch.setenv("COLUMNS", "99")
    assert terminal_width() == 99
    monkeypatch.delenv("COLUMNS")
    assert terminal_width() is None  # pytest's capture: no terminal
    # A child whose standard output is a terminal 97 columns wide.
    code = "from nvtx_regions.core.table import terminal_width, wrap_name; print(terminal_width())"
    env = {k: v for k, v in child_env(Path("/nonexistent")).items() if k != "COLUMNS"}
    main, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 97, 0, 0))
    try:
        subprocess.run([PYTHON, "-c", code], stdout=terminal, env=env, cwd=ROOT, check=True, timeout=60)
        assert os.read(main, 100).decode().strip() == "97"
    finally:
        os.close(terminal)
        os.close(main)


# ------------------------------------------------------------------ the CSV


def test_the_csv_keeps_each_ranks_spread_and_the_step_of_its_longest_call(tmp_path):
    runs, _ = table_of("eager")
    write_csv(runs, tmp_path / "profile.csv")
    with open(tmp_path / "profile.csv", newline="") as stream:
        rows = list(csv.DictReader(stream))
    assert tuple(rows[0]) == CSV_COLUMNS == ("backend", "rank", "range", "pass", "n", "median_us", "min_us", "max_us", "max_step")
    by = {(row["rank"], row["range"], row["pass"]): row for row in rows}
    assert len(rows) == 3 * 3 * 2
    assert by[("1", "blocks.0", "forward")] == {"backend": "eager", "rank": "1", "range": "blocks.0", "pass": "forward", "n": "3",
                                                "median_us": "101.000", "min_us": "101.000", "max_us": "200101.000", "max_step": "3"}  # fmt: skip
    assert by[("2", "blocks.1", "forward")]["median_us"] == "30112.000"


# ------------------------------------------------------------------ the chart


def read_marks(svg: Path) -> dict[str, tuple[float, str, str]]:
    """Per group id of the chart: (x of its mark or text, its fill colour, its text)."""
    found = {}
    for group in ET.parse(svg).getroot().iter(f"{SVG}g"):
        gid = group.get("id", "")
        if gid.startswith(("rank:", "outlier:")):
            use = next(group.iter(f"{SVG}use"))
            fill = re.search(r"fill: (#[0-9a-f]{6})", use.get("style", ""))[1]
            found[gid] = (float(use.get("x")), fill, "")
        elif gid.startswith(("slowest:", "outlier-name:", "median:")):
            text = next(group.iter(f"{SVG}text"))
            found[gid] = (float(text.get("x")), re.search(r"fill: (#[0-9a-f]{6})", text.get("style", ""))[1], text.text or "")
    return found


def test_the_chart_shows_every_row_and_names_only_what_stands_out(tmp_path):
    """Rows 1.1x, 3x and 300x apart: on the log axis each slowest rank sits log(ratio) from the others'
    dots, so 1.1x and 3x read apart beside 300x; only 3x and 300x are named; the stall is a diamond."""
    slow = {"blocks.0": 1.1, "blocks.1": 3.0, "blocks.2": 300.0}

    def calls(rank: int, module: str, phase: str, step: int) -> float:
        ns = 100 * US * (slow[module] if rank == 2 else 1)
        return ns + (200 * MS if (rank, module, phase, step) == (1, "blocks.0", "forward", 3) else 0)

    table = compare_ranks([BackendRanks("eager", ranks_of(calls))])
    write_ranks_chart(table, tmp_path / "ranks")
    marks = read_marks(tmp_path / "ranks.svg")
    gap = {m: marks[f"rank:{m}:forward:eager:2"][0] - marks[f"rank:{m}:forward:eager:0"][0] for m in slow}
    assert gap["blocks.0"] > 2  # points of the SVG: apart, not one dot
    assert gap["blocks.1"] / gap["blocks.2"] == pytest.approx(0.1926, abs=0.01)  # log(3) / log(300)
    assert gap["blocks.0"] / gap["blocks.2"] == pytest.approx(0.0167, abs=0.005)  # log(1.1) / log(300)
    named = {gid.split(":")[1] for gid in marks if gid.startswith("slowest:")}
    assert named == {"blocks.1", "blocks.2"}  # 1.1x does not stand out, in either pass
    assert marks["slowest:blocks.2:forward:eager"][2] == "rank 2, 300.00x"
    assert marks["rank:blocks.2:forward:eager:2"][1] == SLOWEST_COLOR.lower() and marks["rank:blocks.0:forward:eager:2"][1] == RANK_COLOR.lower()
    assert [gid for gid in marks if gid.startswith("outlier:")] == ["outlier:blocks.0:forward:eager"]
    assert marks["outlier:blocks.0:forward:eager"][1] == OUTLIER_COLOR.lower()
    assert marks["outlier-name:blocks.0:forward:eager"][2] == "rank 1, step 3: 200.10 ms"
    assert marks["median:blocks.1:forward:eager"][2] == "100.0 us"


def test_the_docs_name_the_charts_colours():
    """The page says which colour is what, in Okabe and Ito's names; the chart draws those colours."""
    okabe_ito = {"sky blue": "#56B4E9", "vermillion": "#D55E00", "reddish purple": "#CC79A7"}
    assert (RANK_COLOR, SLOWEST_COLOR, OUTLIER_COLOR) == tuple(okabe_ito.values())
    chart = DOC.read_text(encoding="utf-8").split("## The chart", 1)[1].split("\n## ", 1)[0]
    said = re.sub(r"\s+", " ", chart)
    assert "in sky blue" in said and "dot is vermillion" in said and "reddish purple diamond" in said
    assert not re.search(r"\b(in|is) (red|orange)\b", said)


# ------------------------------------------------------------------ real jobs


def doc_block(marker: str) -> str:
    """The code block after ``<!-- slow-rank: marker -->`` on the page."""
    match = re.search(rf"<!-- slow-rank: {marker} -->\n```\w*\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert match, f"no {marker} block in {DOC}"
    return match[1]


def run_page(where: Path, out: Path, *, backends: str | None = None, tool: str | None = None, columns: str = "120",
             runner: Callable[..., subprocess.CompletedProcess] | None = None) -> subprocess.CompletedProcess:  # fmt: skip
    """The page's command on its script and spec, written into `where`, its output to `out`."""
    (where / "slow_rank.py").write_text(doc_block("script"))
    (where / "blocks.nvtx").write_text(doc_block("spec"))
    argv = shlex.split(doc_block("command").strip())
    assert argv[:2] == ["nvtx-regions", "profile"] and "--standalone" in argv  # a free port: other tests run torchrun too
    words = {"blocks.nvtx": str(where / "blocks.nvtx"), "slow_rank.py": str(where / "slow_rank.py"), "slow_rank": str(out),
             "torchrun": TORCHRUN}  # fmt: skip
    argv = [words.get(word, word) for word in argv[2:]]
    for option, value in (("backends", backends), ("tool", tool)):
        if value is not None:
            argv[argv.index(f"--{option}") + 1] = value
    env = {**child_env(where), "COLUMNS": columns}
    # No retry: a rank that aborts at exit after its report (torch's) exits 0 with a note (`rank_ends`).
    return (runner or _profile)(argv, env)


def _profile(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """`nvtx-regions profile argv` in `env`; past its timeout, `finish_or_fail` ends it and its ranks."""
    argv = [PYTHON, "-m", "nvtx_regions", "profile", *argv]
    process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    stdout, stderr = finish_or_fail(process, 900)
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def printed_table(stdout: str, out: Path) -> str:
    """The table as printed: from its first line to the line that says where the files went (left out)."""
    start = re.search(r"^.* per module call, every rank", stdout, re.M).start()
    return stdout[start : stdout.index("\nnvtx-regions profile: reports in", start)].strip("\n").replace(str(out), "slow_rank")


def page_text(stdout: str, out: Path) -> str:
    """What the page shows: the table as printed and the line that says where the files went."""
    where = stdout[stdout.index("nvtx-regions profile: reports in") :].strip()
    return f"{printed_table(stdout, out)}\n\n{where}".replace(str(out), "slow_rank")


def csv_rows(path: Path) -> dict[tuple[str, str, str, str], dict[str, str]]:
    with open(path, newline="") as stream:
        return {(r["backend"], r["rank"], r["range"], r["pass"]): r for r in csv.DictReader(stream)}


def check_both_named(done: subprocess.CompletedProcess, out: Path, backends: tuple[str, ...]) -> str:
    """The straggler and the stall named, each with its rank (and the stall with its step and time), in
    the printed table, 120 columns wide, the CSV and the chart; the printed table."""
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = printed_table(done.stdout, out)
    assert max(map(len, text.splitlines())) <= 120, text
    assert first_row(text).split()[:2] == ["blocks.1", "forward"] and first_row(text).count("rank 2, ") == len(backends), text
    lines = outlier_lines(text)
    assert {tuple(cells[:5]) for cells in lines} == {("blocks.0", "forward", b, "1", "3") for b in backends}, text
    for cells in lines:
        number, unit = cells[5].split()
        assert unit == "ms" and 200 <= float(number) < 400 and cells[8] == "1 of 3", cells
    rows = csv_rows(out / "profile.csv")
    svg = (out / "ranks.svg").read_text()
    marks = read_marks(out / "ranks.svg")
    for backend in backends:
        stall, steady = rows[(backend, "1", "blocks.0", "forward")], rows[(backend, "2", "blocks.1", "forward")]
        assert stall["max_step"] == "3" and float(stall["max_us"]) >= 200_000 and float(stall["median_us"]) < 10_000
        assert float(steady["min_us"]) >= 30_000  # every call 30 ms late
        assert marks[f"outlier-name:blocks.0:forward:{backend}"][2].startswith("rank 1, step 3: ")
        assert marks[f"slowest:blocks.1:forward:{backend}"][2].startswith("rank 2, ")
        assert f'id="outlier:blocks.1:forward:{backend}"' not in svg  # the straggler is no outlier
    return text


@pytest.fixture(scope="module")
def capture_available():
    if unavailable_reason():
        pytest.skip(unavailable_reason())


def test_a_real_job_names_the_straggler_and_the_stall(capture_available, tmp_path):
    """The page's job on eager under our capture, at 120 columns: the default tier's one real run."""
    out = tmp_path / "slow_rank"
    done = run_page(tmp_path, out, backends="eager")
    check_both_named(done, out, ("eager",))
    written = (out / "table.txt").read_text()
    assert max(map(len, written.splitlines())) > 120  # the file's prose is not wrapped


@pytest.fixture(scope="module")
def page_run(capture_available, tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """The page's own command (eager and Inductor, our capture), on a terminal 120 columns wide."""
    where = tmp_path_factory.mktemp("page")
    out = where / "slow_rank"
    return run_page(where, out), out


def masked(text: str) -> list[str]:
    """The table without what changes from run to run: times, ratios, the ranks of the rows that follow the
    first, their order (the lines of each block after its head are sorted), column widths."""
    numbers = re.compile(r"\d+(\.\d+)? (s|ms|us|ns)|\d+\.\d+x?|(?<=rank )\d+")
    blocks = [block.splitlines() for block in text.strip().split("\n\n")]
    found = []
    for block in blocks:
        lines = [re.sub(r"\s+", " ", re.sub("-{3,}", "---", numbers.sub("#", line))).rstrip() for line in block]
        head = next((i + 2 for i, line in enumerate(block) if line.startswith("module ")), len(lines))
        found += lines[:head] + sorted(lines[head:])
    return found


@pytest.mark.slow
def test_the_page_shows_a_real_run_of_its_job(page_run):
    done, out = page_run
    text = check_both_named(done, out, ("eager", "inductor"))
    for backend in ("eager", "inductor"):
        assert f"  {backend}: ranks 0..2, steps 2..4 measured" in done.stdout, done.stdout
    assert masked(doc_block("table")) == masked(page_text(done.stdout, out)), "run `python tests/test_stragglers.py --write`"
    assert first_row(doc_block("table")).split()[:2] == ["blocks.1", "forward"]
    import matplotlib.image

    assert matplotlib.image.imread(IMAGE).shape == matplotlib.image.imread(out / "ranks.png").shape


@pytest.mark.slow
def test_at_120_columns_the_file_keeps_every_column(page_run):
    done, out = page_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    printed, written = printed_table(done.stdout, out), (out / "table.txt").read_text()
    assert "note: to fit 120 columns, left out: each backend's min..max" in printed and "min..max  " not in printed
    assert "eager min..max" in written and "inductor min..max" in written and "note: to fit" not in written
    assert max(map(len, written.splitlines())) > 120


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["nsys", "torch"])
def test_nsys_and_torch_profiler_name_the_stall_with_its_step(capture_available, tool, tmp_path, monkeypatch):
    """The page's job on eager under the real nsys (one report per rank) and under torch.profiler (one trace per rank)."""
    runner = None
    if tool == "nsys":
        require_nsys()
        from test_profile_ranks import profile_holding_the_nsys_lock

        def runner(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
            return profile_holding_the_nsys_lock(argv, tmp_path, columns="120")

    out = tmp_path / "slow_rank"
    done = run_page(tmp_path, out, backends="eager", tool=tool, runner=runner)
    check_both_named(done, out, ("eager",))


# ------------------------------------------------------------------ the page's table and chart, written again


def write_page() -> list[str]:
    """Run the page's command, and put its table and chart on the page; what changed."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        out = where / "slow_rank"
        done = run_page(where, out)
        if done.returncode != 0:
            sys.exit(done.stdout[-3000:] + done.stderr[-3000:])
        text = page_text(done.stdout, out)
        page = DOC.read_text(encoding="utf-8")
        shown = doc_block("table")
        changed = []
        if shown != text + "\n":
            DOC.write_text(page.replace(f"<!-- slow-rank: table -->\n```text\n{shown}```", f"<!-- slow-rank: table -->\n```text\n{text}\n```"),
                           encoding="utf-8")  # fmt: skip
            changed.append(str(DOC.relative_to(ROOT)))
        IMAGE.parent.mkdir(exist_ok=True)
        shutil.copyfile(out / "ranks.png", IMAGE)
        changed.append(str(IMAGE.relative_to(ROOT)))
    return changed


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_stragglers.py --write   (runs the page's job; writes its table and chart on the page)")
    sys.path.insert(0, str(ROOT / "tests"))
    print("\n".join(f"updated {p}" for p in write_page()))
