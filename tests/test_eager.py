"""`nvtx_regions.eager.annotate`: the module rules of a spec as hooks on an eager model.

Every range test captures the NVTX calls that really happen (the capture
plugin attaches the tool in this process) and compares them with what
`NvtxProfileTransform` emits for the same spec on the same nanoGPT.
"""

from __future__ import annotations

import collections
import copy
import threading
import warnings

import pytest
import torch

from support.models import compiled, gpt_inputs, loss_of, make_gpt, plain_gpt
import nvtx_regions
from nvtx_regions import NvtxRegionsWarning, SelectorError, SelectorSyntaxError
from nvtx_regions.eager import annotate
from nvtx_regions.testing import balance_problems, check_balanced, flatten, range_tree


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
        pytest.param(
            "gpt: each class <GPT, Block>",
            [
                (0, "nvtx_regions", "GPT"),
                *[(1, domain, message) for _, domain, message in BLOCKS[:2]],
                (0, "nvtx_regions", "GPT (backward)"),
                *[(1, domain, message) for _, domain, message in BLOCKS[2:]],
            ],
            marks=pytest.mark.slow,
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
    with annotate(model, spec):
        with nvtx_capture() as events:
            for _ in nvtx_regions.steps(range(3), domain="eager_tests_steps"):  # the one step clock
                _step(model)
    events = [e for e in events if e.domain != "eager_tests_steps"]
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


def test_a_module_and_its_last_submodule_share_an_output_and_nest_both_ways(nvtx_capture):
    """The outer call's backward range opens first, as its forward range did."""
    linear = lambda: torch.nn.Linear(4, 4)  # noqa: E731
    model = torch.nn.Sequential(torch.nn.Sequential(linear(), torch.nn.Sequential(linear(), linear())))
    with annotate(model, "each module <**>"):
        with nvtx_capture() as events:
            model(torch.randn(2, 4, requires_grad=True)).sum().backward()
    check_balanced(events)
    assert [(depth, message) for depth, _, message in _ranges(events)] == [
        (0, "0"),
        (1, "0.0"),
        (1, "0.1"),
        (2, "0.1.0"),
        (2, "0.1.1"),
        (0, "0 (backward)"),
        (1, "0.1 (backward)"),
        (2, "0.1.1 (backward)"),
        (2, "0.1.0 (backward)"),
        (1, "0.0 (backward)"),
    ]


@pytest.mark.parametrize(
    "middle",
    [torch.nn.Identity(), torch.nn.ReLU(inplace=True)],
    ids=["returns-its-input", "in-place-on-its-input"],
)
def test_a_call_that_returns_or_changes_its_input_gets_its_own_backward_range(nvtx_capture, middle):
    """A call whose output is its input (``nn.Identity``), or its input changed in place, has a
    backward range of its own between its neighbours' (not one left open around the calls before
    it): the nodes that computed its inputs were noted before it ran."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), middle, torch.nn.Linear(4, 4))
    with annotate(model, "each module <*>"):
        with nvtx_capture() as events:
            model(torch.randn(2, 4, requires_grad=True)).sum().backward()
    check_balanced(events)
    assert [(depth, message) for depth, _, message in _ranges(events)] == [
        (0, "0"),
        (0, "1"),
        (0, "2"),
        (0, "2 (backward)"),
        (0, "1 (backward)"),
        (0, "0 (backward)"),
    ]


def test_a_graph_recorded_before_remove_gets_no_backward_range(nvtx_capture):
    def backward_of_a_graph_recorded_before(remove: bool) -> list[str | None]:
        """The messages of our ranges a graph recorded under the annotation gets in its backward,
        run after `remove()` or (the control) before it."""
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
        handle = annotate(model, "each module <*>")
        loss = model(torch.randn(2, 4, requires_grad=True)).sum()
        if remove:
            handle.remove()
        with nvtx_capture() as events:
            loss.backward()
        handle.remove()
        return [e.message for e in events if e.domain == "nvtx_regions" and e.kind in ("push", "start")]

    # The positive control: the same graph, backward run with the annotation still on, gets its
    # ranges, and the capture sees them; so an empty capture below is remove()'s doing.
    assert backward_of_a_graph_recorded_before(remove=False) == ["1 (backward)", "0 (backward)"]
    assert backward_of_a_graph_recorded_before(remove=True) == []


def test_nothing_keeps_an_annotation_alive_after_its_steps_or_remove():
    """A training loop without `nvtx_regions.steps` reaches no step boundary: what a backward
    registers for recovery is dropped when the backward succeeds, and by `remove()`."""
    import gc
    import weakref

    from nvtx_regions.runtime import ranges

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    for _ in range(2):
        handle = annotate(model, "each module <*>")
        for _ in range(3):
            model(torch.randn(2, 4, requires_grad=True)).sum().backward()
        assert ranges._left_open.__dict__.get("closers", {}) == {}
    gone = weakref.ref(handle)
    handle.remove()
    del handle
    gc.collect()
    assert gone() is None


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
    with annotate(model, "each module <transformer.h.*>"):
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


def test_compiling_twice_replaces_the_hooks_and_the_handle_removes_them(nvtx_capture):
    """A notebook cell run again: the second compile replaces the first's hooks (no range nested in a
    copy of itself); `explain` takes the model compile returned; `remove()` leaves no range of ours."""
    model = plain_gpt(1)
    before = _hook_state(model)
    first = nvtx_regions.compile(model, "each module <transformer.h.0>", backend="eager")
    again = nvtx_regions.compile(model, "each module <transformer.h.0>", backend="eager")
    assert first is again is model
    with nvtx_capture() as events:
        _step(model)
    check_balanced(events)
    assert _ranges(events) == [(0, "nvtx_regions", "transformer.h.0"), (0, "nvtx_regions", "transformer.h.0 (backward)")]
    assert "transformer.h.0" in str(nvtx_regions.explain(model))
    copied = copy.deepcopy(model)  # an EMA copy, say: no range until it is compiled itself
    with nvtx_capture() as events:
        _step(copied)
    assert [e for e in events if e.domain == "nvtx_regions"] == []
    nvtx_regions.compile(copied, "each module <transformer.h.0>", backend="eager")
    with nvtx_capture() as events:
        _step(copied)
        _step(model)
    assert _ranges(events) == 2 * [(0, "nvtx_regions", "transformer.h.0"), (0, "nvtx_regions", "transformer.h.0 (backward)")]
    model.nvtx_regions_backend.remove()
    assert _hook_state(model) == before and not hasattr(model, "nvtx_regions_backend")
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


def test_a_finished_thread_leaves_no_stack_behind():
    """A thread per request (a server) must not grow what the hooks keep: a thread's stack goes
    with the thread."""
    import gc

    from nvtx_regions.runtime.hook_ranges import ThreadStack

    def stacks() -> int:
        gc.collect()
        return sum(type(o) is ThreadStack for o in gc.get_objects())

    model = Shared()
    with annotate(model, "each module <inner>"):
        model(torch.randn(2, 4)).sum().backward()  # this thread's stack
        before = stacks()
        for _ in range(5):
            thread = threading.Thread(target=lambda: model(torch.randn(2, 4, requires_grad=True)).sum().backward())
            thread.start()
            thread.join()
        assert stacks() == before
        model(torch.randn(2, 4)).sum().backward()  # the root's forward marks the other stacks stale


class FailInBackward(torch.nn.Module):
    """The identity; its backward raises while `fail` is set."""

    fail = True

    def forward(self, x):
        return Fail.apply(x) if self.fail else x


def test_what_a_failed_backward_left_on_its_own_thread_is_popped_there(nvtx_capture):
    """On CUDA autograd runs backward on a thread of its own, the same one every step; here one
    worker thread runs every backward. What a failed backward left open there is popped there
    (NVTX pops act on the calling thread), before the next backward's first range."""
    from concurrent.futures import ThreadPoolExecutor

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), FailInBackward(), torch.nn.Linear(4, 4))
    with ThreadPoolExecutor(max_workers=1) as device_thread, nvtx_capture() as events:
        with annotate(model, "each module <*>"):
            for step in range(3):
                model[1].fail = step == 0
                loss = model(torch.randn(2, 4, requires_grad=True)).sum()
                if step == 0:
                    with pytest.raises(RuntimeError, match="boom in backward"):
                        device_thread.submit(loss.backward).result()
                else:
                    device_thread.submit(loss.backward).result()
    ours = [e for e in events if e.domain == "nvtx_regions"]
    check_balanced(ours)
    main = threading.get_native_id()
    worker = [(e.kind, e.message) for e in ours if e.tid != main and e.kind in ("push", "pop")]
    # The failed backward left "1 (backward)" open on the worker; the next backward pops it first.
    assert worker[:5] == [("push", "2 (backward)"), ("pop", None), ("push", "1 (backward)"), ("pop", None), ("push", "2 (backward)")]
    trees = range_tree(ours)
    (worker_tree,) = [roots for tid, roots in trees.items() if tid != main]
    assert [(depth, message) for depth, _, message in flatten(worker_tree)] == [
        (0, "2 (backward)"),
        (0, "1 (backward)"),
        *[(0, "2 (backward)"), (0, "1 (backward)"), (0, "0 (backward)")] * 2,
    ]


