"""Module attribution on real thunder CPU traces (nanoGPT, litgpt llama-like,
an MLP), forward and backward, checked against references written here, and
`each module` ranges checked in real NVTX captures.

References, independent of nvtx_regions' recorder:
- forward: the class whose ``forward`` source (``inspect``) contains the line
  thunder recorded for the op, and the block whose parameters
  (``t_transformer_h_<i>_*``, thunder's names of ``named_parameters()``) an op reads;
- backward: each parameter's gradient, found through the backward trace's
  return (aligned with the forward's arguments), belongs to the module that
  owns the parameter in ``named_parameters()``.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import re
import warnings

import pytest
import thunder
import torch

from support.models import Recorder, gpt_inputs, make_gpt
from nvtx_regions import NvtxProfileTransform, NvtxRegionsWarning, SelectorError, explain
from nvtx_regions.core.calls import common_chain
from nvtx_regions.core.globs import path_matcher
from nvtx_regions.testing import check_balanced, flatten, range_tree
from nvtx_regions.attribution.traceview import TraceView

pytestmark = pytest.mark.thunder  # the whole file needs lightning-thunder


def make_llama(n_layer: int = 3):
    from thunder.tests.litgpt_model import GPT, Config

    torch.manual_seed(0)
    config = Config.from_name(
        "llama2-like", n_layer=n_layer, block_size=32, n_embd=32, n_head=4, intermediate_size=64,
        vocab_size=64, padded_vocab_size=64,
    )  # fmt: skip
    return GPT(config)


def llama_inputs():
    torch.manual_seed(1)
    return (torch.randint(0, 64, (2, 16)),)


def run_step(jitted, model_name):
    if model_name == "gpt":
        _, loss = jitted(*gpt_inputs())
    else:
        loss = jitted(*llama_inputs()).sum()
    loss.backward()


@functools.lru_cache(maxsize=None)
def traced(model_name: str, n_layer: int = 3):
    """(model, forward view, backward view) of one training step, with the traces post-optimization transforms get."""
    model = make_gpt(n_layer) if model_name == "gpt" else make_llama(n_layer)
    recorder = Recorder()
    holder = NvtxProfileTransform()  # while it lives, it holds thunder's patches, which record module calls
    jitted = thunder.jit(model, transforms=[recorder])
    run_step(jitted, model_name)
    del holder
    forward, backward = (TraceView.from_trace(t) for t in recorder.traces)
    backward.forward = forward
    return model, forward, backward


def forward_source_classes(model) -> dict[str, list[tuple[int, int, str]]]:
    """File -> (first line, last line, class name) of each method of each module
    class (``forward`` and the helpers it calls on ``self``)."""
    found: dict[str, list[tuple[int, int, str]]] = {}
    for cls in {type(m) for m in model.modules()}:
        for method in vars(cls).values():
            if not inspect.isfunction(method):
                continue
            try:
                lines, start = inspect.getsourcelines(method)
            except (OSError, TypeError):
                continue
            found.setdefault(inspect.getsourcefile(method), []).append((start, start + len(lines) - 1, cls.__name__))
    return found


def reference_class(sources, filename: str, line: int) -> str | None:
    hits = [(last - first, name) for first, last, name in sources.get(filename, ()) if first <= line <= last]
    return min(hits)[1] if hits else None


def block_of(path: str) -> int | None:
    found = re.match(r"transformer\.h\.(\d+)(\.|$)", path)
    return None if found is None else int(found.group(1))


@pytest.mark.parametrize("model_name", ["gpt", pytest.param("llama", marks=pytest.mark.slow)])
def test_forward_attribution_matches_source_and_parameters(model_name):
    model, forward, _ = traced(model_name)
    sources = forward_source_classes(model)
    chains = forward.module_chains
    assert all(chain is not None for chain in chains)
    checked = 0
    for position, op in enumerate(forward.ops):
        chain = chains[position]
        for filename, line in forward.source_lines[position]:
            expected = reference_class(sources, str(filename), line)
            if expected is not None:  # a line inside some module's forward (not a helper function)
                assert chain[-1].cls == expected, (position, op.name, filename, line, chain[-1])
                checked += 1
        for name in op.reads:
            param = re.match(r"t_transformer_h_(\d+)_", name)
            if param:
                assert block_of(chain[-1].path) == int(param.group(1)), (op.name, name, chain[-1].path)
    assert checked >= 0.6 * len(forward.ops)  # the rest: module-level helpers (litgpt's apply_rope), thunder's files
    # Parameter-free ops count: each block has the same number of ops, in order.
    blocks = [block_of(c[-1].path) for c in chains if block_of(c[-1].path) is not None]
    runs = [(k, len(list(g))) for k, g in itertools.groupby(blocks)]
    assert [k for k, _ in runs] == [0, 1, 2]
    assert len({n for _, n in runs}) == 1


def test_residual_adds_and_attention_ops_belong_to_their_modules():
    """Ops that read no parameter: the block's residual adds, attention's matmuls and softmax."""
    _, forward, _ = traced("gpt")
    by_module: dict[str, list[str]] = {}
    for op, chain in zip(forward.ops, forward.module_chains):
        by_module.setdefault(chain[-1].path, []).append(op.name)
    for i in range(3):
        assert by_module[f"transformer.h.{i}"] == ["add", "add"]  # x + attn(...), x + mlp(...)
        attn = by_module[f"transformer.h.{i}.attn"]
        assert attn.count("matmul") == 2 and attn.count("softmax") == 1
        assert by_module[f"transformer.h.{i}.mlp.c_fc"] == ["linear"]


def parameter_arguments(model) -> dict[str, str]:
    """thunder's proxy name of each parameter -> the path of the module that owns it."""
    return {"t_" + name.replace(".", "_"): name.rsplit(".", 1)[0] for name, _ in model.named_parameters()}


