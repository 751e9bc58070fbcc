"""Profile a small nanoGPT eager and under thunder with the same spec, then compare.

    python examples/compare_eager_thunder.py [--out DIR] [--steps N]

Both runs get one range per transformer block, forward and backward
(``each module <transformer.h.*>``): eager through `nvtx_regions.eager.annotate`,
thunder through `NvtxProfileTransform`. The NVTX calls are recorded with
`nvtx_regions.testing` (no GPU or Nsight needed), written to ``eager.json`` and
``thunder.json`` (Chrome trace format; open them in Perfetto), and compared
per range name, as ``nvtx-regions compare eager.json thunder.json`` does.
The first call of each (thunder compiles then) is a warm-up and is not
recorded; then eager and thunder steps alternate.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

SPEC = "each module <transformer.h.*>"


def make_gpt():
    import torch
    from thunder.tests.nanogpt_model import GPT, GPTConfig

    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=64, vocab_size=256, n_layer=4, n_head=4, n_embd=64, dropout=0.0))


def run(out: Path, steps: int) -> str:
    from nvtx_regions.testing import attach

    attach()  # before this process's first NVTX call
    import thunder
    import torch

    from nvtx_regions import NvtxProfileTransform
    from nvtx_regions.capture import write_chrome_trace
    from nvtx_regions.report.compare import compare, render_table
    from nvtx_regions.eager import annotate
    from nvtx_regions.testing import capture, check_balanced

    # One intra-op thread: on a shared CPU machine more threads make timings jump.
    torch.set_num_threads(1)
    torch.manual_seed(1)
    idx, targets = torch.randint(0, 256, (4, 64)), torch.randint(0, 256, (4, 64))

    def step(model, events) -> None:
        with capture() as captured:
            model(idx, targets)[1].backward()
        check_balanced(captured)  # every push popped, per thread and domain
        events.extend(captured)

    eager_model = make_gpt()
    thunder_model = thunder.jit(make_gpt(), transforms=[NvtxProfileTransform(SPEC)])
    eager_events: list = []
    thunder_events: list = []
    with annotate(eager_model, SPEC):
        step(eager_model, [])  # warm-up
        step(thunder_model, [])  # warm-up: thunder compiles here
        for _ in range(steps):  # interleaved, so that a slower moment of the machine hits both
            step(eager_model, eager_events)
            step(thunder_model, thunder_events)

    out.mkdir(parents=True, exist_ok=True)
    write_chrome_trace(eager_events, out / "eager.json")
    write_chrome_trace(thunder_events, out / "thunder.json")
    return render_table(compare(out / "eager.json", out / "thunder.json"), "eager", "thunder")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."), help="where to write eager.json and thunder.json")
    parser.add_argument("--steps", type=int, default=10, help="recorded training steps per run")
    args = parser.parse_args(argv)
    print(f"spec: {SPEC}, {args.steps} steps each, CPU")
    print(run(args.out, args.steps))
    print(f"wrote {args.out / 'eager.json'} and {args.out / 'thunder.json'}")


if __name__ == "__main__":
    main(sys.argv[1:])
