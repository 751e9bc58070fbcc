"""The loops people run, under Inductor, named as eager names them (issue 42).

- Many models of one class in one process (a sweep, a notebook, an evaluation loop), each through
  `nvtx_regions.compile` with the same spec: Dynamo compiles once for all of them, as for a plain
  ``torch.compile``; every one gets eager's ranges; none stays alive after ``del``.
- Hugging Face ``generate`` on what `nvtx_regions.compile` returned: each layer's range once per
  token, as eager gives it, and the same tokens.
- Layer by layer (one backend, a backend per layer, torchtitan's replacement): eager's names,
  counts and order in every step, the first included.
- Activation checkpointing (``torch.utils.checkpoint``, reentrant or not; Hugging Face's, whole
  model and layer by layer): the recompute is not a forward call, on either backend; each module's
  forward range counts once a step.
"""

from __future__ import annotations

import gc
import os
import warnings
import weakref

import pytest
import torch

import nvtx_regions
from nvtx_regions.testing import continues

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
    """The module calls' ranges: the later parts of a call's range (`continues`) left out."""
    return [e.message for e in events if e.kind == "push" and e.domain == domain and not continues(e.message)]


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


def test_a_model_the_backend_was_not_given_gets_no_range_inside_its_blocks_and_a_warning(nvtx_capture):
    """A backend object passed to a plain torch.compile of a second model: Dynamo runs the first model's
    graphs for it, and no instance of it is known, so no wrong name: no range from those graphs, and a
    warning that says how to give the model to the backend."""
    from nvtx_regions.inductor import NvtxInductor

    torch._dynamo.reset()
    given, other = Net(graph_break=True), Net(graph_break=True)
    backend = NvtxInductor("each module <blocks.*.fc>", model=given)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _step(torch.compile(given, backend=backend))
        with nvtx_capture() as events:
            _step(torch.compile(other, backend=backend))
    assert _ranges(events) == []
    ours = [str(w.message) for w in caught if "of none of the models this backend was given" in str(w.message)]
    assert len(ours) == 1 and "NvtxInductor(model=...), adopt()" in ours[0], "\n".join(ours)
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


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def _llama_steps(model, nvtx_capture, steps=3):
    seen = []
    torch.manual_seed(1)
    for _ in range(steps):
        ids = torch.randint(0, 128, (2, 8))
        with nvtx_capture() as events:
            model(input_ids=ids, labels=ids).loss.backward()
        seen.append(_ranges(events))
    return seen


LAYER_SPEC = "each module <model.layers.*>\neach class <LlamaMLP>"


def _compile_layers(model, way):
    from nvtx_regions.inductor import NvtxInductor

    layers = model.model.layers
    if way == "one backend":
        backend = NvtxInductor(LAYER_SPEC, model=model)
        for layer in layers:
            layer.compile(backend=backend)
        return backend
    elif way == "a backend per layer":
        for layer in layers:
            layer.compile(backend=NvtxInductor(LAYER_SPEC, model=model))
    elif way == "nvtx_regions.compile(within=)":  # the front door, one layer at a time
        for number, layer in enumerate(list(layers)):
            layers[number] = nvtx_regions.compile(layer, LAYER_SPEC, backend="inductor", within=model)
        return layers[0].nvtx_regions_backend
    else:  # torchtitan's apply_compile: the layer replaced by what torch.compile returns
        backend = NvtxInductor(LAYER_SPEC, model=model)
        for number, layer in enumerate(list(layers)):
            layers[number] = torch.compile(layer, backend=backend)
        return backend
    return None


