"""lightning-thunder is an optional dependency: what does not need it never imports it, and what
needs it says how to install it.

Each run here starts Python with ``tests/workers/thunder_blocked`` first on PYTHONPATH: in
that process and every process it starts (the commands' children), ``import thunder`` fails
as where thunder is not installed, and each attempt is logged with where it came from. So this
runs, and means the same, whether thunder is installed here or not.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nvtx_regions.testing import unavailable_reason

ROOT = Path(__file__).resolve().parents[1]
BLOCKER = ROOT / "tests" / "workers" / "thunder_blocked"
PYTHON = sys.executable

TINY = """
import torch
import nvtx_regions


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(4, 4)
        self.last = torch.nn.Linear(4, 1)

    def forward(self, x):
        return self.last(torch.relu(self.first(x)))


torch.manual_seed(0)
compiled = nvtx_regions.compile(Net())  # the backend nvtx-regions profile asks for
x = torch.randn(2, 4)
for _ in nvtx_regions.steps(range(3)):
    compiled(x).sum().backward()
print("tiny: done")
"""

# What needs no thunder: every module but the thunder backend's, both other backends, steps.
LIBRARY = """
import importlib, pkgutil, sys
import torch
import nvtx_regions, nvtx_regions.eager, nvtx_regions.inductor
from nvtx_regions import steps
from nvtx_regions.inductor import NvtxInductor

THUNDER_MODULES = {"nvtx_regions.emission.transform", "nvtx_regions.emission.rewrite"}
for module in pkgutil.walk_packages(nvtx_regions.__path__, "nvtx_regions."):
    if module.name not in THUNDER_MODULES and "_explain_site" not in module.name:
        importlib.import_module(module.name)

model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
x = torch.randn(2, 4)
for backend in ("eager", "inductor"):
    compiled = nvtx_regions.compile(model, "each module <*>", backend=backend)
    for _ in steps(range(2)):
        compiled(x).sum().backward()
print("library: done")
"""

# What needs thunder: our error, naming what needs it and the install command.
ERRORS = """
import torch
import nvtx_regions
from nvtx_regions import MissingDependencyError

model = torch.nn.Linear(2, 2)
attempts = {
    "compile": lambda: nvtx_regions.compile(model, "each module <**>", backend="thunder"),
    "transform": lambda: nvtx_regions.NvtxProfileTransform("all"),
    "explain": lambda: nvtx_regions.explain(model, "all"),
}
for name, attempt in attempts.items():
    try:
        attempt()
    except MissingDependencyError as error:
        print(f"{name}: {error}")
    else:
        print(f"{name}: no error")
"""


def blocked_env(tmp_path: Path, log: Path) -> dict[str, str]:
    drop = ("NVTX_INJECTION64_PATH", "NVTX_REGIONS_CAPTURE_DIR", "NVTX_REGIONS_CAPTURE_MODE", "NVTX_REGIONS_BACKEND", "NVTX_REGIONS_SPEC")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONPATH"] = os.pathsep.join([str(BLOCKER), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["PATH"] = f"{Path(PYTHON).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env.update(NVTX_REGIONS_TESTS_THUNDER_LOG=str(log), OMP_NUM_THREADS="1", TORCHINDUCTOR_COMPILE_THREADS="1",
               TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))  # fmt: skip
    return env


def run(argv: list[str], env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def test_the_blocker_blocks(tmp_path):
    log = tmp_path / "thunder.log"
    done = run([PYTHON, "-c", "import thunder"], blocked_env(tmp_path, log), tmp_path)
    assert done.returncode == 1 and "blocked by tests/workers/thunder_blocked" in done.stderr
    assert log.read_text().count("import thunder from outside nvtx_regions") == 1


@pytest.mark.slow  # the default tier stays under 6 minutes; CI runs the slow tier
def test_the_library_runs_eager_and_inductor_without_importing_thunder(tmp_path):
    log = tmp_path / "thunder.log"
    done = run([PYTHON, "-c", LIBRARY], blocked_env(tmp_path, log), tmp_path)
    assert done.returncode == 0 and "library: done" in done.stdout, done.stderr[-4000:]
    assert not log.exists(), log.read_text()


@pytest.mark.slow
@pytest.mark.skipif(bool(unavailable_reason()), reason=f"capture tool unavailable: {unavailable_reason()}")
def test_the_commands_run_without_importing_thunder(tmp_path):
    log = tmp_path / "thunder.log"
    env = blocked_env(tmp_path, log)
    (tmp_path / "tiny.py").write_text(TINY)
    (tmp_path / "spec.nvtx").write_text("each module <*>\n")
    cli = [PYTHON, "-m", "nvtx_regions"]
    commands = {
        "check": [*cli, "check", "spec.nvtx"],
        "grammar": [*cli, "grammar"],
        "nsys": [*cli, "nsys", "spec.nvtx", "--", "python", "tiny.py"],
        "capture": [*cli, "capture", "-o", "eager.json", "--", PYTHON, "tiny.py"],
        "report": [*cli, "report", "eager.json"],
        "compare": [*cli, "compare", "eager.json", "eager.json"],
        # Without --backends, profile runs the backends installed here; thunder's run would fail on the blocker.
        "profile": [*cli, "profile", "spec.nvtx", "--tool", "capture", "--backends", "eager,inductor", "-o", "out", "--", PYTHON, "tiny.py"],
    }
    for name, argv in commands.items():
        if name == "capture":
            env["NVTX_REGIONS_BACKEND"] = "eager"
        done = run(argv, env, tmp_path)
        env.pop("NVTX_REGIONS_BACKEND", None)
        assert done.returncode == 0, (name, done.stdout[-2000:], done.stderr[-3000:])
    assert "first (backward)" in run(commands["report"], env, tmp_path).stdout
    assert (tmp_path / "out" / "table.txt").read_text().count("first") == 2  # its forward and backward rows
    assert not log.exists(), log.read_text()


def test_what_needs_thunder_says_how_to_install_it(tmp_path):
    log = tmp_path / "thunder.log"
    done = run([PYTHON, "-c", ERRORS], blocked_env(tmp_path, log), tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = dict(line.split(": ", 1) for line in done.stdout.splitlines())
    assert set(lines) == {"compile", "transform", "explain"}
    assert lines["compile"].startswith("nvtx_regions.compile(backend='thunder') needs lightning-thunder, which is not installed here: pip install 'nvtx_regions[thunder]' (thunder 0.2.6 needs torch >=2.8,<2.12")
    assert lines["transform"].startswith("NvtxProfileTransform (the thunder backend) needs lightning-thunder")
    assert lines["explain"].startswith("explain() of a thunder.jit function needs lightning-thunder")
    for line in lines.values():
        assert line.endswith("Eager and Inductor need no thunder: backend='eager' or backend='inductor'")
    assert len(log.read_text().splitlines()) == 3  # each attempt tried once, and said so
