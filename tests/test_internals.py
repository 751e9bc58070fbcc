"""The patches to thunder (`nvtx_regions.internals.patches`): installed by the
first transform, never at import; `uninstall()` restores exactly what was
there; module and marker attribution work after a fresh install and after
uninstall + install; a patch that cannot be applied, or fails while thunder
traces, is reported; thunder and torch outside the tested versions warn once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import thunder
import torch
from thunder.core.transform_common import Transform

from nvtx_regions import NvtxRegionsWarning
from nvtx_regions.attribution.recording import install_module_recorder, uninstall_module_recorder
from nvtx_regions.attribution.traceview import TraceView
from nvtx_regions.internals import patches, recorder, versions

pytestmark = pytest.mark.thunder  # the whole file needs lightning-thunder


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 2)

    def forward(self, x):
        with torch.cuda.nvtx.range("block"):
            h = torch.relu(self.fc1(x))
        return self.fc2(h)


class Keep(Transform):
    """Keeps the traces post-optimization transforms get (and installs nothing)."""

    def __init__(self):
        self.traces = []

    def transform_trace_post_optimization(self, trace, **kwargs):
        self.traces.append(trace)
        return trace


def attribution():
    """(op name, innermost module path, markers open) per op of a fresh Net's forward trace, and whether
    thunder's result equals eager's."""
    torch.manual_seed(0)
    net, keep, x = Net(), Keep(), torch.randn(3, 4)
    out = thunder.jit(net, transforms=[keep])(x)
    view = TraceView.from_trace(keep.traces[0])
    ops = [
        [op.name, chain[-1].path if chain else None, [m.message for m in markers]]
        for op, chain, markers in zip(view.ops, view.module_chains, view.marker_stacks)
    ]
    return ops, bool(torch.equal(out, net(x)))


# Every op of Net's forward: the module that ran it, and the marker open around it.
ATTRIBUTED = [["linear", "fc1", ["block"]], ["gt", "", ["block"]], ["where", "", ["block"]], ["linear", "fc2", []]]


def thunder_state():
    """What the patches change: the three objects, compared by identity."""
    from thunder.core.jit_ext import _general_jit_lookaside_map
    from thunder.core.trace import TraceCtx
    from thunder.dynamo.compiler import ThunderCompiler

    return (
        vars(TraceCtx)["set_current_source_location"],
        dict(_general_jit_lookaside_map),
        vars(ThunderCompiler)["__call__"],
    )


def same(a, b) -> bool:
    return a[0] is b[0] and a[2] is b[2] and a[1].keys() == b[1].keys() and all(a[1][k] is b[1][k] for k in a[1])


@pytest.fixture
def pristine():
    """Thunder as it is without nvtx_regions; the patches are back in place afterwards."""
    uninstall_module_recorder()
    yield thunder_state()
    uninstall_module_recorder()
    install_module_recorder()


def test_import_patches_nothing_and_the_first_transform_installs():
    code = textwrap.dedent(
        f"""
        import json, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from thunder.core.jit_ext import _general_jit_lookaside_map
        from thunder.core.trace import TraceCtx
        from thunder.dynamo.compiler import ThunderCompiler

        before = (vars(TraceCtx)["set_current_source_location"], dict(_general_jit_lookaside_map), vars(ThunderCompiler)["__call__"])
        import test_internals as t  # imports nvtx_regions' attribution and internals
        import nvtx_regions, nvtx_regions.emission.transform
        result = {{"import": t.same(t.thunder_state(), before)}}
        nvtx_regions.NvtxProfileTransform("all")
        after = t.thunder_state()
        result["installed"] = [after[0] is not before[0], after[1] != before[1], after[2] is not before[2]]
        result["wrapped"] = after[0].__wrapped__ is before[0] and after[2].__wrapped__ is before[2]
        result["fresh"] = t.attribution()
        t.patches.uninstall()
        result["uninstalled"] = t.same(t.thunder_state(), before)
        print(json.dumps(result))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {
        "import": True,
        "installed": [True, True, True],
        "wrapped": True,
        "fresh": [ATTRIBUTED, True],
        "uninstalled": True,
    }


