"""The chart of ``nvtx-regions profile`` (`report.chart`), checked by reading its files back.

The PNG is decoded (its size, its colours: not blank, one per backend) and the SVG parsed (each
row's label, each backend's name, each bar's length, each ratio), for tables that
`compare_backends` makes of synthetic runs with 2, 16 and 32 modules. The charts in
docs/images/ are drawn from the tables docs/profile.md prints (the tutorial's run) and a real
run of examples/train.py with 16 layers; ``python tests/test_chart.py --write`` draws them again.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest

from nvtx_regions.capture.chrome import RangeRecord
from nvtx_regions.report.backends_table import BackendRow, BackendRun, BackendsTable, Timing, compare_backends
from nvtx_regions.report.chart import COLORS, DPI, INSTALL, WIDTH_PX, ChartUnavailable, write_chart
from nvtx_regions.report.numbers import format_duration, format_ratio
from nvtx_regions.report.reader import RangeFile, Ranges

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "profile.md"
IMAGES = ROOT / "docs" / "images"
SVG = "{http://www.w3.org/2000/svg}"
BACKENDS = ("eager", "thunder", "inductor")


# ------------------------------------------------------------------ reading a chart back


@dataclass
class Chart:
    """What the two files of a chart show. A key is (module, pass, backend); lengths in SVG points."""

    png_size: tuple[int, int]
    png_colors: set[str]  # "#rrggbb"
    svg_size: tuple[float, float]
    texts: list[str]
    labels: list[str]  # the rows' labels, top to bottom
    bars: dict[tuple[str, str, str], float]
    ratios: dict[tuple[str, str, str], str]
    words: dict[tuple[str, str, str], str]  # "missing", "n/a" or "failed"


def _key(gid: str) -> tuple[str, str, str]:
    module, phase, backend = gid.split(":", 1)[1].rsplit(":", 2)
    return module, phase, backend


def read_chart(stem: Path) -> Chart:
    """Decode ``STEM.png`` and parse ``STEM.svg``."""
    import numpy as np
    from matplotlib.image import imread

    pixels = (imread(f"{stem}.png")[..., :3] * 255).round().astype(np.uint32)
    packed = np.unique((pixels[..., 0] << 16) | (pixels[..., 1] << 8) | pixels[..., 2])
    colors = {f"#{int(c):06x}" for c in packed}
    root = ET.parse(f"{stem}.svg").getroot()
    assert root.tag == f"{SVG}svg"
    texts, rows = [], []
    for text in root.iter(f"{SVG}text"):
        texts.append(text.text or "")
        if re.fullmatch(r".+ \((forward|backward)\)", text.text or ""):
            rows.append((float(text.get("y")), text.text))
    bars, ratios, words = {}, {}, {}
    for group in root.iter(f"{SVG}g"):
        gid = group.get("id", "")
        if gid.startswith("bar:"):
            (path,) = group.iter(f"{SVG}path")
            xs = [float(x) for x in re.findall(r"(-?[\d.]+) -?[\d.]+", path.get("d"))]
            bars[_key(gid)] = max(xs) - min(xs)
        elif gid.startswith(("ratio:", "missing:", "n/a:", "failed:")):
            (text,) = group.iter(f"{SVG}text")
            (ratios if gid.startswith("ratio:") else words)[_key(gid)] = text.text.strip()
    width, height = (float(root.get(side).removesuffix("pt")) for side in ("width", "height"))
    return Chart((pixels.shape[1], pixels.shape[0]), colors, (width, height), texts,
                 [label for _, label in sorted(rows)], bars, ratios, words)  # fmt: skip


# ------------------------------------------------------------------ tables of synthetic runs


def synthetic_runs(modules: int, *, seed: int = 0, lacking: tuple[str, str] | None = None) -> list[BackendRun]:
    """4 steps (0..3) per backend; in each, every module's forward and backward range, the same in every step.

    lacking: (backend, module) that the backend has no range for."""
    rng = random.Random(seed)
    base = {f"transformer.h.{m}": rng.uniform(100e3, 900e3) for m in range(modules)}
    factor = {"eager": {m: 1.0 for m in base}, "thunder": {m: rng.uniform(0.8, 1.8) for m in base},
              "inductor": {m: rng.uniform(0.2, 0.5) for m in base}}  # fmt: skip
    runs = []
    for backend in BACKENDS:
        records = []
        for step in range(4):
            t = step * 10**9
            records.append(RangeRecord(1, 1, "nvtx_regions", f"step {step}", t, t + 10**9 - 1, 0))
            for module, ns in base.items():
                if (backend, module) == lacking:
                    continue
                for message, scale in ((module, 1.0), (f"{module} (backward)", 1.6)):
                    duration = round(ns * scale * factor[backend][module])
                    records.append(RangeRecord(1, 1, "nvtx_regions", message, t + 1, t + 1 + duration, 1))
                    t += duration + 10
        runs.append(BackendRun(backend, Ranges((RangeFile("<synthetic>", False, tuple(records)),))))
    return runs


def expected_order(table: BackendsTable) -> list[str]:
    """The rows' labels, largest ratio to the baseline first, from the medians (rows without a ratio last)."""

    def largest(row: BackendRow) -> float:
        base = row.times[0]
        found = [t.median_ns / base.median_ns for t in row.times[1:] if t is not None and base is not None]
        return max(found, default=-1.0)

    return [f"{row.module} ({row.phase})" for row in sorted(table.rows, key=largest, reverse=True)]


