"""A two-block model whose blocks push their own markers, compiled with `NvtxInductor` and
``fullgraph=True``, 3 training steps; for tests/test_compiled_markers.py.

    python tests/workers/compiled_markers.py SPEC EMIT [--profile TRACE] [--plain] [--bad] [--front-door]

Each block's forward: ``torch.profiler.record_function("mixer")`` around its Linear,
``torch.cuda.nvtx.range_push("norm-in")``/``range_pop()`` around its LayerNorm,
``nvtx.annotate("act", domain="user")`` around its GELU, and a function decorated (at import,
before any `NvtxInductor` exists) with ``nvtx.annotate("head", domain="user")``.
EMIT: ``nvtx``, ``record_function`` or ``both``. ``--profile``: the steps run under
torch.profiler, whose Chrome trace goes to TRACE. ``--plain``: also compile the same model
without its markers with a plain ``torch.compile`` and print its kernels. ``--bad``: one block
pushes a marker it never pops, and one around no op. ``--front-door``: `nvtx_regions.compile` instead of
``torch.compile(backend=NvtxInductor(...))``. The line before the last (``done``) is JSON: graph
breaks, Inductor's cache hits, the wrappers and the kernels each calls (ours and the plain one's),
and the warnings.
"""

from __future__ import annotations

import json
import os
import re
import sys
import warnings

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import nvtx  # noqa: E402
import torch  # noqa: E402


@nvtx.annotate("head", domain="user")
def head(x):
    return x * 2


class Block(torch.nn.Module):
    def __init__(self, markers: bool = True, bad: bool = False) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.act = torch.nn.GELU()
        self.markers = markers
        self.bad = bad

    def forward(self, x):
        if not self.markers:
            return self.act(self.norm(self.lin(x))) * 2
        with torch.profiler.record_function("mixer"):
            x = self.lin(x)
        torch.cuda.nvtx.range_push("norm-in")
        x = self.norm(x)
        torch.cuda.nvtx.range_pop()
        if self.bad:
            torch.cuda.nvtx.range_push("never-popped")
            torch.cuda.nvtx.range_push("around-nothing")
            torch.cuda.nvtx.range_pop()
        with nvtx.annotate("act", color="green", domain="user"):
            x = self.act(x)
        return head(x)


def kernels(code: str) -> list[str]:
    """The kernels a generated wrapper's ``call`` calls, in order (their names, numbers dropped)."""
    body = code.split("def call(", 1)[1]
    found = re.findall(r"^\s+(?:\w+ = )?(cpp_fused_\w+|extern_kernels\.\w+|aten\.\w+)\(", body, flags=re.M)
    return [re.sub(r"_\d+$", "", name) for name in found]


def main() -> None:
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code

    import nvtx_regions
    from nvtx_regions.inductor import NvtxInductor

    spec, emit = sys.argv[1], sys.argv[2]
    emit = ("nvtx", "record_function") if emit == "both" else emit
    torch.manual_seed(0)
    model = torch.nn.Sequential(Block(), Block(bad="--bad" in sys.argv))
    caught = warnings.catch_warnings(record=True)
    seen = caught.__enter__()
    warnings.simplefilter("always")
    if "--front-door" in sys.argv:
        compiled = nvtx_regions.compile(model, spec, backend="inductor", inductor={"fullgraph": True}, emit=emit)
    else:
        compiled = torch.compile(model, backend=NvtxInductor(spec, model=model, emit=emit), fullgraph=True)
    x = torch.randn(4, 16)

    def step():
        model.zero_grad()
        compiled(x).sum().backward()

    profile = sys.argv[sys.argv.index("--profile") + 1] if "--profile" in sys.argv else None
    (_, codes) = run_and_get_code(step)
    if profile:
        from torch.profiler import ProfilerActivity

        with torch.profiler.profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(2):
                step()
        prof.export_chrome_trace(profile)
    else:
        for _ in range(2):
            step()
    caught.__exit__(None, None, None)
    result = {
        "graph_breaks": sum(counters["graph_break"].values()),
        "graphs": counters["stats"]["unique_graphs"],
        "cache_hits": counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"],
        "kernels": [kernels(code) for code in codes],
        "codes": codes,
        "warnings": [str(w.message) for w in seen if "nvtx_regions" in type(w.message).__module__],
    }
    if "--plain" in sys.argv:
        torch.manual_seed(0)
        plain_model = torch.nn.Sequential(Block(markers=False), Block(markers=False))
        plain = torch.compile(plain_model, fullgraph=True)
        (_, plain_codes) = run_and_get_code(lambda: plain(x).sum().backward())
        result["plain_kernels"] = [kernels(code) for code in plain_codes]
    print(json.dumps(result))
    print("done")


if __name__ == "__main__":
    main()