@pytest.mark.parametrize("way", ["one backend", "a backend per layer", "torchtitan", "nvtx_regions.compile(within=)"])
def test_layer_by_layer_compile_gives_eager_names_from_the_first_step(nvtx_capture, way):
    eager = _tiny_llama()
    with nvtx_regions.annotate(eager, LAYER_SPEC):
        expected = _llama_steps(eager, nvtx_capture)
    assert expected[0] == [
        "model.layers.0", "model.layers.0.mlp", "model.layers.1", "model.layers.1.mlp",
        "model.layers.1 (backward)", "model.layers.1.mlp (backward)", "model.layers.0 (backward)", "model.layers.0.mlp (backward)",
    ]  # fmt: skip
    model = _tiny_llama()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        backend = _compile_layers(model, way)
        assert _llama_steps(model, nvtx_capture) == expected  # names, counts and order, step 0 too
        # Inductor runs the MLP's up_proj weight gradient after the attention's backward: the MLP's
        # backward range comes in two parts, the attention's work between them.
        with nvtx_capture() as events:
            model(input_ids=torch.randint(0, 128, (2, 8))).logits.sum().backward()
        parts = [e.message for e in events if e.kind == "push" and continues(e.message)]
        mlps = ["model.layers.1.mlp (backward, continued)", "model.layers.0.mlp (backward, continued)"]
        assert set(parts) <= set(mlps), parts  # another torch's Inductor may schedule it otherwise
        if torch.__version__.startswith("2.11"):
            assert parts == mlps
    assert not [str(w.message) for w in caught if issubclass(w.category, nvtx_regions.NvtxRegionsWarning)]
    if backend is not None:  # what explain says is what ran, the layers' own ranges too
        text = str(backend.explain())
        assert "model.layers.1: kernels" in text and "model.layers.0._orig_mod" not in text, text
    torch._dynamo.reset()


BREAK_SPEC = "each module <blocks.*>\neach class <Linear>"


