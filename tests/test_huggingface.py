"""Hugging Face transformers models, eager and under Inductor: each layer's forward and backward
range every step, and each Linear's, in the order and nesting eager gives.

Tiny configs built here (2 layers, width 64, random weights, nothing downloaded):
a decoder with grouped-query attention (Llama, Qwen2: fewer key/value heads than
query heads) and an encoder (BERT). The step is what a user's training step is:
``model(input_ids=ids, labels=ids).loss.backward()``, the loss computed inside the
model. The ranges are captured for real, over steps after the compiling one.
What this covers under Inductor: transformers' ``forward(*args)`` (Dynamo names
the root ``L['args'][0]``), the loss's backward kernel (it reads a constant
shared with a layer's backward), and extern kernels (each Linear's ``mm``).
No thunder here: the file runs wherever torch and transformers do.
"""

from __future__ import annotations

import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from nvtx_regions import NvtxRegionsWarning  # noqa: E402
from nvtx_regions.eager import annotate  # noqa: E402
from nvtx_regions.core.naming import read_range_message  # noqa: E402
from nvtx_regions.testing import capture, range_tree, start_end_ranges  # noqa: E402
from support.environment import require_transformers  # noqa: E402
from test_inductor import _needs_capture, _ranges, inductor_cache  # noqa: E402, F401  (a fixture: this module's own cache)

STEPS = 2
ROOT = Path(__file__).resolve().parents[1]


def _llama(t):
    return t.LlamaForCausalLM(t.LlamaConfig(**DECODER))


def _qwen2(t):
    return t.Qwen2ForCausalLM(t.Qwen2Config(**DECODER))


def _bert(t):
    return t.BertForMaskedLM(
        t.BertConfig(
            vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        )  # fmt: skip
    )


DECODER = dict(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=64,
)  # fmt: skip
# name -> (model of transformers, where its layers are)
MODELS = {"llama": (_llama, "model.layers"), "qwen2": (_qwen2, "model.layers"), "bert": (_bert, "bert.encoder.layer")}


@dataclass
class Run:
    """One model's steps, eager and compiled: the captured events of each, and the layers' paths."""

    layers: tuple[str, str]
    linears: int  # Linear modules in the layers
    eager: list
    inductor: list
    backend: object
    warnings: list[str]


def _ids() -> torch.Tensor:
    return torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))


# In the slow tier (half a minute or more per model): the docs example below is the default run's.
@pytest.fixture(scope="module", params=[pytest.param(m, marks=pytest.mark.slow) for m in MODELS])
def run(request) -> Run:
    from nvtx_regions.inductor import NvtxInductor

    transformers = require_transformers()
    _needs_capture()
    make, layers = MODELS[request.param]
    spec = f"each module <{layers}.*>\neach class <Linear>"

    def model():
        torch.manual_seed(0)
        return make(transformers)

    def step(forward) -> None:
        forward(input_ids=_ids(), labels=_ids()).loss.backward()

    eager_model = model()
    linears = sum(isinstance(m, torch.nn.Linear) for name, m in eager_model.named_modules() if name.startswith(layers + "."))
    with annotate(eager_model, spec), capture() as eager:
        for _ in range(STEPS):
            step(eager_model)
    torch._dynamo.reset()
    compiled_model = model()
    backend = NvtxInductor(spec, model=compiled_model)  # the model's paths, wherever Dynamo's frame starts
    compiled = torch.compile(compiled_model, backend=backend)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        step(compiled)  # compiles
    with capture() as events:
        for _ in range(STEPS):
            step(compiled)
    ours = [str(w.message) for w in seen if issubclass(w.category, NvtxRegionsWarning)]
    return Run((f"{layers}.0", f"{layers}.1"), linears, list(eager), list(events), backend, ours)


def _layer_ranges(events, layers) -> list[tuple[int | None, str]]:
    """(depth, message) of the layers' ranges, in the order they open; depth None for a start/end range."""
    spans = [(r.start_ns, r.depth, r.message) for roots in range_tree(events, domain="nvtx_regions").values()
             for r in _walk(roots)]  # fmt: skip
    spans += [(r.start_ns, None, r.message) for r in start_end_ranges(events, domain="nvtx_regions")]
    names = {*layers, *(f"{layer} (backward)" for layer in layers)}
    return [(depth, message) for _, depth, message in sorted(spans, key=lambda span: span[0]) if message in names]


def _walk(ranges):
    for r in ranges:
        yield r
        yield from _walk(r.children)


def _intervals(events) -> list[tuple[str, int, int]]:
    """(message, start, end) of every range of ours, push/pop and start/end alike."""
    ranges = [*(r for roots in range_tree(events, domain="nvtx_regions").values() for r in _walk(roots)),
              *start_end_ranges(events, domain="nvtx_regions")]  # fmt: skip
    return [(r.message, r.start_ns, r.end_ns) for r in ranges]


