"""``nvtx-regions report``: what it says for files it cannot read, and the module table.

The reports of a real Nsight Systems run are read in tests/test_nsys_real.py.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from nvtx_regions.capture import write_chrome_trace
from nvtx_regions.core.naming import ANY_DOMAIN
from nvtx_regions.report.records import load_records, module_rows, render_modules
from nvtx_regions.testing import capture_subprocess, unavailable_reason

ROOT = Path(__file__).resolve().parents[1]


def report(*args, env=None):
    return subprocess.run([sys.executable, "-m", "nvtx_regions", "report", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env=env)  # fmt: skip


def test_errors_name_the_file_and_the_fix(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "garbage.sqlite").write_bytes(b"not sqlite at all" * 100)
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    (tmp_path / "empty.nsys-rep").write_bytes(b"")
    cases = [
        (tmp_path / "notes.txt", "notes.txt: not a report this reads: pass an Nsight Systems report"),
        (tmp_path / "missing.sqlite", "missing.sqlite: no such report file"),
        (tmp_path / "garbage.sqlite", "garbage.sqlite: not a readable SQLite export of an nsys report"),
        (other, "other.sqlite: not an Nsight Systems SQLite export (no StringIds table); make one with 'nsys export"),
    ]
    for path, message in cases:
        result = report(path)
        assert result.returncode == 1 and result.stdout == ""
        assert result.stderr.startswith("nvtx-regions report: ") and message in result.stderr, result.stderr
    # A .nsys-rep needs nsys to export it: without nsys on PATH, the message names the install script.
    no_nsys = {**os.environ, "PATH": str(Path(sys.executable).parent)}
    result = report(tmp_path / "empty.nsys-rep", env=no_nsys)
    assert result.returncode == 1 and ".ci/install-nsys installs it" in result.stderr, result.stderr


def _trace(path: Path, ranges: list[tuple[str, str, float, float]]) -> Path:
    events = [{"name": name, "cat": "nvtx_regions", "ph": "X", "ts": ts, "dur": dur, "pid": 1, "tid": 1,
               "args": {"domain": "nvtx_regions", "nvtx_category": category, "depth": 0}}
              for name, category, ts, dur in ranges]  # fmt: skip
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_module_table_pairs_forward_and_backward(tmp_path):
    trace = _trace(tmp_path / "t.json", [
        ("GPT", "model", 0, 100),
        ("transformer.h.0", "blocks", 1, 10),
        ("transformer.h.0.attn", "blocks", 2, 4),
        ("attn0", "attn0", 2, 4),  # a region: named after its label, which is its category too
        ("t5 = ltorch.linear(x, w, b)", "op in <linear>", 3, 1),
        ("transformer.h.0 (backward)", "blocks", 20, 30),
        ("transformer.h.0", "blocks", 60, 12),
    ])  # fmt: skip
    records, reports = load_records([str(trace)])
    assert reports == [] and len(records) == 7
    rows = {row.module: (row.forward, row.backward) for row in module_rows(records)}
    assert rows == {"GPT": ((100_000,), ()), "transformer.h.0": ((10_000, 12_000), (30_000,)),
                    "transformer.h.0.attn": ((4_000,), ())}  # fmt: skip
    assert [row.module for row in module_rows(records)] == ["GPT", "transformer.h.0", "transformer.h.0.attn"]
    table = render_modules(module_rows(records)).splitlines()
    assert table[2].split() == ["1", "100000", "100000.0", "0", "-", "-", "nvtx_regions:GPT"]
    assert table[3].split() == ["2", "22000", "11000.0", "1", "30000", "30000.0", "nvtx_regions:transformer.h.0"]


def test_domain_filter_and_no_ranges(tmp_path):
    trace = _trace(tmp_path / "t.json", [("transformer.h.0", "blocks", 1, 10)])
    assert load_records([str(trace)], domain="other")[0] == []
    result = report(trace, "--domain", "other")
    assert result.returncode == 1 and "no NVTX ranges in domain 'other'" in result.stderr
    result = report(trace)
    assert result.returncode == 0 and "nvtx_regions:transformer.h.0" in result.stdout
    assert "GPU-projected" not in result.stdout  # a capture has no CUDA side to speak of


@pytest.mark.skipif(bool(unavailable_reason()), reason=f"capture tool unavailable: {unavailable_reason()}")
def test_domain_default_selects_the_default_domains_ranges_of_a_capture(tmp_path):
    # A real capture: ranges in NVTX's default domain (records carry domain None) and in a named one.
    captured = capture_subprocess(
        """
        import nvtx
        for _ in range(2):
            nvtx.push_range("plain"); nvtx.pop_range()
        nvtx.push_range("named", domain="mine"); nvtx.pop_range(domain="mine")
        """
    ).check()
    trace = tmp_path / "capture.json"
    write_chrome_trace(captured, trace)
    assert sorted((r.domain or "", r.message) for r in load_records([str(trace)], domain=ANY_DOMAIN)[0]) == [
        ("", "plain"), ("", "plain"), ("mine", "named"),
    ]  # fmt: skip
    assert [(r.domain, r.message) for r in load_records([str(trace)], domain=None)[0]] == [(None, "plain")] * 2
    result = report(trace, "--domain", "default")
    assert result.returncode == 0, result.stderr
    per_range = result.stdout.split("\n\n")[0]
    assert " :plain" in per_range and "mine:named" not in per_range
    result = report(trace, "--domain", "mine")
    assert result.returncode == 0 and "mine:named" in result.stdout and ":plain" not in result.stdout
    # A file with no default-domain ranges: the message spells the domain as the option does.
    only_named = _trace(tmp_path / "named.json", [("transformer.h.0", "blocks", 1, 10)])
    result = report(only_named, "--domain", "default")
    assert result.returncode == 1 and "no NVTX ranges in domain 'default'" in result.stderr
