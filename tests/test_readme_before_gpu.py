"""The tutorial shows the commands to run before the GPU run with their real output, and the
report how-to shows `report` on the tutorial's capture.

The commands and the way their output is compared live in tests/readme_before_gpu.py; when
explain()'s or the summary's text changes, refresh the pages with
``python tests/readme_before_gpu.py --write``.
"""

from __future__ import annotations

import re

import pytest
from readme_before_gpu import COMMANDS, PAGES, TUTORIAL, comparable, page_blocks, real_output, shown_blocks

from nvtx_regions.testing import unavailable_reason


def test_the_tutorial_shows_each_command_once_in_order():
    text = TUTORIAL.read_text(encoding="utf-8")
    steps = re.findall(r"^## (\d)\. ", text, flags=re.M)
    assert steps == ["1", "2", "3", "4", "5", "6"]
    blocks = page_blocks(text)
    assert list(blocks) == ["explain", "capture", "nsys"]
    # each in its step: what a spec selects, the ranges a run emits, the command for the GPU machine
    for step, command in (("2", "explain"), ("3", "capture"), ("4", "nsys")):
        section = text.split(f"\n## {step}. ", 1)[1].split("\n## ", 1)[0]
        assert f"<!-- before-gpu: {command} -->" in section
    assert {name: command for name, (command, _) in shown_blocks().items()} == COMMANDS
    assert set(PAGES) == set(COMMANDS)


# The tutorial's script runs under thunder (its spec selects thunder ops); `nsys` only prints a command.
# capture and explain run the tutorial's script (half a minute each): in the slow tier.
@pytest.mark.parametrize("name", [n if n == "nsys" else pytest.param(n, marks=[pytest.mark.thunder, pytest.mark.slow]) for n in COMMANDS])
def test_page_output_is_the_real_output(name):
    if name in ("capture", "report") and unavailable_reason():
        pytest.skip(f"capture tool unavailable: {unavailable_reason()}")
    _, shown = shown_blocks()[name]
    assert comparable(name, shown) == comparable(name, real_output(name)), (
        f"{PAGES[name].name} is stale: run `python tests/readme_before_gpu.py --write`"
    )


def test_comparable_masks_only_the_times():
    row = "    69.7        941459004         82   11481207.4    7991015.0    3150768   15954357    4099426.9  PushPop  nvtx_regions:matmuls"
    other = "     1.0              123         82        1.5          1.0          1          2          0.0  PushPop  nvtx_regions:matmuls"
    assert comparable("capture", row) == comparable("capture", other) == "<times> 82 <times> PushPop nvtx_regions:matmuls"
    assert comparable("capture", row) != comparable("capture", row.replace(" 82 ", " 83 "))
    assert comparable("explain", "a\n b ") == "a\n b"
    swapped = f"head\n{other}\n{row.replace(' 82 ', ' 2 ')}\ntail"
    assert comparable("capture", swapped) == comparable("capture", f"head\n{row.replace(' 82 ', ' 2 ')}\n{row}\ntail")
    module = "    2   107.59 ms  53.79 ms      2    1.70 ms  851.2 us  nvtx_regions:transformer.h.0"
    assert comparable("report", module) == "2 <times> 2 <times> nvtx_regions:transformer.h.0"
    assert comparable("report", module) != comparable("report", module.replace("    2  ", "    3  ", 1))
