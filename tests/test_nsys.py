"""``nvtx-regions nsys``: exact command lines for a table of specs.

The commands are checked against what the Nsight Systems User Guide ("CLI
Profile Command Switch Options") documents: flag names, value forms
(``range@domain``, ``repeat-shutdown:N``, ``%q{ENV_VAR}`` in ``--output``,
``default`` for the default domain). tests/test_nsys_real.py runs such
commands under the real nsys.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from nvtx_regions import parse
from nvtx_regions.commands.nsys import nsys_command, split_torchrun

ROOT = Path(__file__).resolve().parents[1]
OFF = "--sample=none --cpuctxsw=none"
BASE = f"nsys profile --trace=cuda,nvtx --nvtx-domain-include=nvtx_regions {OFF}"
REGION = "between first(op in <linear>)..last(op in <linear>)"

CASES = [
    # (spec, command, options, expected command line)
    ("op in <linear>", "python train.py", {}, f"{BASE} --output=nvtx_regions_report python train.py"),
    # the user's markers are re-emitted in their own domains: no domain filter
    ("each marker <*>\nop in <linear>", "python train.py", {},
     f"nsys profile --trace=cuda,nvtx {OFF} --output=nvtx_regions_report python train.py"),
    ("all", "python train.py", {"domain": None},
     f"nsys profile --trace=cuda,nvtx --nvtx-domain-include=default {OFF} --output=nvtx_regions_report python train.py"),
    ("all", "python t.py", {"domain": "my,model", "output": "r"},
     rf"nsys profile --trace=cuda,nvtx '--nvtx-domain-include=my\,model' {OFF} --output=r python t.py"),
    # a labelled region gated to steps: capture on its range, one collection per step
    (f"ffn: {REGION} and forward and steps 10..12", "python train.py", {},
     f"{BASE} --capture-range=nvtx --nvtx-capture=ffn@nvtx_regions --capture-range-end=repeat-shutdown:3 "
     "--output=nvtx_regions_report python train.py"),
    # no phase: the region may be in the forward and the backward trace of each step
    (f"ffn: {REGION} and steps 4..5", "python train.py", {},
     f"{BASE} --capture-range=nvtx --nvtx-capture=ffn@nvtx_regions --capture-range-end=repeat-shutdown:4 "
     "--output=nvtx_regions_report python train.py"),
    # open-ended steps: repeat with no count
    (f"ffn: {REGION} and backward and steps 7..", "python train.py", {},
     f"{BASE} --capture-range=nvtx --nvtx-capture=ffn@nvtx_regions --capture-range-end=repeat "
     "--output=nvtx_regions_report python train.py"),
    # the default domain: the range name alone
    (f"ffn: {REGION} and forward and steps 1..1", "python train.py", {"domain": None},
     f"nsys profile --trace=cuda,nvtx --nvtx-domain-include=default {OFF} --capture-range=nvtx --nvtx-capture=ffn "
     "--capture-range-end=repeat-shutdown:1 --output=nvtx_regions_report python train.py"),
    # a steps gate without a label, or on per-op ranges: no capture range
    (f"{REGION} and forward and steps 10..12", "python train.py", {}, f"{BASE} --output=nvtx_regions_report python train.py"),
    ("mm: steps 10..12 and op in <matmul>", "python train.py", {}, f"{BASE} --output=nvtx_regions_report python train.py"),
    # the first eligible rule wins; ungated and rank-only rules never start a capture
    (f"a: {REGION} and forward\nb: {REGION} and forward and rank in <0>\n"
     f"c: {REGION} and forward and steps 2..3 and rank in <0, 1>\nd: {REGION} and forward and steps 5..6",
     "python train.py", {},
     f"{BASE} --capture-range=nvtx --nvtx-capture=c@nvtx_regions --capture-range-end=repeat-shutdown:2 "
     "--output=nvtx_regions_report python train.py"),
    # a quoted label with a space
    (f'"block 0": {REGION} and forward and steps 3..4', "python train.py", {},
     f"{BASE} --capture-range=nvtx '--nvtx-capture=block 0@nvtx_regions' --capture-range-end=repeat-shutdown:2 "
     "--output=nvtx_regions_report python train.py"),
    # torchrun: nsys inside each worker, one report per rank
    ("op in <linear>", "torchrun --nproc_per_node=2 train.py --steps 3", {},
     f"torchrun --nproc_per_node=2 --no-python {BASE} '--output=nvtx_regions_report.rank%q{{RANK}}' "
     "/opt/venv/bin/python3 -u train.py --steps 3"),
    ("op in <linear>", "torchrun --standalone --nproc-per-node 2 -m pkg.train --x", {},
     f"torchrun --standalone --nproc-per-node 2 --no-python {BASE} '--output=nvtx_regions_report.rank%q{{RANK}}' "
     "/opt/venv/bin/python3 -u -m pkg.train --x"),
    ("op in <linear>", "torchrun --nproc_per_node=2 --no-python ./run.sh a", {},
     f"torchrun --nproc_per_node=2 --no-python {BASE} '--output=nvtx_regions_report.rank%q{{RANK}}' ./run.sh a"),
    (f"ffn: {REGION} and forward and steps 10..12 and rank in <0>", "python -m torch.distributed.run --nnodes=1 train.py", {},
     f"python -m torch.distributed.run --nnodes=1 --no-python {BASE} --capture-range=nvtx "
     "--nvtx-capture=ffn@nvtx_regions --capture-range-end=repeat:3 "
     "'--output=nvtx_regions_report.rank%q{RANK}' python -u train.py"),
]  # fmt: skip


@pytest.fixture
def torchrun_on_path(tmp_path, monkeypatch):
    """A `torchrun` console script on PATH whose #! line names /opt/venv/bin/python3 (torchrun's sys.executable)."""
    script = tmp_path / "bin" / "torchrun"
    script.parent.mkdir()
    script.write_text("#!/opt/venv/bin/python3\nimport sys\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("PYTHON_EXEC", raising=False)
    return script


@pytest.mark.parametrize("spec, command, options, expected", CASES)
def test_command_lines(spec, command, options, expected, torchrun_on_path):
    result = nsys_command(parse(spec), shlex.split(command), **options)
    assert result.shell() == expected
    # Every flag is commented with its user-guide entry, in the rendered text.
    text = str(result)
    for flag in result.flags:
        name = flag.text.split("=", 1)[0]
        assert f"# {flag.text}: " in text and f"CLI Profile Command Switch Options: {name}]" in text


def test_rendered_text_is_the_same_command(torchrun_on_path):
    result = nsys_command(parse(f"ffn: {REGION} and forward and steps 10..12"), ["torchrun", "--nproc_per_node=2", "t.py"])
    body = [line for line in str(result).splitlines() if not line.startswith("#")]
    joined = " ".join(line.rstrip("\\").strip() for line in body)
    assert shlex.split(joined) == list(result.argv)


def test_notes_explain_what_the_flags_cannot():
    rank_gated = nsys_command(parse(f"ffn: {REGION} and forward and steps 1..2 and rank in <0>"), ["python", "t.py"])
    assert "only ranks [0] push 'ffn'; other ranks never start collecting" in rank_gated.notes
    unlabelled = nsys_command(parse(f"{REGION} and steps 1..2"), ["python", "t.py"])
    (note,) = unlabelled.notes
    assert "has a steps gate but has no label, so there is no capture range" in note


def test_split_torchrun_leaves_other_commands_alone(torchrun_on_path):
    assert split_torchrun(["python", "train.py"]) is None
    assert split_torchrun([str(torchrun_on_path), "--nproc_per_node=4", "t.py", "-x"]) == (
        [str(torchrun_on_path), "--nproc_per_node=4"], ["/opt/venv/bin/python3", "-u", "t.py", "-x"])  # fmt: skip


def test_cli_prints_the_command_for_a_spec_file():
    result = subprocess.run(
        [sys.executable, "-m", "nvtx_regions", "nsys", "examples/profile_steps.nvtx", "--", "python", "examples/train.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    # The spec travels with the command (env works in every shell), for a script that calls compile(model) without one.
    assert "\n# NVTX_REGIONS_SPEC=examples/profile_steps.nvtx: nvtx_regions.compile(model) without a spec takes this file" in result.stdout
    assert "\nenv NVTX_REGIONS_SPEC=examples/profile_steps.nvtx nsys profile \\\n" in result.stdout
    assert result.stdout.rstrip().endswith(
        "nsys profile \\\n    --trace=cuda,nvtx \\\n    --nvtx-domain-include=nvtx_regions \\\n"
        "    --sample=none \\\n    --cpuctxsw=none \\\n"
        "    --capture-range=nvtx \\\n    --nvtx-capture=block0@nvtx_regions \\\n"
        "    --capture-range-end=repeat-shutdown:3 \\\n    --output=nvtx_regions_report \\\n    python examples/train.py"
    )


def test_the_spec_file_goes_before_torchrun_too(torchrun_on_path):
    command = nsys_command(parse("each module <*>"), [str(torchrun_on_path), "--nproc_per_node=2", "t.py"], spec_path="a b.nvtx")
    assert command.argv[:3] == ("env", "NVTX_REGIONS_SPEC=a b.nvtx", str(torchrun_on_path))
    assert command.shell().startswith("env 'NVTX_REGIONS_SPEC=a b.nvtx' ")
    assert nsys_command(parse("each module <*>"), ["python", "t.py"]).argv[0] == "nsys"  # no file, nothing to carry


def test_the_exit_status_and_the_reports_the_command_promises(tmp_path, torchrun_on_path):
    from nvtx_regions.commands.nsys import report_files

    shutdown = nsys_command(parse(f"ffn: {REGION} and forward and steps 1..2"), ["python", "t.py"], output=str(tmp_path / "r"))
    assert (shutdown.status(143), shutdown.status(1)) == (0, 1)
    assert nsys_command(parse("each module <*>"), ["python", "t.py"]).status(143) == 143
    for name in ("r.nsys-rep", "r.1.nsys-rep", "r.rank0.nsys-rep", "r.rank1.2.nsys-rep", "rr.nsys-rep", "r.sqlite"):
        (tmp_path / name).touch()
    assert report_files(str(tmp_path / "r"), torchrun=False) == [str(tmp_path / n) for n in ("r.1.nsys-rep", "r.nsys-rep")]
    assert report_files(str(tmp_path / "r"), torchrun=True) == [str(tmp_path / n) for n in ("r.rank0.nsys-rep", "r.rank1.2.nsys-rep")]
    assert report_files(str(tmp_path / "r"), torchrun=True, rank=1) == [str(tmp_path / "r.rank1.2.nsys-rep")]
    assert report_files(str(tmp_path / "missing" / "r"), torchrun=False) == []


def test_emit_goes_before_the_command_with_the_spec(torchrun_on_path):
    command = nsys_command(parse("each module <*>"), ["python", "t.py"], spec_path="s.nvtx", emit=("nvtx", "record_function"))
    assert command.argv[:4] == ("env", "NVTX_REGIONS_SPEC=s.nvtx", "NVTX_REGIONS_EMIT=nvtx,record_function", "nsys")
    assert "\n# NVTX_REGIONS_EMIT=nvtx,record_function: where the ranges go, where the script gives no emit= (--emit)\n" in str(command)
    assert command.program == "nsys"
    alone = nsys_command(parse("each module <*>"), [str(torchrun_on_path), "t.py"], emit=("nvtx",))
    assert alone.argv[:2] == ("env", "NVTX_REGIONS_EMIT=nvtx") and alone.program == str(torchrun_on_path)