@pytest.mark.parametrize("model_name", ["gpt", pytest.param("llama", marks=pytest.mark.slow)])
def test_backward_gradient_of_a_parameter_belongs_to_its_module(model_name):
    model, forward, backward = traced(model_name)
    owners = parameter_arguments(model)
    producer = {name: p for p, op in enumerate(backward.ops) for name in op.writes}
    checked = 0
    for argument, gradient in zip(forward.arg_order, backward.returned):
        if argument in owners and gradient is not None:
            chain = backward.module_chains[producer[gradient]]
            assert chain[-1].path == owners[argument], (argument, backward.ops[producer[gradient]].name)
            checked += 1
    assert checked >= len(owners) - 1  # nanoGPT's lm_head weight is tied to wte's


@pytest.mark.parametrize("model_name", ["gpt", pytest.param("llama", marks=pytest.mark.slow)])
def test_backward_blocks_in_reverse_order_without_gaps(model_name):
    _, _, backward = traced(model_name)
    blocks = [None if c is None else block_of(c[-1].path) for c in backward.module_chains]
    positions = [p for p, b in enumerate(blocks) if b is not None]
    inside = blocks[positions[0] : positions[-1] + 1]
    assert None not in inside  # every op between the first block op and the last is in a block
    assert [k for k, _ in itertools.groupby(inside)] == [2, 1, 0]  # reverse order, no interleaving


def test_module_globs_follow_path_conventions():
    matches = path_matcher(("transformer.h.*",))
    assert matches("transformer.h.0") and not matches("transformer.h.0.attn") and not matches("transformer.h")
    deep = path_matcher(("**.attn",))
    assert deep("transformer.h.3.attn") and deep("attn") and not deep("transformer.h.3.attn.c_attn")
    assert path_matcher(("transformer.**",))("transformer.h.0.mlp.c_fc")
    assert not path_matcher(("**",))("")  # the root module has no path


def test_common_chain_prefers_the_earlier_call_of_a_shared_module():
    from nvtx_regions.core.calls import ModuleCall as C

    first = (C("", "M", 1), C("shared", "Linear", 2))
    second = (C("", "M", 1), C("shared", "Linear", 5))
    other = (C("", "M", 1), C("other", "Linear", 3))
    assert common_chain([second, first]) == first
    assert common_chain([first, other]) == (C("", "M", 1),)
    assert common_chain([None]) is None


# ------------------------------------------------------------------ the language on real traces


def plan_of(spec: str, model_name: str = "gpt"):
    _, forward, backward = traced(model_name)
    transform = NvtxProfileTransform(spec, messages="module")
    from nvtx_regions.selection.plan import make_plan

    return [make_plan(transform.compiled, view) for view in (forward, backward)], forward, backward


def test_op_in_and_module_selects_block_zero_linears():
    (fw, bw), forward, _ = plan_of("op in <linear> and module <transformer.h.0>")
    chosen = [forward.ops[forward.position_of(r.start)] for r in fw.ranges]
    assert [op.name for op in chosen] == ["linear"] * 4
    assert bw.empty


def test_module_list_path_covers_its_children():
    (fw, _), forward, _ = plan_of("module <transformer.h>")
    expected = sum(1 for c in forward.module_chains if block_of(c[-1].path) is not None)
    assert len(fw.ranges) == expected > 0


