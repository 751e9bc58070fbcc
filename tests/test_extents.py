"""Right extents, not only right names (issue 49): where each module range starts and ends, checked
against an independent reference, autograd's own sequence numbers.

torch.profiler records every op of the forward with the sequence number of the autograd node it
makes, and every node the backward runs with the same number. The spec's ranges go to the same
timeline through the ``record_function`` sink. A module call's forward work is the numbered ops inside
its forward range; its backward work is the nodes of those numbers. Each backward range must hold
every node of its module's work and no node of any other module's, so a module never holds a
sibling's backward open (siblings reading one input: a gated MLP, q/k/v, MoE experts; a residual
stream; LayerNorms before a shared residual).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import pytest
import torch

from nvtx_regions.eager import annotate

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning")


@dataclass(frozen=True)
class Span:
    name: str
    start: float
    end: float
    thread: int

    def holds(self, other: Span) -> bool:
        return self.thread == other.thread and self.start <= other.start and other.end <= self.end

    def overlaps(self, other: Span) -> bool:
        return self.thread == other.thread and self.start < other.end and other.start < self.end


@dataclass
class Profile:
    ranges: dict[str, Span]  # our ranges by message (each module is called once a step)
    forward_ops: dict[int, Span]  # sequence number -> the forward op that made that node
    backward_nodes: dict[int, list[Span]]  # sequence number -> the backward nodes run for it


def profile_step(model, inputs, spec: str, loss_of=lambda output: output.float().sum()) -> Profile:
    """One training step of `model` (after an untimed one), annotated with `spec`, its ranges sent to
    torch.profiler, and the numbered ops and nodes of that step."""
    with annotate(model, spec, emit="record_function"):
        loss_of(model(*inputs())).backward()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            with torch.profiler.record_function("test::forward"):
                loss = loss_of(model(*inputs()))
            with torch.profiler.record_function("test::backward"):
                loss.backward()
    events = [Span(e.name, e.time_range.start, e.time_range.end, e.thread) for e in prof.events()]
    numbers = {id(span): e.sequence_nr for span, e in zip(events, prof.events())}
    forward = next(e for e in events if e.name == "test::forward")
    backward = next(e for e in events if e.name == "test::backward")
    ranges: dict[str, Span] = {}
    forward_ops: dict[int, Span] = {}
    backward_nodes: dict[int, list[Span]] = collections.defaultdict(list)
    for span in events:
        number = numbers[id(span)]
        if number < 0 or "evaluate_function" in span.name:
            continue
        if forward.holds(span) and number not in forward_ops:  # the outermost op of that number
            forward_ops[number] = span
        elif span.start >= backward.start and not span.name.startswith("aten::"):
            backward_nodes[number].append(span)
    return Profile(_our_ranges(model, events), forward_ops, dict(backward_nodes))


def _our_ranges(model, events) -> dict[str, Span]:
    paths = {path for path, _ in model.named_modules()}
    found: dict[str, Span] = {}
    for span in events:
        path = span.name.removesuffix(" (backward)")
        if path in paths:
            assert span.name not in found, f"{span.name} ranged twice in one step"
            found[span.name] = span
    return found


def check_extents(profile: Profile) -> dict[str, int]:
    """Check every backward range against the reference (see the module doc); returns how many
    backward nodes of its own each holds."""
    work: dict[str, set[int]] = {}
    for name, span in profile.ranges.items():
        if not name.endswith(" (backward)"):
            work[name] = {n for n, op in profile.forward_ops.items() if span.holds(op)}
    counted = {}
    problems = []
    for name, span in profile.ranges.items():
        if not name.endswith(" (backward)"):
            continue
        module = name.removesuffix(" (backward)")
        own = work[module]
        counted[module] = 0
        for number, nodes in profile.backward_nodes.items():
            if number not in profile.forward_ops:
                continue  # a node of no forward op of this step (a recompute's)
            for node in nodes:
                if number in own:
                    counted[module] += 1
                    if not span.holds(node):
                        problems.append(f"{name} does not hold {node.name} (#{number}), a node of its own")
                elif span.holds(node):  # (a node around the range, a reentrant checkpoint's, is no sibling)
                    owner = [m for m, numbers in work.items() if number in numbers]
                    problems.append(f"{name} holds {node.name} (#{number}), a node of {owner or 'no module'}")
    assert problems == [], "\n".join(problems)
    return counted


def _nesting(profile: Profile) -> list[tuple[str, str]]:
    """The pairs (outer, inner) of backward ranges where the inner is not below the outer's module."""
    backward = {name.removesuffix(" (backward)"): span for name, span in profile.ranges.items() if name.endswith(" (backward)")}
    return [
        (outer, inner)
        for outer, o in backward.items()
        for inner, i in backward.items()
        if outer != inner and o.holds(i) and not (inner.startswith(outer + ".") or outer == "")
    ]


# -- the models ---------------------------------------------------------------------------


