"""The Inductor view of a graph's kernel calls (`inductor.kernels`), planned by the same
selection code as thunder traces: plain data in, no thunder trace anywhere.

The kernels here are written as `internals.inductor` hands them over (each
with the FX origins Inductor fused into it); tests/test_inductor.py checks the
same rules on kernels Inductor really generated.
"""

from __future__ import annotations

import pytest

from nvtx_regions import parse
from nvtx_regions.core.errors import SelectorError
from nvtx_regions.inductor.kernels import kernel_view
from nvtx_regions.internals.inductor import Origin, WrapperKernel, module_path
from nvtx_regions.selection.compile import compile_spec
from nvtx_regions.selection.plan import make_plan

H0 = (("k0", "h.0", "Block"),)
H1 = (("k1", "h.1", "Block"),)
H0_FC = (*H0, ("k2", "h.0.fc", "Linear"))


def _kernel(number: int, name: str, *origins: tuple) -> WrapperKernel:
    """A kernel of `origins`: (aten op, modules) or (aten op, modules, static)."""
    return WrapperKernel(name, tuple(Origin(f"n{number}_{i}", *origin) for i, origin in enumerate(origins)),
                         2 * number, 2 * number + 1)  # fmt: skip


def _plan(text: str, kernels: list[WrapperKernel], phase: str = "forward"):
    view = kernel_view(kernels, phase, "graph 0", {})
    return view, make_plan(compile_spec(parse(text)), view, "nvtx_regions")


def _spans(plan) -> list[tuple[str, int, int]]:
    return [(r.label, r.start, r.end) for r in plan.ranges]


def test_a_kernel_spanning_two_blocks_belongs_to_neither():
    kernels = [
        _kernel(0, "extern_kernels.addmm", ("addmm", H0_FC)),
        _kernel(1, "cpp_fused_add_layer_norm_0", ("add", H0), ("native_layer_norm", H1)),
        _kernel(2, "extern_kernels.addmm", ("addmm", H1)),
    ]
    view, plan = _plan("each module <h.*>", kernels)
    assert view.module_chains[1] == ()
    assert _spans(plan) == [("h.0", 0, 0), ("h.1", 2, 2)]


def test_a_kernel_of_no_module_does_not_end_the_range_it_is_in():
    kernels = [
        _kernel(0, "extern_kernels.mm", ("mm", H0_FC)),
        _kernel(1, "cpp_fused_add_0", ("add", ())),  # a gradient accumulation
        _kernel(2, "extern_kernels.mm", ("mm", H0_FC)),
        _kernel(3, "extern_kernels.mm", ("mm", H1)),
    ]
    view, plan = _plan("each module <h.*>", kernels, "backward")
    assert view.module_chains[1] is None
    assert _spans(plan) == [("h.0 (backward)", 0, 2), ("h.1 (backward)", 3, 3)]


def test_a_call_whose_kernels_another_modules_work_splits_comes_in_parts():
    # h.0's weight gradient scheduled after another module's kernel: h.0's range in two parts.
    embedding = (("k9", "wte", "Embedding"),)
    kernels = [
        _kernel(0, "extern_kernels.mm", ("mm", H0_FC)),
        _kernel(1, "cpp_fused_embedding_dense_backward_0", ("embedding_dense_backward", embedding)),
        _kernel(2, "extern_kernels.mm", ("mm", H0_FC)),
    ]
    _, plan = _plan("each module <h.*>", kernels, "backward")
    assert _spans(plan) == [("h.0 (backward)", 0, 0), ("h.0 (backward, continued)", 2, 2)]
    assert {r.style for r in plan.ranges} == {"PushPop"}
    # A kernel of the module around it (h.0's own add) stays inside h.0.fc's range; a kernel of h.0
    # that fuses the work of h.0.fc's sibling (proj's gelu) cuts it, as does a kernel of two other
    # blocks; one that does some of h.0's work (of both blocks) stays, as does one of no module.
    proj = (*H0, ("k3", "h.0.proj", "Linear"))
    for middle, parts in [
        (_kernel(1, "cpp_fused_add_0", ("add", H0)), [("h.0.fc (backward)", 0, 2)]),
        (_kernel(1, "cpp_fused_add_gelu_0", ("add", H0), ("gelu", proj)), [("h.0.fc (backward)", 0, 0), ("h.0.fc (backward, continued)", 2, 2)]),
        (_kernel(1, "cpp_fused_add_0", ("add", H1), ("add", (("k4", "h.2", "Block"),))), [("h.0.fc (backward)", 0, 0), ("h.0.fc (backward, continued)", 2, 2)]),
        (_kernel(1, "cpp_fused_add_0", ("add", H0), ("add", H1)), [("h.0.fc (backward)", 0, 2)]),
        (_kernel(1, "cpp_fused_add_0", ("add", ())), [("h.0.fc (backward)", 0, 2)]),  # of no module
    ]:  # fmt: skip
        _, plan = _plan("each module <h.0.fc>", [kernels[0], middle, kernels[2]], "backward")
        assert _spans(plan) == parts, middle.name


