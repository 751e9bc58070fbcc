"""`nvtx_regions.eager.annotate`: the module rules of a spec as hooks on an eager model.

Every range test captures the NVTX calls that really happen (the capture
plugin attaches the tool in this process) and compares them with what
`NvtxProfileTransform` emits for the same spec on the same nanoGPT.
"""

from __future__ import annotations

import collections
import threading
import warnings

import pytest
import torch

from conftest import compiled, gpt_inputs, loss_of, make_gpt, plain_gpt
from nvtx_regions import NvtxRegionsWarning, SelectorError, SelectorSyntaxError
from nvtx_regions.eager import annotate
from nvtx_regions.testing import balance_problems, check_balanced, flatten, range_tree

# torch warns once when a full backward hook fires early (a module whose inputs need no gradient).
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning")


def _step(model) -> None:
    loss_of(model(*gpt_inputs())).backward()


def _pushes(events) -> list[tuple]:
    return [(e.domain, e.message, e.color, e.category) for e in events if e.kind == "push"]


def _ranges(events) -> list[tuple[int, str | None, str | None]]:
    (roots,) = range_tree(events).values()
    return flatten(roots)


BLOCKS = [
    (0, "nvtx_regions", "transformer.h.0"),
    (0, "nvtx_regions", "transformer.h.1"),
    (0, "nvtx_regions", "transformer.h.1 (backward)"),
    (0, "nvtx_regions", "transformer.h.0 (backward)"),
]


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("each module <transformer.h.*>", BLOCKS),
        (
            "gpt: each class <GPT, Block>",
            [
                (0, "nvtx_regions", "GPT"),
                *[(1, domain, message) for _, domain, message in BLOCKS[:2]],
                (0, "nvtx_regions", "GPT (backward)"),
                *[(1, domain, message) for _, domain, message in BLOCKS[2:]],
            ],
        ),
    ],
    ids=["each-module", "each-class-with-root"],
)
@pytest.mark.thunder
def test_same_ranges_as_thunder(nvtx_capture, spec, expected):
    jitted = compiled("gpt", None, spec)[0]  # compiled and run once
    model = make_gpt()
    with annotate(model, spec):
        with nvtx_capture() as eager_events:
            _step(model)
            _step(model)
    with nvtx_capture() as thunder_events:
        _step(jitted)
        _step(jitted)
    check_balanced(eager_events)
    check_balanced(thunder_events)
    assert _ranges(eager_events) == _ranges(thunder_events) == expected * 2
    # Same domain, message, colour and NVTX category, range for range.
    assert collections.Counter(_pushes(eager_events)) == collections.Counter(_pushes(thunder_events))
    assert {e.category for e in eager_events if e.kind == "push"} != {None}


def test_module_scope_gates_and_passes(nvtx_capture):
    model = plain_gpt()
    spec = (
        "each class <Linear> and module <transformer.h.1.mlp> and forward\n"
        "late: each module <transformer.h.0> and steps 1..1\n"
        "each module <lm_head> and rank in <1>"
    )
    with annotate(model, spec) as handle:
        with nvtx_capture() as events:
            for _ in range(3):
                _step(model)
        assert handle.steps == 3
    check_balanced(events)
    mlp = [(0, "nvtx_regions", "transformer.h.1.mlp.c_fc"), (0, "nvtx_regions", "transformer.h.1.mlp.c_proj")]
    late = [(0, "nvtx_regions", "transformer.h.0"), (0, "nvtx_regions", "transformer.h.0 (backward)")]
    assert _ranges(events) == mlp + [late[0], *mlp, late[1]] + mlp


class Shared(torch.nn.Module):
    """One Linear called twice per forward (shared weights)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.inner(torch.relu(self.inner(x)))


def test_weight_sharing_gets_two_ranges_each_way(nvtx_capture):
    model = Shared()
    with annotate(model, "each module <inner>"):
        with nvtx_capture() as events:
            model(torch.randn(2, 4, requires_grad=True)).sum().backward()
    check_balanced(events)
    assert [m for _, _, m in _ranges(events)] == ["inner", "inner", "inner (backward)", "inner (backward)"]
    with annotate(model, "each module <inner>"):
        with nvtx_capture() as events, torch.no_grad():
            model(torch.randn(2, 4))
    check_balanced(events)
    assert [m for _, _, m in _ranges(events)] == ["inner", "inner"]


class Fail(torch.autograd.Function):
    """Identity forward; backward raises."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("boom in backward")


