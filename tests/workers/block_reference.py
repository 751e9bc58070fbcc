"""A reference for `each module <transformer.h.*>` ranges where thunder moves ops
(ThunderFX, FSDP), shared by tests/test_hoisting.py and the torchrun worker.

Written from the issue's words, not from nvtx_regions' hoisting rule (which
follows tags that thunder and dynamo put on parameters): here what does *not*
stretch a block's range is found the other way round, from the model's inputs.

- Forward: an op *carries the input* if it reads the input tokens (``idx``),
  or a value an op carrying the input wrote. Block ``i``'s range runs from the
  first to the last op of block ``i`` (module attribution, tested on its own
  in test_modules.py) that carries the input.
- Backward: the same, from the gradients flowing in (the trace's cotangents)
  instead of the tokens.

And checks that need no attribution at all, from parameter names only:
- every op that carries the input and reads block ``i``'s weights (directly or
  through all-gathers and other ops on weights alone) lies in block ``i``'s
  range and in no other block's;
- in the forward, consecutive block ranges meet in the data flow: the op
  that ends block ``i``'s range writes a value that the op starting block
  ``i + 1``'s range reads (the residual stream between the blocks).
"""

from __future__ import annotations

import re
from typing import Any

BLOCK_PARAMETER = re.compile(r"(?:^t_transformer_h_|_transformer_modules_h_modules_)(\d+)_")
INPUTS = ("idx", "l_idx_")


def block_of_parameter(name: str) -> int | None:
    """The block whose weight a trace argument is, from thunder's or dynamo's name for it."""
    found = BLOCK_PARAMETER.search(name)
    return None if found is None else int(found.group(1))


def _carriers(view: Any, sources: set[str]) -> list[bool]:
    flowing = set(sources)
    out = []
    for op in view.ops:
        carries = any(name in flowing for name in op.reads)
        if carries:
            flowing.update(op.writes)
        out.append(carries)
    return out


def _weight_blocks(view: Any) -> dict[str, int]:
    """Name -> block, for block weights (what the trace reads and never writes: its
    arguments, or values saved from the forward) and every value computed from one
    block's weights alone."""
    written = {name for op in view.ops for name in op.writes}
    blocks: dict[str, int] = {}
    for op in view.ops:
        for name in op.reads:
            block = block_of_parameter(name)
            if block is not None and name not in written:
                blocks[name] = block
    for op in view.ops:
        found = {blocks.get(name) for name in op.reads}
        if op.reads and len(found) == 1 and None not in found:
            block = found.pop()
            for name in op.writes:
                blocks[name] = block
    return blocks


def block_of_chain(chain: Any) -> int | None:
    for call in chain or ():
        found = re.fullmatch(r"transformer\.h\.(\d+)", call.path)
        if found:
            return int(found.group(1))
    return None


def reference_ranges(view: Any, cotangents: set[str] | None = None) -> dict[int, tuple[int, int]]:
    """Block -> (first, last) compute positions of its range, as the module doc says."""
    sources = set(INPUTS) if view.phase == "forward" else set(cotangents or ())
    carries = _carriers(view, sources)
    ranges: dict[int, tuple[int, int]] = {}
    for position, chain in enumerate(view.module_chains):
        block = block_of_chain(chain)
        if block is None or not carries[position]:
            continue
        first, last = ranges.get(block, (position, position))
        ranges[block] = (min(first, position), max(last, position))
    return ranges


def problems(view: Any, ranges: dict[int, tuple[int, int]], cotangents: set[str] | None = None) -> list[str]:
    """What the name-only checks of the module doc find wrong with `ranges` (empty: nothing)."""
    found: list[str] = []
    sources = set(INPUTS) if view.phase == "forward" else set(cotangents or ())
    carries = _carriers(view, sources)
    weights = _weight_blocks(view)
    for position, op in enumerate(view.ops):
        blocks = {weights[name] for name in op.reads if name in weights}
        if not carries[position] or len(blocks) != 1:
            continue
        (block,) = blocks
        inside = [b for b, (first, last) in ranges.items() if first <= position <= last]
        if inside != [block]:
            found.append(f"op #{position} {op.name} reads block {block}'s weights but lies in blocks {inside}")
    order = sorted(ranges.values())
    for (_, last), (first, _) in zip(order, order[1:]):
        if first <= last:
            found.append(f"ranges overlap: {order}")
    if view.phase == "forward":
        for block in sorted(ranges)[:-1]:
            end, start = view.ops[ranges[block][1]], view.ops[ranges[block + 1][0]]
            if not set(end.writes) & set(start.reads):
                found.append(f"block {block} ends at {end.name} {end.writes}, block {block + 1} starts at "
                             f"{start.name} {start.reads}: they do not meet in the data flow")  # fmt: skip
    return found
