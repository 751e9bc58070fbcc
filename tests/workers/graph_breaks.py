"""Models with a graph break in a chosen place, run for tests/test_graph_breaks.py.

    python tests/workers/graph_breaks.py PATTERN BACKEND SPEC [--strict] [--steps N]

PATTERN names a model below (`PATTERNS`), BACKEND is ``eager`` or ``inductor``
(`nvtx_regions.compile`). Each step is a forward and a backward in a
``nvtx_regions.steps`` loop. Inductor's cache is $TORCHINDUCTOR_CACHE_DIR. The
last line printed is JSON: our warnings' texts, the error the run raised (its
class name and text, or null), and the FX graph cache's hits and misses and
AOTAutograd's cache hits.
"""

from __future__ import annotations

import json
import os
import sys
import warnings

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import torch  # noqa: E402


def _break(kind: str, x: torch.Tensor) -> torch.Tensor:
    """A graph break of `kind` that leaves `x`'s value alone."""
    if kind == "print":
        print("", end="")
    elif kind == "item":
        if x.sum().item() > 1e30:  # a data-dependent branch
            x = x * 2
    elif kind == "nonzero":
        x = x + 0 * x.nonzero().shape[0]
    elif kind == "graph_break":
        torch._dynamo.graph_break()
    elif kind == "builtin":
        os.getpid()  # a builtin Dynamo does not trace
    return x


class Block(torch.nn.Module):
    """Linear, a graph break, Linear."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.fc1 = torch.nn.Linear(8, 8)
        self.fc2 = torch.nn.Linear(8, 8)

    def forward(self, x):
        x = torch.relu(self.fc1(x))
        x = _break(self.kind, x)
        return self.fc2(x)


class InPlace(Block):
    """Its input changed in place before a Linear, then a graph break: the call's backward range
    closes once the gradient of its input as it came in is computed, after the Linear's."""

    def forward(self, x):
        x = torch.relu(self.fc1(torch.relu_(x)))
        x = _break(self.kind, x)
        return self.fc2(x)


class Outer(torch.nn.Module):
    """A block nested one level deeper, with a Linear of its own before it."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.inner = Block(kind)

    def forward(self, x):
        return self.inner(self.proj(x))


class Looped(torch.nn.Module):
    """Three blocks called in a loop (a break inside a loop skips the model's frame)."""

    def __init__(self, kind: str, nested: bool = False, block: type = Block) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([(Outer if nested else block)(kind) for _ in range(3)])
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class Unrolled(torch.nn.Module):
    """Two blocks called one after the other (Dynamo resumes the model's frame after each)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(kind), Block(kind)])

    def forward(self, x):
        x = self.blocks[0](x)
        x = self.blocks[1](x)
        return x


class Between(torch.nn.Module):
    """The break between two blocks, in the model's own forward."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block("none"), Block("none")])
        self.kind = kind

    def forward(self, x):
        x = self.blocks[0](x)
        x = _break(self.kind, x)
        return self.blocks[1](x)


class Shared(torch.nn.Module):
    """One block called twice (shared weights), then another."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(kind), Block(kind)])

    def forward(self, x):
        for block in (self.blocks[0], self.blocks[0], self.blocks[1]):
            x = block(x)
        return x


class LoopBreak(Looped):
    """The break in the model's loop, after each block: Dynamo skips the model's frame, and compiles
    each block's forward, which has no break, whole, as a frame of its own."""

    def __init__(self, kind: str) -> None:
        super().__init__("none")
        self.kind = kind

    def forward(self, x):
        for block in self.blocks:
            x = _break(self.kind, block(x))
        return self.head(x)


class KeywordLoop(Looped):
    """The blocks called with their input as a keyword argument: a call's backward range closes once
    the gradient of that input is computed, as for a positional one."""

    def forward(self, x):
        for block in self.blocks:
            x = block(x=x)
        return self.head(x)


def qwen2_moe() -> torch.nn.Module:
    """Hugging Face Qwen2-MoE with transformers' eager experts code, which breaks the graph at
    ``nonzero`` inside each layer's experts (called with token ids)."""
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    config = Qwen2MoeConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        shared_expert_intermediate_size=16, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        num_experts=4, num_experts_per_tok=2, experts_implementation="eager",
    )  # fmt: skip
    return Qwen2MoeForCausalLM(config)


def mixtral() -> torch.nn.Module:
    """Hugging Face Mixtral with transformers' eager experts code (a graph break in each layer's experts)."""
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=2, experts_implementation="eager",
    )  # fmt: skip
    return MixtralForCausalLM(config)


PATTERNS = {
    "print": lambda: Looped("print"),
    "item": lambda: Looped("item"),
    "nonzero": lambda: Looped("nonzero"),
    "graph_break": lambda: Looped("graph_break"),
    "builtin": lambda: Looped("builtin"),
    "nested": lambda: Looped("print", nested=True),
    "unrolled": lambda: Unrolled("graph_break"),
    "between": lambda: Between("print"),
    "shared": lambda: Shared("print"),
    "inplace": lambda: Looped("print", block=InPlace),
    "loop": lambda: LoopBreak("print"),
    "keyword": lambda: KeywordLoop("print"),
    "qwen2_moe": qwen2_moe,
    "mixtral": mixtral,
}


def main(argv: list[str]) -> int:
    import nvtx_regions
    from torch._dynamo.utils import counters

    pattern, backend, spec = argv[:3]
    steps = int(argv[argv.index("--steps") + 1]) if "--steps" in argv else 3
    torch.manual_seed(0)
    model = PATTERNS[pattern]()
    error = None
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            compiled = nvtx_regions.compile(model, spec, backend=backend, strict="--strict" in argv)
            for _ in nvtx_regions.steps(range(steps)):
                if pattern in ("qwen2_moe", "mixtral"):
                    ids = torch.randint(0, 64, (2, 8))
                    compiled(input_ids=ids, labels=ids).loss.backward()
                else:
                    compiled(torch.randn(4, 8)).sum().backward()
        except Exception as raised:  # noqa: BLE001
            error = [type(raised).__name__, str(raised)]
    ours = [str(w.message) for w in seen if w.category.__name__ == "NvtxRegionsWarning"]
    print(json.dumps({
        "warnings": ours,
        "error": error,
        "fx_hits": counters["inductor"]["fxgraph_cache_hit"],
        "fx_misses": counters["inductor"]["fxgraph_cache_miss"],
        "aot_hits": counters["aot_autograd"]["autograd_cache_hit"],
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