@pytest.mark.parametrize("way", ["one backend", "a backend per layer", "torchtitan"])
def test_layer_by_layer_with_a_graph_break_in_each_layer_gives_eager_names(nvtx_capture, way):
    """Each layer compiled on its own breaks its graph: its call gets its range from the hooks, its
    Linear from its graphs. With a backend per layer the backends share one set of hooks and know
    each other's graphs: before, each layer's range came twice (the backend of layer 0 hooked layer 1
    again, its graphs held by another backend) and the backward ranges went missing."""
    from nvtx_regions.inductor import NvtxInductor

    eager = Net(graph_break=True)
    with nvtx_regions.annotate(eager, BREAK_SPEC), nvtx_capture() as events:
        _step(eager)
    expected = _ranges(events)
    assert expected == ["blocks.0", "blocks.0.fc", "blocks.1", "blocks.1.fc",
                        "blocks.1 (backward)", "blocks.1.fc (backward)", "blocks.0 (backward)", "blocks.0.fc (backward)"]  # fmt: skip
    model = Net(graph_break=True)
    shared = NvtxInductor(BREAK_SPEC, model=model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for number, block in enumerate(list(model.blocks)):
            if way == "torchtitan":
                model.blocks[number] = torch.compile(block, backend=shared)
            else:
                block.compile(backend=shared if way == "one backend" else NvtxInductor(BREAK_SPEC, model=model))
        seen = []
        for _ in range(3):
            with nvtx_capture() as events:
                _step(model)
            seen.append(_ranges(events))
    assert seen == [expected] * 3  # step 0 too
    torch._dynamo.reset()


def test_a_call_across_a_graph_break_has_eager_names_and_explain_says_where_they_come_from(nvtx_capture):
    """Each block's call spans a graph break: no graph holds it, and hooks give it its range, as eager,
    in every step, the one that compiles too; explain() names the calls ranged so."""
    eager = Net(graph_break=True)
    with nvtx_regions.annotate(eager, SPEC), nvtx_capture() as events:
        _step(eager)
    expected = _ranges(events)
    assert expected == ["blocks.0", "blocks.1", "blocks.1 (backward)", "blocks.0 (backward)"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = nvtx_regions.compile(Net(graph_break=True), SPEC, backend="inductor")
        seen = []
        for _ in range(3):
            with nvtx_capture() as events:
                _step(compiled)
            seen.append(_ranges(events))
    assert seen == [expected] * 3
    text = str(nvtx_regions.explain(compiled))
    assert "ranges from hooks (calls outside every graph): blocks.0, blocks.1" in text, text
    # The rule is explained by its hooks, not as a rule that selected nothing (issue 49).
    assert "  ranges from hooks, for its calls outside every graph: blocks.0, blocks.1" in text, text
    assert "nothing selected" not in text, text
    torch._dynamo.reset()


@pytest.mark.parametrize("reset", [False, True], ids=["", "reset"])
@pytest.mark.parametrize("layer_by_layer", [False, True], ids=["whole model", "layer by layer"])
def test_the_compile_steps_hooks_change_no_graph_and_cost_no_recompile(layer_by_layer, reset):
    """In the step that compiles, every selected module carries hooks, off while Dynamo compiles: the
    graphs and graph breaks are those of a plain torch.compile, and nothing is compiled after that
    step (taking the hooks off changes nothing Dynamo guards). `reset`: torch._dynamo.reset() between
    making the backend and its first step clears Dynamo's compile callbacks, so the first graph holds
    the hooks: they then stay, and still nothing is compiled again."""
    from nvtx_regions.inductor import NvtxInductor

    counts = {}
    for ours in (False, True):
        torch._dynamo.reset()
        model = Net(graph_break=True)
        # The Linears' calls are in graphs: their hooks would be traced there, and guarded.
        backend = NvtxInductor(SPEC + "\neach class <Linear>", model=model) if ours else "inductor"
        if reset:
            torch._dynamo.reset()  # as torch._inductor.utils.run_and_get_code does
        torch._dynamo.utils.counters.clear()
        if layer_by_layer:
            for block in model.blocks:
                block.compile(backend=backend)
        else:
            model = torch.compile(model, backend=backend)
        seen = []
        for _ in range(3):
            _step(model)
            counters = torch._dynamo.utils.counters
            seen.append((dict(counters["frames"]), _graphs(), sum(counters["graph_break"].values())))
        assert seen[0] == seen[1] == seen[2], seen  # nothing compiled after the first step
        counts[ours] = seen[0][1:]
    assert counts[True] == counts[False] == (3, 2), counts
    torch._dynamo.reset()


def test_compile_within_a_model_shares_one_backend_and_refuses_what_it_cannot_name():
    model = _tiny_llama()
    layers = model.model.layers
    parts = [nvtx_regions.compile(layer, LAYER_SPEC, backend="inductor", within=model) for layer in layers]
    assert parts[0].nvtx_regions_backend is parts[1].nvtx_regions_backend  # Dynamo compiles their code once
    with pytest.raises(ValueError, match=r"does not hold the LlamaDecoderLayer compiled; pass the whole model"):
        nvtx_regions.compile(layers[0], LAYER_SPEC, backend="inductor", within=_tiny_llama())
    with pytest.raises(ValueError, match=r"backend='eager' takes the whole model: nvtx_regions.compile\(model, spec"):
        nvtx_regions.compile(layers[0], LAYER_SPEC, backend="eager", within=model)
    torch._dynamo.reset()


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.mlp = torch.nn.LayerNorm(8), MLP()

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class Deep(torch.nn.Module):
    """Ten layers: more than Dynamo's recompile limit (8), which a recompile per layer would pass."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(Layer() for _ in range(10))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def _compile_plainly(model: Deep, way: str) -> None:
    for number, layer in enumerate(model.layers):
        if way == "layer.compile()":
            layer.compile()
        else:
            model.layers[number] = torch.compile(layer)


@pytest.mark.parametrize("way", ["layer.compile()", "torchtitan"])
def test_eager_annotation_beside_a_plain_per_layer_compile_breaks_no_graph_and_says_what_it_misses(nvtx_capture, way):
    """Eager annotation, then each layer compiled by a plain torch.compile: Dynamo compiles as it does
    without the annotation (one graph, no break, no recompile per layer), the layers' own ranges
    (their hooks run outside compiled code) are eager's, and one warning says that the modules inside
    the compiled layers get none, and how to get them."""
    spec = "each module <layers.*>\neach class <MLP>"

    def steps(model):
        seen = []
        for _ in range(3):
            with nvtx_capture() as events:
                model(torch.randn(4, 8, requires_grad=True)).sum().backward()
            seen.append(_ranges(events))
        return seen

    with nvtx_regions.annotate(Deep(), spec) as annotation:
        eager = steps(annotation.model)
    assert eager[0][:2] == ["layers.0", "layers.0.mlp"]
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    plain = Deep()
    _compile_plainly(plain, way)
    steps(plain)
    plain_graphs = _graphs()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = Deep()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with nvtx_regions.annotate(model, spec):
            _compile_plainly(model, way)
            seen = steps(model)
    assert not torch._dynamo.utils.counters["graph_break"]
    assert _graphs() == plain_graphs == 1
    layers_only = [[name for name in step if ".mlp" not in name] for step in eager]
    assert seen == layers_only and len(seen[0]) == 20
    ours = [str(w.message) for w in caught if issubclass(w.category, nvtx_regions.NvtxRegionsWarning)]
    assert len(ours) == 1, ours
    assert "compiles the forward of layers.0 with a backend that is not nvtx_regions'" in ours[0]
    assert "backend=nvtx_regions.NvtxInductor(spec, model=model)" in ours[0]
    torch._dynamo.reset()


def test_a_backend_per_layer_past_the_recompile_limit_is_named_as_our_doing(tmp_path, monkeypatch):
    """Ten layers, each compiled with a new NvtxInductor: Dynamo compiles the layers' shared code again
    for each new backend object, and stops at its recompile limit (8). The warning says the recompiles
    are ours, and what to do (one backend for all); with one backend, no warning and every layer compiled."""
    from nvtx_regions.inductor import NvtxInductor

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    model = Deep()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for layer in model.layers:
            layer.compile(backend=NvtxInductor("each module <layers.*>", model=model))
        _step(model)
    ours = [str(w.message) for w in caught if issubclass(w.category, nvtx_regions.NvtxRegionsWarning) and "recompile_limit" in str(w.message)]
    assert len(ours) == 1, ours
    assert "The recompiles are ours: Dynamo compiled it for 8 different NvtxInductor objects" in ours[0]
    assert "Make one NvtxInductor(spec, model=model) and pass it to every compile" in ours[0]
    torch._dynamo.reset()
    shared_model = Deep()
    shared = NvtxInductor("each module <layers.*>", model=shared_model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for layer in shared_model.layers:
            layer.compile(backend=shared)
        _step(shared_model)
    assert not [str(w.message) for w in caught if "recompile_limit" in str(w.message)]
    torch._dynamo.reset()


class CheckpointedNet(torch.nn.Module):
    def __init__(self, reentrant: bool, graph_break: bool = False) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(graph_break), Block(graph_break)])
        self.reentrant = reentrant

    def forward(self, x):
        for block in self.blocks:
            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=self.reentrant)
        return x


def _checkpointed_steps(model, nvtx_capture, steps=2):
    seen = []
    for _ in range(steps):
        with nvtx_capture() as events:
            model(torch.randn(2, 8, requires_grad=True)).sum().backward()
        seen.append(_ranges(events))
    return seen


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_activation_checkpointing_recompute_is_not_a_forward_call(nvtx_capture, reentrant):
    spec = "each module <blocks.*>\neach class <Linear>"
    expected = [
        "blocks.0", "blocks.0.fc", "blocks.1", "blocks.1.fc",
        "blocks.1 (backward)", "blocks.1.fc (backward)", "blocks.0 (backward)", "blocks.0.fc (backward)",
    ]  # fmt: skip
    eager = CheckpointedNet(reentrant)
    with nvtx_regions.annotate(eager, spec):
        assert _checkpointed_steps(eager, nvtx_capture) == [expected] * 2  # each forward once a step
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = nvtx_regions.compile(CheckpointedNet(reentrant), spec, backend="inductor")
        assert _checkpointed_steps(compiled, nvtx_capture) == [expected] * 2
    torch._dynamo.reset()


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_checkpoint_wrapper_keeps_the_names_of_the_model_without_it(nvtx_capture, backend):
    """torch.distributed's checkpoint_wrapper (apply_activation_checkpointing, torchtitan's way) puts
    each block under ``blocks.0._checkpoint_wrapped_module``: the ranges keep the paths and classes of
    the model without it (before: ``blocks.0._checkpoint_wrapped_module.fc``, and under Inductor no
    graph could be named), and the recompute is no forward call."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    spec = "each module <blocks.*>\neach class <Linear>"
    expected = [
        "blocks.0", "blocks.0.fc", "blocks.1", "blocks.1.fc",
        "blocks.1 (backward)", "blocks.1.fc (backward)", "blocks.0 (backward)", "blocks.0.fc (backward)",
    ]  # fmt: skip
    model = Net()
    for number, block in enumerate(list(model.blocks)):
        model.blocks[number] = checkpoint_wrapper(block)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = nvtx_regions.compile(model, spec, backend=backend)
        assert _checkpointed_steps(compiled, nvtx_capture, steps=3) == [expected] * 3
    assert not [str(w.message) for w in caught if issubclass(w.category, nvtx_regions.NvtxRegionsWarning)]
    assert "blocks.0._checkpoint_wrapped_module" not in str(nvtx_regions.explain(compiled))
    torch._dynamo.reset()


FULLY_SHARDED = """
import json, os, socket, sys, warnings
with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
import torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
import nvtx_regions
from nvtx_regions.testing import attach, capture
from test_loops import Net
attach()
dist.init_process_group("gloo")
spec, backend, graph_break = sys.argv[1], sys.argv[2], sys.argv[3] == "graph-break"
model = Net(graph_break)
for block in model.blocks:
    fully_shard(block)
fully_shard(model)
classes = sorted({type(module).__name__ for module in model.modules()})
seen = []
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    if backend == "eager":
        annotation = nvtx_regions.annotate(model, spec)
    else:
        model = nvtx_regions.compile(model, spec, backend=backend)
    for _ in range(3):
        with capture() as events:
            model(torch.randn(2, 8)).sum().backward()
        seen.append([e.message for e in events if e.kind == "push" and e.domain == "nvtx_regions"])
ours = [str(w.message) for w in caught if issubclass(w.category, nvtx_regions.NvtxRegionsWarning)]
print(json.dumps({"classes": classes, "seen": seen, "warnings": ours}))
dist.destroy_process_group()
"""


def _fully_sharded(spec: str, backend: str, graph_break: str) -> dict:
    """`FULLY_SHARDED`'s result: one process, gloo, world size 1."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).resolve().parent
    done = subprocess.run([sys.executable, "-c", FULLY_SHARDED, spec, backend, graph_break], cwd=tests,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": f"{tests.parent}{os.pathsep}{tests}"})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_fully_shard_keeps_the_class_names_of_the_model_without_it():
    """FSDP2's fully_shard gives each module it shards a class of its own (``FSDPBlock``): ``class
    <Block>`` still selects it, and the root keeps its name (before: nothing selected, the nearest
    name FSDPBlock)."""
    result = _fully_sharded("each class <Block>\neach class <Net>", "eager", "whole")
    assert {"FSDPNet", "FSDPBlock"} <= set(result["classes"])  # what fully_shard made of them
    expected = ["Net", "blocks.0", "blocks.1", "Net (backward)", "blocks.1 (backward)", "blocks.0 (backward)"]
    assert result["seen"] == [expected] * 3 and result["warnings"] == [], result


@pytest.mark.slow  # the default tier stays under 6 minutes; CI runs the slow tier
@pytest.mark.parametrize("graph_break", ["whole", "graph-break"])
def test_fully_shard_under_inductor_names_every_call_as_eager_does(graph_break):
    """FSDP2's hooks break the graph inside each sharded block, so Dynamo compiles a block's code on its
    own, and gathers its parameters into tensors of their own for each call: the instance a graph runs
    for is found by the tensors the block holds at that moment (before: no range inside a block, and a
    warning), in every step, the compiling one too. Compared with eager, range by range."""
    spec = "each class <Block>\neach module <**.fc>"
    expected = _fully_sharded(spec, "eager", graph_break)["seen"][0]
    assert expected == ["blocks.0", "blocks.0.fc", "blocks.1", "blocks.1.fc", "blocks.1 (backward)",
                        "blocks.1.fc (backward)", "blocks.0 (backward)", "blocks.0.fc (backward)"]  # fmt: skip
    result = _fully_sharded(spec, "inductor", graph_break)
    assert result["seen"] == [expected] * 3 and result["warnings"] == [], result


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_a_model_dynamo_runs_uncompiled_gets_eager_names_and_a_warning(nvtx_capture, reentrant):
    """A graph break inside each checkpointed block: Dynamo cannot resume from it and runs the whole
    call uncompiled, so no graph holds a range. The hooks of the compile step give the module calls
    their ranges in every step, as on eager (the recompute inside the backward no forward call there
    either), and a warning says that the model ran uncompiled."""
    spec = "each module <blocks.*>"
    eager = CheckpointedNet(reentrant, graph_break=True)
    with nvtx_regions.annotate(eager, spec):
        expected = _checkpointed_steps(eager, nvtx_capture)[0]
    assert expected == ["blocks.0", "blocks.1", "blocks.1 (backward)", "blocks.0 (backward)"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = nvtx_regions.compile(CheckpointedNet(reentrant, graph_break=True), spec, backend="inductor")
        seen = _checkpointed_steps(compiled, nvtx_capture, steps=3)
    assert seen == [expected] * 3  # the compile step too
    assert not compiled.nvtx_regions_backend.graphs
    ours = [str(w.message) for w in caught if "compiled no graph" in str(w.message)]
    assert len(ours) == 1 and "get their ranges from hooks, as on eager" in ours[0], ours
    torch._dynamo.reset()


class CheckpointedInside(torch.nn.Module):
    """A block that checkpoints its own body, with a graph break in it: compiled on its own, Dynamo
    compiles nothing of it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def body(self, x):
        x = self.fc(x)
        torch._dynamo.graph_break()
        return torch.relu(x)

    def forward(self, x):
        return torch.utils.checkpoint.checkpoint(self.body, x, use_reentrant=False)


def test_layers_dynamo_compiles_nothing_of_are_said_and_named(nvtx_capture):
    """Layer by layer, each layer given NvtxInductor(model=model) directly: Dynamo compiles nothing, so
    the backend is never called. The model's first call says so, once, and hooks name the calls in
    every step, the compile step too, as eager."""
    from nvtx_regions.inductor import NvtxInductor

    def net():
        model = torch.nn.Module()
        model.blocks = torch.nn.ModuleList([CheckpointedInside(), CheckpointedInside()])
        model.forward = lambda x: model.blocks[1](model.blocks[0](x))
        return model

    eager = net()
    with nvtx_regions.annotate(eager, SPEC):
        expected = _checkpointed_steps(eager, nvtx_capture)[0]
    assert expected == ["blocks.0", "blocks.1", "blocks.1 (backward)", "blocks.0 (backward)"]
    model = net()
    backend = NvtxInductor(SPEC, model=model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for block in model.blocks:
            block.compile(backend=backend)
        seen = _checkpointed_steps(model, nvtx_capture, steps=3)
    assert not backend.graphs and seen == [expected] * 3
    ours = [str(w.message) for w in caught if "compiled no graph" in str(w.message)]
    assert len(ours) == 1 and "get their ranges from hooks, as on eager" in ours[0], ours
    torch._dynamo.reset()


@pytest.mark.slow
@pytest.mark.parametrize("way", ["eager", "whole model", "layer by layer"])
def test_hugging_face_gradient_checkpointing_gives_eager_names(nvtx_capture, way):
    from nvtx_regions.inductor import NvtxInductor

    model = _tiny_llama()
    model.train()
    model.gradient_checkpointing_enable()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if way == "eager":
            nvtx_regions.annotate(model, LAYER_SPEC)
        elif way == "whole model":
            model = nvtx_regions.compile(model, LAYER_SPEC, backend="inductor")
        else:
            backend = NvtxInductor(LAYER_SPEC, model=model)
            for layer in model.model.layers:
                layer.compile(backend=backend)
        seen = _llama_steps(model, nvtx_capture, steps=2)
    expected = [
        "model.layers.0", "model.layers.0.mlp", "model.layers.1", "model.layers.1.mlp",
        "model.layers.1 (backward)", "model.layers.1.mlp (backward)", "model.layers.0 (backward)", "model.layers.0.mlp (backward)",
    ]  # fmt: skip
    torch._dynamo.reset()
    assert seen == [expected] * 2


class SharedMiddle(torch.nn.Module):
    """One module instance reachable as ``blocks.0.middle`` and ``blocks.1.middle``."""

    def __init__(self) -> None:
        super().__init__()
        middle = torch.nn.Linear(8, 8)
        self.blocks = torch.nn.ModuleList([torch.nn.Sequential(torch.nn.Linear(8, 8), middle) for _ in range(2)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


class Albert(torch.nn.Module):
    """One layer called three times (ALBERT's shared layers)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = Block()

    def forward(self, x):
        for _ in range(3):
            x = self.layer(x)
        return x


@pytest.mark.parametrize(
    ("make", "spec"),
    [(SharedMiddle, "each module <blocks.*>\neach module <blocks.*.1>"), (Albert, "each module <layer>\neach class <Linear>")],
    ids=["two parents", "called three times"],
)
def test_a_shared_module_gets_eager_names(nvtx_capture, make, spec):
    def steps(model):
        seen = []
        for _ in range(2):
            with nvtx_capture() as events:
                model(torch.randn(2, 8)).sum().backward()
            # A call's later parts (`continues`) are left out: Inductor may run the shared weight's
            # gradient, summed over the calls, between kernels of a block's backward.
            ours = [e for e in events if e.kind in ("push", "start") and e.domain == "nvtx_regions" and not continues(e.message)]
            seen.append([(e.kind, e.message) for e in ours])
        return seen

    torch.manual_seed(0)
    eager = make()
    with nvtx_regions.annotate(eager, spec):
        expected = steps(eager)
    assert expected[0] and all(kind == "push" for kind, _ in expected[0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seen = steps(nvtx_regions.compile(make(), spec, backend="inductor"))
    assert not [str(w.message) for w in caught if issubclass(w.category, nvtx_regions.NvtxRegionsWarning)]
    if make is SharedMiddle and torch.__version__ >= "2.11":
        assert seen == expected
    elif make is SharedMiddle:
        # torch 2.8's AOTAutograd records the shared module's two backward calls as one: the names are
        # eager's, but the backward ranges cross (start/end ranges).
        forward = [r for r in expected[0] if "(backward)" not in r[1]]
        for step in seen:
            assert [r for r in step if "(backward)" not in r[1]] == forward
            assert sorted(m for _, m in step) == sorted(m for _, m in expected[0])
    else:
        # Every forward call named as eager names it. In the backward, Inductor computes the shared
        # weight's gradient for all three calls in the later calls' kernels: the first call's
        # `layer.fc (backward)` has no kernel of its own, so no range (missing, never misnamed).
        forward = [(k, m) for k, m in expected[0] if "(backward)" not in m]
        for step in seen:
            assert [(k, m) for k, m in step if "(backward)" not in m] == forward
            backward = [(k, m) for k, m in step if "(backward)" in m]
            assert backward == [(k, m) for k, m in expected[0] if "(backward)" in m][: len(backward)]
            assert len(backward) >= len(expected[0]) - len(forward) - 1
    torch._dynamo.reset()


class Generator(torch.nn.Module):
    """nanoGPT's shape of ``generate``: it calls the model once per new token."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x

    @torch.no_grad()
    def generate(self, x, tokens: int):
        for _ in range(tokens):
            x = self(x)
        return x


def test_a_generate_of_our_own_runs_compiled_with_the_ranges_eager_gives(nvtx_capture):
    torch.manual_seed(0)
    model = Generator()
    x = torch.randn(2, 8)
    with nvtx_regions.annotate(model, SPEC), nvtx_capture() as events:
        expected_out = model.generate(x, 3)
    expected = _ranges(events)
    assert expected == ["blocks.0", "blocks.1"] * 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = nvtx_regions.compile(model, SPEC, backend="inductor")
        with nvtx_capture() as events:
            out = compiled.generate(x, 3)  # takes no Hugging Face option
    assert _ranges(events) == expected
    assert torch.allclose(out, expected_out)
    torch._dynamo.reset()
