"""Compile a small GPT with thunder on the CPU and annotate it with a spec.

    python examples/quickstart.py                 # spec: examples/regions.nvtx
    python examples/quickstart.py --select "op in <linear>"
    python examples/quickstart.py --full          # print the whole traces

Prints the annotated forward and backward traces (the lines around each NVTX
push and pop, or everything with --full) and how many ranges each rule
produced in each trace.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import thunder
import torch
from thunder.tests.nanogpt_model import GPT, GPTConfig

from nvtx_regions import NvtxProfileTransform, render

HERE = Path(__file__).parent


def small_gpt(n_layer: int = 2) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=n_layer, n_head=2, n_embd=32, dropout=0.0))


def excerpt(trace_text: str, context: int = 1) -> str:
    """The lines of a trace that push or pop a range, with `context` lines after each."""
    lines = trace_text.splitlines()
    keep = set(range(min(len(lines), 12)))  # the signature
    for i, line in enumerate(lines):
        if line.lstrip().startswith("nvtx"):
            keep.update(range(i, min(len(lines), i + context + 1)))
    out, last = [], -1
    for i in sorted(keep):
        if i != last + 1:
            out.append("  ...")
        out.append(lines[i])
        last = i
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--select", help="spec text (default: the rules of examples/regions.nvtx)")
    parser.add_argument("--spec", default=None, help="a .nvtx file")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--executors", nargs="*", default=None, help='e.g. --executors torchcompile')
    parser.add_argument("--full", action="store_true", help="print the whole annotated traces")
    args = parser.parse_args(argv)
    spec = args.spec if args.spec or args.select else HERE / "regions.nvtx"

    transform = NvtxProfileTransform(args.select, spec=spec)
    model = small_gpt(args.layers)
    options = {"executors": args.executors} if args.executors else {}
    jitted = thunder.jit(model, transforms=[transform], **options)

    idx = torch.randint(0, 64, (2, 16))
    targets = torch.randint(0, 64, (2, 16))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # thunder's and torch's own chatter
        warnings.simplefilter("always", category=__import__("nvtx_regions").NvtxRegionsWarning)
        _, loss = jitted(idx, targets)
        loss.backward()

    for title, trace in (
        ("forward", thunder.last_traces(jitted)[-1]),
        ("backward", thunder.last_backward_traces(jitted)[-1]),
    ):
        text = str(trace)
        print(f"===== annotated {title} trace =====")
        print(text if args.full else excerpt(text))
        print()

    print("===== ranges per rule =====")
    reports = {r.phase: r for r in transform.reports}
    print(f"{'line':>4}  {'forward':>7}  {'backward':>8}  rule")
    for rule in transform.compiled.rules:
        counts = [reports[p].ranges_per_rule[rule.number] if p in reports else 0 for p in ("forward", "backward")]
        print(f"{rule.rule.line:>4}  {counts[0]:>7}  {counts[1]:>8}  {render(rule.rule)}")
    total = sum(r.ranges for r in transform.reports)
    print(f"{len(transform.compiled.rules)} rules, {total} ranges, loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