def test_op_in_matches_kernel_names_their_last_part_and_their_aten_ops():
    kernels = [
        _kernel(0, "extern_kernels.addmm", ("addmm", H0_FC)),
        _kernel(1, "cpp_fused_gelu_0", ("gelu", H0), ("mul", H0)),
        _kernel(2, "aten._scaled_dot_product_flash_attention_for_cpu.default",
                ("_scaled_dot_product_flash_attention_for_cpu", H0)),
    ]  # fmt: skip
    for text, selected in [
        ("op in <addmm>", [0]), ("op in <extern_kernels.*>", [0]), ("op in <gelu>", [1]), ("op in <cpp_fused_*>", [1]),
        ("op in <_scaled_dot_product*>", [2]), ("op in <mul, addmm>", [0, 1]),
    ]:  # fmt: skip
        _, plan = _plan(text, kernels)
        assert [r.start for r in plan.ranges] == selected, text
        assert all(r.label is None for r in plan.ranges)


def test_between_first_and_last_and_phases():
    kernels = [
        _kernel(0, "extern_kernels.addmm", ("addmm", H0_FC)),
        _kernel(1, "cpp_fused_gelu_0", ("gelu", H0)),
        _kernel(2, "extern_kernels.addmm", ("addmm", H1)),
    ]
    _, plan = _plan("between first(op in <gelu>)..last(module <h.1>) and forward", kernels)
    assert _spans(plan) == [("first(op in <gelu>)..last(module <h.1>)", 1, 2)]
    _, plan = _plan("between first(op in <gelu>)..last(module <h.1>) and backward", kernels)
    assert plan.empty


@pytest.mark.parametrize(
    "source, path",
    [
        # The compiled frame's root, however it reaches the model: `self` of a plain forward,
        # an argument of a `forward(*args)` (transformers 5.x's decorated forwards), a local,
        # a global, a keyword argument.
        ("L['self']", ""),
        ("L['self'].transformer.h.0.attn", "transformer.h.0.attn"),
        ("L['args'][0]", ""),
        ("L['args'][0].model.layers.0", "model.layers.0"),
        ("L['args'][0].model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.q_proj"),
        ("L['mod'].blocks.1", "blocks.1"),
        ("G['model'].encoder.layer.0", "encoder.layer.0"),
        ('G["model"].encoder', "encoder"),
        ("L['kwargs']['m'].layers.1", "layers.1"),
        # Subscripts past the root are path components.
        ("L['self'].h[0]", "h.0"),
        ("L['self']._modules['h']['0']", "h.0"),
        ("L['args'][0]._modules['model'].layers[1]", "model.layers.1"),
    ],
)
def test_module_paths_from_dynamo_sources(source, path):
    assert module_path(source) == path


# -- static origins: constants, and in a backward what no gradient reaches -------------------

LOSS = ()  # the loss is computed in the root's own forward: no module
SHARED_ZERO = ("full", H0, True)  # a constant Inductor made once, with the module that first made it


@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_a_static_origin_does_not_decide_the_module_of_a_kernel(phase):
    # The loss's kernel reads a zero shared across the graph that carries h.0: the kernel is
    # the loss's, and belongs to no module, so h.0's range does not start there.
    kernels = [
        _kernel(0, "cpp_fused_nll_loss_0", ("nll_loss_backward", LOSS), SHARED_ZERO),
        _kernel(1, "extern_kernels.mm", ("mm", H1)),
        _kernel(2, "extern_kernels.mm", ("mm", H0_FC)),
    ]
    view, plan = _plan("each module <h.*>", kernels, phase)
    assert view.module_chains[0] is None and not view.ops[0].hoisted
    suffix = " (backward)" if phase == "backward" else ""
    assert _spans(plan) == [(f"h.1{suffix}", 1, 1), (f"h.0{suffix}", 2, 2)]
    # Its op names are still all of its origins'.
    _, plan = _plan("op in <full>", kernels, phase)
    assert [r.start for r in plan.ranges] == [0]


