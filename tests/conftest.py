"""The test run's hooks and shared fixtures. What the tests share besides fixtures (running
nsys, the models and their thunder traces, optional dependencies) is in tests/support/.

The capture plugin attaches the NVTX capture tool before the first NVTX call,
so in this test session NVTX domains are real and every range call is seen.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import pytest

from support.environment import THUNDER_INSTALLED, needs_thunder
from support.models import CONFIGS
from support.nsys import one_nsys_session_at_a_time

# The two test workers share the machine's cores: one intra-op thread per process (its idle
# threads would spin on the core the other worker needs), and Inductor compiling in the process
# rather than in a pool of processes that each import torch. Child processes inherit both.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

pytest_plugins = ["nvtx_regions.testing.pytest_plugin"]

one_nsys_session_at_a_time()

TESTS = Path(__file__).resolve().parent


def pytest_configure(config):
    warnings.filterwarnings("ignore", message="transformer_engine module not found")
    warnings.filterwarnings("ignore", message=".*is_autocast_cpu_enabled.*")
    if not THUNDER_INSTALLED and "not thunder" not in (config.option.markexpr or ""):
        raise pytest.UsageError(
            "lightning-thunder is not installed, and the tests marked `thunder` need it: run "
            "pytest -m \"not thunder\" (or pip install -e '.[test]' for every test)"
        )


def pytest_ignore_collect(collection_path, config):
    if not THUNDER_INSTALLED and collection_path.suffix == ".py" and needs_thunder(collection_path):
        return True
    return None


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not THUNDER_INSTALLED:
        files = sorted(p.name for p in TESTS.glob("test_*.py") if needs_thunder(p))
        terminalreporter.write_line(
            f"lightning-thunder is not installed: {len(files)} test files that need it were not collected "
            f"({', '.join(files)}); the tests marked `thunder` in other files were deselected"
        )


@pytest.fixture(scope="module", autouse=True)
def dynamo_state_of_this_module_only():
    """Dynamo's caches reset after each test module that used torch.compile (dynamo, ThunderFX).

    Once dynamo has run, its patched ``nn.Module.__init__`` records every module made
    afterwards in a weak-key dictionary (torch 2.11: ``GenerationTracker``). When thunder's
    interpreter traces code that adds to it, it iterates that dictionary, and a weakref
    callback of a module collected meanwhile changes its size under the iteration:
    "dictionary changed size during iteration", seen once in a full run, in a later
    file's thunder.jit. The larger the dictionary, the longer that window.
    """
    yield
    if "torch._dynamo" in sys.modules:
        import torch

        torch.compiler.reset()


# Thunder's torch.compile fusions cost a minute to compile: in the slow tier (test_modules and
# test_markers keep fusions in the default run).
@pytest.fixture(
    params=[pytest.param(c, marks=pytest.mark.slow) if c[1] == "torchcompile" else c for c in CONFIGS],
    ids=lambda c: f"{c[0]}-{c[1] or 'default'}",
)
def config(request):
    return request.param
