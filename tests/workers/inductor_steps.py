"""Training steps of a small two-block model under torch.compile, annotated or plain, for tests/test_inductor.py.

    python tests/workers/inductor_steps.py SPEC STEPS [--graph-break]

SPEC is the spec text for `NvtxInductor`, or ``-`` for a plain ``torch.compile``.
Inductor's cache is $TORCHINDUCTOR_CACHE_DIR. The last line printed is JSON:
the FX graph cache's hits and misses, AOTAutograd's cache hits, graph breaks,
and the folder of the nvtx_regions that ran.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


def make_blocks(graph_break: bool = False, container: str = "blocks"):
    """Two blocks (linear, GELU, residual, LayerNorm) in a ModuleList named `container`, and a head;
    with `graph_break`, Dynamo breaks the graph between the blocks."""
    import torch

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(16, 16)
            self.act = torch.nn.GELU()
            self.norm = torch.nn.LayerNorm(16)

        def forward(self, x):
            return self.norm(x + self.act(self.fc(x)))

    class Blocks(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            setattr(self, container, torch.nn.ModuleList([Block(), Block()]))
            self.head = torch.nn.Linear(16, 4)
            self.container = container

        def forward(self, x):
            # Through the attribute each time: Dynamo names a module by how the frame reaches it,
            # and a local alias would name blocks after the graph break by the alias.
            x = getattr(self, self.container)[0](x)
            if graph_break:
                # Outside a loop, so that Dynamo resumes the root's frame after it (a break
                # inside a loop skips the frame, and compiles each block's forward on its own).
                torch._dynamo.graph_break()
            x = getattr(self, self.container)[1](x)
            return self.head(x)

    torch.manual_seed(0)
    return Blocks()


def blocks_input():
    import torch

    torch.manual_seed(1)
    return torch.randn(8, 16)


def main(argv: list[str]) -> int:
    import torch
    from torch._dynamo.utils import counters

    import nvtx_regions

    spec, steps, graph_break = argv[0], int(argv[1]), "--graph-break" in argv
    model = make_blocks(graph_break)
    if spec == "-":
        compiled = torch.compile(model)
    else:
        from nvtx_regions.inductor import NvtxInductor

        compiled = torch.compile(model, backend=NvtxInductor(spec))
    for _ in range(steps):
        compiled(blocks_input()).sum().backward()
    print(
        json.dumps(
            {
                "fx_hits": counters["inductor"]["fxgraph_cache_hit"],
                "fx_misses": counters["inductor"]["fxgraph_cache_miss"],
                "aot_hits": counters["aot_autograd"]["autograd_cache_hit"],
                "graph_breaks": sum(counters["graph_break"].values()),
                "package": str(Path(nvtx_regions.__file__).parent),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