def test_uninstall_restores_exactly_and_install_again_attributes(pristine):
    assert patches.installed() == ()
    ops, equal = attribution()
    assert equal and ops == [[name, None, []] for name, *_ in ATTRIBUTED]  # nothing records without the patches

    install_module_recorder()
    assert len(patches.installed()) == len(patches.PATCHES)
    assert not same(thunder_state(), pristine)
    install_module_recorder()  # once: a second install changes nothing
    first = thunder_state()
    assert attribution() == (ATTRIBUTED, True)

    uninstall_module_recorder()
    assert same(thunder_state(), pristine)
    uninstall_module_recorder()  # nothing left to undo
    assert same(thunder_state(), pristine)

    install_module_recorder()
    again = thunder_state()
    assert again[0] is not first[0] and again[0].__wrapped__ is pristine[0]
    assert attribution() == (ATTRIBUTED, True)


def test_a_patch_that_cannot_be_applied_says_what_is_lost(pristine, monkeypatch):
    from thunder.core.trace import TraceCtx

    with monkeypatch.context() as m:
        m.delattr(TraceCtx, "set_current_source_location")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            install_module_recorder()
        assert [p.name for p in patches.PATCHES[1:]] == list(patches.installed())
        uninstall_module_recorder()
    messages = [str(w.message) for w in caught if issubclass(w.category, NvtxRegionsWarning)]
    assert len(messages) == 1, messages
    assert messages[0].startswith("nvtx_regions cannot patch thunder.core.trace.TraceCtx.set_current_source_location (AttributeError")
    assert "`module`, `class`, `each module` and `marker` rules select nothing" in messages[0]
    assert "install those, or drop the rules that need it" in messages[0]
    assert caught[0].filename == __file__  # the line that asked for the install
    assert same(thunder_state(), pristine)


def test_a_patch_failing_while_thunder_traces_warns_once_and_thunder_goes_on(monkeypatch):
    install_module_recorder()
    monkeypatch.setattr(patches, "_reported", set())

    def broken():
        raise RuntimeError("planted failure")

    monkeypatch.setattr(recorder, "_module_calls", broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ops, equal = attribution()
        attribution()
    messages = [str(w.message) for w in caught if issubclass(w.category, NvtxRegionsWarning)]
    assert equal and [chain for _, chain, _ in ops] == [None] * len(ATTRIBUTED)
    assert messages == [
        "nvtx_regions: thunder.core.trace.TraceCtx.set_current_source_location failed (RuntimeError: planted "
        f"failure); for what thunder compiles while this happens, {patches.PATCHES[0].lost}. {patches._PROCEED}"
    ]


@pytest.mark.parametrize(
    "tested, version, covered",
    [
        (0, "0.2.6", True), (0, "0.2.6.dev20250101", True), (0, "0.2.5", False), (0, "0.2.7", False),
        (0, "0.3.0", False), (1, "2.11.0", True), (1, "2.11.0+cpu", True), (1, "2.8.0", True),
        (1, "2.7.1", False), (1, "2.12.0", False), (1, "3.0", False), (1, "nightly", False),
    ],
)  # fmt: skip
def test_tested_versions(tested, version, covered):
    assert versions.TESTED[tested].covers(version) is covered


def test_the_versions_here_are_tested():
    assert versions.untested() == []


def test_untested_versions_warn_once_naming_found_and_tested(pristine, monkeypatch):
    found = {"lightning-thunder": "0.3.0", "torch": "2.12.1"}
    monkeypatch.setattr(versions, "installed_version", found.get)
    monkeypatch.setattr(versions, "_checked", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        install_module_recorder()
        uninstall_module_recorder()
        install_module_recorder()
        versions.check_versions()
    messages = [w for w in caught if issubclass(w.category, NvtxRegionsWarning)]
    assert [str(w.message) for w in messages] == [
        "nvtx_regions' thunder backend was tested with thunder 0.2.6, torch >=2.8,<2.12; found thunder 0.3.0, "
        "torch 2.12.1. Module attribution and the user's markers reach into thunder's and torch's internals, "
        "which may differ here: if `module`, `class` or `marker` rules select nothing or ranges look wrong, "
        "install the tested versions"
    ]
    assert messages[0].filename == __file__
    assert attribution() == (ATTRIBUTED, True)  # a warning, not an error: everything still works here


def test_a_missing_distribution_is_named(monkeypatch):
    monkeypatch.setattr(versions, "installed_version", {"torch": "2.11.0"}.get)
    monkeypatch.setattr(versions, "_checked", False)
    with pytest.warns(NvtxRegionsWarning, match="found thunder not installed"):
        versions.check_versions()
