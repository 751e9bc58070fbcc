"""One step clock on every backend: `steps a..b` selects the same training steps on eager,
thunder and Inductor, across recompiles, evaluation calls and micro-batches.

Each run is a child process under the capture tool: a two-linear net compiled with
``nvtx_regions.compile(model, "each module <l1> and steps 2..3", backend=...)``.

- ``loop``: 8 steps of a `nvtx_regions.steps` loop; the batch shrinks from 4 to 3 at
  step 4 (thunder and Inductor recompile), and each step ends with an evaluation call
  under ``torch.no_grad()`` (another compilation). Step N is the loop's N-th iteration.
- ``optimizer``: no `steps` loop; 6 optimizer steps of 2 micro-batches each, the batch
  shrinking at step 3. Step N is the number of ``optimizer.step()`` calls so far.
"""

from __future__ import annotations

import collections
import sys

import pytest

from nvtx_regions.testing import capture_subprocess, range_tree, unavailable_reason

pytestmark = pytest.mark.skipif(bool(unavailable_reason()), reason=f"capture tool unavailable: {unavailable_reason()}")

SCRIPT = """
import sys, warnings
import torch
import nvtx_regions

warnings.simplefilter("ignore")
backend, scenario = sys.argv[1], sys.argv[2]


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(4, 4)
        self.l2 = torch.nn.Linear(4, 1)

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x)))


torch.manual_seed(0)
model = Net()
compiled = nvtx_regions.compile(model, "each module <l1> and steps 2..3", backend=backend)
if scenario == "loop":
    for step in nvtx_regions.steps(range(8)):
        x = torch.randn(4 if step < 4 else 3, 4)
        compiled(x).sum().backward()
        with torch.no_grad():
            compiled(x)
else:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(6):
        for micro_batch in range(2):
            compiled(torch.randn(4 if step < 3 else 3, 4)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
print("done")
"""

BACKENDS = ["eager", "inductor", pytest.param("thunder", marks=pytest.mark.thunder)]


@pytest.fixture(scope="module")
def inductor_cache(tmp_path_factory):
    """One Inductor cache for this file's runs: the second scenario compiles the same graphs
    (the same model, spec and shapes), and a wrapper served from the cache must place the same ranges."""
    return tmp_path_factory.mktemp("inductor")


def run(backend: str, scenario: str, inductor_cache):
    env = {"TORCHINDUCTOR_CACHE_DIR": str(inductor_cache), "TORCHINDUCTOR_COMPILE_THREADS": "1", "OMP_NUM_THREADS": "1"}
    result = capture_subprocess([sys.executable, "-c", SCRIPT, backend, scenario], env=env, timeout=600).check()
    assert "done" in result.stdout
    (process,) = result.processes.values()
    return [e for e in process.events if e.domain == "nvtx_regions"]


# Inductor's steps of a loop in the slow tier (a minute of compiling); its optimizer steps stay in the default run.
@pytest.mark.parametrize("backend", ["eager", pytest.param("inductor", marks=pytest.mark.slow), BACKENDS[2]])
def test_steps_of_a_loop_are_its_iterations(backend, inductor_cache):
    events = run(backend, "loop", inductor_cache)
    (roots,) = range_tree(events).values()  # one thread: CPU backward runs on the caller's
    steps = {r.message: r for r in roots if r.message.startswith("step ")}
    assert sorted(steps) == [f"step {n}" for n in range(8)]
    inside: dict[str, list[str]] = collections.defaultdict(list)
    for step in steps.values():
        for child in step.children:
            inside[step.message].append(child.message)
    # Steps 2 and 3: the training call's forward and backward, and the evaluation call's forward.
    assert dict(inside) == {"step 2": ["l1", "l1 (backward)", "l1"], "step 3": ["l1", "l1 (backward)", "l1"]}
    assert all(r.message.startswith("step ") for r in roots)  # nothing outside the steps


@pytest.mark.parametrize("backend", BACKENDS)
def test_without_a_loop_steps_are_optimizer_steps(backend, inductor_cache):
    events = run(backend, "optimizer", inductor_cache)
    pushes = [e.message for e in events if e.kind == "push"]
    # Optimizer steps 2 and 3, two micro-batches each, across the recompile at step 3.
    assert pushes == ["l1", "l1 (backward)"] * 4


STUCK = """
import sys, torch, nvtx_regions
model = torch.nn.Sequential(torch.nn.Linear(4, 4))
compiled = nvtx_regions.compile(model, "each module <*> and steps 2..3", backend="eager")
loop = nvtx_regions.steps(range(4)) if sys.argv[1] == "loop" else range(4)
for _ in loop:
    compiled(torch.randn(2, 4)).sum().backward()
"""


@pytest.mark.parametrize("loop", ["loop", "no loop"])
def test_a_clock_that_never_moved_is_named_at_exit(loop):
    import subprocess

    done = subprocess.run([sys.executable, "-c", STUCK, loop], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    said = "the step clock stayed at step 0 in this process (no nvtx_regions.steps loop, no optimizer.step()), so these rules' steps never came: rule 'each module <*> and steps 2..3'"
    assert (said in done.stderr) == (loop == "no loop"), done.stderr[-3000:]
