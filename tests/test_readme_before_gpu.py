"""README's "Before the GPU run" shows the three commands with their real output.

The commands and the way their output is compared live in
tests/readme_before_gpu.py; when explain()'s or the summary's text changes,
refresh README with ``python tests/readme_before_gpu.py --write``.
"""

from __future__ import annotations

import pytest
from readme_before_gpu import COMMANDS, README, comparable, readme_blocks, real_output

from nvtx_regions.testing import unavailable_reason


def test_the_section_shows_each_command_once_in_order():
    text = README.read_text(encoding="utf-8")
    section = text.split("## Before the GPU run", 1)[1].split("\n## ", 1)[0]
    assert text.index("## Proving the ranges happen") < text.index("## Before the GPU run") < text.index("## Performance")
    blocks = readme_blocks(section)
    assert list(blocks) == ["capture", "nsys", "explain"]
    assert {name: command for name, (command, _) in blocks.items()} == COMMANDS
    assert "the tests **run these commands under the real nsys**" in " ".join(section.split())


@pytest.mark.parametrize("name", list(COMMANDS))
def test_readme_output_is_the_real_output(name):
    if name == "capture" and unavailable_reason():
        pytest.skip(f"capture tool unavailable: {unavailable_reason()}")
    _, shown = readme_blocks()[name]
    assert comparable(name, shown) == comparable(name, real_output(name)), (
        "README is stale: run `python tests/readme_before_gpu.py --write`"
    )


def test_comparable_masks_only_the_times():
    row = "    69.7        941459004         82   11481207.4    7991015.0    3150768   15954357    4099426.9  PushPop  nvtx_regions:matmuls"
    other = "     1.0              123         82        1.5          1.0          1          2          0.0  PushPop  nvtx_regions:matmuls"
    assert comparable("capture", row) == comparable("capture", other) == "<times> 82 <times> PushPop nvtx_regions:matmuls"
    assert comparable("capture", row) != comparable("capture", row.replace(" 82 ", " 83 "))
    assert comparable("explain", "a\n b ") == "a\n b"
    swapped = f"head\n{other}\n{row.replace(' 82 ', ' 2 ')}\ntail"
    assert comparable("capture", swapped) == comparable("capture", f"head\n{row.replace(' 82 ', ' 2 ')}\n{row}\ntail")
