"""Never a wrong name: Inductor's ranges through graph breaks, recompiles and cache hits (issue 33).

Each model of tests/workers/graph_breaks.py has a graph break in a chosen
place. The test runs it eagerly and under Inductor, each under the capture
tool, and compares the NVTX calls that really happened: names, counts per
step, forward and backward, and nesting. Where Inductor cannot place a range
(a module call that spans the break; a module that runs outside any graph)
the range is left out, and one of our warnings names that module: the test
takes exactly the modules the warnings name out of eager's ranges.
"""

from __future__ import annotations

import json
import re
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
    """(depth, message) of our ranges, depth first, after checking that every range closes."""
    check_balanced(events)
    ours = [e for e in events if e.domain == "nvtx_regions"]
    by_thread = range_tree(ours)
    return [(depth, message) for tid in sorted(by_thread) for depth, _, message in flatten(by_thread[tid])]


def _named_in(warnings_: list[str]) -> set[str]:
    """The module paths our warnings say got no range."""
    named: set[str] = set()
    for text in warnings_:
        found = re.search(r"\): (?:the calls of )?(.+?) g[eo]t no NVTX range", text)
        if found:
            named.update(part.strip() for part in re.split(r",| and ", found.group(1)) if part.strip())
    return named


def _without(tree: list[tuple[int, str]], left_out: set[str]) -> list[tuple[int, str]]:
    """`tree` without the ranges of `left_out` modules (forward and backward); the ranges inside one keep
    their place, one level up."""
    kept, open_depths = [], []
    for depth, message in tree:
        while open_depths and open_depths[-1] >= depth:
            open_depths.pop()
        if message.removesuffix(" (backward)") in left_out:
            open_depths.append(depth)
            continue
        kept.append((depth - len(open_depths), message))
    return kept


# (pattern, what is left out under Inductor): see tests/workers/graph_breaks.py.
CORPUS = [
    ("print", {"head"}),  # a print inside each of 3 blocks called in a loop
    ("item", {"head"}),  # .item() and a data-dependent branch
    ("nonzero", {"head"}),  # a data-dependent output shape
    ("nested", {"head"}),  # the break one module deeper, under a module with a Linear of its own
    ("unrolled", set()),  # blocks called one after the other: Dynamo resumes the model's frame
    ("shared", set()),  # one block called twice (shared weights)
]


@pytest.mark.parametrize("pattern,left_out", CORPUS, ids=[c[0] for c in CORPUS])
def test_ranges_through_a_graph_break_are_eagers(cache, pattern, left_out):
    spec = "each class <Linear>"
    eager, eager_out = _run(cache, pattern, "eager", spec)
    inductor, inductor_out = _run(cache, pattern, "inductor", spec)
    assert eager_out["error"] is None and inductor_out["error"] is None, (eager_out, inductor_out)
    named = _named_in(inductor_out["warnings"])
    assert named == left_out, inductor_out["warnings"]
    expected = _without(_tree(eager.events), named)
    assert any("(backward)" in message for _, message in expected)
    assert len({message for _, message in expected if message.startswith("blocks.")}) >= 4
    assert _tree(inductor.events) == expected


def test_a_module_whose_call_spans_the_break_is_named_in_a_warning_and_gets_no_range(cache):
    # Before: the blocks got no range and the Linear ranges carried other blocks' names, silently.
    spec = "each module <blocks.*>\neach class <Linear>"
    eager, _ = _run(cache, "print", "eager", spec)
    inductor, out = _run(cache, "print", "inductor", spec)
    assert _named_in(out["warnings"]) == {"blocks.0", "blocks.1", "blocks.2", "head"}, out["warnings"]
    (spanning,) = [w for w in out["warnings"] if "the calls of" in w]
    assert "a graph break inside Block.forward" in spanning and "backend='eager'" in spanning
    expected = _without(_tree(eager.events), {"blocks.0", "blocks.1", "blocks.2", "head"})
    assert _tree(inductor.events) == expected
    assert ("blocks.1.fc2" in [m for _, m in expected]) and all("blocks" in m for _, m in expected if m != "step 0" and m != "step 1")


@pytest.mark.parametrize(
    "spec",
    ["each module <blocks.0.*>", "each module <blocks.1.fc2>\neach class <Linear> and backward"],
    ids=["one-instance", "one-instance-and-all"],
)
def test_a_spec_that_selects_in_some_instances_of_shared_code_is_eagers(cache, spec):
    # The graph of Block's code is the same for all three blocks; the spec selects in some of them.
    eager, _ = _run(cache, "print", "eager", spec)
    inductor, out = _run(cache, "print", "inductor", spec)
    expected = _without(_tree(eager.events), _named_in(out["warnings"]))
    assert [m for _, m in expected if not m.startswith("step ")], expected
    assert _tree(inductor.events) == expected


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
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 1)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    compiled = torch.compile(model, backend=NvtxInductor("each class <Linear>", model=model), dynamic=False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with torch.no_grad():
            for rows in (1, 2, 3):
                compiled(torch.randn(rows, 4))
    ours = [str(w.message) for w in seen if issubclass(w.category, NvtxRegionsWarning) and "recompile_limit" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in seen]
    assert "torch._dynamo.config.recompile_limit (1)" in ours[0] and "recompile_limit = N" in ours[0]
    torch._dynamo.reset()
