"""Eager's module ranges against hand-written hooks making the same ranges, side by side in one run.

    python benchmarks/eager_hooks.py [--repeats 80] [--json out.json]

A launch-bound CPU training step (forward and backward, tiny tensors, so the hooks' Python shows)
of 6 GPT-2-style blocks, one range per block each way (12 a step), in the domain, message and
colour ours give:
- ``plain``: no hook;
- ``hand-written``: a forward pre-hook pushing and a forward hook popping (``nvtx.Domain``'s
  ``push_range``/``pop_range`` with prebuilt attributes); with backward, the forward hook also
  puts a pre-hook on the output's autograd node (push) and a hook on the input tensor (pop);
- ``full hooks``: the same with ``register_full_backward_pre_hook``/``register_full_backward_hook``
  for backward, what eager did before;
- ``ours``: ``nvtx_regions.compile(model, "each module <blocks.*>", backend="eager")``, and with
  ``and forward``; its backward range ends where the block's own backward does (each input reaches
  the block as an alias, whose autograd node ends the range);
- ``ours, ending at each input's node``: the same with the block's range ending at the node that
  computed its input, where the input's whole gradient is done (before issue 49: a range held open
  around a sibling's that reads the same input). The hand-written hooks end there too; torch's
  full hooks end where ours do.

Prints each variant's median step time, and the ratios the issue names: ours / hand-written,
forward and backward (target within 3%) and forward only (target within 1%), and ours against ours
ending at each input's node and against torch's full hooks. No NVTX tool is
attached, as in a run outside Nsight: the NVTX calls return at once, and what is measured is
what the hooks cost.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import warnings

import nvtx
import torch

import nvtx_regions

warnings.simplefilter("ignore")
BLOCKS, WIDTH, HEADS, TOKENS, STEPS = 6, 32, 2, 8, 5


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = torch.nn.LayerNorm(WIDTH), torch.nn.LayerNorm(WIDTH)
        self.attn = torch.nn.MultiheadAttention(WIDTH, HEADS, batch_first=True)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.GELU(), torch.nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(64, WIDTH)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(BLOCKS))
        self.head = torch.nn.Linear(WIDTH, 64)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def hand_written(model: Net, backward: bool, full_hooks: bool = False) -> list:
    """Hooks on each block making its range, as a user would write them; returns their handles."""
    domain = nvtx.get_domain("nvtx_regions")
    handles = []
    for path, block in model.named_modules():
        if path.count(".") != 1:
            continue
        forward = domain.get_event_attributes(message=path)
        back = domain.get_event_attributes(message=f"{path} (backward)")

        def push(module, args, attributes=forward):
            domain.push_range(attributes)

        def pop(module, args, output):
            domain.pop_range()
            if backward and not full_hooks and output.grad_fn is not None:
                output.grad_fn.register_prehook(lambda grads: domain.push_range(back))
                args[0].register_hook(lambda grad: domain.pop_range())

        handles += [block.register_forward_pre_hook(push), block.register_forward_hook(pop)]
        if backward and full_hooks:
            handles.append(block.register_full_backward_pre_hook(lambda module, grads, a=back: domain.push_range(a)))
            handles.append(block.register_full_backward_hook(lambda module, gi, go: domain.pop_range()))
    return handles


def ours(model: Net, backward: bool, exact_end: bool = True) -> list:
    spec = "each module <blocks.*>" + ("" if backward else " and forward")
    if exact_end:
        return [nvtx_regions.compile(model, spec, backend="eager").nvtx_regions_backend]
    from nvtx_regions.runtime import module_ranges  # the hooks' front end, made without aliases

    made = module_ranges.ModuleRanges.__init__
    module_ranges.ModuleRanges.__init__ = lambda self, *args, **kwargs: made(self, *args, **{**kwargs, "alias_inputs": False})
    try:
        return [nvtx_regions.compile(model, spec, backend="eager").nvtx_regions_backend]
    finally:
        module_ranges.ModuleRanges.__init__ = made


def remove(handles: list) -> None:
    for handle in handles:
        handle.remove()


def step_times(model: Net, idx: torch.Tensor) -> list[float]:
    """CPU seconds of this thread for each of STEPS training steps (forward, backward: CPU
    autograd runs on the calling thread), after one untimed step (the first step after hooks go
    in pays for what they build once; a training run pays it once). Thread CPU time leaves out
    the time other processes of the machine take."""
    model(idx).sum().backward()
    times = []
    for _ in range(STEPS):
        start = time.thread_time()
        model(idx).sum().backward()
        times.append(time.thread_time() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=80)
    parser.add_argument("--json", help="also write the medians and ratios here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, idx = Net(), torch.randint(0, 64, (2, TOKENS))
    variants = {
        "plain": lambda: [],
        "hand-written, forward": lambda: hand_written(model, backward=False),
        "ours, forward": lambda: ours(model, backward=False),
        "hand-written, forward and backward": lambda: hand_written(model, backward=True),
        "full hooks, forward and backward": lambda: hand_written(model, backward=True, full_hooks=True),
        "ours, forward and backward": lambda: ours(model, backward=True),
        "ours ending at inputs' nodes, f and b": lambda: ours(model, backward=True, exact_end=False),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    order = random.Random(0)
    for _ in range(args.repeats):  # each round in a new order, so drift and order hit every variant alike
        for name in order.sample(list(variants), len(variants)):
            handles = variants[name]()
            times[name] += step_times(model, idx)
            remove(handles)
    medians = {name: statistics.median(values) for name, values in times.items()}
    ratios = {
        "ours / hand-written, forward": medians["ours, forward"] / medians["hand-written, forward"],
        "ours / hand-written, forward and backward": medians["ours, forward and backward"]
        / medians["hand-written, forward and backward"],
        "full hooks / hand-written, forward and backward": medians["full hooks, forward and backward"]
        / medians["hand-written, forward and backward"],
        "ours / ours ending at inputs' nodes, forward and backward": medians["ours, forward and backward"]
        / medians["ours ending at inputs' nodes, f and b"],
        "ours / full hooks, forward and backward": medians["ours, forward and backward"]
        / medians["full hooks, forward and backward"],
    }
    print(f"torch {torch.__version__}, {BLOCKS} blocks, {STEPS} steps x {args.repeats} rounds, median step time:")
    for name, value in medians.items():
        print(f"  {name:<38} {value * 1e6:9.1f} us  ({value / medians['plain']:.3f} x plain)")
    for name, value in ratios.items():
        print(f"  {name:<48} {value:.3f}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"medians_s": medians, "ratios": ratios}, out, indent=1)


if __name__ == "__main__":
    main()
