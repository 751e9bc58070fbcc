"""A few training steps of a small GPT on the CPU, for the "Before the GPU run"
commands of README.md and for ``nvtx-regions profile``.

    python examples/train.py --steps 3 --backend eager                 # every module's ranges, eager
    python examples/train.py --steps 3 --backend inductor --spec examples/blocks.nvtx
    nvtx-regions profile examples/blocks.nvtx --backends eager,inductor -- python examples/train.py

The model is the small GPT of `examples/gpt.py` (plain PyTorch). One line,
`nvtx_regions.compile`, chooses the backend and puts the ranges in; without
``--backend`` the backend is the one ``nvtx-regions profile`` asks for, else
inductor. `nvtx_regions.steps` puts each
training step in a range. Prints one line: the number of steps and the last loss.
"""

from __future__ import annotations

import argparse
import warnings

import torch
from gpt import small_gpt

import nvtx_regions


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--spec", help="a .nvtx file (default: the one nvtx-regions profile passes, else every module)")
    parser.add_argument("--backend", choices=("eager", "thunder", "inductor"), help="default: as the command asks, else inductor")
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", UserWarning)  # thunder's and torch's own chatter
    warnings.simplefilter("default", nvtx_regions.NvtxRegionsWarning)  # but not ours: what the spec did

    model = small_gpt(args.layers)
    compiled = nvtx_regions.compile(model, spec=args.spec, backend=args.backend)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    idx = torch.randint(0, 64, (2, 16))
    targets = torch.randint(0, 64, (2, 16))
    for _ in nvtx_regions.steps(range(args.steps)):
        optimizer.zero_grad()
        _, loss = compiled(idx, targets)
        loss.backward()
        optimizer.step()
    print(f"{args.steps} step{'s' * (args.steps != 1)}, loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
