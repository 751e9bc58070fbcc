"""The Chrome trace and the nvtx_sum-like summary, checked with a reader written
here from the Trace Event Format's documented fields, not with the writer's code.

Format fields (Google's "Trace Event Format"): ``ph`` phase ("X" complete
event with ``dur``, "i" instant with scope ``s``, "M" metadata, "b"/"e" a
nestable async pair matched by ``cat`` and ``id``), ``ts`` and ``dur`` in
microseconds, ``pid``, ``tid``, ``name``, ``cat``, ``args``.
"""

from __future__ import annotations

import io
import json
import statistics
from collections import Counter, defaultdict

import pytest

from nvtx_regions.capture import NvtxEvent, RangeRecord, summarize, to_chrome_trace, write_chrome_trace
from nvtx_regions.report.chrome_trace import load_chrome_trace
from nvtx_regions.testing import capture_subprocess, unavailable_reason


def read_chrome_trace(data: dict) -> dict:
    """An independent reader: validate every event's fields and types, check that
    complete events nest per process, thread and category (NVTX stacks are per
    thread and domain), and return {"ranges", "instants", "process_names", "thread_names",
    "async"}; "async" holds each b/e pair as the "b" event with its "dur" (µs) added."""
    assert isinstance(data, dict) and isinstance(data["traceEvents"], list)
    ranges, instants, process_names, thread_names = [], [], {}, {}
    begun, pairs = {}, []
    for ev in data["traceEvents"]:
        assert ev["ph"] in ("X", "i", "M", "b", "e"), ev
        if ev["ph"] in ("b", "e"):
            assert isinstance(ev["id"], str) and isinstance(ev["cat"], str) and isinstance(ev["ts"], (int, float)), ev
            key = (ev["pid"], ev["cat"], ev["id"])
            if ev["ph"] == "b":
                assert key not in begun, ev
                begun[key] = ev
            else:
                begin = begun.pop(key)
                assert begin["name"] == ev["name"] and ev["ts"] >= begin["ts"], (begin, ev)
                pairs.append({**begin, "dur": round(ev["ts"] - begin["ts"], 3)})
            continue
        assert isinstance(ev["pid"], int) and isinstance(ev["tid"], int), ev
        assert isinstance(ev["name"], str), ev
        if ev["ph"] == "M":
            assert ev["name"] in ("process_name", "process_sort_index", "thread_name"), ev
            if ev["name"] == "process_name":
                process_names[ev["pid"]] = ev["args"]["name"]
            elif ev["name"] == "thread_name":
                thread_names[(ev["pid"], ev["tid"])] = ev["args"]["name"]
            continue
        assert isinstance(ev["cat"], str) and isinstance(ev["args"], dict), ev
        assert isinstance(ev["ts"], (int, float)) and ev["ts"] > 0, ev
        if ev["ph"] == "X":
            assert isinstance(ev["dur"], (int, float)) and ev["dur"] >= 0, ev
            ranges.append(ev)
        else:
            assert ev["s"] in ("t", "p", "g"), ev
            instants.append(ev)
    by_stack = defaultdict(list)
    for ev in ranges:
        start = round(ev["ts"] * 1000)  # µs -> ns; the writer keeps 3 decimals
        by_stack[(ev["pid"], ev["tid"], ev["cat"])].append((start, start + round(ev["dur"] * 1000), ev))
    for spans in by_stack.values():
        spans.sort(key=lambda s: (s[0], -s[1]))
        open_ = []
        for start, end, ev in spans:
            while open_ and open_[-1][1] <= start and not (open_[-1][0] <= start and end <= open_[-1][1]):
                open_.pop()
            if open_:
                parent = open_[-1]
                assert parent[0] <= start and end <= parent[1], f"{ev} overlaps {parent[2]} without nesting"
                assert ev["args"]["depth"] == parent[2]["args"]["depth"] + 1, (ev, parent[2])
            else:
                assert ev["args"]["depth"] == 0, ev
            open_.append((start, end, ev))
    assert not begun, begun
    return {"ranges": ranges, "instants": instants, "process_names": process_names, "thread_names": thread_names, "async": pairs}


