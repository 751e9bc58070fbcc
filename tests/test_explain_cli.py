"""``nvtx-regions explain SPEC -- COMMAND``: the quickstart model (jitted with its
own transform), a script that jits plain functions (the spec is added, and its
ranges really happen), one small model on each other backend (eager and Inductor
through `nvtx_regions.compile`, a plain ``torch.compile``, and no compile at all),
and the cases with nothing to explain."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nvtx_regions.testing import capture_subprocess, unavailable_reason

ROOT = Path(__file__).resolve().parents[1]


def plain_env() -> dict[str, str]:
    drop = ("NVTX_INJECTION64_PATH", "NVTX_REGIONS_CAPTURE_DIR", "NVTX_REGIONS_CAPTURE_MODE")
    return {k: v for k, v in os.environ.items() if k not in drop}


def explain_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nvtx_regions", "explain", *args], cwd=cwd, env=plain_env(),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.thunder
def test_explain_on_the_quickstart_model_agrees_with_its_range_counts():
    result = explain_cli("examples/regions.nvtx", "--max-ops", "1", "--", sys.executable, "examples/quickstart.py")
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    quickstart_table = out[out.index("===== ranges per rule") : out.index("=====", out.index("rules, ") - 1)]
    counts = {int(m[1]): (int(m[2]), int(m[3])) for m in re.finditer(r"^\s+(\d+)\s+(\d+)\s+(\d+)\s+\S", quickstart_table, re.M)}
    assert set(counts) == {7, 11, 15, 19}

    report = out[out.index("===== thunder: GPT (jitted at examples/quickstart.py:") :]
    assert report.splitlines()[0].endswith(", with its own NvtxProfileTransform) =====")
    explained = {}
    for block in re.split(r"^(?=rule ')", report, flags=re.M)[1:]:
        line = int(re.match(r"rule '.*' \(examples/regions\.nvtx:(\d+)\)", block)[1])
        fwd = int(re.search(r"^  forward '\w+': (\d+) range", block, re.M)[1])
        bwd = int(re.search(r"^  backward '\w+': (\d+) range", block, re.M)[1])
        explained[line] = (fwd, bwd)
    assert explained == counts  # explain() agrees with what the transform reported in the child

    # The range-tree picture: regions contain the per-op ranges inside them.
    assert re.search(
        r"^forward '\w+' \(20 ranges\)\n├── embed ×2  #\d+, #\d+\n├── transformer\.h\.0  #\d+\.\.#\d+\n"
        r"│   ├── attn0  #\d+\.\.#\d+\n│   │   └── matmuls ×5  #\d+\.\.#\d+\n│   └── matmuls ×2", report, re.M
    )
    assert re.search(r"^├── transformer\.h\.1 \(backward\)  #\d+\.\.#\d+\n│   └── matmuls ×12", report, re.M)
    assert "... " in report and " more" in report  # --max-ops 1 cut the op lists


SCRIPT = """
import sys, thunder, torch

def ffn(x, w):
    return torch.nn.functional.linear(x, w).relu()

def never_called(x):
    return x + 1