def test_the_gradient_carrying_origins_decide():
    # A gradient of h.1 fused with a value recomputed from h.0's saved inputs: h.1's.
    kernels = [
        _kernel(0, "extern_kernels.mm", ("mm", H1)),
        _kernel(1, "cpp_fused_mul_0", ("mul", H1), ("gelu", H0, True)),
        _kernel(2, "extern_kernels.mm", ("mm", H0_FC)),
    ]
    view, plan = _plan("each module <h.*>", kernels, "backward")
    assert [call.path for call in view.module_chains[1]] == ["h.1"]
    assert _spans(plan) == [("h.1 (backward)", 0, 1), ("h.0 (backward)", 2, 2)]


def test_a_kernel_of_static_origins_only_keeps_their_module_and_is_hoisted():
    # Scheduled first, it neither opens h.0's range early nor is left out of h.0's kernels.
    kernels = [
        _kernel(0, "cpp_fused_clone_0", ("clone", H0, True), SHARED_ZERO),
        _kernel(1, "extern_kernels.mm", ("mm", H1)),
        _kernel(2, "extern_kernels.mm", ("mm", H0_FC)),
    ]
    view, plan = _plan("each module <h.*>", kernels, "backward")
    assert [call.path for call in view.module_chains[0]] == ["h.0"] and view.ops[0].hoisted
    assert _spans(plan) == [("h.1 (backward)", 1, 1), ("h.0 (backward)", 2, 2)]


def test_static_nodes_of_fx_graphs():
    import torch
    from torch.fx import Graph

    from nvtx_regions.internals.inductor_origins import static_nodes as _static_nodes

    aten = torch.ops.aten
    # Forward: the graph's inputs (parameters among them) are not static; a constant is.
    graph = Graph()
    x = graph.placeholder("primals_1")
    zero = graph.call_function(aten.full.default, ([3], 0.0), name="full_default")
    doubled = graph.call_function(aten.mul.Tensor, (zero, 2), name="mul")
    added = graph.call_function(aten.add.Tensor, (x, zero), name="add")
    graph.output((added, doubled))
    assert sorted(n.name for n in _static_nodes(graph, "forward")) == ["full_default", "mul"]
    # Backward: saved values and what only they reach are static; what a gradient reaches is not.
    graph = Graph()
    saved, tangent = graph.placeholder("primals_1"), graph.placeholder("tangents_1")
    recomputed = graph.call_function(aten.sin.default, (saved,), name="sin")
    gradient = graph.call_function(aten.mul.Tensor, (tangent, recomputed), name="mul")
    graph.output((gradient,))
    assert sorted(n.name for n in _static_nodes(graph, "backward")) == ["primals_1", "sin"]


def test_a_refusal_is_our_selector_error_naming_the_rule():
    from nvtx_regions.inductor.check import check_spec

    with pytest.raises(SelectorError, match=r"^rule 'between t3\.\.t9' \(<select>:1\): not supported under Inductor"):
        check_spec(parse("between t3..t9"))


def test_a_crossing_range_is_explained_in_kernels_not_bound_symbols():
    """A region that starts inside one module call and ends inside the next: each call's range becomes
    a start/end range, and why says so in Inductor's words (issue 49: it spoke of thunder's bound
    symbols)."""
    kernels = [
        _kernel(0, "extern_kernels.mm", ("mm", H0)),
        _kernel(1, "cpp_fused_gelu_1", ("gelu", H0)),
        _kernel(2, "cpp_fused_tanh_2", ("tanh", H1)),
        _kernel(3, "extern_kernels.mm", ("mm", H1)),
    ]
    _, plan = _plan("each module <h.*>\nr: between first(op in <gelu>)..first(op in <tanh>)", kernels, "backward")
    whys = {r.label: r.why for r in plan.ranges}
    assert whys == {
        "h.0 (backward)": "crosses 'r' (kernels 1..2): the compiler (thunder, Inductor) interleaved their ops",
        "h.1 (backward)": "crosses 'r' (kernels 1..2): the compiler (thunder, Inductor) interleaved their ops",
        "r": None,
    }
