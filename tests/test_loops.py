"""The loops people run, under Inductor, named as eager names them (issue 42).

- Many models of one class in one process (a sweep, a notebook, an evaluation loop), each through
  `nvtx_regions.compile` with the same spec: Dynamo compiles once for all of them, as for a plain
  ``torch.compile``; every one gets eager's ranges; none stays alive after ``del``.
- Hugging Face ``generate`` on what `nvtx_regions.compile` returned: each layer's range once per
  token, as eager gives it, and the same tokens.
"""

from __future__ import annotations

import gc
import warnings
import weakref

import pytest
import torch

import nvtx_regions

SPEC = "each module <blocks.*>"


class Block(torch.nn.Module):
    def __init__(self, graph_break: bool = False) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.graph_break = graph_break

    def forward(self, x):
        x = self.fc(x)
        if self.graph_break:
            torch._dynamo.graph_break()
        return torch.relu(x)


class Net(torch.nn.Module):
    def __init__(self, graph_break: bool = False) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(graph_break), Block(graph_break)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def _ranges(events, domain="nvtx_regions"):
    return [e.message for e in events if e.kind == "push" and e.domain == domain]


def _step(model):
    model(torch.randn(2, 8)).sum().backward()


def _graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("graph_break", [False, True], ids=["whole", "graph-break"])
def test_many_models_of_one_class_compile_once_and_each_gets_its_ranges(nvtx_capture, graph_break):
    eager = Net(graph_break)
    with nvtx_regions.annotate(eager, SPEC), nvtx_capture() as events:
        _step(eager)
    expected = _ranges(events)
    assert expected == ["blocks.0", "blocks.1", "blocks.1 (backward)", "blocks.0 (backward)"]

    torch._dynamo.reset()
    plain_graphs = _graphs()
    _step(torch.compile(Net(graph_break)))
    plain_graphs = _graphs() - plain_graphs

    torch._dynamo.reset()
    before, alive, seen = _graphs(), [], []
    for number in range(12):
        model = Net(graph_break)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled = nvtx_regions.compile(model, SPEC, backend="inductor")
            _step(compiled)  # the first model's compile step
            with nvtx_capture() as events:
                _step(compiled)
        seen.append(_ranges(events))
        alive.append(weakref.ref(model))
        del model, compiled
    assert _graphs() - before == plain_graphs  # compiled once for all twelve, as a plain compile is
    assert seen == [expected] * 12
    gc.collect()
    assert [ref() for ref in alive] == [None] * 12
    torch._dynamo.reset()


@pytest.mark.slow
def test_generate_gives_each_layer_its_range_per_token_as_eager_does(nvtx_capture):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    prompt = torch.randint(0, 128, (1, 6))
    options = dict(max_new_tokens=3, do_sample=False, cache_implementation="static", pad_token_id=0)
    spec = "each module <model.layers.*>"
    with nvtx_regions.annotate(model, spec), nvtx_capture() as events:
        expected_tokens = model.generate(prompt, **options)
    expected = _ranges(events)
    assert expected == ["model.layers.0", "model.layers.1"] * 3  # the prompt's token, and two more
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = nvtx_regions.compile(model, spec, backend="inductor")
        with nvtx_capture() as events:
            tokens = compiled.generate(prompt, **options)
    assert _ranges(events) == expected
    assert torch.equal(tokens, expected_tokens)
    assert "forward" not in vars(model)  # the model is as it was
