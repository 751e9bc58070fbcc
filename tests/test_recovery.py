"""Recovery on every backend: a call that raises inside ranges leaves nothing open, and the next
ranges are where they would have been without the failure.

The script: two blocks, the first looking up an embedding of ``idx``; in step 2 of a
`nvtx_regions.steps` loop ``idx`` is out of range, so the lookup raises inside ``blocks.0``'s
range, as an out-of-memory error would; the loop catches the error, marks it with a range of
its own (``caught``) and goes on. Captured in a child process per backend.
"""

from __future__ import annotations

import sys

import pytest

from nvtx_regions.testing import capture_subprocess, check_balanced, flatten, range_tree, unavailable_reason

pytestmark = pytest.mark.skipif(bool(unavailable_reason()), reason=f"capture tool unavailable: {unavailable_reason()}")

SCRIPT = """
import sys, warnings
import nvtx, torch
import nvtx_regions

warnings.simplefilter("ignore")
backend, gated = sys.argv[1], sys.argv[2] == "gated"


class Lookup(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.emb = torch.nn.Embedding(16, 8)

    def forward(self, x, idx):
        return torch.relu(self.fc(x)) + self.emb(idx)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Lookup(), torch.nn.Linear(8, 8)])

    def forward(self, x, idx):
        return self.blocks[1](self.blocks[0](x, idx))


torch.manual_seed(0)
spec = "each module <blocks.*>" + (" and steps 1.." if gated else "")
compiled = nvtx_regions.compile(Net(), spec, backend=backend)
x, good, bad = torch.randn(4, 8), torch.tensor([1, 2, 3, 4]), torch.tensor([1, 2, 99, 4])
ours = nvtx.get_domain("nvtx_regions")
failed = []
for step in nvtx_regions.steps(range(5)):
    try:
        compiled(x, bad if step == 2 else good).sum().backward()
    except Exception as error:  # IndexError (eager, thunder), RuntimeError (Inductor's bounds check)
        ours.push_range(ours.get_event_attributes(message="caught"))
        ours.pop_range()
        failed.append(step)
print("failed in steps", failed)
"""

# Inductor compiles for half a minute here: in the slow tier.
BACKENDS = ["eager", pytest.param("inductor", marks=pytest.mark.slow), pytest.param("thunder", marks=pytest.mark.thunder)]
STEP = [(1, "blocks.0"), (1, "blocks.1"), (1, "blocks.1 (backward)"), (1, "blocks.0 (backward)")]


@pytest.fixture(scope="module")
def inductor_cache(tmp_path_factory):
    """One Inductor cache for this file's runs: gated and ungated compile the same kernels."""
    return tmp_path_factory.mktemp("inductor")


@pytest.mark.parametrize("gated", ["gated", "ungated"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failed_call_leaves_nothing_open(backend, gated, inductor_cache):
    env = {"TORCHINDUCTOR_CACHE_DIR": str(inductor_cache), "TORCHINDUCTOR_COMPILE_THREADS": "1", "OMP_NUM_THREADS": "1"}
    result = capture_subprocess([sys.executable, "-c", SCRIPT, backend, gated], env=env, timeout=600).check()
    assert "failed in steps [2]" in result.stdout
    (process,) = result.processes.values()
    events = [e for e in process.events if e.domain == "nvtx_regions"]
    check_balanced(events)
    (roots,) = range_tree(events).values()
    steps = {}
    for depth, _, message in flatten(roots):
        if depth == 0:
            assert message.startswith("step "), message  # nothing outside the steps
            current = steps[message] = []
        else:
            current.append((depth, message))
    # A whole step: the four ranges (nested as the backend ran the kernels: torch 2.8's Inductor
    # runs blocks.1's last backward kernel after blocks.0's, so its range holds blocks.0's).
    whole = steps["step 1"]
    assert sorted(m for _, m in whole) == sorted(m for _, m in STEP) and whole[:2] == STEP[:2]
    # Step 2's call raised inside blocks.0: its range closed as the exception left the call, so
    # `caught` sits right inside the step, and steps 3 and 4 are whole again.
    assert steps == {
        "step 0": whole if gated == "ungated" else [],
        "step 1": whole,
        "step 2": [(1, "blocks.0"), (1, "caught")],
        "step 3": whole,
        "step 4": whole,
    }