_EAGER = "eager PyTorch runs module calls, not a trace of ops"
_OP_RULE = (
    f"a rule that gives one range per selected op; {_EAGER}: write 'each module <...>' or 'each class <...>' "
    "for one range per module call"
)
_BOTH = "thunder and Inductor can run it"

# Rules eager cannot express: (text, why, which backends can), as `selection.support` says.
UNSUPPORTED = [
    ("op in <linear>", f"'op in <linear>' selects ops by name; {_EAGER}", _BOTH),
    ("attn: between t1..t2", f"'between t1..t2' is a region between two ops; {_EAGER}", "thunder can run it"),
    (
        "between first(module <transformer.h.0>)..last(module <transformer.h.0>)",
        f"'between first(module <transformer.h.0>)..last(module <transformer.h.0>)' is a region between two ops; {_EAGER}",
        _BOTH,
    ),
    ("reads <t_*>", f"'reads <t_*>' selects ops by the values they read; {_EAGER}", "thunder can run it"),
    ("source <model.py:3>", f"'source <model.py:3>' selects ops by the source line that recorded them; {_EAGER}", "thunder can run it"),
    (
        "backward of (op in <linear>)",
        f"'backward of (op in <linear>)' maps backward ops to the forward ops they are traced to; {_EAGER}",
        "thunder can run it",
    ),
    ("all", f"'all' selects every op; {_EAGER}", _BOTH),
    ("marker <attn>", f"'marker <attn>' selects ops inside the model's own markers; {_EAGER}", "thunder and Inductor can run it"),
    ("not op in <mul>", f"'not op in <mul>' combines op filters; {_EAGER}", _BOTH),
    ("module <transformer.h.0>", _OP_RULE, _BOTH),
    ("class <Block>", _OP_RULE, _BOTH),
    ("forward and steps 0..2", _OP_RULE, _BOTH),
]


