"""Never a wrong name: Inductor's ranges through graph breaks, recompiles and cache hits (issue 33).

Each model of tests/workers/graph_breaks.py has a graph break in a chosen
place. The test runs it eagerly and under Inductor, each under the capture
tool, and compares the NVTX calls that really happened: names, counts per
step, forward and backward, and nesting, in every step: the one that compiles
too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from nvtx_regions import NvtxRegionsWarning
from nvtx_regions.testing import capture_subprocess, check_balanced, flatten, range_tree

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "workers" / "graph_breaks.py"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One Inductor cache for this module's processes."""
    return tmp_path_factory.mktemp("graph_breaks_cache")


def _run(cache: Path, pattern: str, backend: str, spec: str, *extra: str):
    env = {"TORCHINDUCTOR_CACHE_DIR": str(cache), "TORCHINDUCTOR_COMPILE_THREADS": "1", "PYTHONPATH": str(ROOT)}
    result = capture_subprocess(
        [sys.executable, str(WORKER), pattern, backend, spec, *extra], env=env, timeout=600, cwd=ROOT
    ).check()
    return result, json.loads(result.stdout.strip().splitlines()[-1])


def _tree(events) -> list[tuple[int, str]]:
    """(depth, message) of our ranges in every step, the one that compiles too, depth first, after
    checking that every range closes."""
    check_balanced(events)
    ours = [e for e in events if e.domain == "nvtx_regions"]
    by_thread = range_tree(ours)
    tree = [(depth, message) for tid in sorted(by_thread) for depth, _, message in flatten(by_thread[tid])]
    assert [m for d, m in tree if d == 0 and m.startswith("step ")] == ["step 0", "step 1", "step 2"], tree
    return tree


# See tests/workers/graph_breaks.py.
CORPUS = [
    "print",  # a print inside each of 3 blocks called in a loop (Dynamo skips the model's frame)
    "item",  # .item() and a data-dependent branch
    "nonzero",  # a data-dependent output shape
    "graph_break",  # torch._dynamo.graph_break()
    "builtin",  # a builtin Dynamo does not trace
    "nested",  # the break one module deeper, under a module with a Linear of its own
    "unrolled",  # blocks called one after the other: Dynamo resumes the model's frame
    "between",  # the break in the model's forward, between two blocks
    "shared",  # one block called twice (shared weights)
    "inplace",  # each block changes its input in place first
    "loop",  # the break in the model's loop: each block compiled whole, as a frame of its own
    "keyword",  # the blocks called with their input as a keyword argument
]


# "print" in the default run; the rest of the corpus in the slow tier.
@pytest.mark.parametrize("pattern", [p if p == "print" else pytest.param(p, marks=pytest.mark.slow) for p in CORPUS])
def test_ranges_through_a_graph_break_are_eagers(cache, pattern):
    # Before: the blocks got no range and the Linear ranges carried other blocks' names, silently.
    spec = "each module <blocks.*>\neach class <Linear>"
    eager, eager_out = _run(cache, pattern, "eager", spec)
    inductor, inductor_out = _run(cache, pattern, "inductor", spec)
    assert eager_out["error"] is None and inductor_out["error"] is None, (eager_out, inductor_out)
    expected = _tree(eager.events)
    messages = [message for _, message in expected]
    assert "blocks.1 (backward)" in messages and any(m.startswith("blocks.1.") and m.endswith("fc2") for m in messages)
    assert _tree(inductor.events) == expected
    assert inductor_out["warnings"] == []


@pytest.mark.slow
@pytest.mark.parametrize(
    "spec",
    ["each module <blocks.0.*>", "each module <blocks.1.fc2>\neach class <Linear> and backward"],
    ids=["one-instance", "one-instance-and-all"],
)
def test_a_spec_that_selects_in_some_instances_of_shared_code_is_eagers(cache, spec):
    # The graph of Block's code is the same for all three blocks; the spec selects in some of them.
    eager, _ = _run(cache, "print", "eager", spec)
    inductor, out = _run(cache, "print", "inductor", spec)
    expected = _tree(eager.events)
    assert [m for _, m in expected if not m.startswith("step ")], expected
    assert _tree(inductor.events) == expected
    assert out["warnings"] == []