def test_balanced_after_a_raise_in_a_blocks_forward(nvtx_capture):
    model = plain_gpt()
    with annotate(model, "each module <transformer.h.*, transformer.h.*.attn>"):

        def boom(module, args):
            raise RuntimeError("boom in forward")

        hook = model.transformer.h[1].attn.c_proj.register_forward_pre_hook(boom)
        with nvtx_capture() as events:
            with pytest.raises(RuntimeError, match="boom in forward"):
                _step(model)
        hook.remove()
        assert balance_problems(events) == []
        assert [(d, m) for d, _, m in _ranges(events)] == [
            (0, "transformer.h.0"),
            (1, "transformer.h.0.attn"),
            (0, "transformer.h.1"),
            (1, "transformer.h.1.attn"),
        ]


def test_balanced_after_a_raise_in_a_blocks_backward(nvtx_capture):
    model = plain_gpt()
    with annotate(model, "each module <transformer.h.*>") as handle:
        hook = model.transformer.h[0].mlp.register_forward_hook(lambda m, args, out: Fail.apply(out))
        with nvtx_capture() as failed:
            with pytest.raises(RuntimeError, match="boom in backward"):
                _step(model)
        hook.remove()
        # The failed backward left its range open on this thread...
        assert [(p.problem, p.message) for p in balance_problems(failed)] == [
            ("push_never_popped", "transformer.h.0 (backward)")
        ]
        # ...and the root's next forward pops it before its own first range.
        with nvtx_capture() as later:
            _step(model)
    check_balanced(later[1:])
    assert later[0].kind == "pop" and later[0].domain == "nvtx_regions"
    check_balanced([*failed, *later])
    assert [m for _, _, m in _ranges([*failed, *later])] == [
        "transformer.h.0",
        "transformer.h.1",
        "transformer.h.1 (backward)",
        "transformer.h.0 (backward)",  # closed by the next step's recovery
        *[m for _, _, m in BLOCKS],
    ]
    assert handle.steps == 2


def test_remove_pops_what_a_failed_backward_left_open(nvtx_capture):
    model = plain_gpt()
    handle = annotate(model, "each module <transformer.h.*>")
    model.transformer.h[1].register_forward_hook(lambda m, args, out: Fail.apply(out))
    with nvtx_capture() as events:
        with pytest.raises(RuntimeError, match="boom in backward"):
            _step(model)
        handle.remove()
    check_balanced(events)


def _hook_state(model) -> list:
    state = []
    for name, module in model.named_modules():
        state.append(
            (
                name,
                list(module._forward_pre_hooks.items()),
                list(module._forward_pre_hooks_with_kwargs.items()),
                list(module._forward_hooks.items()),
                list(module._forward_hooks_with_kwargs.items()),
                list(module._forward_hooks_always_called.items()),
                list(module._backward_pre_hooks.items()),
                list(module._backward_hooks.items()),
                module._is_full_backward_hook,
            )
        )
    return state


def test_remove_restores_the_hook_dicts(nvtx_capture):
    model = plain_gpt()
    # The user's own hooks stay, in their order.
    model.register_forward_pre_hook(lambda m, args: None)
    model.transformer.h[0].register_full_backward_hook(lambda m, gi, go: None)
    model.transformer.h[1].register_forward_hook(lambda m, args, out: None, with_kwargs=False)
    before = _hook_state(model)
    with annotate(model, "each module <**>"):
        assert _hook_state(model) != before
    assert _hook_state(model) == before
    handle = annotate(model, "each class <GPT, Linear> and backward")
    handle.remove()
    handle.remove()  # idempotent
    assert _hook_state(model) == before
    with nvtx_capture() as events:
        _step(model)
    assert [e for e in events if e.domain == "nvtx_regions"] == []


