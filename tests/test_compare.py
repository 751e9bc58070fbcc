"""`nvtx-regions compare` and `nvtx_regions.compare` (`report.compare`): two Chrome-trace captures side by side.

Synthetic files pin the table exactly; the example test runs the real
eager-against-thunder comparison on nanoGPT and checks README's table against it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nvtx_regions.__main__ import main
import nvtx_regions
from nvtx_regions import CaptureFileError
from nvtx_regions.capture import NvtxEvent, to_chrome_trace, write_chrome_trace
from nvtx_regions.report.chrome_trace import load_chrome_trace
from nvtx_regions.report.compare import CompareRow, compare, render_table
from nvtx_regions.report.reader import read_file

ROOT = Path(__file__).resolve().parents[1]


def load_ranges(source, **domain):
    """(domain, name, duration in µs) of each range of a capture, as the one reader gives them."""
    return [(r.domain, r.message, r.duration_ns / 1000) for r in read_file(source, **domain).records]


def _x(name, dur, cat="nvtx_regions", **extra):
    return {"name": name, "cat": cat, "ph": "X", "ts": 0, "dur": dur, "pid": 1, "tid": 1, **extra}


A = {
    "displayTimeUnit": "ms",
    "traceEvents": [
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "rank 0"}},
        _x("block", 100),
        _x("attn", 1500),
        _x("block", 300),
        {"name": "block", "ph": "B", "ts": 0, "pid": 1, "tid": 1},  # not a complete event: ignored
        {"name": "block", "ph": "E", "ts": 5, "pid": 1, "tid": 1},
        {"name": "tick", "ph": "i", "s": "t", "ts": 3, "pid": 1, "tid": 1},
        _x("block", 200),
        _x("block", 9999, cat="other"),
        _x("torch", 50, cat="NVTX", args={"domain": None}),
    ],
}
B = [_x("block", 400), _x("only b", 10), _x("block", 500), _x("attn", 0.5)]

TABLE = """\
range   eager n  thunder n  eager median  thunder median  thunder/eager
block         4          2      250.0 us        450.0 us           1.80
attn          1          1       1.50 ms          500 ns       0.000333
torch         1          0       50.0 us               -              -
only b        0          1             -         10.0 us              -"""


@pytest.fixture
def files(tmp_path):
    a, b = tmp_path / "eager.json", tmp_path / "thunder.json"
    a.write_text(json.dumps(A))
    b.write_text(json.dumps(B))
    return a, b


def test_rows_and_table(files):
    rows = compare(*files)
    assert rows[0] == CompareRow("block", 4, 2, 250.0, 450.0)
    assert rows[0].ratio == 1.8
    assert [r.name for r in rows] == ["block", "attn", "torch", "only b"]
    assert rows[2].ratio is None and rows[3].ratio is None
    assert render_table(rows, "eager", "thunder") == TABLE


def test_domain_filter(files):
    rows = compare(*files, domain="nvtx_regions")
    assert [(r.name, r.count_a, r.median_a_us) for r in rows] == [("block", 3, 200.0), ("attn", 1, 1500.0), ("only b", 0, None)]
    assert [(r.name, r.count_a) for r in compare(*files, domain=None)] == [("torch", 1)]
    assert load_ranges(A, domain="other") == [("other", "block", 9999.0)]


def test_command(files, capsys):
    assert main(["compare", *map(str, files)]) == 0
    assert capsys.readouterr().out == TABLE + "\n"
    assert main(["compare", *map(str, files), "--names", "x", "y", "--domain", "default"]) == 0
    assert capsys.readouterr().out == (
        "range  x n  y n  x median  y median  y/x\n"
        "torch    1    0   50.0 us         -    -\n"
    )


def test_command_errors(files, tmp_path, capsys):
    a, _ = files
    missing = tmp_path / "missing.json"
    assert main(["compare", str(a), str(missing)]) == 1
    assert capsys.readouterr().err == (
        f"nvtx-regions compare: {missing}: cannot read the capture file: No such file or directory\n"
    )
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": 3}')
    assert main(["compare", str(bad), str(a)]) == 1
    assert capsys.readouterr().err == (
        f"nvtx-regions compare: {bad}: not a Chrome trace (expected a 'traceEvents' list or a list of events); "
        "pass a file written by 'nvtx-regions capture -o FILE.json'\n"
    )
    bad.write_text("{")  # cut short: the run that wrote it was killed
    assert main(["compare", str(bad), str(a)]) == 1
    assert "cut short" in capsys.readouterr().err
    bad.write_text("{nonsense}")
    assert main(["compare", str(bad), str(a)]) == 1
    assert "not JSON" in capsys.readouterr().err
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    assert main(["compare", str(empty), str(empty)]) == 1
    assert capsys.readouterr().err == "nvtx-regions compare: no complete ('ph': 'X') range events in either file\n"
    with pytest.raises(CaptureFileError):  # its own error, not the spec's SelectorError
        read_file({"nothing": []})


def _event(kind, message, ts, domain="nvtx_regions", tid=7):
    return NvtxEvent(kind=kind, domain=domain, message=message, color=None, category=None, tid=tid, ts_ns=ts, pid=3)


def test_chrome_trace_from_events():
    events = [
        _event("push", "outer", 1000),
        _event("push", "inner", 2000),
        _event("pop", None, 5000),
        _event("pop", None, 9000),
        _event("push", "default", 10_000, domain=None),
        _event("pop", None, 11_000, domain=None),
        _event("push", "never popped", 12_000),
    ]
    trace = to_chrome_trace(events)
    # One writer (nvtx_regions.capture.chrome): ranges come in the order they close, with its args.
    ranges = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    fields = ("name", "cat", "ph", "ts", "dur", "pid", "tid")
    assert [({k: e[k] for k in fields}, e["args"]["domain"], e["args"]["depth"]) for e in ranges] == [
        ({"name": "inner", "cat": "nvtx_regions", "ph": "X", "ts": 2.0, "dur": 3.0, "pid": 3, "tid": 7}, "nvtx_regions", 1),
        ({"name": "outer", "cat": "nvtx_regions", "ph": "X", "ts": 1.0, "dur": 8.0, "pid": 3, "tid": 7}, "nvtx_regions", 0),
        ({"name": "default", "cat": "NVTX", "ph": "X", "ts": 10.0, "dur": 1.0, "pid": 3, "tid": 7}, None, 0),
        ({"name": "never popped", "cat": "nvtx_regions", "ph": "X", "ts": 12.0, "dur": 0.0, "pid": 3, "tid": 7}, "nvtx_regions", 0),
    ]  # fmt: skip
    assert [e["args"].get("unclosed", False) for e in ranges] == [False, False, False, True]
    assert load_ranges(trace) == [
        ("nvtx_regions", "inner", 3.0), ("nvtx_regions", "outer", 8.0), (None, "default", 1.0), ("nvtx_regions", "never popped", 0.0),
    ]  # fmt: skip


def test_write_chrome_trace_to_a_path_is_the_capture_writer(tmp_path):
    events = [_event("push", "a", 1000), _event("pop", None, 3000)]
    path = tmp_path / "t.json"
    assert write_chrome_trace(events, path) == 1  # the one writer: events first, then a path or a stream
    assert json.loads(path.read_text()) == to_chrome_trace(events)


def test_the_public_compare_is_the_function():
    # `from nvtx_regions import compare` gives the function, not a module, in a fresh interpreter too.
    assert nvtx_regions.compare is compare and callable(compare)
    code = "from nvtx_regions import compare; import inspect; print(inspect.isfunction(compare), compare.__module__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["True", "nvtx_regions.report.compare"]


def test_both_trace_readers_agree_on_the_default_domain(tmp_path):
    # "NVTX" is how the writer (and the nvtx package) names the default domain; without args.domain
    # both readers take it to be None, and any other cat to be that domain.
    events = [_x("d", 2.0, cat="NVTX"), _x("m", 3.0, cat="mine"), _x("n", 4.0, cat="x", args={"domain": None})]
    path = tmp_path / "other_producer.json"
    path.write_text(json.dumps(events))
    assert [d for d, _, _ in load_ranges(path)] == [None, "mine", None]
    assert [r.domain for r in load_chrome_trace(path)] == [None, "mine", None]


ROW = re.compile(r"^(\S+(?: \(backward\))?)\s+(\d+)\s+(\d+)\s+[\d.]+ (?:us|ms)\s+[\d.]+ (?:us|ms)\s+[\d.]+$")


def _rows(text: str) -> list[tuple[str, int, int]]:
    return [(m[1], int(m[2]), int(m[3])) for m in map(ROW.match, text.splitlines()) if m]


@pytest.mark.slow
@pytest.mark.thunder
def test_example_compares_eager_with_thunder(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    for name in ("NVTX_INJECTION64_PATH", "NVTX_REGIONS_CAPTURE_DIR", "NVTX_REGIONS_CAPTURE_MODE"):
        env.pop(name, None)  # the example attaches its own tool
    result = subprocess.run(
        [sys.executable, "examples/compare_eager_thunder.py", "--out", str(tmp_path), "--steps", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    blocks = [f"transformer.h.{i}" for i in range(4)]
    expected = [(b, 2, 2) for b in blocks] + [(f"{b} (backward)", 2, 2) for b in reversed(blocks)]
    assert _rows(result.stdout) == expected
    assert result.stdout.splitlines()[1].split() == ["range", "eager", "n", "thunder", "n", "eager", "median", "thunder", "median", "thunder/eager"]
    # The files are standard Chrome traces that the command reads too.
    assert [r.name for r in compare(tmp_path / "eager.json", tmp_path / "thunder.json")] == [r[0] for r in expected]
    # docs/how-to/eager-vs-thunder.md shows a real run of the same example (ten steps, the default).
    page = (ROOT / "docs" / "how-to" / "eager-vs-thunder.md").read_text(encoding="utf-8")
    section = page.split("## Side by side", 1)[1].split("\n## ", 1)[0]
    assert _rows(section) == [(name, 10, 10) for name, _, _ in expected]