@pytest.mark.slow
# Mixtral's experts break the graph as Qwen2-MoE's do; it runs in the long run (a minute more of CI's 45).
@pytest.mark.parametrize("model", ["qwen2_moe", pytest.param("mixtral", marks=pytest.mark.long)])
def test_moe_with_eager_experts_is_eagers(cache, model):
    # Before: layer 1's attention range was named model.layers.0.self_attn, and the layers got none.
    spec = "each module <model.layers.*>\neach class <*Attention>\neach module <model.layers.*.mlp.gate>"
    eager, _ = _run(cache, model, "eager", spec)
    inductor, out = _run(cache, model, "inductor", spec)
    expected = _tree(eager.events)
    messages = [m for _, m in expected]
    assert "model.layers.1.self_attn" in messages and "model.layers.1 (backward)" in messages, messages
    assert _tree(inductor.events) == expected
    assert out["warnings"] == []


@pytest.mark.slow
def test_diagnostics_are_the_same_on_a_cache_hit(tmp_path):
    # A typo warns on the compile and on the cache hit; strict=True raises SelectorError in both.
    typo = "each module <blokcs.*>"
    first, first_out = _run(tmp_path, "unrolled", "inductor", typo)
    second, second_out = _run(tmp_path, "unrolled", "inductor", typo)
    assert second_out["aot_hits"] > 0 or second_out["fx_hits"] > 0, second_out
    assert first_out["fx_misses"] > 0, first_out
    selected_nothing = [w for w in first_out["warnings"] if "selected nothing" in w]
    assert selected_nothing and "nearest: blocks" in selected_nothing[0], first_out
    assert [w for w in second_out["warnings"] if "selected nothing" in w] == selected_nothing
    for _ in range(2):
        _, strict = _run(tmp_path, "unrolled", "inductor", typo, "--strict")
        assert strict["error"] is not None and strict["error"][0] == "SelectorError", strict
        assert "each module <blokcs.*>" in strict["error"][1]
    assert strict["aot_hits"] > 0 or strict["fx_hits"] > 0, strict


def test_the_recompile_limit_is_not_silent(monkeypatch, tmp_path):
    from nvtx_regions.inductor import NvtxInductor

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    compiled = torch.compile(model, backend=NvtxInductor("each class <Linear>", model=model), dynamic=False)
    # torch's own patch: pytest's monkeypatch would undo a config entry by deleting it.
    with warnings.catch_warnings(record=True) as seen, torch._dynamo.config.patch(recompile_limit=1):
        warnings.simplefilter("always")
        with torch.no_grad():
            for rows in (1, 2, 3):
                compiled(torch.randn(rows, 4))
    ours = [str(w.message) for w in seen if issubclass(w.category, NvtxRegionsWarning) and "recompile_limit" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in seen]
    assert "torch._dynamo.config.recompile_limit (1)" in ours[0] and "recompile_limit = N" in ours[0]
    # Another function past the limit, compiled by a plain torch.compile: not ours to speak of.
    plain = torch.compile(lambda x: x.sin() * 2, backend="eager", dynamic=False)
    with warnings.catch_warnings(record=True) as seen, torch._dynamo.config.patch(recompile_limit=1):
        warnings.simplefilter("always")
        for rows in (1, 2, 3):
            plain(torch.randn(rows, 4))
    assert not [w for w in seen if issubclass(w.category, NvtxRegionsWarning)], [str(w.message) for w in seen]
    torch._dynamo.reset()


class Doubled(torch.nn.Module):
    def forward(self, x):
        return x * 2


def test_the_recompile_limit_is_heard_whatever_the_log_level_and_names_the_users_function(monkeypatch, tmp_path, caplog):
    """Dynamo's loggers at ERROR (a quiet notebook): Dynamo logs nothing of the limit (the control: no
    record reaches any handler), yet the notice comes. The code Dynamo compiles is its own wrapper
    (``external_utils.wrap_inline``'s ``inner``, as for a module whose forward it skips); the notice
    names the user's function, with its file and line, not Dynamo's ``inner``."""
    import inspect
    import logging

    from torch._dynamo.external_utils import wrap_inline

    from nvtx_regions.inductor import NvtxInductor

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    model = Doubled()
    compiled = torch.compile(wrap_inline(model), backend=NvtxInductor("each module <**>", model=model), dynamic=False)
    torch._logging.set_logs(dynamo=logging.ERROR)
    try:
        with caplog.at_level(logging.DEBUG), warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with torch._dynamo.config.patch(recompile_limit=1), torch.no_grad():
                for rows in (1, 2, 3):
                    compiled(torch.randn(rows, 4))
    finally:
        torch._logging.set_logs()
    assert not [r for r in caplog.records if "hit config" in r.getMessage()]  # Dynamo said nothing
    ours = [str(w.message) for w in seen if issubclass(w.category, NvtxRegionsWarning) and "recompile_limit" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in seen]
    line = inspect.getsourcelines(Doubled.forward)[1]
    assert f"for Doubled.forward ({__file__}:{line})" in ours[0], ours[0]
    assert "'inner'" not in ours[0] and "external_utils" not in ours[0]
    torch._dynamo.reset()