@pytest.mark.parametrize("modules", [2, 16, 32])
def test_the_chart_reads_back_as_its_table(tmp_path, modules):
    table = compare_backends(synthetic_runs(modules, lacking=("inductor", "transformer.h.1")), warmup=1)
    png, svg = write_chart(table, tmp_path / "profile")
    assert (png, svg) == (tmp_path / "profile.png", tmp_path / "profile.svg")
    chart = read_chart(tmp_path / "profile")
    # The PNG: its width, the SVG's height at the PNG's resolution, and every backend's colour drawn.
    assert chart.png_size[0] == WIDTH_PX == chart.svg_size[0] * DPI / 72
    assert abs(chart.png_size[1] - chart.svg_size[1] * DPI / 72) <= 1
    assert {c.lower() for c in COLORS[:3]} <= chart.png_colors and len(chart.png_colors) > 50
    # The SVG: one labelled row per module and pass, largest ratio first; the legend; the axis with its unit.
    assert chart.labels == expected_order(table) and len(chart.labels) == 2 * modules
    assert {"eager (baseline)", "thunder", "inductor"} <= set(chart.texts)
    longest = max(cell.median_ns for row in table.rows for cell in row.times if cell is not None)
    assert f"CPU time, median per call ({format_duration(longest).split()[1]})" in chart.texts  # the unit of the tables
    # A bar per backend and row, its length proportional to the median; the ratio beside the others' bars.
    scales = []
    for row in table.rows:
        for backend, cell, ratio in zip(BACKENDS, row.times, row.ratios):
            key = (row.module, row.phase, backend)
            if cell is None:
                assert key not in chart.bars and chart.words[key] == "missing"
                continue
            scales.append(chart.bars[key] / cell.median_ns)
            if backend != "eager":
                assert chart.ratios[key] == f"{format_ratio(ratio)}x"
    assert max(scales) == pytest.approx(min(scales), rel=1e-4)
    assert len(chart.bars) == 3 * 2 * modules - 2 and len(chart.ratios) == 2 * 2 * modules - 2
    assert {key[:2] for key in chart.words} == {("transformer.h.1", "forward"), ("transformer.h.1", "backward")}


def test_a_taller_table_makes_a_taller_chart_of_the_same_width(tmp_path):
    sizes = []
    for modules in (2, 16):
        write_chart(compare_backends(synthetic_runs(modules), warmup=1), tmp_path / str(modules))
        sizes.append(read_chart(tmp_path / str(modules)).png_size)
    assert sizes[0][0] == sizes[1][0] and sizes[1][1] > 4 * sizes[0][1]


def test_a_failed_backend_and_a_table_without_rows(tmp_path):
    runs = synthetic_runs(2)
    runs[1] = BackendRun("thunder", failure="exited with status 3")
    write_chart(compare_backends(runs, warmup=1), tmp_path / "failed")
    chart = read_chart(tmp_path / "failed")
    assert "thunder (failed)" in chart.texts and set(chart.words.values()) == {"failed"}
    assert {key[2] for key in chart.words} == {"thunder"} and len(chart.words) == 4
    write_chart(compare_backends([BackendRun("eager", failure="exited with status 1")]), tmp_path / "empty")
    assert "no module ranges" in read_chart(tmp_path / "empty").texts


