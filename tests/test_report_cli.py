"""``nvtx-regions report``: what it says for files it cannot read, and the module table; the one
reader of reports and captures (`report.reader`), and the one format of a duration (`report.numbers`).

The reports of a real Nsight Systems run are read in tests/test_nsys_real.py; here a small
SQLite file in the export's schema (``NVTX_EVENTS``, ``StringIds``, ``ENUM_NSYS_EVENT_TYPE``,
the CUPTI tables) stands in for one where a test needs what this machine cannot record (CUDA kernels).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from nvtx_regions import CaptureFileError
from nvtx_regions.capture import write_chrome_trace
from nvtx_regions.core.naming import ANY_DOMAIN
from nvtx_regions.report.numbers import format_duration, format_ratio
from nvtx_regions.report.reader import read_file, read_ranges
from nvtx_regions.report.records import module_rows, render_modules
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
    ranges = read_ranges([str(trace)])
    records = ranges.records
    assert [file.nsys for file in ranges.files] == [False] and len(records) == 7
    rows = {row.module: (row.forward, row.backward) for row in module_rows(records)}
    assert rows == {"GPT": ((100_000,), ()), "transformer.h.0": ((10_000, 12_000), (30_000,)),
                    "transformer.h.0.attn": ((4_000,), ())}  # fmt: skip
    assert [row.module for row in module_rows(records)] == ["GPT", "transformer.h.0", "transformer.h.0.attn"]
    table = render_modules(module_rows(records)).splitlines()
    assert table[0].split() == ["Fwd", "n", "Fwd", "Total", "Fwd", "Med", "Bwd", "n", "Bwd", "Total", "Bwd", "Med", "Module"]
    assert table[2].split() == ["1", "100.0", "us", "100.0", "us", "0", "-", "-", "nvtx_regions:GPT"]
    assert table[3].split() == ["2", "22.0", "us", "11.0", "us", "1", "30.0", "us", "30.0", "us", "nvtx_regions:transformer.h.0"]


def test_domain_filter_and_no_ranges(tmp_path):
    trace = _trace(tmp_path / "t.json", [("transformer.h.0", "blocks", 1, 10)])
    assert read_ranges([str(trace)], domain="other").records == ()
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
    assert sorted((r.domain or "", r.message) for r in read_ranges([str(trace)], domain=ANY_DOMAIN).records) == [
        ("", "plain"), ("", "plain"), ("mine", "named"),
    ]  # fmt: skip
    assert [(r.domain, r.message) for r in read_ranges([str(trace)], domain=None).records] == [(None, "plain")] * 2
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


# ------------------------------------------------------------------ one reader for reports and captures

PUSH_POP, DOMAIN_CREATE = 59, 75  # their numbers in ENUM_NSYS_EVENT_TYPE (nsys 2022.4.2)


def nsys_export(path: Path, ranges, *, pid: int = 100, kernels=()) -> Path:
    """A file in the schema of ``nsys export --type sqlite``: push/pop `ranges` (domain, message, start, end)
    on one thread of process `pid`, and per `kernels` item (launched at, start, end) one CUDA launch and its kernel."""
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    db.execute("CREATE TABLE ENUM_NSYS_EVENT_TYPE (id INTEGER, name TEXT)")
    db.executemany("INSERT INTO ENUM_NSYS_EVENT_TYPE VALUES (?, ?)", [(PUSH_POP, "NvtxPushPopRange"), (DOMAIN_CREATE, "NvtxDomainCreate")])
    db.execute("CREATE TABLE NVTX_EVENTS (start INT, end INT, eventType INT, textId INT, text TEXT, color INT, "
               "category INT, domainId INT, globalTid INT)")  # fmt: skip
    thread = (pid << 24) | pid
    domains: dict[str, int] = {}
    insert = "INSERT INTO NVTX_EVENTS (start, end, eventType, text, domainId, globalTid) VALUES (?, ?, ?, ?, ?, ?)"
    for domain, message, start, end in ranges:
        if domain is not None and domain not in domains:
            domains[domain] = len(domains) + 1
            db.execute(insert, (0, None, DOMAIN_CREATE, domain, domains[domain], thread))
        db.execute(insert, (start, end, PUSH_POP, message, domains.get(domain, 0), thread))
    if kernels:
        db.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INT, end INT, globalTid INT, correlationId INT)")
        db.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, correlationId INT)")
        for k, (launch, start, end) in enumerate(kernels):
            db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?)", (launch, launch + 1, thread, k))
            db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?)", (start, end, k))
    db.commit()
    db.close()
    return path


def test_one_reader_reads_reports_and_captures_together(tmp_path):
    export = nsys_export(tmp_path / "r.sqlite", [("nvtx_regions", "transformer.h.0", 1_000, 9_000), (None, "torch", 2_000, 3_000)])
    capture = _trace(tmp_path / "c.json", [("transformer.h.0", "blocks", 1, 10)])
    ranges = read_ranges([export, capture])
    assert [(file.source, file.nsys) for file in ranges.files] == [(str(export), True), (str(capture), False)]
    assert [(r.domain, r.message, r.duration_ns) for r in ranges.records] == [
        ("nvtx_regions", "transformer.h.0", 8_000), (None, "torch", 1_000), ("nvtx_regions", "transformer.h.0", 10_000),
    ]  # fmt: skip
    assert ranges.domains == {None, "nvtx_regions"}
    assert ranges.gpu_ns is None  # a capture holds no CUDA kernels, and neither does this report
    kept = read_ranges([export, capture], domain="nvtx_regions")
    assert [r.message for r in kept.records] == ["transformer.h.0"] * 2 and kept.domains == ranges.domains
    assert read_ranges([export], domain=None).records == (ranges.records[1],)
    # A Chrome trace already loaded reads as its file does.
    assert read_file(json.loads(capture.read_text())).records == read_file(capture).records


def test_rank_keeps_an_nsys_report_whole_and_one_rank_of_a_capture(tmp_path):
    # Under torchrun each rank writes its own nsys report, chosen by its name; its records name no rank.
    export = nsys_export(tmp_path / "report.rank1.sqlite", [("nvtx_regions", "block", 0, 10)])
    assert [r.message for r in read_ranges([export], rank=1).records] == ["block"]
    events = [{"name": f"r{rank}", "ph": "X", "ts": 0, "dur": 1, "pid": rank + 1, "tid": 1, "args": {"rank": rank}} for rank in (0, 1)]
    events.append({"name": "no RANK", "ph": "X", "ts": 0, "dur": 1, "pid": 9, "tid": 1})  # counts as rank 0
    assert [r.message for r in read_file(events, rank=0).records] == ["r0", "no RANK"]
    assert [r.message for r in read_file(events, rank=1).records] == ["r1"]


def test_a_file_it_cannot_read_is_one_error_that_names_it_and_the_fix(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("x")
    with pytest.raises(CaptureFileError) as error:
        read_ranges([notes])
    assert str(error.value) == (
        f"{notes}: not a report this reads: pass an Nsight Systems report (.nsys-rep, .qdrep, .sqlite), "
        "a capture from 'nvtx-regions capture -o FILE.json', or a torch.profiler trace (*.pt.trace.json)"
    )
    with pytest.raises(TypeError, match="read_file"):
        read_ranges(str(notes))  # one path is not a list of paths


def test_report_gives_gpu_projected_time_where_a_report_holds_kernels(tmp_path):
    # Two ranges of one name launch one kernel each (1500 ns and 2500 ns from first to last GPU work); a third launches none.
    export = nsys_export(
        tmp_path / "gpu.sqlite",
        [("nvtx_regions", "transformer.h.0", 1_000, 9_000), ("nvtx_regions", "transformer.h.0", 10_000, 12_000),
         ("nvtx_regions", "idle", 20_000, 21_000)],
        kernels=[(2_000, 9_500, 11_000), (10_500, 13_000, 15_500)],
    )  # fmt: skip
    ranges = read_ranges([export])
    assert ranges.gpu_ns == (1_500, 2_500, None) and ranges.files[0].kernels == 2
    result = report(export)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split("GPU-projected time per range (2 CUDA kernels; as nsys's nvtxgpuproj):\n")[1].splitlines()
    assert lines[0].split() == ["Instances", "CPU", "Total", "CPU", "Med", "GPU", "n", "GPU", "Proj", "Total", "GPU", "Proj", "Med", "Range"]
    assert lines[2].split() == ["2", "10.0", "us", "5.0", "us", "2", "4.0", "us", "2.0", "us", "nvtx_regions:transformer.h.0"]
    assert lines[3].split() == ["1", "1.0", "us", "1.0", "us", "0", "-", "-", "nvtx_regions:idle"]


# ------------------------------------------------------------------ one format of a duration, in every table


@pytest.mark.parametrize(
    ("ns", "text"),
    [(0, "0 ns"), (812, "812 ns"), (999.6, "1.0 us"), (1_000, "1.0 us"), (182_940, "182.9 us"),
     (999_960, "1.00 ms"), (1_504_000, "1.50 ms"), (5_767_210_679, "5.77 s")],
)  # fmt: skip
def test_a_duration_reads_in_the_largest_unit_it_reaches(ns, text):
    assert format_duration(ns) == text


def test_a_ratio_keeps_three_digits_below_one_tenth():
    assert [format_ratio(r) for r in (1.594, 0.1, 0.000333, None)] == ["1.59", "0.10", "0.000333", "-"]


def test_a_reader_that_closes_the_pipe_early_stops_the_command_quietly():
    """``nvtx-regions ... | head -1``: no BrokenPipeError traceback, and the status of a process
    SIGPIPE ended (141), whether the pipe closes before the command writes or as it flushes."""
    process = subprocess.Popen(
        [sys.executable, "-m", "nvtx_regions", "grammar"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    process.stdout.close()  # the reader is gone before the first line
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) == 141, stderr
    assert stderr == "", stderr


@pytest.mark.skipif(bool(unavailable_reason()), reason=f"capture tool unavailable: {unavailable_reason()}")
def test_a_capture_cut_short_is_refused_as_cut_short(tmp_path, capsys):
    """A timeline whose writer was killed, or whose disk filled, ends mid-way: the message says so and
    asks for the run again, not for another kind of file."""
    from nvtx_regions.commands.main import main

    captured = capture_subprocess(
        """
        import nvtx
        for n in range(50):
            nvtx.push_range(f"step {n}", domain="nvtx_regions"); nvtx.push_range("block", domain="nvtx_regions")
            nvtx.pop_range(domain="nvtx_regions"); nvtx.pop_range(domain="nvtx_regions")
        """
    ).check()
    trace = tmp_path / "timeline.json"
    write_chrome_trace(captured, trace)
    whole = trace.read_bytes()
    assert main(["report", str(trace)]) == 0  # the positive control: the whole file reads
    assert "nvtx_regions:block" in capsys.readouterr().out
    for cut in (len(whole) // 2, len(whole) - 2, 1):
        trace.write_bytes(whole[:cut])
        assert main(["report", str(trace)]) == 1
        err = capsys.readouterr().err
        assert err == (
            f"nvtx-regions report: {trace}: cut short: its JSON ends mid-way, at byte {cut} (the run that wrote it was killed, "
            "or the disk filled); run that command again, to its end, with room on the disk\n"
        )
    trace.write_bytes(b"")
    assert main(["report", str(trace)]) == 1
    assert f"{trace}: empty (the run that wrote it was killed, or the disk filled)" in capsys.readouterr().err
    trace.write_bytes(whole[:-2] + b"]]")  # not cut short: wrong
    assert main(["report", str(trace)]) == 1
    assert "not JSON (" in capsys.readouterr().err


def test_a_name_among_folders_that_does_not_exist_is_named(tmp_path, capsys):
    from nvtx_regions.commands.main import main

    (tmp_path / "node0").mkdir()
    (tmp_path / "notes.txt").write_text("x")
    assert main(["report", str(tmp_path / "node0"), str(tmp_path / "nosuch")]) == 2
    assert capsys.readouterr().err == (
        f"nvtx-regions report: {tmp_path / 'nosuch'}: no such file or folder; give each node's output folder of "
        "'nvtx-regions profile' (its -o)\n"
    )
    assert main(["report", str(tmp_path / "nosuch")]) == 1  # no folder given: the reader says it
    assert f"{tmp_path / 'nosuch'}: no such file or folder; give reports (" in capsys.readouterr().err
    # The positive control: a file that exists, among folders, is another mistake.
    assert main(["report", str(tmp_path / "node0"), str(tmp_path / "notes.txt")]) == 2
    assert "notes.txt: a file among profile folders; give report files or profile folders, not both" in capsys.readouterr().err


def test_the_items_of_a_root_sequential_are_module_ranges(tmp_path):
    """``each module <*>`` on a ``Sequential`` names its items ``0``, ``1``: module paths, rows of the table."""
    trace = _trace(tmp_path / "t.json", [("step 0", "nvtx_regions.steps", 0, 100), ("0", "each module <*>", 1, 10),
                                         ("1", "each module <*>", 12, 10), ("1 (backward)", "each module <*>", 30, 20)])  # fmt: skip
    rows = {row.module: (row.forward, row.backward) for row in module_rows(read_ranges([str(trace)]).records)}
    assert rows == {"0": ((10_000,), ()), "1": ((10_000,), (20_000,))}  # and no "step 0"
