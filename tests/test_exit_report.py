"""One report at exit for every backend (issue 43): what a handle has not said by the end of the
process is said then, by each backend, and a removed handle says nothing more."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return result


INDUCTOR = (
    "import torch, nvtx_regions\n"
    "def once(spec):\n"
    "    compiled = nvtx_regions.compile(torch.nn.Sequential(torch.nn.Linear(4, 4)), spec, backend='inductor')\n"
    "    with torch.no_grad():\n"
    "        compiled(torch.randn(2, 4))\n"
    "    return compiled\n"
    "kept = once('each module <said_at_exit>')\n"
    "removed = once('each module <removed_before_exit>')\n"
    "removed.nvtx_regions_backend.remove()\n"
)


def test_an_inductor_backend_says_at_exit_what_it_left_unsaid_unless_removed(tmp_path):
    # Each called once without gradients: no backward and no second call to say it at.
    result = _run(INDUCTOR, tmp_path)
    assert "rule 'each module <said_at_exit>' (<select>:1) selected nothing" in result.stderr, result.stderr[-2000:]
    assert "removed_before_exit" not in result.stderr


@pytest.mark.thunder
def test_one_report_at_exit_speaks_for_every_backend(tmp_path):
    code = INDUCTOR + (
        "import thunder\n"
        "from thunder.dynamo import ThunderCompiler\n"
        "from nvtx_regions import NvtxProfileTransform\n"
        # ThunderFX gives no moment when all subgraphs are compiled: its check waits for check() or exit.
        "fx = NvtxProfileTransform('op in <tanh>\\nop in <no_such_op>')\n"
        "def fn(x):\n"
        "    y = torch.tanh(x)\n"
        "    torch._dynamo.graph_break()\n"
        "    return (y * 2).sum()\n"
        "torch.compile(fn, backend=ThunderCompiler(transforms=[fx]))(torch.randn(2, 4))\n"
        "unused = NvtxProfileTransform('each module <*>')  # alive, never handed a trace\n"
    )
    result = _run(code, tmp_path)
    said = result.stderr
    assert "rule 'each module <said_at_exit>' (<select>:1) selected nothing" in said, said[-3000:]
    assert "rule 'op in <no_such_op>' (<select>:2) selected nothing" in said, said[-3000:]
    assert "thunder never handed a trace to" in said and "each module <*>" in said, said[-3000:]
    assert "removed_before_exit" not in said