@pytest.mark.skipif(
    hasattr(torch._dynamo.config, "capture_profiler_record_function"),
    reason="this torch keeps record_function in compiled code (NvtxInductor turns the option on)",
)
def test_dynamo_dropping_a_record_function_is_heard_whatever_the_users_logging():
    # What 2.8's Dynamo does with a record_function in code it compiles: it drops it, and says so only in
    # its log. Ours is said where Dynamo traces it, so the user's logging cannot silence it: the log
    # level at ERROR (quiet notebooks) and every existing logger disabled, as logging.config does (HTA
    # does at import). A plain compile of the same code gets nothing of ours.
    code = (
        "import json, logging, logging.config, warnings, torch\n"
        "import torch._dynamo\n"
        "from nvtx_regions.inductor import NvtxInductor\n"
        "torch._logging.set_logs(dynamo=logging.ERROR)\n"
        "logging.config.dictConfig({'version': 1})\n"
        "def f(x):\n"
        "    with torch.profiler.record_function('mine'):\n"
        "        return x.view(-1)\n"  # no op under the marker: no kernel to build
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    torch.compile(f, backend='eager')(torch.randn(2))\n"
        "    plain = len(seen)\n"
        "    torch._dynamo.reset()\n"
        "    torch.compile(f, backend=NvtxInductor('each class <Linear>'))(torch.randn(2))\n"
        "print(json.dumps([[str(w.message) for w in seen[:plain]], [str(w.message) for w in seen[plain:]]]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    plain, ours = json.loads(done.stdout.strip().splitlines()[-1])
    assert not [m for m in plain if "record_function" in m], plain
    dropped = [m for m in ours if "the ranges of torch.autograd.profiler.record_function" in m]
    assert len(dropped) == 1 and "capture_profiler_record_function" in dropped[0], ours


def test_a_torch_that_drops_record_function_is_told_when_one_is_traced_for_us_not_before(monkeypatch):
    # On every torch, what 2.8 does: no warning at construction (every 2.8 user got one, 2.8's tests
    # failed), none where Dynamo traces a record_function for another backend, one where it traces one
    # for ours (once a process), whatever the log level.
    import logging

    from nvtx_regions.inductor import NvtxInductor, state
    from nvtx_regions.internals import compiled_markers

    def f(x):
        with torch.profiler.record_function("mine"):  # no op inside: no kernel for Inductor to build
            return x.view(-1)

    monkeypatch.setattr(compiled_markers, "record_function_lost", lambda: "torch 2.8 has no such option")
    monkeypatch.setattr(state, "drops_said", set())
    torch._dynamo.reset()
    torch._logging.set_logs(dynamo=logging.ERROR)
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            backend = NvtxInductor("each class <Linear>")  # alive: it holds the listener (internals.installs)
            said_before = [str(w.message) for w in seen if issubclass(w.category, NvtxRegionsWarning)]
            torch.compile(f, backend="eager")(torch.randn(2))
            said_for_others = [str(w.message) for w in seen if issubclass(w.category, NvtxRegionsWarning)]
            for _ in range(2):  # traced twice for us: said once
                torch._dynamo.reset()
                torch.compile(f, backend=backend)(torch.randn(2))
    finally:
        torch._logging.set_logs()
        torch._dynamo.reset()
    assert said_before == [] and said_for_others == []
    ours = [str(w.message) for w in seen if issubclass(w.category, NvtxRegionsWarning)]
    assert len(ours) == 1 and ours[0].startswith("torch 2.8 has no such option: the ranges of torch.autograd.profiler.record_function"), ours
    backend.remove()


def test_a_model_called_once_without_gradients_is_told_at_exit(tmp_path):
    # No second call and no backward to say it at: the warning comes at exit, not never.
    code = (
        "import torch, nvtx_regions\n"
        "model = torch.nn.Sequential(torch.nn.Linear(4, 4))\n"
        "compiled = nvtx_regions.compile(model, 'each module <blokcs.*>', backend='inductor')\n"
        "with torch.no_grad():\n"
        "    compiled(torch.randn(2, 4))\n"
    )
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "rule 'each module <blokcs.*>' (<select>:1) selected nothing" in result.stderr, result.stderr[-2000:]