class GatedMLP(torch.nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.gate = torch.nn.Linear(width, 2 * width)
        self.up = torch.nn.Linear(width, 2 * width)
        self.down = torch.nn.Linear(2 * width, width)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


class Attention(torch.nn.Module):
    def __init__(self, width: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(width, width) for _ in range(3))
        self.o = torch.nn.Linear(width, width)
        self.heads = heads

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (p(x).view(b, t, self.heads, c // self.heads).transpose(1, 2) for p in (self.q, self.k, self.v))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, c))


class Experts(torch.nn.Module):
    """A mixture of experts: a router, and every expert on the same tokens, weighted."""

    def __init__(self, width: int = 16, count: int = 3) -> None:
        super().__init__()
        self.router = torch.nn.Linear(width, count)
        self.experts = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(count))

    def forward(self, x):
        weights = self.router(x).softmax(-1)
        return sum(weights[..., i : i + 1] * expert(x) for i, expert in enumerate(self.experts))


class Block(torch.nn.Module):
    """A pre-norm block: a residual stream read by each norm and by each add."""

    def __init__(self, width: int = 16, moe: bool = False) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.attn = Attention(width)
        self.mlp = Experts(width) if moe else GatedMLP(width)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Net(torch.nn.Module):
    def __init__(self, moe: bool = False) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(32, 16)
        self.blocks = torch.nn.ModuleList(Block(moe=moe) for _ in range(2))
        self.head = torch.nn.Linear(16, 32)

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _ids():
    return (torch.randint(0, 32, (2, 8)),)


@pytest.mark.parametrize("moe", [False, True], ids=["gated-mlp", "moe"])
@pytest.mark.parametrize("spec", ["each class <Linear>", "each module <**>"])
def test_every_backward_range_holds_its_own_work_and_no_siblings(spec, moe):
    torch.manual_seed(0)
    model = Net(moe=moe)
    profile = profile_step(model, _ids, spec)
    counted = check_extents(profile)
    linears = [path for path, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    assert set(linears) <= set(counted)
    assert all(counted[path] > 0 for path in linears), counted  # each range was checked against real work
    assert _nesting(profile) == []


def test_shared_input_siblings_close_in_turn_not_nested():
    """The case issue 49 measured: `up` held open around `gate`, `v` around `k` around `q`."""
    torch.manual_seed(0)
    model = Net()
    profile = profile_step(model, _ids, "each class <Linear>")
    span = profile.ranges
    for block in ("blocks.0", "blocks.1"):
        gate, up = span[f"{block}.mlp.gate (backward)"], span[f"{block}.mlp.up (backward)"]
        assert not gate.overlaps(up), (gate, up)
        q, k, v = (span[f"{block}.attn.{p} (backward)"] for p in "qkv")
        assert not (q.overlaps(k) or k.overlaps(v) or q.overlaps(v)), (q, k, v)


def test_the_reference_sees_the_old_nesting(monkeypatch):
    """The positive control: with each input's own node ending the range (before issue 49), the check
    above finds a sibling's node inside a range."""
    from nvtx_regions.runtime import module_ranges

    original = module_ranges.ModuleRanges.__init__

    def without_aliases(self, *args, **kwargs):
        original(self, *args, **{**kwargs, "alias_inputs": False})

    monkeypatch.setattr(module_ranges.ModuleRanges, "__init__", without_aliases)
    torch.manual_seed(0)
    profile = profile_step(Net(), _ids, "each class <Linear>")
    with pytest.raises(AssertionError, match="a node of \\['blocks.0.mlp.gate'\\]"):
        check_extents(profile)


def test_a_tiny_llama_each_linear_holds_its_own_backward_only():
    """A Hugging Face Llama (q/k/v and gate/up read one input each)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    model = LlamaForCausalLM(config)
    ids = torch.randint(0, 64, (2, 8))
    profile = profile_step(model, lambda: (ids,), "each class <Linear>", loss_of=lambda output: output.logits.float().sum())
    counted = check_extents(profile)
    projections = [f"model.layers.{i}.{p}" for i in range(2) for p in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")]
    assert all(counted[path] > 0 for path in projections), counted
    assert _nesting(profile) == []


class Checkpointed(Net):
    """`Net` with each block under activation checkpointing."""

    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.reentrant = reentrant

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=self.reentrant)
        return self.head(x)


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_checkpointed_blocks_keep_their_extents(reentrant):
    """Non-reentrant checkpointing runs the forward's own nodes in the backward: each range is checked
    against them. The reentrant kind runs the forward without gradients and makes its nodes anew in
    the backward, where no forward range numbers them: there no range may hold another's."""
    torch.manual_seed(0)
    model = Checkpointed(reentrant)
    profile = profile_step(model, _ids, "each class <Linear>")
    counted = check_extents(profile)
    assert _nesting(profile) == []
    if not reentrant:
        assert counted["blocks.0.mlp.gate"] > 0 and counted["blocks.1.attn.q"] > 0, counted
    else:
        assert set(counted) >= {"blocks.0.mlp.gate", "blocks.1.attn.q"}  # their backward ranges came


def test_an_in_place_module_keeps_its_extent():
    """ReLU(inplace=True) writes into its input's alias, which takes the alias's node out of the
    graph: its range ends where its input's whole gradient is done, and nothing nests wrongly."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(inplace=True), torch.nn.Linear(16, 16))
    profile = profile_step(model, lambda: (torch.randn(4, 16, requires_grad=True),), "each module <**>")
    counted = check_extents(profile)
    assert counted["1"] > 0 and counted["0"] > 0 and counted["2"] > 0, counted
    assert _nesting(profile) == []