def E(kind, message=None, ts=0, *, domain=None, tid=1, pid=10, category=None, color=None, range_id=None):
    return NvtxEvent(kind, domain, message, color, category, tid, ts, range_id=range_id, pid=pid)


SYNTHETIC = [
    E("name_category", "rule-a", 0, domain="d", category=3),
    E("name_thread", None, 0),
    E("push", "outer", 1_000, domain="d", category=3, color=0xFF102030),
    E("push", "inner", 1_500, domain="d"),
    E("push", "other domain", 1_600),  # default domain: its own stack
    E("pop", None, 2_000, domain="d"),
    E("mark", "here", 2_100, domain="d"),
    E("pop", None, 2_500),
    E("push", "inner", 3_000, domain="d"),
    E("pop", None, 3_250, domain="d"),
    E("pop", None, 4_000, domain="d"),
    E("start", "async", 4_100, range_id=7),
    E("end", None, 4_600, tid=2, range_id=7),
    E("push", "left open", 5_000, domain="d", tid=2),
    E("pop", None, 6_000),  # a pop with nothing open: dropped
]


def test_synthetic_events_become_documented_chrome_fields():
    data = to_chrome_trace(SYNTHETIC)
    json.dumps(data)  # plain JSON
    seen = read_chrome_trace(data)
    got = sorted((ev["name"], ev["cat"], ev["ts"], ev["dur"], ev["args"]["depth"]) for ev in seen["ranges"])
    assert got == sorted(
        [
            ("outer", "d", 1.0, 3.0, 0),
            ("inner", "d", 1.5, 0.5, 1),
            ("inner", "d", 3.0, 0.25, 1),
            ("other domain", "NVTX", 1.6, 0.9, 0),
            ("left open", "d", 5.0, 1.0, 0),  # closed at the process's last timestamp
        ]
    )
    # A start/end range is an async pair, on its own track: not on its thread's stack.
    (start_end,) = seen["async"]
    assert (start_end["name"], start_end["cat"], start_end["ts"], start_end["dur"]) == ("async", "NVTX", 4.1, 0.5)
    assert start_end["args"]["style"] == "StartEnd" and start_end["id"] == "10:7"
    outer = next(ev for ev in seen["ranges"] if ev["name"] == "outer")
    assert outer["args"] == {"domain": "d", "color": "#102030", "nvtx_category": "rule-a", "depth": 0, "style": "PushPop"}
    left = next(ev for ev in seen["ranges"] if ev["name"] == "left open")
    assert left["args"]["unclosed"] is True and left["tid"] == 2
    (mark,) = seen["instants"]
    assert (mark["name"], mark["cat"], mark["ts"], mark["s"]) == ("here", "d", 2.1, "t")
    assert seen["process_names"] == {10: "pid 10"}
    assert seen["thread_names"] == {(10, 1): "thread 1", (10, 2): "thread 2"}


def test_load_chrome_trace_gives_back_the_ranges_and_the_same_summary(tmp_path):
    path = tmp_path / "t.json"
    with open(path, "w") as f:
        write_chrome_trace(SYNTHETIC, f)
    loaded = load_chrome_trace(path)
    assert all(isinstance(r, RangeRecord) for r in loaded)
    assert str(summarize(loaded)) == str(summarize(SYNTHETIC))
    assert str(summarize(loaded, by="label")) == str(summarize(SYNTHETIC, by="label"))
    outer = next(r for r in loaded if r.message == "outer")
    assert (outer.domain, outer.category_name, outer.color, outer.start_ns, outer.end_ns) == ("d", "rule-a", 0x102030, 1000, 4000)
    assert {r.message for r in loaded if r.unclosed} == {"left open"}


