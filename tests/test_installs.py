"""One owner of every change nvtx_regions makes outside its own objects (`internals.installs`): a
process that used every backend and removed every handle is, in everything nvtx_regions may change
(torch.cuda.nvtx, nvtx, Dynamo's config and wrappers, the loggers, Inductor's code generation, torch.optim's
global hooks, thunder's classes and lookasides), what it was before, object by object; and a compile
after that makes its changes again and gives its ranges."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from nvtx_regions.internals import installs
from nvtx_regions.testing import capture_subprocess, unavailable_reason

WORKER = Path(__file__).resolve().parent / "workers" / "installs_snapshot.py"

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))


def _run(*args: str) -> tuple[dict, list]:
    result = capture_subprocess([__import__("sys").executable, str(WORKER), *args], timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1]), result.events


def _check(said: dict, events: list, thunder: bool) -> None:
    # The positive control: while the handles live, each kind of change is in place.
    changed = {"InstructionTranslatorBase", "torch._dynamo.convert_frame",
               "Scheduler", "CppScheduling", "PythonWrapperCodegen", "optimizer hooks"}  # fmt: skip
    if hasattr(torch._dynamo.config, "capture_profiler_record_function"):  # 2.11, 2.14: set while ours live
        changed.add("torch._dynamo.config")
    if thunder:
        changed |= {"thunder lookasides", "TraceCtx", "ThunderCompiler", "CompileData"}
    assert changed <= set(said["during"]), said["during"]
    # What other code's guards check: never replaced. The user's logging: never touched (2.8's dropped
    # record_function is heard where Dynamo traces it, not from its log).
    unchanged = {"torch.cuda.nvtx", "nvtx", "nvtx.nvtx", "nvtx.annotate", "Dynamo's handlers of torch functions", "loggers"}
    assert unchanged.isdisjoint(said["during"]), said["during"]
    assert said["after"] == []
    assert "the marker stand-ins" in said["made again"] and "Inductor's code generation" in said["made again"]
    again = {e.message for e in events if e.kind == "push" and e.domain == "again"}
    assert again == {"blocks.0", "blocks.1", "blocks.0 (backward)", "blocks.1 (backward)"}, again


@pytest.mark.slow
def test_the_last_remove_puts_back_everything_eager_and_inductor_changed():
    said, events = _run()
    _check(said, events, thunder=False)


@pytest.mark.slow
@pytest.mark.thunder
def test_the_last_remove_puts_back_everything_thunder_changed_too():
    said, events = _run("--thunder")
    _check(said, events, thunder=True)


def test_a_change_is_made_once_held_by_the_live_handles_and_put_back_by_the_last_release(monkeypatch):
    # The handles of this worker's other tests hold the process's changes: this test has its own log.
    monkeypatch.setattr(installs, "_made", {})
    monkeypatch.setattr(installs, "_holders", {})

    class Handle:
        pass

    class Owner:
        value = "theirs"

    first, second = Handle(), Handle()
    installs.hold(first)
    installs.hold(second)
    calls = []

    def apply(undo: installs.Undo) -> None:
        calls.append(1)
        undo.setattr(Owner, "value", "ours")

    installs.make("a test's change", apply)
    installs.make("a test's change", apply)
    assert calls == [1] and Owner.value == "ours" and installs.made("a test's change")
    installs.release(first)
    assert Owner.value == "ours"  # the second handle holds it
    del second  # collected: the last holder
    __import__("gc").collect()
    assert Owner.value == "theirs" and not installs.made("a test's change")
    installs.make("a test's change", apply)  # made again after that
    assert calls == [1, 1] and Owner.value == "ours"
    installs.put_back("a test's change")
    assert Owner.value == "theirs"


def test_a_holder_collected_while_a_compiler_traces_leaves_the_put_back_to_the_next_call(monkeypatch):
    """thunder's interpreter asserts that the module globals it read do not change while it traces, and a
    collection can come at any allocation: then the changes stay until nvtx_regions is next called."""
    monkeypatch.setattr(installs, "_made", {})
    monkeypatch.setattr(installs, "_holders", {})
    monkeypatch.setattr(installs, "_pending", False)

    class Handle:
        pass

    class Owner:
        value = "theirs"

    handle = Handle()
    installs.hold(handle)
    installs.make("a test's change", lambda undo: undo.setattr(Owner, "value", "ours"))
    monkeypatch.setattr(installs, "compiling_on_some_thread", lambda: True)
    del handle
    __import__("gc").collect()
    assert Owner.value == "ours"  # a compiler runs: not now
    installs.make("another change", lambda undo: None)  # still compiling: still not
    assert Owner.value == "ours"
    monkeypatch.setattr(installs, "compiling_on_some_thread", lambda: False)
    other = Handle()
    installs.hold(other)  # the next call, outside every compile, puts it back first
    assert Owner.value == "theirs" and not installs.made("a test's change")
    installs.release(other)