def test_annotation_describes_its_ranges():
    model = plain_gpt(1)
    with annotate(model, "each module <transformer.h.0.mlp.c_*> and forward; each class <GPT> and backward") as h:
        assert h.messages == [
            ("backward", "GPT (backward)"),
            ("forward", "transformer.h.0.mlp.c_fc"),
            ("forward", "transformer.h.0.mlp.c_proj"),
        ]
    # A scope matches the module itself and everything above it, the root included.
    with annotate(model, "each class <Linear> and class <GPT> and module <transformer.h.0.attn> and forward") as h:
        assert h.messages == [("forward", "transformer.h.0.attn.c_attn"), ("forward", "transformer.h.0.attn.c_proj")]
    with annotate(model, "each class <Block, CausalSelfAttention> and module <transformer.h.0.attn> and forward") as h:
        assert h.messages == [("forward", "transformer.h.0.attn")]
    with annotate(model, "each class <Linear> and module <transformer.h.0.attn.**> and forward") as h:
        assert h.messages == [("forward", "transformer.h.0.attn.c_attn"), ("forward", "transformer.h.0.attn.c_proj")]


def test_threads_keep_their_own_stacks(nvtx_capture):
    model = Shared()
    with annotate(model, "each module <inner>"):
        with nvtx_capture() as events:
            threads = [threading.Thread(target=lambda: model(torch.randn(2, 4)).sum().backward()) for _ in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    check_balanced(events)
    trees = range_tree(events)
    assert len(trees) == 3
    for roots in trees.values():
        assert [m for _, _, m in flatten(roots)] == ["inner", "inner", "inner (backward)", "inner (backward)"]


_SUPPORTED = (
    "in annotate() a rule is 'each module <...>' or 'each class <...>', optionally joined with 'and' to "
    "'forward', 'backward', 'module <...>', 'class <...>', 'rank in <...>' and 'steps a..b'"
)
_TRACE = ", and eager PyTorch has no trace, only module calls; " + _SUPPORTED + ". Use NvtxProfileTransform for this rule"

ERRORS = [
    ("op in <linear>", "rule 'op in <linear>' (<select>:1): 'op in <linear>' selects trace ops by name" + _TRACE),
    (
        "each module <*> and op in <linear>",
        "rule 'each module <*> and op in <linear>' (<select>:1): 'op in <linear>' selects trace ops by name" + _TRACE,
    ),
    ("attn: between t1..t2", "rule 'attn: between t1..t2' (<select>:1): 'between t1..t2' is a region between trace ops" + _TRACE),
    ("reads <t_*>", "rule 'reads <t_*>' (<select>:1): 'reads <t_*>' selects trace ops by the proxies they read" + _TRACE),
    (
        "source <model.py:3>",
        "rule 'source <model.py:3>' (<select>:1): 'source <model.py:3>' selects trace ops by the source line "
        "that recorded them" + _TRACE,
    ),
    (
        "backward of (each module <a>)",
        "rule 'backward of (each module <a>)' (<select>:1): 'backward of (each module <a>)' maps backward trace "
        "ops to the forward ops that saved their inputs" + _TRACE,
    ),
    ("all", "rule 'all' (<select>:1): 'all' selects every trace op" + _TRACE),
    (
        "module <transformer.h.0>",
        "rule 'module <transformer.h.0>' (<select>:1): 'module <transformer.h.0>' alone selects the ops inside "
        "matching modules, which only a thunder trace has; for one range per module call write "
        "'each module <transformer.h.0>' (or restrict an each rule: 'each class <Linear> and module <...>')",
    ),
    (
        "class <Block>",
        "rule 'class <Block>' (<select>:1): 'class <Block>' alone selects the ops inside matching modules, which "
        "only a thunder trace has; for one range per module call write 'each class <Block>' (or restrict an each "
        "rule: 'each class <Linear> and class <...>')",
    ),
    ("forward and steps 0..2", "rule 'forward and steps 0..2' (<select>:1): the rule names no module; " + _SUPPORTED),
    (
        "each module <a> or each class <B>",
        "rule 'each module <a> or each class <B>' (<select>:1): 'each module <a> or each class <B>': eager rules "
        "cannot use 'not' or 'or'; " + _SUPPORTED + ". Write one rule per alternative",
    ),
    (
        "each module <a> and not rank in <0>",
        "rule 'each module <a> and not rank in <0>' (<select>:1): 'not rank in <0>': eager rules cannot use "
        "'not' or 'or'; " + _SUPPORTED + ". Write one rule per alternative",
    ),
    (
        "each module <a> and each class <B>",
        "rule 'each module <a> and each class <B>' (<select>:1): 'each class <B>' is a rule of its own (one "
        "range per module call): join it only with 'and forward', 'and backward', 'and module <...>', "
        "'and class <...>' or run-time gates, at the top of the rule; to select the ops inside modules write "
        "'module <...>' or 'class <...>' instead",
    ),
]


@pytest.mark.parametrize("text, message", ERRORS, ids=[t for t, _ in ERRORS])
def test_rules_without_an_eager_meaning(text, message):
    model = plain_gpt(1)
    before = _hook_state(model)
    with pytest.raises(SelectorError) as error:
        annotate(model, text)
    assert str(error.value) == message
    assert _hook_state(model) == before


def test_errors_name_the_file_line(tmp_path):
    spec = tmp_path / "eager.nvtx"
    spec.write_text("each module <transformer.h.*>\n\nlinears: op in <linear>\n")
    with pytest.raises(SelectorError, match=r"^rule 'linears: op in <linear>' \(.*eager\.nvtx:3\): "):
        annotate(plain_gpt(1), spec=spec)


def test_argument_errors():
    with pytest.raises(SelectorSyntaxError):
        annotate(plain_gpt(1), "each module <a")
    with pytest.raises(TypeError, match="annotate\\(\\) takes a torch.nn.Module, not function"):
        annotate(plain_gpt, "each module <a>")
    with pytest.raises(TypeError, match="select= takes spec text"):
        annotate(plain_gpt(1), ["each module <a>"])
    model = Shared()
    model.inner.register_backward_hook(lambda *a: None)
    before = _hook_state(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError, match="module 'inner' has a backward hook from register_backward_hook"):
            annotate(model, "each module <inner>")
    assert _hook_state(model) == before
    annotate(model, "each module <inner> and forward").remove()


UNSELECTED = [
    (
        "each module <transformer.h.9>",
        "rule 'each module <transformer.h.9>' (<select>:1) selected no module; module 'transformer.h.9' matches no "
        "module of this GPT (nearest: transformer.h.0, transformer.h, transformer)",
    ),
    (
        "each class <Blok>",
        "rule 'each class <Blok>' (<select>:1) selected no module; class 'Blok' matches no module of this GPT "
        "(nearest: Block)",
    ),
    (
        "each class <Linear> and module <transformer.wte>",
        "rule 'each class <Linear> and module <transformer.wte>' (<select>:1) selected no module; its "
        "'module <...>' / 'class <...>' scope excludes every module it matches",
    ),
    (
        "each module <lm_head> and forward and backward",
        "rule 'each module <lm_head> and forward and backward' (<select>:1) selected no module; "
        "'forward and backward' is never true",
    ),
]


@pytest.mark.parametrize("text, message", UNSELECTED, ids=[t for t, _ in UNSELECTED])
def test_rule_that_matches_no_module_warns(text, message):
    model = plain_gpt(1)
    before = _hook_state(model)
    with pytest.warns(NvtxRegionsWarning) as record:
        annotate(model, text).remove()
    assert [str(w.message) for w in record] == [message]
    assert record[0].filename == __file__  # points at the caller
    with pytest.raises(SelectorError) as error:
        annotate(model, text, strict=True)
    assert str(error.value) == message
    assert _hook_state(model) == before


def test_parenthesized_and_is_flattened_as_in_the_transform():
    # The transform reads '(each module <0> and forward) and class <Linear>' as one
    # each rule with a class scope; annotate() reads the same conjuncts the same way.
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    with annotate(model, "(each module <0> and forward) and class <Linear>") as h:
        assert h.messages == [("forward", "0")]
    with annotate(model, "(each class <Linear> and module <2>) and (backward and steps 0..)") as h:
        assert h.messages == [("backward", "2 (backward)")]
