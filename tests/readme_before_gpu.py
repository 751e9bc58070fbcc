"""The commands of README's "Before the GPU run" section, and their real output.

    python tests/readme_before_gpu.py          # check: exit 1 and a diff when README is stale
    python tests/readme_before_gpu.py --write  # refresh README's output blocks from real runs

Each command sits in README after ``<!-- before-gpu: NAME -->`` as a ``bash``
block, followed by a ``text`` block with its output. `real_output` runs the
command (``.venv/bin/nvtx-regions`` as ``python -m nvtx_regions``, and any
other ``.venv/bin/NAME`` as NAME beside this interpreter, which the output
shows as ``.venv/bin/`` again; the timeline goes to a temporary directory)
and returns its stdout. `comparable` masks what changes from run
to run: the times in the capture summary. tests/test_readme_before_gpu.py
asserts that README holds `comparable` real output.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

COMMANDS = {
    "capture": ".venv/bin/nvtx-regions capture -o timeline.json --summary-by label -- "
    ".venv/bin/python examples/train.py --steps 2 --spec examples/regions.nvtx",
    "nsys": ".venv/bin/nvtx-regions nsys examples/profile_steps.nvtx -- "
    ".venv/bin/torchrun --nproc_per_node=2 examples/train.py --steps 13 --spec examples/profile_steps.nvtx",
    "explain": ".venv/bin/nvtx-regions explain examples/regions.nvtx --max-ops 1 -- .venv/bin/python examples/train.py --steps 1",
}
BLOCK = re.compile(r"<!-- before-gpu: (?P<name>\w+) -->\n```bash\n(?P<command>.*?)\n```\n\n```text\n(?P<output>.*?)```", re.S)
TIMELINE = "timeline.json"
VENV_BIN = ".venv/bin/"
HERE_BIN = f"{Path(sys.executable).parent}/"


def argv_of(command: str, timeline: str) -> list[str]:
    argv = []
    for word in command.split():
        if word == ".venv/bin/nvtx-regions":
            argv += [sys.executable, "-m", "nvtx_regions"]
        elif word == ".venv/bin/python":
            argv.append(sys.executable)
        elif word.startswith(VENV_BIN):
            argv.append(HERE_BIN + word[len(VENV_BIN) :])
        else:
            argv.append(timeline if word == TIMELINE else word)
    return argv


@functools.lru_cache(maxsize=None)
def real_output(name: str) -> str:
    """The stdout of README's command `name`, run in the repository root (paths as README shows them)."""
    with tempfile.TemporaryDirectory(prefix="readme-") as tmp:
        timeline = str(Path(tmp) / TIMELINE)
        result = subprocess.run(
            argv_of(COMMANDS[name], timeline), cwd=ROOT, capture_output=True, text=True, timeout=600
        )
    if result.returncode != 0:
        raise RuntimeError(f"{COMMANDS[name]} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return result.stdout.replace(timeline, TIMELINE).replace(HERE_BIN, VENV_BIN)


SUMMARY_ROW = re.compile(r"^(\s*)([\d.]+(?:\s+[\d.]+){7})(\s+(?:PushPop|StartEnd)\s.*)$")


def comparable(name: str, text: str) -> str:
    """`text` with run-to-run noise masked: the capture summary keeps only Instances, Style and Range,
    and its rows are compared in sorted order (their order follows the times)."""
    if name != "capture":
        return text.strip()
    out = []
    for line in text.strip().splitlines():
        m = SUMMARY_ROW.match(line)
        if m:
            numbers = m[2].split()
            line = f"<times> {numbers[2]} <times>{m[3]}"
        elif line.startswith("--------"):
            line = "<column rule>"  # widths follow the numbers
        if m or line.startswith("Time (%)"):
            line = re.sub(r"\s+", " ", line).strip()
        out.append(line)
    # Rows are sorted by total time, which changes from run to run: compare them as a set.
    rows = sorted(line for line in out if line.startswith("<times>"))
    first = next((i for i, line in enumerate(out) if line.startswith("<times>")), len(out))
    rest = [line for line in out if not line.startswith("<times>")]
    return "\n".join(rest[:first] + rows + rest[first:])


def readme_blocks(text: str | None = None) -> dict[str, tuple[str, str]]:
    """name -> (command, output) as README shows them."""
    text = README.read_text(encoding="utf-8") if text is None else text
    return {m["name"]: (m["command"], m["output"]) for m in BLOCK.finditer(text)}


def refresh_readme() -> bool:
    """Write real output into README's blocks; True when README changed."""
    text = README.read_text(encoding="utf-8")

    def replace(m: re.Match) -> str:
        return f"<!-- before-gpu: {m['name']} -->\n```bash\n{COMMANDS[m['name']]}\n```\n\n```text\n{real_output(m['name']).rstrip()}\n```"

    new = BLOCK.sub(replace, text)
    README.write_text(new, encoding="utf-8")
    return new != text


if __name__ == "__main__":
    if "--write" in sys.argv:
        print("README.md updated" if refresh_readme() else "README.md already current")
    else:
        stale = [n for n, (c, o) in readme_blocks().items() if c != COMMANDS[n] or comparable(n, o) != comparable(n, real_output(n))]
        print(f"stale: {stale}" if stale else "README.md current")
        sys.exit(1 if stale else 0)