jf = thunder.jit(ffn)
jf(torch.randn(3, 4), torch.randn(5, 4))
thunder.jit(never_called)
print("script done")
sys.exit(int(sys.argv[1]))
"""


@pytest.mark.skipif(bool(unavailable_reason()), reason=f"capture tool unavailable: {unavailable_reason()}")
@pytest.mark.thunder
def test_functions_jitted_without_a_transform_get_the_spec_and_emit_its_ranges(tmp_path):
    script = tmp_path / "jit_two.py"
    script.write_text(SCRIPT)
    spec = tmp_path / "s.nvtx"
    spec.write_text("mm: op in <linear>\n")
    result = capture_subprocess(
        [sys.executable, "-m", "nvtx_regions", "explain", str(spec), "--no-tree", "--", sys.executable, str(script), "0"],
        env={"NVTX_REGIONS_EXPLAIN_SPEC": None}, timeout=300,
    ).check()  # fmt: skip
    assert "script done" in result.stdout
    sections = re.findall(r"^===== (.*) =====$", result.stdout, re.M)
    assert sections == [
        f"thunder: ffn (jitted at {os.path.relpath(script, ROOT)}:10, spec added)",
        f"thunder: never_called (jitted at {os.path.relpath(script, ROOT)}:12, spec added)",
    ]
    assert re.search(r"rule 'mm: op in <linear>' \(.*s\.nvtx:1\): one range per op\n  forward '\w+': 1 range\n", result.stdout)
    assert "not explained: explain(): the compiled function has not run yet" in result.stdout
    assert "├──" not in result.stdout  # --no-tree
    # The spec was really applied in the child: its per-op range happened.
    pushes = [e.message for e in result.events if e.kind == "push" and e.domain == "nvtx_regions"]
    assert len(pushes) == 1 and "linear" in pushes[0]


@pytest.mark.thunder
def test_exit_status_and_nothing_to_explain(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(SCRIPT)
    failed = explain_cli("examples/regions.nvtx", "--", sys.executable, str(script), "3")
    assert failed.returncode == 3
    assert "===== thunder: ffn" in failed.stdout  # still explained: atexit runs on sys.exit
    assert "exited with status 3" in failed.stderr

    idle = tmp_path / "idle.py"
    idle.write_text(textwrap.dedent("print('no thunder here')\n"))
    nothing = explain_cli("examples/regions.nvtx", "--", sys.executable, str(idle))
    assert nothing.returncode == 1
    assert "no thunder here" in nothing.stdout
    assert nothing.stderr.strip() == (
        "nvtx-regions explain: the command compiled no model (thunder.jit, torch.compile with Inductor, "
        "nvtx_regions.compile) and called none; nothing to explain"
    )


def test_an_existing_sitecustomize_still_runs(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import builtins\nbuiltins.SITE_WAS_HERE = True\n")
    idle = tmp_path / "idle.py"
    idle.write_text("print('site ran:', getattr(__builtins__, 'SITE_WAS_HERE', False))\n")
    env = plain_env()
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-m", "nvtx_regions", "explain", "examples/regions.nvtx", "--", sys.executable, str(idle)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "site ran: True" in result.stdout, result.stderr


# One small model for every backend but thunder: `h.0` and `h.1` are what the spec selects.
MODEL_SCRIPT = """
import sys, torch, nvtx_regions

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.h = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)])

    def forward(self, x):
        for layer in self.h:
            x = layer(x).relu()
        return x

model = Net()
how = sys.argv[1]
if how == "torch.compile":
    model = torch.compile(model)
elif how != "no compile":
    model = nvtx_regions.compile(model, backend=how)
loss = torch.nn.MSELoss()(model(torch.randn(2, 4)), torch.zeros(2, 4))
loss.backward()
print("script done")
"""

HEADERS = {
    "eager": "eager: Net (annotated at {script}:19)",
    "no compile": "eager: Net (first called at {script}:20; no compile, no ranges added)",
    "inductor": "inductor: Net (compiled at {script}:19, with its own NvtxInductor)",
    "torch.compile": "inductor: Net (compiled at {script}:17, spec added)",
}


def explain_model(tmp_path: Path, how: str) -> subprocess.CompletedProcess:
    script = tmp_path / "net.py"
    script.write_text(MODEL_SCRIPT)
    spec = tmp_path / "blocks.nvtx"
    spec.write_text("blocks: each module <h.*>\n")
    result = explain_cli(str(spec), "--", sys.executable, str(script), how)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "script done" in result.stdout
    sections = re.findall(r"^===== (.*) =====$", result.stdout, re.M)
    # The loss module is called too, outside the model, but the spec selects nothing there.
    assert sections == [HEADERS[how].format(script=os.path.relpath(script, ROOT))]
    return result


@pytest.mark.parametrize("how", ["eager", "no compile"])
def test_an_eager_model_is_explained(tmp_path, how):
    out = explain_model(tmp_path, how).stdout
    assert "forward 'Net': 2 ranges\n    h.0: modules #2..#2 (1 module)\n    h.1: modules #3..#3 (1 module)\n" in out
    assert "backward 'Net': 2 ranges\n    h.0 (backward): modules #2..#2" in out
    assert re.search(r"^forward 'Net' \(2 ranges\)\n├── h\.0  #2\.\.#2\n└── h\.1  #3\.\.#3$", out, re.M)


@pytest.mark.slow  # an Inductor compile, forward and backward: 20 to 60 s
@pytest.mark.parametrize("how", ["inductor", "torch.compile"])
def test_an_inductor_model_is_explained(tmp_path, how):
    out = explain_model(tmp_path, how).stdout
    assert "NvtxInductor('blocks: each module <h.*>', domain='nvtx_regions')" in out
    assert re.search(r"^  forward 'graph 0 \(forward\)': 2 ranges\n    h\.0: kernels #\d+\.\.#\d+ .*\n    h\.1: kernels", out, re.M)
    assert re.search(r"^  backward 'graph 0 \(backward\)': 2 ranges\n    h\.1 \(backward\): kernels", out, re.M)
    assert re.search(r"^forward 'graph 0 \(forward\)' \(2 ranges\)\n├── h\.0  #", out, re.M)
