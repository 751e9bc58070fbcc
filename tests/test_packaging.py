"""The wheel carries the grammar and the capture tool's C source, and the
installed package reads the grammar it carries."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (path,) = out.glob("nvtx_regions-*.whl")
    return path


def test_wheel_carries_the_grammar_file_itself(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        assert "nvtx_regions/grammar/nvtx_regions.lark" in names
        assert archive.read("nvtx_regions/grammar/nvtx_regions.lark") == (ROOT / "grammar/nvtx_regions.lark").read_bytes()
        assert "nvtx_regions/capture/nvtx_capture.c" in names
        assert not [n for n in names if n.startswith(("tests/", "examples/"))]


def test_installed_package_reads_its_packaged_grammar(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
    )
    # Mark the installed copy so that reading it proves which file the loader used.
    packaged = target / "nvtx_regions/grammar/nvtx_regions.lark"
    packaged.write_text(packaged.read_text() + "\n// packaged copy\n")
    code = (
        "import nvtx_regions; from nvtx_regions.language.parse import grammar_resource, grammar_text;"
        "print(grammar_resource()); print(grammar_text().endswith('// packaged copy\\n'));"
        "print(nvtx_regions.render(nvtx_regions.parse('a: op in <linear>')))"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    location, marked, rendered = result.stdout.splitlines()
    assert Path(location) == packaged
    assert marked == "True"
    assert rendered == "a: op in <linear>"


def test_installed_command_line_has_every_command(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True)  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(target)}
    result = subprocess.run([sys.executable, "-m", "nvtx_regions", "--help"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, check=True)  # fmt: skip
    assert "{check,grammar,capture,nsys,explain,profile,report,compare}" in result.stdout
    assert "exit status: 0 ok" in result.stdout
