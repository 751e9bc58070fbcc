"""A plain ``torch.compile`` of a model with the user's markers of every form, in a process where
nvtx_regions compiled another model before it, after it, or not at all (argv[1]: before, after,
none), of `Marked` or (argv[2] ``nvtx``) `NvtxAfterOps`. Prints, as JSON, what Dynamo made of the plain model: its graphs (their code), its graph
breaks and its output. nvtx_regions must change none of it."""

from __future__ import annotations

import json
import sys
import warnings

import nvtx
import torch
import torch.cuda.nvtx as torch_nvtx


class Marked(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 4)

    def forward(self, x):
        torch_nvtx.range_push("a")
        x = self.a(x).relu()
        torch_nvtx.range_pop()
        with torch_nvtx.range("b"):
            x = self.b(x)
        with nvtx.annotate("sin", color="red"):
            x = x.sin()
        nvtx.push_range("cos")
        x = x.cos()
        nvtx.pop_range()
        with torch.profiler.record_function("tanh"):
            x = x.tanh()
        return x


class NvtxAfterOps(torch.nn.Module):
    """The nvtx package's markers after a graph's ops: Dynamo guards that graph on the functions it read."""

    def forward(self, x):
        x = x.sin()
        nvtx.push_range("a")
        x = x.cos()
        nvtx.pop_range()
        with nvtx.annotate("b"):
            return x.tan()


def ours() -> None:
    import nvtx_regions

    torch.manual_seed(1)
    other = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4))
    compiled = nvtx_regions.compile(other, "each module <**>", backend="inductor")
    compiled(torch.randn(2, 4)).sum().backward()


def main() -> None:
    when = sys.argv[1]
    warnings.simplefilter("ignore")
    if when == "before":
        ours()
    graphs: list[str] = []

    def backend(gm, example_inputs):
        graphs.append(gm.code.strip())
        return gm.forward

    torch.manual_seed(0)
    model = NvtxAfterOps() if sys.argv[2:] == ["nvtx"] else Marked()
    compiled = torch.compile(model, backend=backend)
    out = compiled(torch.ones(2, 4))
    if when == "after":
        ours()
        out = compiled(torch.ones(2, 4))  # runs what was compiled before ours, under our patches now
    breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
    print(json.dumps({"graphs": graphs, "graph_breaks": breaks, "output": out.tolist()}))


if __name__ == "__main__":
    main()