@pytest.mark.parametrize("text, why, who", UNSUPPORTED, ids=[t for t, _, _ in UNSUPPORTED])
def test_rules_eager_cannot_express_are_left_out_with_one_warning(nvtx_capture, text, why, who):
    model = plain_gpt(1)
    before = _hook_state(model)
    problem = f"rule {text!r} (<select>:2): not supported under eager PyTorch: {why}; {who}"
    with pytest.raises(SelectorError) as error:
        annotate(model, f"each module <transformer.h.0>\n{text}", strict=True)
    assert str(error.value) == problem
    assert _hook_state(model) == before
    # Without strict=True: one warning, pointing at the caller, and the rest of the spec runs.
    with pytest.warns(NvtxRegionsWarning) as record:
        handle = annotate(model, f"each module <transformer.h.0>\n{text}")
    assert [str(w.message) for w in record] == [
        "1 rule of the spec is left out under eager PyTorch, and the rest runs (strict=True makes this a "
        f"SelectorError):\n  {problem}"
    ]
    assert record[0].filename == __file__
    with handle, nvtx_capture() as events:
        _step(model)
    assert [m for _, _, m in _ranges(events)] == ["transformer.h.0", "transformer.h.0 (backward)"]
    assert "not supported under eager PyTorch" in str(handle.explain())


def test_one_warning_names_every_rule_left_out(tmp_path):
    spec = tmp_path / "eager.nvtx"
    spec.write_text("each module <transformer.h.*>\n\nlinears: op in <linear>\nattn: between t1..t2\n")
    with pytest.warns(NvtxRegionsWarning) as record:
        annotate(plain_gpt(1), spec=spec).remove()
    (warning,) = record
    lines = str(warning.message).splitlines()
    assert lines[0].startswith("2 rules of the spec are left out under eager PyTorch, and the rest runs")
    assert lines[1].startswith(f"  rule 'linears: op in <linear>' ({spec}:3): not supported under eager PyTorch: ")
    assert lines[2].startswith(f"  rule 'attn: between t1..t2' ({spec}:4): not supported under eager PyTorch: ")