def test_without_matplotlib_profile_writes_the_table_and_says_what_to_install(tmp_path, monkeypatch):
    from nvtx_regions.commands.profile import write_outputs

    table = compare_backends(synthetic_runs(2), warmup=1)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    with pytest.raises(ChartUnavailable, match=re.escape(INSTALL)):
        write_chart(table, tmp_path / "profile")
    where = write_outputs(tmp_path, table, "the table", [])
    assert where == (
        f"the table in {tmp_path / 'table.txt'}, one line per rank and row in {tmp_path / 'profile.csv'}; "
        "no chart: the chart needs matplotlib, which is not installed: pip install 'nvtx_regions[chart]'"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["profile.csv", "table.txt"]
    assert (tmp_path / "table.txt").read_text() == "the table\n"


def test_matplotlib_is_imported_only_to_draw():
    code = (
        "import sys, nvtx_regions, nvtx_regions.report.chart, nvtx_regions.commands.profile\n"
        "print('matplotlib' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "False"


# ------------------------------------------------------------------ the charts in the docs

# A real run on a CPU-only machine (no nsys: CPU times under our capture), 16 transformer blocks:
#   nvtx-regions profile examples/blocks.nvtx --tool capture --backends eager,thunder,inductor --warmup 1 \
#       -o profile_out -- python examples/train.py --steps 5 --layers 16
SIXTEEN = """\
CPU time per module call: median over the measured steps (n ranges), warm-up step 0 (compile) and 1 more left out; ratio: backend / eager
  eager: steps 2..4 measured
  thunder: steps 2..4 measured
  inductor: steps 2..4 measured

module            pass             eager       thunder     inductor  thunder/eager  inductor/eager
----------------  --------  ------------  ------------  -----------  -------------  --------------
transformer.h.5   backward  235.1 us (3)  357.6 us (3)  74.2 us (3)           1.52            0.32
transformer.h.10  backward  220.8 us (3)  324.1 us (3)  75.7 us (3)           1.47            0.34
transformer.h.4   forward   186.4 us (3)  273.1 us (3)  56.2 us (3)           1.46            0.30
transformer.h.13  backward  222.3 us (3)  317.6 us (3)  75.2 us (3)           1.43            0.34
transformer.h.12  backward  220.7 us (3)  313.6 us (3)  71.8 us (3)           1.42            0.33
transformer.h.14  forward   170.2 us (3)  240.8 us (3)  52.0 us (3)           1.42            0.31
transformer.h.8   backward  220.1 us (3)  309.4 us (3)  73.1 us (3)           1.41            0.33
transformer.h.2   forward   182.0 us (3)  255.6 us (3)  55.4 us (3)           1.40            0.30
transformer.h.9   backward  218.4 us (3)  304.8 us (3)  75.2 us (3)           1.40            0.34
transformer.h.15  forward   163.8 us (3)  227.5 us (3)  50.5 us (3)           1.39            0.31
transformer.h.11  backward  220.2 us (3)  305.7 us (3)  87.2 us (3)           1.39            0.40
transformer.h.7   backward  222.7 us (3)  308.9 us (3)  73.6 us (3)           1.39            0.33
transformer.h.14  backward  231.9 us (3)  319.6 us (3)  74.5 us (3)           1.38            0.32
transformer.h.13  forward   166.7 us (3)  229.4 us (3)  51.2 us (3)           1.38            0.31
transformer.h.6   backward  221.2 us (3)  303.7 us (3)  72.6 us (3)           1.37            0.33
transformer.h.0   backward  240.0 us (3)  322.2 us (3)  74.6 us (3)           1.34            0.31
transformer.h.12  forward   174.9 us (3)  231.3 us (3)  50.0 us (3)           1.32            0.29
transformer.h.6   forward   186.8 us (3)  243.5 us (3)  52.5 us (3)           1.30            0.28
transformer.h.10  forward   178.3 us (3)  228.7 us (3)  50.0 us (3)           1.28            0.28
transformer.h.11  forward   182.2 us (3)  233.0 us (3)  50.8 us (3)           1.28            0.28
transformer.h.8   forward   179.1 us (3)  228.8 us (3)  52.0 us (3)           1.28            0.29
transformer.h.9   forward   179.3 us (3)  228.7 us (3)  50.0 us (3)           1.27            0.28
transformer.h.1   forward   209.3 us (3)  265.1 us (3)  55.2 us (3)           1.27            0.26
transformer.h.2   backward  237.0 us (3)  296.7 us (3)  74.9 us (3)           1.25            0.32
transformer.h.7   forward   184.7 us (3)  230.2 us (3)  56.2 us (3)           1.25            0.30
transformer.h.0   forward   488.6 us (3)  590.4 us (3)  93.8 us (3)           1.21            0.19
transformer.h.3   forward   215.5 us (3)  244.4 us (3)  69.8 us (3)           1.13            0.32
transformer.h.1   backward  285.3 us (3)  297.5 us (3)  75.2 us (3)           1.04            0.26
transformer.h.3   backward  315.6 us (3)  308.6 us (3)  75.9 us (3)           0.98            0.24
transformer.h.15  backward  384.3 us (3)  374.3 us (3)  93.4 us (3)           0.97            0.24
transformer.h.5   forward   267.6 us (3)  242.1 us (3)  52.7 us (3)           0.90            0.20
transformer.h.4   backward  423.4 us (3)  310.9 us (3)  72.3 us (3)           0.73            0.17
"""


def parse_table(text: str) -> BackendsTable:
    """A `BackendsTable` of the table `nvtx-regions profile` prints (its rows in their printed order)."""
    lines = text.strip().splitlines()
    time = lines[0].split(" per module call")[0]
    baseline = lines[0].rsplit("ratio: backend / ", 1)[1]
    at = next(i for i, line in enumerate(lines) if line.startswith("module "))
    head = lines[at].split()
    backends = tuple(head[2 : 2 + (len(head) - 1) // 2])
    scale = {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}
    rows = []
    for line in lines[at + 2 :]:
        if not line.strip():
            break
        module, phase, *cells = re.split(r"\s{2,}", line.strip())
        times = []
        for cell in cells[: len(backends)]:
            match = re.fullmatch(r"([\d.]+) (\w+) \((\d+)(?:: [^)]*)?\)", cell)  # median (n: shortest..longest)
            times.append(Timing(int(match[3]), float(match[1]) * scale[match[2]]) if match else None)
        ratios = [None if r == "-" else float(r) for r in cells[len(backends) :]]
        ratios.insert(backends.index(baseline), 1.0 if times[backends.index(baseline)] else None)
        rows.append(BackendRow(module, phase, tuple(times), tuple(ratios)))
    modules = tuple(dict.fromkeys(row.module for row in rows))
    failed = tuple(None if any(row.times[b] for row in rows) else "failed" for b in range(len(backends)))
    return BackendsTable(backends, baseline, time, tuple(rows), modules, ((),) * len(backends), 1, failed)


def doc_tables() -> dict[str, BackendsTable]:
    """The file name of each chart in docs/images/, and the table it is drawn from."""
    text = DOC.read_text(encoding="utf-8")
    shown = re.search(r"<!-- profile: table -->\n```text\n(.*?)```", text, re.S)[1]
    return {"profile-2-modules": parse_table(shown), "profile-16-modules": parse_table(SIXTEEN)}


def test_the_docs_show_the_charts_of_their_tables(tmp_path):
    text = DOC.read_text(encoding="utf-8")
    for name, table in doc_tables().items():
        assert f"](images/{name}.png)" in text
        assert len(table.modules) == int(name.split("-")[1])
        write_chart(table, tmp_path / name)
        assert read_chart(tmp_path / name).labels == [f"{row.module} ({row.phase})" for row in table.rows]
        # The image in the docs is the chart of that table (its size follows the rows).
        import matplotlib.image

        assert matplotlib.image.imread(IMAGES / f"{name}.png").shape == matplotlib.image.imread(tmp_path / f"{name}.png").shape


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_chart.py --write   (draws the charts in docs/images/ again)")
    IMAGES.mkdir(exist_ok=True)
    for name, table in doc_tables().items():
        png, svg = write_chart(table, IMAGES / name)
        svg.unlink()  # the docs show the PNG
        print(png)