def test_a_pid_or_tid_that_is_not_a_number_gets_a_negative_one_of_its_own():
    # PyTorch's profiler writes names where the format has process and thread ids.
    def X(name, pid, tid):
        return {"ph": "X", "name": name, "ts": 1.0, "dur": 2.0, "pid": pid, "tid": tid}

    events = [X("a", "Spans", "PyTorch Profiler"), X("b", 7, 7), X("c", "Spans", 7), X("d", "Other", "PyTorch Profiler")]
    assert [(r.message, r.pid, r.tid) for r in load_chrome_trace(events)] == [
        ("a", -1, -2), ("b", 7, 7), ("c", -1, 7), ("d", -3, -2),
    ]  # fmt: skip


def test_summary_columns_are_nvtx_sum_statistics():
    durations = [100, 250, 400, 1000, 1250]
    events = []
    t = 0
    for d in durations:
        events += [E("push", "step", t), E("pop", None, t + d)]
        t += d + 10
    events += [E("push", "once", t, domain="x"), E("pop", None, t + 50, domain="x")]
    summary = summarize(events)
    step, once = summary.rows
    assert step.range == ":step" and once.range == "x:once"  # nsys: domain:message, empty for the default
    assert step.instances == 5 and step.total_ns == sum(durations)
    assert step.med_ns == statistics.median(durations) and step.avg_ns == statistics.mean(durations)
    assert step.stddev_ns == pytest.approx(statistics.stdev(durations))  # sample standard deviation
    assert (step.min_ns, step.max_ns) == (100, 1250)
    assert once.stddev_ns == 0.0 and once.instances == 1
    assert step.time_pct == pytest.approx(100 * 3000 / 3050)
    lines = str(summary).splitlines()
    assert lines[0].split() == ["Time", "(%)", "Total", "Time", "(ns)", "Instances", "Avg", "(ns)", "Med", "(ns)",
                                "Min", "(ns)", "Max", "(ns)", "StdDev", "(ns)", "Style", "Range"]  # fmt: skip
    assert lines[2].split() == ["98.4", "3000", "5", "600.0", "400.0", "100", "1250", f"{statistics.stdev(durations):.1f}", "PushPop", ":step"]


def test_summary_by_label_groups_by_named_category():
    events = [
        E("name_category", "matmuls", 0, domain="d", category=1),
        E("push", "t1 = linear(a)", 10, domain="d", category=1),
        E("pop", None, 20, domain="d"),
        E("push", "t2 = linear(b)", 30, domain="d", category=1),
        E("pop", None, 60, domain="d"),
        E("push", "no category", 70, domain="d"),
        E("pop", None, 75, domain="d"),
    ]
    assert summarize(events).instances() == {("d", "t2 = linear(b)"): 1, ("d", "t1 = linear(a)"): 1, ("d", "no category"): 1}
    assert summarize(events, by="label").instances() == {("d", "matmuls"): 2, ("d", "no category"): 1}
    with pytest.raises(ValueError, match="by= must be one of"):
        summarize(events, by="module")


@pytest.mark.skipif(bool(unavailable_reason()), reason=f"capture tool unavailable: {unavailable_reason()}")
def test_real_capture_of_nvtx_and_torch_ranges_in_two_threads():
    result = capture_subprocess(
        """
        import threading, nvtx, torch
        nvtx.push_range("main outer", domain="app")
        def work():
            torch.cuda.nvtx.range_push("worker")
            nvtx.mark("tick")
            torch.cuda.nvtx.range_pop()
        t = threading.Thread(target=work); t.start(); t.join()
        with nvtx.annotate("main inner", domain="app", category="phase"):
            pass
        nvtx.pop_range(domain="app")
        """
    ).check()
    (proc,) = result.processes.values()
    seen = read_chrome_trace(to_chrome_trace(result))
    got = Counter((ev["name"], ev["cat"], ev["tid"] == proc.pid) for ev in seen["ranges"])
    assert got == Counter({("main outer", "app", True): 1, ("main inner", "app", True): 1, ("worker", "NVTX", False): 1})
    assert [ev["name"] for ev in seen["instants"]] == ["tick"]
    assert seen["thread_names"][(proc.pid, proc.pid)] == "main thread"
    pushes = Counter((e.domain, e.message) for e in proc.events if e.kind == "push")
    assert summarize(result).instances() == dict(pushes)
    inner = next(ev for ev in seen["ranges"] if ev["name"] == "main inner")
    assert inner["args"]["nvtx_category"] == "phase"
    buffer = io.StringIO()
    assert write_chrome_trace(result, buffer) == 4  # 3 ranges + 1 mark