SPEC_ERRORS = [
    "each module <a> or each class <B>",
    "each module <a> and not rank in <0>",
    "each module <a> and each class <B>",
    "each module <*> and op in <linear>",
]


@pytest.mark.parametrize("text", SPEC_ERRORS)
def test_spec_errors_are_the_same_error_as_on_every_backend(text):
    from nvtx_regions import parse
    from nvtx_regions.selection.compile import compile_spec

    with pytest.raises(SelectorError) as expected:
        compile_spec(parse(text))
    model = plain_gpt(1)
    before = _hook_state(model)
    with pytest.raises(SelectorError) as error:
        annotate(model, text)
    assert str(error.value) == str(expected.value)
    assert _hook_state(model) == before


def test_argument_errors():
    with pytest.raises(SelectorSyntaxError):
        annotate(plain_gpt(1), "each module <a")
    with pytest.raises(TypeError, match="annotate\\(\\) takes a torch.nn.Module, not function"):
        annotate(plain_gpt, "each module <a>")
    with pytest.raises(TypeError, match="select= takes spec text"):
        annotate(plain_gpt(1), ["each module <a>"])


@pytest.mark.filterwarnings("ignore:Using a non-full backward hook:FutureWarning")
def test_backward_ranges_next_to_in_place_outputs_and_old_style_backward_hooks(nvtx_capture):
    """Backward ranges come from hooks on tensors and autograd nodes, not full backward hooks: torch
    refuses those next to an in-place op on the output or a `register_backward_hook`."""
    model = Shared()
    model.inner.register_forward_hook(lambda m, args, out: out.relu_())  # torch refuses full backward hooks here
    user_hook = []
    model.inner.register_backward_hook(lambda *a: user_hook.append(1))  # and next to this one
    before = _hook_state(model)
    with annotate(model, "each module <inner>"):
        with nvtx_capture() as events:
            model(torch.randn(2, 4, requires_grad=True)).sum().backward()
    check_balanced(events)
    assert [m for _, _, m in _ranges(events)] == ["inner", "inner", "inner (backward)", "inner (backward)"]
    assert user_hook == [1, 1]
    assert _hook_state(model) == before


UNSELECTED = [
    (
        "each module <transformer.h.9>",
        "rule 'each module <transformer.h.9>' (<select>:1) selected nothing in the module calls of this GPT; module "
        "'transformer.h.9' matches nothing in the model's module calls (nearest: transformer.h.0, transformer.h, transformer)",
    ),
    (
        "each class <Blok>",
        "rule 'each class <Blok>' (<select>:1) selected nothing in the module calls of this GPT; class 'Blok' "
        "matches nothing in the model's module calls (nearest: Block)",
    ),
    (
        "each class <Linear> and module <transformer.wte>",
        "rule 'each class <Linear> and module <transformer.wte>' (<select>:1) selected nothing in the module calls of this GPT; its "
        "'module <...>' / 'class <...>' scope excludes every module it matches",
    ),
    (
        "each module <lm_head> and forward and backward",
        "rule 'each module <lm_head> and forward and backward' (<select>:1) selected nothing in the module calls of "
        "this GPT; 'forward and backward' is never true",
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



def test_two_rules_on_one_module_give_two_nested_ranges_each_way(nvtx_capture):
    # Module 0 gets two ranges (the hooks' loop), module 1 one (their one-range path).
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    with annotate(model, "each module <0, 1>\nagain: each class <Linear> and module <0>"):
        with nvtx_capture() as events:
            for _ in range(2):
                model(torch.randn(2, 4, requires_grad=True)).sum().backward()
    check_balanced(events)
    step = [(0, "0"), (1, "0"), (0, "1"), (0, "1 (backward)"), (0, "0 (backward)"), (1, "0 (backward)")]
    assert [(depth, message) for depth, _, message in _ranges(events)] == step * 2
    pushes = [e for e in events if e.kind == "push"]
    assert pushes[0].category != pushes[1].category  # each rule's own NVTX category