def _outside_their_layer(events, layers) -> list[str]:
    """The ranges of a layer's submodules that do not lie within a range of their layer (same phase)."""
    intervals = _intervals(events)
    outside = []
    for message, start, end in intervals:
        for layer in layers:
            if not message.startswith(layer + "."):
                continue
            phase = " (backward)" if read_range_message(message)[1] == "backward" else ""  # a later part's too
            if not any(m == layer + phase and s <= start and end <= e for m, s, e in intervals):
                outside.append(message)
    return outside


def test_no_rule_selects_nothing(run):
    # Before the root's name was read past ``L['args'][0]``, every module rule selected nothing.
    assert run.warnings == []
    # What the warning would come from agrees: in the graphs compiled, each rule selected
    # something (an empty list of warnings is not a warning lost) ...
    assert run.backend.explain().reasons == {}
    # ... and, the positive control, the same graphs asked about a rule that selects nothing say so.
    nowhere = f"{run.layers[0].rpartition('.')[0]}.9"
    assert [nowhere in reason for reason in run.backend.explain(f"each module <{nowhere}>").reasons.values()] == [True]


@pytest.mark.slow
def test_the_warnings_recorded_hold_a_rule_that_selects_nothing():
    """The positive control of `test_no_rule_selects_nothing`'s first check: recorded as `run`
    records them (the step that compiles, under an NvtxInductor given the model), the warnings of a
    rule that selects nothing in llama are there, and only its."""
    from nvtx_regions.inductor import NvtxInductor

    transformers = require_transformers()
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _llama(transformers)
    backend = NvtxInductor("each module <model.layers.*>\neach module <model.layerz.*>", model=model)
    compiled = torch.compile(model, backend=backend)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        compiled(input_ids=_ids(), labels=_ids()).loss.backward()  # compiles
    ours = [str(w.message) for w in seen if issubclass(w.category, NvtxRegionsWarning)]
    assert len(ours) == 1 and "model.layerz" in ours[0] and "model.layers.*>" not in ours[0], ours


def test_each_layer_has_its_forward_and_backward_range_each_step_as_eager(run):
    first, second = run.layers
    step = [(0, first), (0, second), (0, f"{second} (backward)"), (0, f"{first} (backward)")]
    assert _layer_ranges(run.eager, run.layers) == step * STEPS
    assert _layer_ranges(run.inductor, run.layers) == step * STEPS


def test_each_linear_has_its_range_in_eagers_order_inside_its_layer(run):
    # Every module range of the spec (the layers and every Linear: q/k/v/o, the MLP's, the head),
    # opened in eager's order. Under Inductor a Linear's backward whose weight gradient is
    # scheduled after the next Linear's input gradient comes in parts (`_ranges` leaves the later
    # parts out): still inside its layer's.
    inductor, eager = _ranges(run.inductor), _ranges(run.eager)
    assert inductor == eager
    in_layers = [m for m in eager[: len(eager) // STEPS] if m.startswith(tuple(layer + "." for layer in run.layers))]
    assert len(in_layers) == 2 * run.linears >= 2 * 2 * 6, in_layers  # forward and backward; 2 layers of 6 or 7
    assert _outside_their_layer(run.inductor, run.layers) == []
    assert _outside_their_layer(run.eager, run.layers) == []


def test_the_loss_kernels_belong_to_no_layer(run):
    # The loss's backward kernel reads a zero Inductor made once for the whole backward, which
    # carries the module of the layer that first needed it: a constant does not decide its module.
    kernels = [op for graph in run.backend.graphs for op in graph.view.ops if "nll_loss_backward" in op.name]
    assert kernels, [op.names for graph in run.backend.graphs for op in graph.view.ops]
    for kernel in kernels:
        path = kernel.chain[-1].path if kernel.chain else ""
        assert not any(path == layer or path.startswith(layer + ".") for layer in run.layers), (kernel.name, path)


@pytest.mark.slow  # the default tier stays under 6 minutes; CI runs the slow tier
def test_the_docs_example_runs_and_emits_each_layers_ranges():
    require_transformers()
    _needs_capture()
    text = (ROOT / "docs" / "inductor.md").read_text(encoding="utf-8")
    (example,) = re.findall(r"<!-- test: huggingface-example -->\s*```python\n(.*?)```", text, flags=re.S)
    torch._dynamo.reset()
    with capture() as events:
        exec(compile(example, "docs/inductor.md", "exec"), {"__name__": "__main__"})
    step = ["model.layers.0", "model.layers.1", "model.layers.1 (backward)", "model.layers.0 (backward)"]
    assert _ranges(list(events)) == step * 2