def test_the_reader_rejects_ranges_that_overlap_without_nesting():
    def X(name, ts, dur, depth):
        return {"ph": "X", "name": name, "cat": "d", "ts": ts, "dur": dur, "pid": 1, "tid": 1, "args": {"depth": depth}}

    read_chrome_trace({"traceEvents": [X("a", 1.0, 2.0, 0), X("b", 1.5, 0.5, 1)]})
    with pytest.raises(AssertionError, match="overlaps"):
        read_chrome_trace({"traceEvents": [X("a", 1.0, 2.0, 0), X("b", 2.5, 1.0, 1)]})
    with pytest.raises(AssertionError):
        read_chrome_trace({"traceEvents": [X("a", 1.0, 2.0, 0), X("b", 1.5, 0.5, 0)]})  # wrong depth


@pytest.mark.skipif(bool(unavailable_reason()), reason=f"capture tool unavailable: {unavailable_reason()}")
def test_real_start_end_ranges_that_overlap(tmp_path):
    """nvtxDomainRangeStartEx/End (the nvtx package's start_range/end_range) captured: two
    overlapping start/end ranges and a push/pop between them, in the events, the Chrome
    trace (async pairs, apart from the thread's stack), the summary and `compare`."""
    from nvtx_regions.report.compare import compare
    from nvtx_regions.testing import check_balanced, start_end_ranges

    result = capture_subprocess(
        """
        import time, nvtx
        first = nvtx.start_range("first", domain="se", color="red", category="layer")
        time.sleep(0.002)
        second = nvtx.start_range("second", domain="se")
        nvtx.end_range(first)
        nvtx.push_range("pushed", domain="se")
        nvtx.pop_range(domain="se")
        nvtx.end_range(second)
        """
    ).check()
    (proc,) = result.processes.values()
    check_balanced(proc.events)
    first, second = start_end_ranges(proc.events, domain="se")
    assert (first.message, second.message) == ("first", "second")
    assert first.start_ns < second.start_ns < first.end_ns < second.end_ns  # they overlap
    seen = read_chrome_trace(to_chrome_trace(result))
    assert [ev["name"] for ev in seen["ranges"]] == ["pushed"]
    pairs = {ev["name"]: ev for ev in seen["async"]}
    assert sorted(pairs) == ["first", "second"]
    assert pairs["first"]["cat"] == "se" and pairs["first"]["args"]["color"] == "#ff0000"
    assert pairs["first"]["args"]["nvtx_category"] == "layer" and pairs["first"]["args"]["style"] == "StartEnd"
    assert pairs["first"]["dur"] == pytest.approx(first.duration_ns / 1000, abs=0.002)
    summary = summarize(result)
    styles = {(r.name, r.style) for r in summary.rows if r.domain == "se"}
    assert styles == {("first", "StartEnd"), ("second", "StartEnd"), ("pushed", "PushPop")}
    assert any(line.rstrip().endswith("StartEnd  se:first") for line in str(summary).splitlines())
    path = tmp_path / "se.json"
    with open(path, "w") as f:
        write_chrome_trace(result, f)
    assert str(summarize(load_chrome_trace(path))) == str(summary)
    rows = {row.name: row for row in compare(path, path, domain="se")}
    assert sorted(rows) == ["first", "pushed", "second"]
    assert rows["first"].count_a == rows["first"].count_b == 1
    assert rows["first"].median_a_us == pytest.approx(first.duration_ns / 1000, abs=0.002)