def test_backward_of_selects_the_weight_gradient_matmuls():
    """The issue's case: weight-gradient matmuls read a reshape of the saved input, not the saved tensor."""
    model, forward, backward = traced("gpt")
    (_, bw), *_ = plan_of("backward of (op in <linear> and module <transformer.h.0>)")
    selected = {r.start for r in bw.ranges}
    producer = {name: op.index for op in backward.ops for name in op.writes}
    # The gradient of each Linear's weight: 4 Linears in each of the 3 blocks, and lm_head.
    linear_weight = re.compile(r"t_(transformer_h_\d+_(attn|mlp)_c_\w+|lm_head)_weight")
    made_by = {argument: producer[gradient] for argument, gradient in zip(forward.arg_order, backward.returned)
               if argument and linear_weight.fullmatch(argument)}  # fmt: skip
    assert len(made_by) == 13
    # Block 0's four are selected, and no other Linear's.
    assert sorted(argument for argument, index in made_by.items() if index in selected) == [
        f"t_transformer_h_0_{linear}_weight" for linear in ("attn_c_attn", "attn_c_proj", "mlp_c_fc", "mlp_c_proj")
    ]


def test_each_rules_nest_like_the_module_tree():
    (fw, bw), *_ = plan_of("each module <transformer.h.*, transformer.h.*.attn>")
    assert [r.label for r in fw.ranges] == [f"transformer.h.{i}{s}" for i in range(3) for s in ("", ".attn")]
    assert [r.label for r in bw.ranges] == [
        f"transformer.h.{i}{s} (backward)" for i in (2, 1, 0) for s in ("", ".attn")
    ]
    for ranges in (fw.ranges, bw.ranges):
        for block, attn in zip(ranges[::2], ranges[1::2]):
            assert block.start <= attn.start <= attn.end <= block.end


def test_each_class_and_restrictions():
    (fw, bw), *_ = plan_of("each class <CausalSelfAttention> and forward")
    assert [r.label for r in fw.ranges] == ["transformer.h.0.attn", "transformer.h.1.attn", "transformer.h.2.attn"]
    assert bw.empty
    (fw, _), *_ = plan_of("each class <Linear> and module <transformer.h.1>")
    assert [r.label for r in fw.ranges] == [
        "transformer.h.1.attn.c_attn", "transformer.h.1.attn.c_proj", "transformer.h.1.mlp.c_fc", "transformer.h.1.mlp.c_proj",
    ]  # fmt: skip


def test_source_selects_the_ops_of_one_line():
    from thunder.tests import nanogpt_model

    model, forward, _ = traced("gpt")
    lines, start = inspect.getsourcelines(nanogpt_model.Block.forward)
    residual = start + next(i for i, text in enumerate(lines) if "self.attn(" in text)
    (fw, bw), *_ = plan_of(f"source <nanogpt_model.py:{residual}>")
    chosen = [forward.ops[forward.position_of(r.start)] for r in fw.ranges]
    assert [op.name for op in chosen] == ["add"] * 3  # x = x + self.attn(self.ln_1(x)), once per block
    assert bw.empty


def test_each_rule_errors_name_the_fix():
    for text in ("not each module <a>", "each module <a> or op in <linear>", "each module <a> and op in <linear>"):
        with pytest.raises(SelectorError, match=r"is a rule of its own .* join it only with 'and forward'"):
            NvtxProfileTransform(text)


def test_selected_nothing_warnings_name_nearest_modules():
    jitted = thunder.jit(make_gpt(2), transforms=[NvtxProfileTransform("each module <transformer.h.9>; class <CasualSelfAttention>; each module <transformer.h>")])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", NvtxRegionsWarning)
        run_step(jitted, "gpt")
    texts = [str(w.message) for w in caught if issubclass(w.category, NvtxRegionsWarning)]
    assert any("module 'transformer.h.9' matches nothing in these traces (nearest: transformer.h.1, transformer.h.0" in t for t in texts)
    assert any("(nearest: CausalSelfAttention)" in t for t in texts)
    assert any("'transformer.h' matches transformer.h, whose forward never runs" in t and "each module <transformer.h.*>" in t for t in texts)


@pytest.mark.slow  # the default tier stays under 6 minutes; CI runs the slow tier
def test_explain_shows_modules_and_calls():
    jitted = thunder.jit(make_gpt(2), transforms=[NvtxProfileTransform("each module <transformer.h.*>\nop in <linear> and module <transformer.h.0.mlp>")])
    run_step(jitted, "gpt")
    text = str(explain(jitted))
    assert "one range per module call" in text
    assert "    transformer.h.1 (backward): ops #" in text
    assert "[transformer.h.0.mlp.c_fc] t" in text and "[transformer.h.0.mlp.c_proj] t" in text


