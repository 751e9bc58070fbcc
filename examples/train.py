"""A few training steps of a small GPT under thunder on the CPU, for the
"Before the GPU run" commands of README.md.

    python examples/train.py --steps 3                              # thunder.jit(model), no transform
    python examples/train.py --steps 3 --spec examples/regions.nvtx # with NvtxProfileTransform(spec=...)

Prints one line: the number of steps and the last loss.
"""

from __future__ import annotations

import argparse
import warnings

import thunder
import torch
from thunder.tests.nanogpt_model import GPT, GPTConfig


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--spec", help="a .nvtx file: jit with NvtxProfileTransform(spec=SPEC)")
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", UserWarning)  # thunder's and torch's own chatter

    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=args.layers, n_head=2, n_embd=32, dropout=0.0))
    transforms = []
    if args.spec:
        from nvtx_regions import NvtxProfileTransform

        transforms.append(NvtxProfileTransform(spec=args.spec))
    jitted = thunder.jit(model, transforms=transforms)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    idx = torch.randint(0, 64, (2, 16))
    targets = torch.randint(0, 64, (2, 16))
    for _ in range(args.steps):
        optimizer.zero_grad()
        _, loss = jitted(idx, targets)
        loss.backward()
        optimizer.step()
    print(f"{args.steps} step{'s' * (args.steps != 1)}, loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
