"""A guest in the user's process: what nvtx_regions installs changes no other model's
``torch.compile``, and each handle belongs to the one compile that made it.

- A plain ``torch.compile`` of a model with markers of every form (``torch.cuda.nvtx``, ``nvtx``,
  ``record_function``) gives the same graphs, graph breaks and output in a process where
  nvtx_regions compiled another model first as in a process without nvtx_regions; compiled before
  our first backend, it compiles nothing more when called after it.
- ``explain`` and the handle of what ``nvtx_regions.compile`` returned name that compile's spec,
  also when the same model is compiled twice.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import nvtx_regions

WORKERS = Path(__file__).resolve().parent / "workers"


def _plain_compile(when: str, *model: str) -> dict:
    done = subprocess.run(
        [sys.executable, str(WORKERS / "plain_compile_beside.py"), when, *model], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_plain_compile_beside_ours_compiles_as_without_us():
    alone, before, after = (_plain_compile(when) for when in ("none", "before", "after"))
    assert alone["graph_breaks"] > 0 and alone["graphs"]  # the markers break a plain compile's graph
    assert before == alone
    # Called again after our backend was made: nothing compiled again (once, Dynamo's guards on the
    # torch.cuda.nvtx functions we replaced failed, and it compiled every graph twice).
    assert after == alone


@pytest.mark.slow
def test_a_plain_compile_guarded_on_the_nvtx_packages_markers_compiles_nothing_more():
    # The nvtx package's markers after a graph's ops: Dynamo guards that graph on the functions it read
    # (the graph list holds every graph compiled, so a recompile shows as more graphs). Once, while our
    # backends lived, those functions were replaced: a graph guarded on them compiled again (4 graphs instead of 2, torch 2.11).
    alone, before, after = (_plain_compile(when, "nvtx") for when in ("none", "before", "after"))
    assert len(alone["graphs"]) >= 2 and alone["graph_breaks"] > 0, alone  # graphs on both sides of a marker
    assert before == alone
    assert after == alone


class Two(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(4, 4)
        self.second = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.second(self.first(x))


@pytest.mark.parametrize("backend", ["eager", "inductor", pytest.param("thunder", marks=pytest.mark.thunder)])
def test_each_compile_explains_its_own_spec(backend):
    model = Two()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        one = nvtx_regions.compile(model, "each module <first>", backend=backend)
        one(torch.ones(2, 4))
        two = nvtx_regions.compile(model, "each module <second>", backend=backend)
        two(torch.ones(2, 4))
    if backend == "eager":  # eager returns the model itself: a second annotation replaces the first
        assert one is two and "second" in str(nvtx_regions.explain(two))
        return
    assert "nvtx_regions_backend" not in vars(model)  # nothing hangs on the user's model
    for compiled, own, other in ((one, "first", "second"), (two, "second", "first")):
        text = str(nvtx_regions.explain(compiled))
        assert f"each module <{own}>" in text and f"each module <{other}>" not in text, text
        assert compiled.nvtx_regions_backend.explain().rules == nvtx_regions.explain(compiled).rules


@pytest.mark.parametrize("backend", ["eager", "inductor", pytest.param("thunder", marks=pytest.mark.thunder)])
def test_remove_ends_the_ranges_on_every_backend(nvtx_capture, backend):
    # One ungated rule and one gated rule (their lines call through the call's gates).
    spec = "each module <first> and forward\nlate: each module <second> and steps 0..99"

    def ours(events):
        return [e.message for e in events if e.kind == "push" and e.domain == "guest_tests"]

    model = Two()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = nvtx_regions.compile(model, spec, backend=backend, domain="guest_tests")
        with nvtx_capture() as before:
            compiled(torch.ones(2, 4)).sum().backward()
        handle = compiled.nvtx_regions_backend
        handle.remove()
        handle.remove()  # twice is harmless
        with nvtx_capture() as after:
            compiled(torch.ones(2, 4)).sum().backward()  # the code compiled before remove()
            compiled(torch.ones(3, 5, 4)).sum().backward()  # compiled after it
    assert sorted(set(ours(before))) == ["first", "second", "second (backward)"]
    assert ours(after) == []
