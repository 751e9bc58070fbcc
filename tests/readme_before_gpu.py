"""The commands the tutorial runs before the GPU run (and `report` on their capture), and their real output.

    python tests/readme_before_gpu.py          # check: exit 1 and a list when a page is stale
    python tests/readme_before_gpu.py --write  # refresh the pages' output blocks from real runs

Each command sits on a page of docs/ after ``<!-- before-gpu: NAME -->`` as a
``bash`` block, followed by a ``text`` block with its output. `real_output`
runs the command (``.venv/bin/nvtx-regions`` as ``python -m nvtx_regions``,
and any other ``.venv/bin/NAME`` as NAME beside this interpreter, which the
output shows as ``.venv/bin/`` again; the timeline goes to a temporary
directory, which `report` then reads) and returns its stdout, or for `report`
the part a page shows. `comparable` masks what changes from run to run: the
times in the summary tables. tests/test_readme_before_gpu.py asserts that
the pages hold `comparable` real output.
"""

from __future__ import annotations

import atexit
import functools
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "docs" / "tutorial.md"
REPORT_PAGE = ROOT / "docs" / "how-to" / "read-a-report.md"
PAGES = {"explain": TUTORIAL, "capture": TUTORIAL, "nsys": TUTORIAL, "report": REPORT_PAGE}

COMMANDS = {
    "explain": ".venv/bin/nvtx-regions explain examples/regions.nvtx --max-ops 1 -- .venv/bin/python examples/train.py --steps 1 --backend thunder",
    "capture": ".venv/bin/nvtx-regions capture -o timeline.json --summary-by label -- "
    ".venv/bin/python examples/train.py --steps 2 --spec examples/regions.nvtx --backend thunder",
    "nsys": ".venv/bin/nvtx-regions nsys examples/profile_steps.nvtx -- "
    ".venv/bin/torchrun --nproc_per_node=2 examples/train.py --steps 13 --spec examples/profile_steps.nvtx --backend thunder",
    "report": ".venv/bin/nvtx-regions report timeline.json",  # the capture's timeline
}
REPORT_SHOWN_FROM = "Per rule (NVTX category):"  # the page leaves out the table per range
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
def workdir() -> Path:
    """Where the capture writes its timeline, kept for `report` until this process ends."""
    path = Path(tempfile.mkdtemp(prefix="docs-before-gpu-"))
    atexit.register(shutil.rmtree, path, True)
    return path


@functools.lru_cache(maxsize=None)
def real_output(name: str) -> str:
    """The stdout of the page's command `name`, run in the repository root (paths as the page shows them)."""
    if name == "report":
        real_output("capture")  # writes the timeline that report reads
    timeline = str(workdir() / TIMELINE)
    result = subprocess.run(argv_of(COMMANDS[name], timeline), cwd=ROOT, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise RuntimeError(f"{COMMANDS[name]} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    out = result.stdout.replace(timeline, TIMELINE).replace(HERE_BIN, VENV_BIN)
    return out[out.index(REPORT_SHOWN_FROM) :] if name == "report" else out


SUMMARY_ROW = re.compile(r"^(\s*)([\d.]+(?:\s+[\d.]+){7})(\s+(?:PushPop|StartEnd)\s.*)$")
_TIME = r"[\d.]+ (?:s|ms|us|ns)"  # a duration as report.numbers writes it
MODULE_ROW = re.compile(rf"^\s*(\d+)\s+{_TIME}\s+{_TIME}\s+(\d+)\s+{_TIME}\s+{_TIME}\s+(\S+)$")


def comparable(name: str, text: str) -> str:
    """`text` with run-to-run noise masked: a summary row keeps only Instances, Style and Range, a
    module row only its counts and module, and each table's rows are compared in sorted order
    (their order follows the times)."""
    if name not in ("capture", "report"):
        return text.strip()
    out: list[str] = []
    rows: list[str] = []
    for line in [*text.strip().splitlines(), ""]:
        summary, module = SUMMARY_ROW.match(line), MODULE_ROW.match(line)
        if summary:
            rows.append(re.sub(r"\s+", " ", f"<times> {summary[2].split()[2]} <times>{summary[3]}").strip())
            continue
        if module:
            rows.append(f"{module[1]} <times> {module[2]} <times> {module[3]}")
            continue
        out += sorted(rows)  # rows are sorted by total time, which changes from run to run
        rows = []
        if line.startswith(("--------", "-----  ")):
            line = "<column rule>"  # widths follow the numbers
        elif line.startswith(("Time (%)", "Fwd n")):
            line = re.sub(r"\s+", " ", line).strip()
        out.append(line)
    return "\n".join(out).strip()


def page_blocks(text: str) -> dict[str, tuple[str, str]]:
    """name -> (command, output) as a page shows them."""
    return {m["name"]: (m["command"], m["output"]) for m in BLOCK.finditer(text)}


def shown_blocks() -> dict[str, tuple[str, str]]:
    """name -> (command, output) over every page, as they show them."""
    found: dict[str, tuple[str, str]] = {}
    for page in dict.fromkeys(PAGES.values()):
        found.update(page_blocks(page.read_text(encoding="utf-8")))
    return found


def refresh_pages() -> list[Path]:
    """Write real output into the pages' blocks; the pages that changed."""
    changed = []
    for page in dict.fromkeys(PAGES.values()):
        text = page.read_text(encoding="utf-8")

        def replace(m: re.Match) -> str:
            return f"<!-- before-gpu: {m['name']} -->\n```bash\n{COMMANDS[m['name']]}\n```\n\n```text\n{real_output(m['name']).rstrip()}\n```"

        new = BLOCK.sub(replace, text)
        if new != text:
            page.write_text(new, encoding="utf-8")
            changed.append(page)
    return changed


if __name__ == "__main__":
    if "--write" in sys.argv:
        print("\n".join(f"updated {p.relative_to(ROOT)}" for p in refresh_pages()) or "already current")
    else:
        stale = [n for n, (c, o) in shown_blocks().items() if c != COMMANDS[n] or comparable(n, o) != comparable(n, real_output(n))]
        print(f"stale: {stale}" if stale else "current")
        sys.exit(1 if stale else 0)
