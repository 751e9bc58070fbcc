"""Tests of nvtx_regions.testing: the NVTX capture tool and the helpers around it.

Everything that needs the tool runs NVTX in child processes, since NVTX fixes
its tool at a process's first call; the pure helpers are tested on synthetic events.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

import nvtx_regions.capture
import nvtx_regions.testing
from nvtx_regions.capture import CapturedProcessFailed, CaptureNotAttached, CaptureUnavailable, build_tool, is_balanced
from nvtx_regions.testing import (
    NvtxEvent,
    UnbalancedRanges,
    balance_problems,
    capture_subprocess,
    check_balanced,
    flatten,
    range_tree,
    start_end_ranges,
    unavailable_reason,
)
from nvtx_regions.capture.build import find_nvtx_include

RANGE_KINDS = ("push", "pop", "start", "end", "mark")


@pytest.fixture(scope="module")
def tool() -> Path:
    """The built tool; skips (with the reason) where it cannot be built."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"NVTX capture tool unavailable: {reason}")
    return build_tool()


def _json_line(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def _only_process(result):
    assert len(result.processes) == 1, result.processes
    (proc,) = result.processes.values()
    return proc


def _plain_env(**changes: str) -> dict[str, str]:
    """This process's environment without any NVTX tool (the plugin may have set one)."""
    drop = ("NVTX_INJECTION64_PATH", "NVTX_REGIONS_CAPTURE_DIR", "NVTX_REGIONS_CAPTURE_MODE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(changes)
    return env


def _run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=_plain_env(**env),
        timeout=60,
    )


# ------------------------------------------------------------------ subprocess capture

MAIN_SCRIPT = """
import json, threading, time
import nvtx
import torch

t0 = time.monotonic_ns()
d = nvtx.get_domain("my.domain")
assert type(d).__name__ == "Domain", type(d)  # not DummyDomain: the tool is attached
nvtx.push_range("outer", color=0xFF00FF00)
d.push_range(d.get_event_attributes(message="dom-range", color=0xFF112233, category=5, payload=42))
nvtx.mark("a mark", color=0xFFABCDEF)
rid = nvtx.start_range("startend", domain="my.domain")
rs = d.get_registered_string("registered!")
attrs = d.get_event_attributes(color=0xFF000001)
d.set_event_attributes(attrs, message=rs)
d.push_range(attrs)
d.pop_range()
nvtx.push_range("ünïcødé ✓")
nvtx.pop_range()
nvtx.end_range(rid)
d.pop_range()
nvtx.pop_range()
depths = [torch.cuda.nvtx.range_push("t.outer"), torch.cuda.nvtx.range_push("t.inner")]
torch.cuda.nvtx.mark("t.mark")
depths += [torch.cuda.nvtx.range_pop(), torch.cuda.nvtx.range_pop()]

# In-process capture works here too: the tool is attached (by capture_subprocess).
from nvtx_regions.testing import attach, capture
attach()
with capture() as inproc:
    torch.cuda.nvtx.mark("inproc")
inproc = [(e.kind, e.message) for e in inproc]
print(json.dumps({"tid": threading.get_native_id(), "t0": t0, "t1": time.monotonic_ns(), "depths": depths,
                  "inproc": inproc}))
"""


def test_subprocess_captures_nvtx_package_and_torch(tool):
    result = capture_subprocess(MAIN_SCRIPT, timeout=90).check()
    out = _json_line(result.stdout)
    proc = _only_process(result)
    assert proc.complete and proc.mode == "events" and proc.rank is None

    ranged = [
        (e.kind, e.domain, e.message, e.color, e.category, e.depth)
        for e in result.events
        if e.kind in RANGE_KINDS
    ]
    assert ranged == [
        ("push", None, "outer", 0xFF00FF00, None, 0),
        ("push", "my.domain", "dom-range", 0xFF112233, 5, 0),
        ("mark", None, "a mark", 0xFFABCDEF, None, None),
        ("start", "my.domain", "startend", 0x0000FF, None, None),  # nvtx's default color: "blue"
        ("push", "my.domain", "registered!", 0xFF000001, None, 1),
        ("pop", "my.domain", None, None, None, 1),
        ("push", None, "ünïcødé ✓", 0x0000FF, None, 1),
        ("pop", None, None, None, None, 1),
        ("end", "my.domain", None, None, None, None),
        ("pop", "my.domain", None, None, None, 0),
        ("pop", None, None, None, None, 0),
        ("push", None, "t.outer", None, None, 0),  # torch.cuda.nvtx: nvtxRangePushA, no color
        ("push", None, "t.inner", None, None, 1),
        ("mark", None, "t.mark", None, None, None),
        ("pop", None, None, None, None, 1),
        ("pop", None, None, None, None, 0),
        ("mark", None, "inproc", None, None, None),  # and not capture()'s probe marks
    ]
    assert out["inproc"] == [["mark", "inproc"]]
    # What torch's range_push/range_pop returned is what the tool answered.
    assert out["depths"] == [0, 1, 1, 0]

    events = result.events
    (create,) = [e for e in events if e.kind == "domain_create"]
    assert create.domain == "my.domain"
    registered = [(e.domain, e.message) for e in events if e.kind == "register_string"]
    assert (None, "outer") in registered and ("my.domain", "registered!") in registered
    (push,) = [e for e in events if e.message == "dom-range" and e.kind == "push"]
    assert push.payload == 42
    start, end = [e for e in events if e.kind in ("start", "end")]
    assert start.range_id == end.range_id and start.range_id is not None

    assert {e.tid for e in events if e.kind in RANGE_KINDS} == {out["tid"]}
    assert {e.pid for e in events} == {proc.pid}
    stamps = [e.ts_ns for e in events if e.kind in RANGE_KINDS]
    assert stamps == sorted(stamps) and stamps[0] < stamps[-1]
    assert out["t0"] <= stamps[0] and stamps[-1] <= out["t1"]  # same clock as time.monotonic_ns

    tree = range_tree(events)
    assert flatten(tree) == [
        (0, None, "outer"),
        (1, None, "ünïcødé ✓"),
        (0, "my.domain", "dom-range"),
        (1, "my.domain", "registered!"),
        (0, None, "t.outer"),
        (1, None, "t.inner"),
    ]
    assert flatten(range_tree(events, domain="my.domain")[out["tid"]]) == [
        (0, "my.domain", "dom-range"),
        (1, "my.domain", "registered!"),
    ]
    (se,) = start_end_ranges(events)
    assert se.message == "startend" and se.end_ns is not None and se.end_ns > se.start_ns
    check_balanced(events)
    assert proc.counts["push"] == 6 and proc.counts["pop"] == 6 and proc.counts["mark"] == 3


WIDE_CLIENT = r"""
#include <nvtx3/nvToolsExt.h>
#include <stdio.h>

int main(void) {
    nvtxDomainHandle_t d = nvtxDomainCreateW(L"wide.domain \u2713");
    nvtxNameOsThreadA(1234, "worker");
    nvtxDomainNameCategoryW(d, 7, L"cat \u2713");
    int l0 = nvtxRangePushW(L"wide \u2713 \U0001F600");
    nvtxMarkW(L"wide mark");
    nvtxStringHandle_t s = nvtxDomainRegisterStringW(d, L"reg wide \u00e9");
    nvtxEventAttributes_t a = {0};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
    a.message.registered = s;
    a.payloadType = NVTX_PAYLOAD_TYPE_DOUBLE;
    a.payload.dValue = 2.5;
    int l1 = nvtxDomainRangePushEx(d, &a);
    nvtxEventAttributes_t b = {0};
    b.version = NVTX_VERSION;
    b.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    b.messageType = NVTX_MESSAGE_TYPE_UNICODE;
    b.message.unicode = L"ex \"quoted\"\n\u2713";
    b.colorType = NVTX_COLOR_ARGB;
    b.color = 0x80FF0000u;
    b.category = 3;
    b.payloadType = NVTX_PAYLOAD_TYPE_INT32;
    b.payload.iValue = -7;
    nvtxRangeId_t r = nvtxRangeStartEx(&b);
    nvtxRangeEnd(r);
    int p1 = nvtxDomainRangePop(d);
    int p0 = nvtxRangePop();
    int extra = nvtxRangePop();
    printf("%d %d %d %d %d\n", l0, l1, p1, p0, extra);
    return 0;
}
"""


def test_wide_strings_and_core_api_from_c(tool, tmp_path):
    src = tmp_path / "client.c"
    src.write_text(WIDE_CLIENT)
    exe = tmp_path / "client"
    cc = subprocess.run(
        ["cc", f"-I{find_nvtx_include()}", str(src), "-o", str(exe), "-ldl", "-pthread"],
        capture_output=True,
        text=True,
    )
    if cc.returncode != 0:
        pytest.skip(f"cannot build the C test client: {cc.stderr}")
    result = capture_subprocess([str(exe)]).check()
    # Push returns the 0-based level opened, pop the level closed, -1 when nothing is open.
    assert result.stdout.split() == ["0", "0", "0", "0", "-1"]
    got = [(e.kind, e.domain, e.message) for e in result.events]
    wd = "wide.domain \u2713"
    assert got == [
        ("domain_create", wd, None),
        ("name_thread", None, "worker"),
        ("name_category", wd, "cat \u2713"),
        ("push", None, "wide \u2713 \U0001f600"),
        ("mark", None, "wide mark"),
        ("register_string", wd, "reg wide \u00e9"),
        ("push", wd, "reg wide \u00e9"),
        ("start", None, 'ex "quoted"\n\u2713'),
        ("end", None, None),
        ("pop", wd, None),
        ("pop", None, None),
        ("pop", None, None),
    ]
    by_kind = {}
    for e in result.events:
        by_kind.setdefault(e.kind, e)
    assert by_kind["name_thread"].target_tid == 1234
    assert by_kind["name_category"].category == 7
    assert by_kind["start"].color == 0x80FF0000 and by_kind["start"].category == 3
    assert by_kind["start"].payload == -7
    assert [e.payload for e in result.events if e.kind == "push"] == [None, 2.5]
    problems = balance_problems(result.events)
    assert [(p.problem, p.domain) for p in problems] == [("pop_without_push", None)]


THREADS_SCRIPT = """
import json, threading, nvtx
barrier = threading.Barrier(2)
tids = {}

def nested(name):
    tids[name] = threading.get_native_id()
    nvtx.push_range(name + ".outer")
    barrier.wait()  # both threads now have a range open
    for i in range(2):
        nvtx.push_range(f"{name}.inner{i}")
        barrier.wait()
        nvtx.pop_range()
    nvtx.pop_range()

def hammer():
    for i in range(2000):
        nvtx.push_range("h")
        nvtx.mark("m")
        nvtx.pop_range()

threads = [threading.Thread(target=nested, args=(n,)) for n in "ab"]
threads += [threading.Thread(target=hammer) for _ in range(3)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(tids))
"""


def test_threads_get_separate_balanced_trees(tool):
    result = capture_subprocess(THREADS_SCRIPT).check()
    tids = _json_line(result.stdout)
    events = result.events
    check_balanced(events)
    tree = range_tree(events)
    assert len(tree) == 5
    for name in "ab":
        assert flatten(tree[tids[name]]) == [
            (0, None, f"{name}.outer"),
            (1, None, f"{name}.inner0"),
            (1, None, f"{name}.inner1"),
        ]
        # The tool's own per-thread depth agrees, though the threads interleaved.
        assert [e.depth for e in events if e.tid == tids[name] and e.kind == "push"] == [0, 1, 1]
    hammer_tids = set(tree) - set(tids.values())
    for tid in hammer_tids:
        assert flatten(tree[tid]) == [(0, None, "h")] * 2000
    proc = _only_process(result)
    assert proc.counts["push"] == 6 + 6000 and proc.counts["mark"] == 6000
    stamps = [e.ts_ns for e in events]
    assert stamps == sorted(stamps)  # recorded in time order across threads


UNBALANCED_SCRIPT = """
import nvtx
nvtx.push_range("closed"); nvtx.pop_range()
nvtx.push_range("left open")
nvtx.pop_range(domain="other")
nvtx.start_range("dangling")
"""


def test_unbalanced_ranges_are_reported(tool):
    events = capture_subprocess(UNBALANCED_SCRIPT).check().events
    problems = balance_problems(events)
    assert [(p.problem, p.domain, p.message) for p in problems] == [
        ("push_never_popped", None, "left open"),
        ("pop_without_push", "other", None),
        ("start_never_ended", None, "dangling"),
    ]
    assert not is_balanced(events)
    with pytest.raises(UnbalancedRanges, match="left open") as info:
        check_balanced(events)
    assert info.value.problems == problems
    (roots,) = range_tree(events).values()
    assert [(r.message, r.end_ns is None) for r in roots] == [("closed", False), ("left open", True)]
    (dangling,) = start_end_ranges(events)
    assert dangling.end_ns is None


def test_failed_child_is_reported_by_check(tool):
    result = capture_subprocess("""
        import sys
        sys.exit("boom")
    """)
    assert result.returncode == 1 and result.processes == {} and result.events == []
    with pytest.raises(CapturedProcessFailed, match="boom"):
        result.check()


def test_count_mode_counts_only(tool):
    code = """
        import nvtx
        for i in range(500):
            nvtx.push_range("x"); nvtx.mark("m"); nvtx.pop_range()
        nvtx.pop_range()
    """
    result = capture_subprocess(code, mode="count").check()
    proc = _only_process(result)
    assert proc.mode == "count" and proc.complete
    assert proc.events == ()
    assert result.counts["push"] == 500 and result.counts["pop"] == 501 and result.counts["mark"] == 500
    assert result.counts["register_string"] == 2  # nvtx caches its registered strings


FORK_SCRIPT = """
import os, nvtx
nvtx.push_range("parent")
pid = os.fork()
if pid == 0:
    nvtx.mark("in child")
    os._exit(0)  # no atexit: the child's file has no end record
os.waitpid(pid, 0)
nvtx.pop_range()
print(pid)
"""


def test_forked_child_writes_its_own_file(tool):
    result = capture_subprocess(FORK_SCRIPT).check()
    child_pid = int(result.stdout.split()[-1])
    assert len(result.processes) == 2
    child = result.processes[child_pid]
    (parent,) = [p for p in result.processes.values() if p.pid != child_pid]
    assert [(e.kind, e.message) for e in child.events if e.kind in RANGE_KINDS] == [("mark", "in child")]
    assert not child.complete and child.ppid == parent.pid
    assert [(e.kind, e.message) for e in parent.events if e.kind in RANGE_KINDS] == [
        ("push", "parent"),
        ("pop", None),
    ]
    assert parent.complete and parent.counts["mark"] == 0


TORCHRUN_SCRIPT = """
import os, torch
torch.cuda.nvtx.range_push(f"rank{os.environ['RANK']}")
torch.cuda.nvtx.mark("step")
torch.cuda.nvtx.range_pop()
"""


def test_torchrun_workers_are_captured_per_rank(tool, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(TORCHRUN_SCRIPT)
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    result = capture_subprocess(argv, timeout=120).check()
    ranks = result.by_rank()
    assert sorted(ranks) == [0, 1]
    assert ranks[0].pid != ranks[1].pid
    for rank, proc in ranks.items():
        assert proc.world_size == 2 and proc.complete
        assert flatten(range_tree(proc.events)) == [(0, None, f"rank{rank}")]
        assert [e.message for e in proc.events if e.kind == "mark"] == ["step"]


# ------------------------------------------------------------------ in-process capture

IN_PROCESS_SCRIPT = """
import json, nvtx
from nvtx_regions.testing import attach, capture
from nvtx_regions.capture import is_attached
attach()
assert is_attached()
nvtx.push_range("before"); nvtx.pop_range()
with capture() as outer:
    nvtx.push_range("a")
    with capture() as inner:
        nvtx.mark("m")
    nvtx.pop_range()
nvtx.push_range("after"); nvtx.pop_range()
with capture() as again:
    nvtx.push_range("b"); nvtx.pop_range()
pick = lambda evs: [(e.kind, e.message) for e in evs if e.kind in ("push", "pop", "mark")]
print(json.dumps({"outer": pick(outer), "inner": pick(inner), "again": pick(again), "counts": outer.counts}))
"""


def test_in_process_capture_after_attach(tool):
    out = _run_python(IN_PROCESS_SCRIPT)
    assert out.returncode == 0, out.stderr
    got = _json_line(out.stdout)
    assert got["outer"] == [["push", "a"], ["mark", "m"], ["pop", None]]
    assert got["inner"] == [["mark", "m"]]
    assert got["again"] == [["push", "b"], ["pop", None]]
    assert got["counts"]["push"] == 1 and got["counts"]["mark"] == 1


def test_in_process_count_mode(tool):
    out = _run_python(
        """
        import json, nvtx
        from nvtx_regions.testing import attach, capture
        attach(mode="count")
        with capture() as events:
            for _ in range(3):
                nvtx.push_range("x"); nvtx.pop_range()
        print(json.dumps({"n": len(events), "mode": events.mode, "counts": events.counts}))
        """
    )
    assert out.returncode == 0, out.stderr
    got = _json_line(out.stdout)
    assert got["n"] == 0 and got["mode"] == "count"
    assert got["counts"]["push"] == 3 and got["counts"]["pop"] == 3


def test_capture_without_attach_raises(tool):
    out = _run_python(
        """
        from nvtx_regions.testing import capture
        from nvtx_regions.capture import CaptureNotAttached
        try:
            with capture():
                pass
        except CaptureNotAttached as e:
            print("raised:", e)
        """
    )
    assert out.returncode == 0, out.stderr
    assert "raised:" in out.stdout and "attach()" in out.stdout


def test_attach_after_first_nvtx_call_raises(tool):
    out = _run_python(
        """
        import nvtx
        nvtx.push_range("too early"); nvtx.pop_range()
        from nvtx_regions.testing import attach
        from nvtx_regions.capture import CaptureNotAttached
        try:
            attach()
        except CaptureNotAttached as e:
            print("raised:", e)
        """
    )
    assert out.returncode == 0, out.stderr
    assert "raised:" in out.stdout and "nvtx package" in out.stdout
    assert "before the first NVTX call" in out.stdout


PLUGIN_TEST = """
import threading
import nvtx
from nvtx_regions.testing import flatten, range_tree

def test_fixture(nvtx_capture):
    with nvtx_capture() as events:
        nvtx.push_range("p")
        nvtx.pop_range()
    assert flatten(range_tree(events)[threading.get_native_id()]) == [(0, None, "p")]
"""


def _run_plugin_test(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_plugin_use.py").write_text(PLUGIN_TEST)
    argv = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider"]
    argv += ["-p", "nvtx_regions.testing.pytest_plugin", "test_plugin_use.py"]
    env = _plain_env(**env)
    return subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=60)


def test_pytest_plugin_fixture(tool, tmp_path):
    out = _run_plugin_test(tmp_path)
    assert "1 passed" in out.stdout, out.stdout + out.stderr


def test_pytest_plugin_skips_without_compiler(tmp_path):
    out = _run_plugin_test(tmp_path, CC="/nonexistent/cc", NVTX_REGIONS_CACHE=str(tmp_path / "cache"))
    assert "1 skipped" in out.stdout, out.stdout + out.stderr
    assert "NVTX capture unavailable" in out.stdout and "/nonexistent/cc" in out.stdout


def test_fixture_in_this_process(request):
    """Runs when the lead's conftest enables the plugin; skips otherwise."""
    try:
        nvtx_capture = request.getfixturevalue("nvtx_capture")
    except pytest.FixtureLookupError:
        pytest.skip("nvtx_regions.testing.pytest_plugin is not enabled in this session")
    import nvtx

    with nvtx_capture() as events:
        nvtx.push_range("here")
        nvtx.pop_range()
    assert flatten(range_tree(events)[threading.get_native_id()]) == [(0, None, "here")]


# ------------------------------------------------------------------ building the tool


def test_missing_compiler_raises_capture_unavailable(monkeypatch, tmp_path):
    monkeypatch.setenv("NVTX_REGIONS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with pytest.raises(CaptureUnavailable, match="/nonexistent/cc") as info:
        build_tool()
    assert isinstance(info.value, RuntimeError)
    assert "install a C compiler" in str(info.value)
    assert "/nonexistent/cc" in unavailable_reason()
    with pytest.raises(CaptureUnavailable):
        capture_subprocess("pass")
    assert not (tmp_path / "cache").exists()


def test_missing_headers_raise_capture_unavailable(monkeypatch, tmp_path):
    monkeypatch.setenv("NVTX_REGIONS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("NVTX_REGIONS_NVTX_INCLUDE", str(tmp_path))
    monkeypatch.setenv("CC", sys.executable)  # any existing program: the headers are checked before it runs
    with pytest.raises(CaptureUnavailable, match="NVTX_REGIONS_NVTX_INCLUDE"):
        build_tool()
    with pytest.raises(CaptureUnavailable, match="directory that contains the nvtx3/"):
        find_nvtx_include()


def test_failing_compiler_output_is_reported(monkeypatch, tmp_path):
    monkeypatch.setenv("NVTX_REGIONS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", "false")
    with pytest.raises(CaptureUnavailable, match="building the NVTX capture tool failed"):
        build_tool()
    assert list((tmp_path / "cache").iterdir()) == []  # no partial library left behind


def test_concurrent_builds_share_one_cached_library(tool, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    code = "from nvtx_regions.capture import build_tool; print(build_tool())"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            text=True,
            env=_plain_env(NVTX_REGIONS_CACHE=str(cache)),
        )
        for _ in range(2)
    ]
    paths = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert paths[0] == paths[1] and Path(paths[0]).parent == cache
    assert [f.name for f in cache.iterdir()] == [Path(paths[0]).name]  # no temp files left
    monkeypatch.setenv("NVTX_REGIONS_CACHE", str(cache))
    mtime = Path(paths[0]).stat().st_mtime_ns
    assert str(build_tool()) == paths[0]  # cached: same key, no rebuild
    assert Path(paths[0]).stat().st_mtime_ns == mtime


# ------------------------------------------------------------------ helpers on synthetic events


def _ev(kind, message=None, *, tid=1, ts, domain=None, range_id=None, pid=7):
    return NvtxEvent(kind, domain, message, None, None, tid, ts, range_id=range_id, pid=pid)


def test_range_tree_nests_per_thread_and_domain():
    events = [
        _ev("push", "a", ts=1),
        _ev("push", "x", ts=2, domain="d"),
        _ev("push", "b", ts=3),
        _ev("push", "other-thread", ts=4, tid=2),
        _ev("pop", ts=5),
        _ev("pop", ts=6, domain="d"),
        _ev("pop", ts=7),
    ]
    tree = range_tree(events)
    assert sorted(tree) == [1, 2]
    assert flatten(tree[1]) == [(0, None, "a"), (1, None, "b"), (0, "d", "x")]
    a, x = tree[1]
    assert (a.start_ns, a.end_ns, a.children[0].end_ns, x.end_ns) == (1, 7, 5, 6)
    assert tree[2][0].end_ns is None
    with pytest.raises(ValueError, match="2 threads"):
        flatten(tree)
    assert flatten(range_tree([])) == []
    assert [(p.problem, p.tid, p.message) for p in balance_problems(events)] == [
        ("push_never_popped", 2, "other-thread")
    ]


def test_balance_problems_on_start_end():
    events = [
        _ev("start", "s1", ts=1, range_id=1),
        _ev("end", ts=2, range_id=2, tid=3),
        _ev("end", ts=3, range_id=1, tid=2),  # ending on another thread is fine
    ]
    problems = balance_problems(events)
    assert [(p.problem, p.range_id) for p in problems] == [("end_without_start", 2)]
    assert "end without start" in str(problems[0]) and "thread 3" in str(problems[0])
    (r,) = start_end_ranges(events)
    assert (r.message, r.start_ns, r.end_ns) == ("s1", 1, 3)


def test_capture_not_attached_is_runtime_error():
    assert issubclass(CaptureNotAttached, RuntimeError) and issubclass(CaptureUnavailable, RuntimeError)


def test_testing_is_a_small_face_of_capture():
    # What a test needs, nothing more; every name is capture's own object, and capture has the rest.
    testing, capture_package = nvtx_regions.testing, nvtx_regions.capture
    assert sorted(testing.__all__) == [
        "NvtxEvent", "Range", "UnbalancedRanges", "all_ranges", "attach", "balance_problems", "capture", "capture_subprocess",
        "check_balanced", "continues", "flatten", "range_tree", "start_end_ranges", "unavailable_reason",
    ]  # fmt: skip
    # `continues` reads a range's name: naming's own, which capture does not need.
    assert [n for n in testing.__all__ if getattr(testing, n) is not getattr(capture_package, n, None)] == ["continues"]
    assert testing.continues is nvtx_regions.core.naming.continues
    assert {"CaptureResult", "ProcessCapture", "build_tool", "summarize", "to_chrome_trace"} <= set(capture_package.__all__)
    assert [n for n in capture_package.__all__ if not hasattr(capture_package, n)] == []


def test_all_ranges_gives_push_pop_and_start_end_ranges_alike_in_start_order():
    from nvtx_regions.capture import NvtxEvent
    from nvtx_regions.testing import all_ranges

    def event(kind, ts, message=None, domain="d", range_id=None, tid=1):
        return NvtxEvent(kind=kind, domain=domain, message=message, color=None, category=None, tid=tid, ts_ns=ts, range_id=range_id)

    events = [
        event("push", 1, "outer"),
        event("start", 2, "interleaved", range_id=7),
        event("push", 3, "inner"),
        event("pop", 4),
        event("push", 5, "other domain", domain="e"),
        event("pop", 6, domain="e"),
        event("end", 8, range_id=7, tid=2),  # ended on another thread
        event("pop", 9),
    ]
    found = all_ranges(events, domain="d")
    assert [(r.message, r.depth, r.start_ns, r.end_ns) for r in found] == [
        ("outer", 0, 1, 9), ("interleaved", 0, 2, 8), ("inner", 1, 3, 4),
    ]  # fmt: skip
    outer, interleaved, inner = found
    assert outer.holds(inner) and outer.holds(interleaved) and interleaved.holds(inner)
    assert not inner.holds(outer)
    assert len(all_ranges(events)) == 4  # every domain