# ------------------------------------------------------------------ captured ranges


@pytest.mark.slow  # the default tier stays under 6 minutes; CI runs the slow tier
@pytest.mark.parametrize("model_name", ["gpt", "llama"])
def test_each_module_ranges_captured(model_name, nvtx_capture):
    make = make_gpt if model_name == "gpt" else make_llama
    transform = NvtxProfileTransform(
        "each module <transformer.h.*>\nop in <linear> and forward", domain=f"modules_{model_name}", messages="module"
    )
    jitted = thunder.jit(make(3), transforms=[transform])
    run_step(jitted, model_name)  # compile
    with nvtx_capture() as events:
        run_step(jitted, model_name)
    ours = [e for e in events if e.domain == f"modules_{model_name}"]
    check_balanced(ours)
    (roots,) = range_tree(ours).values()
    got = [(depth, message) for depth, _, message in flatten(roots)]
    blocks = [(d, m) for d, m in got if m.startswith("transformer.h.") and ":" not in m]
    assert blocks == [(0, f"transformer.h.{i}") for i in range(3)] + [(0, f"transformer.h.{i} (backward)") for i in (2, 1, 0)]
    # Every linear of a block sits inside that block's range, one level down.
    current = None
    for depth, message in got:
        if ":" not in message:
            current = message
        elif depth == 1:
            assert message.startswith(current + ".") and message.endswith(": linear"), (current, message)
        else:
            assert depth == 0 and not message.startswith("transformer.h."), message
    linears = 4 if model_name == "gpt" else 5  # c_attn, c_proj, c_fc, c_proj / qkv, proj, fc_1, fc_2, proj
    assert sum(1 for d, m in got if d == 1) == 3 * linears


@pytest.mark.slow  # the default tier stays under 6 minutes; CI runs the slow tier
def test_fusion_spanning_blocks_belongs_to_their_common_module():
    """With torch.compile fusions a 1-layer forward is one TorchCompile0 spanning the whole model."""
    transform = NvtxProfileTransform("each module <transformer.h.*> and forward\nmodule <**>")
    jitted = thunder.jit(make_gpt(1), transforms=[transform], executors=["torchcompile"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", NvtxRegionsWarning)
        run_step(jitted, "gpt")
    forward = TraceView.from_trace(thunder.last_traces(jitted)[-1])
    fusions = [p for p, op in enumerate(forward.ops) if op.is_fusion]
    assert fusions
    for p in fusions:
        parts = {sub.source_filename.calls[-1].path for sub in forward.ops[p].bsym.subsymbols if hasattr(sub.source_filename, "calls")}
        paths = sorted(parts)
        prefix = []
        for pieces in zip(*(s.split(".") if s else [] for s in paths)):
            if len(set(pieces)) != 1:
                break
            prefix.append(pieces[0])
        assert forward.module_chains[p][-1].path == ".".join(prefix)
    assert any("each module <transformer.h.*> and forward" in str(w.message) for w in caught)


def test_thunderfx_gives_the_same_paths():
    """Under ThunderFX thunder traces dynamo's FX graph; paths come from its nodes' nn_module_stack."""
    import thunder.dynamo

    transform = NvtxProfileTransform("op in <linear> and module <transformer.h.1>\nclass <CausalSelfAttention> and op in <linear>")
    model = make_gpt(2)
    compiled_model = torch.compile(model, backend=thunder.dynamo.ThunderCompiler(transforms=[transform]))
    _, loss = compiled_model(*gpt_inputs())
    loss.backward()
    transform.check()
    forward = next(r for r in transform.reports if r.phase == "forward")
    assert forward.ranges_per_rule == (4, 4)
    lines = [line for _, line in forward.ranges_emitted]
    h1 = [l for l in lines if "transformer_modules_h_modules_1_" in l]
    attn = [l for l in lines if "_modules_attn_modules_" in l]
    assert len(lines) == 6 and len(h1) == 4 and len(attn) == 4


@pytest.mark.slow
def test_modules_benchmark_smoke():
    """benchmarks/modules.py runs and counts the ranges it compares (1 layer: one block, forward and backward)."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "modules.py"
    out = subprocess.run([sys.executable, str(script), "--smoke"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith(("| none", "| attached"))]
    assert len(rows) == 2 and all(row.split("|")[6].strip() == "2" for row in rows), out.stdout
