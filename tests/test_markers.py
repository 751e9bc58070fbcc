"""The user's own NVTX markers (issue 15): recorded while thunder traces, and
re-emitted by ``each marker <...>``.

Recording: the reference is eager PyTorch under the NVTX capture tool: a
`TorchFunctionMode` drops an NVTX mark at every torch call, naming the line
that made it, and the real push/pop/mark events say which markers were open
there. Each op of thunder's forward trace must carry the markers open around
the same line in the same order of calls.

Re-emission: the NVTX calls a thunder run really makes (captured) must equal
eager's, call for call, in the forward.
"""

from __future__ import annotations

import sys
import threading
import warnings

import nvtx
import pytest
import torch
from torch.overrides import TorchFunctionMode

import thunder
from support.models import make_gpt, gpt_inputs
import nvtx_regions
from nvtx_regions import NvtxRegionsWarning
from nvtx_regions.attribution.recording import install_module_recorder
from nvtx_regions.attribution.traceview import TraceView
from nvtx_regions.core.markers import RECORD_FUNCTION, common_markers

pytestmark = pytest.mark.thunder  # the whole file needs lightning-thunder


@pytest.fixture(autouse=True)
def _recorded():
    """thunder's patches, for the tests here that jit without a transform: made again where another
    test's last handle's remove() put them back (`internals.installs`)."""
    install_module_recorder()

RANGE_KINDS = {"push", "pop", "start", "end", "mark"}


# -- the reference: eager, with real NVTX events ------------------------------------


class _MarkEveryCall(TorchFunctionMode):
    """An NVTX mark at every torch call, naming ``file:line`` of its three innermost
    callers (outside torch's dispatch to this mode), ``|``-separated: thunder
    records a call of ``F.dropout`` at the line that calls it, where eager
    reaches the mode from inside ``F.dropout``."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        import sys

        frame, callers = sys._getframe(1), []
        while frame is not None and len(callers) < 3:
            if not frame.f_code.co_filename.endswith("torch/overrides.py"):
                callers.append(f"{frame.f_code.co_filename}:{frame.f_lineno}")
            frame = frame.f_back
        torch.cuda.nvtx.mark("|".join(callers))
        return func(*args, **(kwargs or {}))


def eager_reference(fn, *args, nvtx_capture):
    """[(callers, ((domain, message), ...))] per torch call of `fn(*args)` in eager, in call order."""
    with nvtx_capture() as events:
        with _MarkEveryCall():
            fn(*args)
    me = threading.get_native_id()
    open_: list[tuple[str | None, str | None]] = []  # across domains, in push order
    calls = []
    for event in events:
        if event.tid != me:
            continue
        if event.kind == "push":
            open_.append((event.domain, event.message))
        elif event.kind == "pop":
            innermost = max(i for i, (domain, _) in enumerate(open_) if domain == event.domain)
            del open_[innermost]
        elif event.kind == "mark":
            calls.append((event.message.split("|"), tuple(open_)))
    return calls


def thunder_records(view: TraceView):
    """[(file:line, ((domain, message), ...))] per recorded torch call of a forward trace, in record order
    (calls recorded before the first marker have no number: trace order), less thunder's own lines."""
    import os

    own = os.path.dirname(thunder.__file__)
    seen = {}
    for index, (op, stack) in enumerate(zip(view.ops, view.marker_stacks)):
        filename = op.bsym.source_filename
        if op.is_fusion or filename is None or op.bsym.source_positions is None or filename.startswith(own):
            continue
        key = (getattr(filename, "seq", -1), f"{filename}:{op.bsym.source_positions.lineno}")
        seen.setdefault(key, (index, tuple((m.domain, m.message) for m in stack)))
    return [(where, stack) for (_, where), (_, stack) in sorted(seen.items(), key=lambda kv: (kv[0][0], kv[1][0]))]


def assert_matches_eager(records, reference):
    """Every thunder record appears, in order, among eager's calls from the same line with the same open markers."""
    position = 0
    for where, stack in records:
        while position < len(reference) and not (where in reference[position][0] and stack == reference[position][1]):
            position += 1
        assert position < len(reference), f"no eager call at {where} inside {stack} after call {position}"
        position += 1


def forward_view(jitted) -> TraceView:
    return TraceView.from_trace(thunder.last_traces(jitted)[-1])


def backward_view(jitted) -> TraceView:
    view = TraceView.from_trace(thunder.last_backward_traces(jitted)[-1])
    view.forward = forward_view(jitted)
    return view


# -- models -----------------------------------------------------------------------


class ToyBlock(torch.nn.Module):
    """Every marker form around parts of a block."""

    def __init__(self, i: int):
        super().__init__()
        self.i = i
        self.attn = torch.nn.Linear(8, 8)
        self.mlp = torch.nn.Linear(8, 8)
        self.out = torch.nn.Linear(8, 8)

    def forward(self, x):
        torch.cuda.nvtx.range_push(f"layer{self.i}")
        with torch.cuda.nvtx.range("attn{}", self.i):
            x = self.attn(x).relu()
        with nvtx.annotate("mlp", color="red", domain="mine"):
            nvtx.push_range("inner", domain="other")
            x = self.mlp(x).tanh()
            nvtx.pop_range(domain="other")
        x = self.project(x)
        torch.cuda.nvtx.range_pop()
        return x

    @nvtx.annotate(domain="mine")
    def project(self, x):
        return self.out(x) * 2


def make_toy():
    torch.manual_seed(0)
    return torch.nn.Sequential(ToyBlock(0), ToyBlock(1))


def toy_input():
    torch.manual_seed(1)
    return torch.randn(3, 8, requires_grad=True)


def make_marked_gpt(n_layer: int = 2):
    """nanoGPT with markers around attention and MLP of every block."""
    model = make_gpt(n_layer)
    for i, block in enumerate(model.transformer.h):
        block.forward = _marked_block_forward.__get__(block)
        block.index = i
    return model


def _marked_block_forward(self, x):
    with torch.cuda.nvtx.range(f"attention{self.index}"):
        x = x + self.attn(self.ln_1(x))
    with nvtx.annotate("mlp", domain="gpt", color="green"):
        x = x + self.mlp(self.ln_2(x))
    return x


# -- recording ----------------------------------------------------------------------


def test_toy_stacks_match_eager(nvtx_capture):
    model, x = make_toy(), toy_input()
    reference = eager_reference(model, x, nvtx_capture=nvtx_capture)
    jitted = thunder.jit(model)
    with nvtx_capture() as tracing:
        jitted(x)
    records = thunder_records(forward_view(jitted))
    assert_matches_eager(records, reference)
    # Not vacuous: every (domain, message) eager had open around some call is recorded around some op.
    assert {m for _, stack in reference for m in stack} == {m for _, stack in records for m in stack}
    assert [e for e in tracing if e.kind in RANGE_KINDS] == []  # nothing pushed while tracing
    with nvtx_capture() as later:
        jitted(x)
    assert [e for e in later if e.kind in RANGE_KINDS] == []


def test_toy_marker_details():
    model, x = make_toy(), toy_input()
    jitted = thunder.jit(model)
    jitted(x)
    view = forward_view(jitted)
    markers = {m.occurrence: m for stack in view.marker_stacks for m in stack}
    by_message = {}
    for m in markers.values():
        by_message.setdefault(m.message, []).append(m)
    assert sorted(by_message) == ["attn0", "attn1", "inner", "layer0", "layer1", "mlp", "project"]
    # Two occurrences of the same marker (one per block) stay apart.
    assert len(by_message["mlp"]) == 2 and len(by_message["project"]) == 2
    (mlp, _) = by_message["mlp"]
    assert (mlp.domain, mlp.color, mlp.form) == ("mine", 0xFF0000, "nvtx")
    assert by_message["inner"][0].domain == "other" and by_message["inner"][0].color == 0xFF  # nvtx's default blue
    layer0 = by_message["layer0"][0]
    assert (layer0.domain, layer0.color, layer0.form) == (None, None, "torch.cuda.nvtx")
    # Warnings and rules name the user's line, not torch's or nvtx's.
    assert layer0.where == (__file__, ToyBlock.forward.__code__.co_firstlineno + 1)
    assert by_message["mlp"][0].where[1] == ToyBlock.forward.__code__.co_firstlineno + 4
    assert view.marker_log is not None and view.marker_log.open == () and view.marker_log.unmatched == []


def test_backward_follows_forward_origins():
    model, x = make_toy(), toy_input()
    jitted = thunder.jit(model)
    jitted(x).sum().backward()
    backward = backward_view(jitted)
    forward = backward.forward
    assert forward.marker_log is backward.marker_log is not None
    messages = [tuple(m.message for m in stack) for stack in backward.marker_stacks]
    assert ("layer0", "mlp", "inner") in messages and ("layer1", "mlp", "inner") in messages
    assert ("layer1", "attn1") in messages
    # The backward of layer 1 comes before layer 0's.
    first = {m: messages.index(next(s for s in messages if s and s[0] == m)) for m in ("layer0", "layer1")}
    assert first["layer1"] < first["layer0"]
    # Each backward op has the markers open around all its forward origins.
    for origins, stack in zip(backward.origins, backward.marker_stacks):
        if origins is None:
            assert stack == ()
            continue
        around = [set(forward.marker_stacks[p]) for p in range(len(forward.ops)) if origins >> p & 1]
        assert set(stack) == set.intersection(*around)


def test_record_function_no_longer_fails(nvtx_capture):
    class WithRecordFunction(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 4)

        def forward(self, x):
            with torch.profiler.record_function("scoped"):
                y = self.a(x)
            return y.relu()

    model, x = WithRecordFunction(), torch.randn(2, 4)
    jitted = thunder.jit(model)
    torch.testing.assert_close(jitted(x), model(x))
    view = forward_view(jitted)
    names = [(op.name, tuple((m.form, m.message, m.domain) for m in stack)) for op, stack in zip(view.ops, view.marker_stacks)]
    assert names[0] == ("linear", ((RECORD_FUNCTION, "scoped", None),))
    assert len(names) > 1 and all(stack == () for _, stack in names[1:])  # relu, after the block


def test_nanogpt_stacks_match_eager(nvtx_capture):
    model = make_marked_gpt()
    idx, targets = gpt_inputs()
    reference = eager_reference(model, idx, targets, nvtx_capture=nvtx_capture)
    jitted = thunder.jit(model)
    with nvtx_capture() as tracing:
        loss = jitted(idx, targets)[1]
    loss.backward()
    records = thunder_records(forward_view(jitted))
    assert_matches_eager(records, reference)
    opened = {m for _, stack in records for m in stack}
    assert opened == {(None, "attention0"), (None, "attention1"), ("gpt", "mlp")}
    assert [e for e in tracing if e.kind in RANGE_KINDS] == []
    backward = backward_view(jitted)
    assert {m.message for stack in backward.marker_stacks for m in stack} == {"attention0", "attention1", "mlp"}



def make_marked_llama(n_layer: int = 2):
    """litgpt's llama2-like model, attention wrapped by the `nvtx.annotate` decorator and
    the MLP by `torch.cuda.nvtx.range` used as a decorator, per block."""
    from thunder.tests.litgpt_model import GPT, Config

    torch.manual_seed(0)
    config = Config.from_name(
        "llama2-like", n_layer=n_layer, block_size=32, n_embd=32, n_head=4, intermediate_size=64,
        vocab_size=64, padded_vocab_size=64,
    )  # fmt: skip
    model = GPT(config)
    for i, block in enumerate(model.transformer.h):
        block.attn.forward = nvtx.annotate(f"attn{i}", domain="llama", color="blue")(block.attn.forward)
        block.mlp.forward = torch.cuda.nvtx.range(f"mlp{i}")(block.mlp.forward)
    return model


@pytest.mark.slow
def test_llama_stacks_match_eager(nvtx_capture):
    model = make_marked_llama()
    torch.manual_seed(1)
    idx = torch.randint(0, 64, (2, 16))
    reference = eager_reference(model, idx, nvtx_capture=nvtx_capture)
    jitted = thunder.jit(model)
    with nvtx_capture() as tracing:
        jitted(idx).sum().backward()
    records = thunder_records(forward_view(jitted))
    assert_matches_eager(records, reference)
    opened = {m for _, stack in records for m in stack}
    assert opened == {("llama", "attn0"), ("llama", "attn1"), (None, "mlp0"), (None, "mlp1")}
    assert [e for e in tracing if e.kind in RANGE_KINDS] == []
    backward = backward_view(jitted)
    assert {m.message for stack in backward.marker_stacks for m in stack} == {"attn0", "attn1", "mlp0", "mlp1"}


# -- pitfalls -----------------------------------------------------------------------


class Opener(torch.nn.Module):
    def forward(self, x):
        torch.cuda.nvtx.range_push("span")
        return x * 2


class Closer(torch.nn.Module):
    def forward(self, x):
        x = x + 1
        torch.cuda.nvtx.range_pop()
        return x - 3


def test_push_in_one_module_pop_in_another(nvtx_capture):
    model, x = torch.nn.Sequential(Opener(), torch.nn.Tanh(), Closer()), torch.randn(3)
    reference = eager_reference(model, x, nvtx_capture=nvtx_capture)
    jitted = thunder.jit(model)
    jitted(x)
    view = forward_view(jitted)
    assert_matches_eager(thunder_records(view), reference)
    assert [(op.name, [m.message for m in stack]) for op, stack in zip(view.ops, view.marker_stacks)] == [
        ("mul", ["span"]), ("tanh", ["span"]), ("add", ["span"]), ("sub", []),
    ]  # fmt: skip


def test_pop_with_nothing_open_warns_at_the_users_line():
    def closes_the_callers(x):
        y = x * 2
        torch.cuda.nvtx.range_pop()
        return y + 1

    jitted = thunder.jit(closes_the_callers)
    with pytest.warns(NvtxRegionsWarning, match="did not open") as caught:
        jitted(torch.randn(3))
    (warning,) = [w for w in caught if issubclass(w.category, NvtxRegionsWarning)]
    assert (warning.filename, warning.lineno) == (__file__, closes_the_callers.__code__.co_firstlineno + 2)
    view = forward_view(jitted)
    (pop,) = view.marker_log.unmatched
    assert pop.stack_key == ("nvtx", None) and pop.where == (warning.filename, warning.lineno)
    assert pop.after == 1  # after the mul was recorded
    assert view.marker_stacks == [(), ()]


def test_marker_left_open_at_the_end():
    def leaves_open(x):
        y = x * 2
        nvtx.push_range("tail", domain="mine")
        return y + 1

    jitted = thunder.jit(leaves_open)
    jitted(torch.randn(3))
    view = forward_view(jitted)
    (tail,) = view.marker_log.open
    assert (tail.domain, tail.message) == ("mine", "tail")
    assert [[m.message for m in stack] for stack in view.marker_stacks] == [[], ["tail"]]


def test_marker_around_no_op():
    def empty_marker(x):
        y = x * 2
        with torch.cuda.nvtx.range("nothing"):
            z = y
        return z + 1

    jitted = thunder.jit(empty_marker)
    jitted(torch.randn(3))
    view = forward_view(jitted)
    (nothing,) = view.marker_log.pushed
    assert nothing.message == "nothing"
    assert all(stack == () for stack in view.marker_stacks)
    assert view.marker_log.open == ()


def test_markers_in_a_loop_over_layers(nvtx_capture):
    class Layers(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))

        def forward(self, x):
            for i, layer in enumerate(self.layers):
                torch.cuda.nvtx.range_push(f"layer{i}")
                x = layer(x)
                torch.cuda.nvtx.range_pop()
            return x

    model, x = Layers(), torch.randn(2, 4)
    reference = eager_reference(model, x, nvtx_capture=nvtx_capture)
    jitted = thunder.jit(model)
    jitted(x)
    view = forward_view(jitted)
    assert_matches_eager(thunder_records(view), reference)
    assert [[m.message for m in stack] for stack in view.marker_stacks] == [["layer0"], ["layer1"], ["layer2"]]
    assert len({stack[0].where for stack in view.marker_stacks}) == 1  # one line, three occurrences
    assert len({stack[0].occurrence for stack in view.marker_stacks}) == 3


def test_symbolic_message_warns_and_is_not_frozen():
    def scaled(x, i):
        torch.cuda.nvtx.range_push(f"step{i}")
        y = x * i
        torch.cuda.nvtx.range_pop()
        return y

    jitted = thunder.jit(scaled, cache="symbolic values")
    with pytest.warns(NvtxRegionsWarning, match="symbolic values") as caught:
        jitted(torch.ones(2), 3)
    (warning,) = [w for w in caught if issubclass(w.category, NvtxRegionsWarning)]
    assert (warning.filename, warning.lineno) == (__file__, scaled.__code__.co_firstlineno + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NvtxRegionsWarning)
        torch.testing.assert_close(jitted(torch.ones(2), 4), torch.full((2,), 4.0))
    assert thunder.cache_misses(jitted) == 1
    (stack,) = forward_view(jitted).marker_stacks
    (marker,) = stack
    assert "3" not in marker.message and marker.message.startswith("step<") and marker.symbolic


def test_common_markers_of_a_fusion():
    from nvtx_regions.core.markers import Marker

    outer, left, right = (Marker(None, name, None, "nvtx", n) for n, name in enumerate(("o", "l", "r")))
    assert common_markers([(outer, left), (outer, right)]) == (outer,)
    assert common_markers([(outer, left), None, (outer, left)]) == (outer, left)
    assert common_markers([None]) is None


# -- ThunderFX ----------------------------------------------------------------------


class FxForms(torch.nn.Module):
    def __init__(self, form: str):
        super().__init__()
        self.form = form
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)

    def forward(self, x):
        x = self.a(x)
        if self.form == "range_push":
            torch.cuda.nvtx.range_push("m")  # marker:range_push
            x = self.b(x).relu()
            torch.cuda.nvtx.range_pop()
        elif self.form == "range":
            with torch.cuda.nvtx.range("m"):  # marker:range
                x = self.b(x).relu()
        elif self.form == "annotate":
            with nvtx.annotate("m", domain="fx"):  # marker:annotate
                x = self.b(x).relu()
        elif self.form == "decorator":
            x = self.decorated(x)  # marker:decorator
        elif self.form == "push_range":
            nvtx.push_range("m", domain="fx")  # marker:push_range
            x = self.b(x).relu()
            nvtx.pop_range(domain="fx")
        elif self.form == "record_function":
            with torch.profiler.record_function("m"):  # marker:record_function
                x = self.b(x).relu()
        return x * 2

    @nvtx.annotate("m", domain="fx")
    def decorated(self, x):
        return self.b(x).relu()


def _tagged_line(form: str) -> int:
    import inspect

    lines, first = inspect.getsourcelines(FxForms.forward)
    return first + next(i for i, line in enumerate(lines) if line.rstrip().endswith(f"# marker:{form}"))


# form -> (thunder subgraphs, does the marker still run at run time): what torch 2.11's dynamo does.
THUNDERFX = {
    "range_push": (3, True),  # graph breaks at push and pop; the marker runs eagerly between subgraphs
    "range": (1, True),  # the `with` block and what follows run without thunder
    "annotate": (1, True),
    "decorator": (3, True),
    "push_range": (3, True),
    "record_function": (1, False),  # dynamo drops it (torch logs "will be ignored"); no break
}


@pytest.mark.parametrize("form", list(THUNDERFX))
def test_thunderfx_forms(form, nvtx_capture):
    from thunder.dynamo import thunderfx

    torch._dynamo.reset()
    model, x = FxForms(form), torch.randn(2, 8)
    compiled = thunderfx(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.testing.assert_close(compiled(x), model(x))
    ours = [w for w in caught if issubclass(w.category, NvtxRegionsWarning)]
    subgraphs, runs = THUNDERFX[form]
    if form == "record_function":
        assert ours == []
    else:
        (warning,) = ours  # once, however many breaks the marker causes
        assert (warning.filename, warning.lineno) == (__file__, _tagged_line(form))
        assert "under ThunderFX" in str(warning.message) and "marker:" + form in str(warning.message)
    assert len(compiled._backend.subgraph_infos) == subgraphs
    with nvtx_capture() as events:
        compiled(x)
    pushes = [(e.domain, e.message) for e in events if e.kind == "push"]
    domain = None if form in ("range_push", "range") else "fx"
    assert pushes == ([(domain, "m")] if runs else [])


# -- re-emission: `each marker <...>` and `marker <...>` ----------------------------

from nvtx_regions import NvtxProfileTransform, explain  # noqa: E402
from nvtx_regions.testing import check_balanced  # noqa: E402


def _nvtx_calls(events):
    """(kind, domain, message, depth) of every push and pop on this thread."""
    me = threading.get_native_id()
    return [(e.kind, e.domain, e.message, e.depth) for e in events if e.kind in ("push", "pop") and e.tid == me]


def _marked_models():
    torch.manual_seed(1)
    llama_idx = torch.randint(0, 64, (2, 16))
    return {
        "toy": (make_toy, (toy_input(),)),
        "nanogpt": (make_marked_gpt, gpt_inputs()),
        "llama": (make_marked_llama, (llama_idx,)),
    }


@pytest.mark.parametrize("name", ["toy", pytest.param("nanogpt", marks=pytest.mark.slow), pytest.param("llama", marks=pytest.mark.slow)])
def test_each_marker_forward_is_eager_call_for_call(name, nvtx_capture):
    """The same (domain, message, depth) pushes and pops as eager, on the first call and the later ones."""
    expected, calls = _eager_and_jitted_calls(name, nvtx_capture)
    if name == "toy":  # markers nest there, across three domains
        assert any(depth > 0 for kind, _, _, depth in expected if kind == "push")
    assert calls == [expected] * 3


def test_markers_are_recorded_after_an_nvtx_inductor_installed_its_stand_ins(nvtx_capture):
    """NvtxInductor's marker stand-ins (`compiled_markers`) let thunder record the markers as before:
    they act only where Dynamo traces for an NvtxInductor, never in thunder's interpreter."""
    from nvtx_regions.internals import compiled_markers

    installed_before = compiled_markers.installed()
    compiled_markers.install()
    try:
        expected, calls = _eager_and_jitted_calls("toy", nvtx_capture)
    finally:
        if not installed_before:
            compiled_markers.uninstall()
    assert calls == [expected] * 3


def _eager_and_jitted_calls(name, nvtx_capture):
    """Eager's marker calls, and those of three calls of the model jitted with `each marker <*>`."""
    make, inputs = _marked_models()[name]
    model = make()
    with nvtx_capture() as eager:
        model(*inputs)
    jitted = thunder.jit(model, transforms=[NvtxProfileTransform("each marker <*> and forward")])
    calls = []
    for _ in range(3):
        with nvtx_capture() as events:
            jitted(*inputs)
        calls.append(_nvtx_calls(events))
    expected = _nvtx_calls(eager)
    assert expected
    return expected, calls


def test_each_marker_backward_in_the_users_domain(nvtx_capture):
    model, x = make_toy(), toy_input()
    jitted = thunder.jit(model, transforms=[NvtxProfileTransform("each marker <layer*, mlp>")])
    jitted(x).sum().backward()  # compile
    with nvtx_capture() as events:
        jitted(x).sum().backward()
    check_balanced(events)
    pushes = [(e.domain, e.message) for e in events if e.kind == "push"]
    assert pushes[:4] == [(None, "layer0"), ("mine", "mlp"), (None, "layer1"), ("mine", "mlp")]
    backward = pushes[4:]
    assert (None, "layer1 (backward)") in backward and ("mine", "mlp (backward)") in backward
    assert backward.index((None, "layer1 (backward)")) < backward.index((None, "layer0 (backward)"))
    # The user's colour where the user gave one (nvtx); torch.cuda.nvtx has none, and nvtx's attributes
    # then carry nvtx's default (0xFF).
    assert {e.color for e in events if e.kind == "push" and e.domain == "mine"} == {0xFF0000}


def test_marker_filter_selects_the_ops_inside(nvtx_capture):
    model, x = make_toy(), toy_input()
    jitted = thunder.jit(model, transforms=[NvtxProfileTransform("op in <linear> and marker <mlp> and forward")])
    with nvtx_capture() as events:
        jitted(x)
    pushes = [(e.domain, e.message) for e in events if e.kind == "push"]
    assert len(pushes) == 2 and all(d == "nvtx_regions" and "linear" in m and "mlp_weight" in m for d, m in pushes)


def test_each_marker_joins_module_and_gates(nvtx_capture):
    model, x = make_toy(), toy_input()
    jitted = thunder.jit(model, transforms=[NvtxProfileTransform("each marker <attn*> and module <0> and forward and steps 1..")])
    seen = []
    for _ in nvtx_regions.steps(range(2), domain="markers_tests_steps"):  # the step clock
        with nvtx_capture() as events:
            jitted(x)
        seen.append([(e.domain, e.message) for e in events if e.kind == "push"])
    assert seen == [[], [(None, "attn0")]]


def test_record_function_goes_in_the_transforms_domain(nvtx_capture):
    class WithRecordFunction(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 4)

        def forward(self, x):
            with torch.profiler.record_function("scoped"):
                y = self.a(x)
            return y.relu()

    jitted = thunder.jit(WithRecordFunction(), transforms=[NvtxProfileTransform("each marker <scoped> and forward", domain="mine")])
    with nvtx_capture() as events:
        jitted(torch.randn(2, 4))
    assert [(e.domain, e.message) for e in events if e.kind == "push"] == [("mine", "scoped")]


def test_left_open_marker_warns_and_stays_balanced(nvtx_capture):
    def leaves_open(x):
        y = x * 2
        nvtx.push_range("tail", domain="mine")
        return y + 1

    jitted = thunder.jit(leaves_open, transforms=[NvtxProfileTransform("each marker <tail>")])
    with pytest.warns(NvtxRegionsWarning, match="still open") as caught:
        jitted(torch.randn(3))
    (warning,) = [w for w in caught if "still open" in str(w.message)]
    assert (warning.filename, warning.lineno) == (__file__, leaves_open.__code__.co_firstlineno + 2)
    with nvtx_capture() as events:
        jitted(torch.randn(3))
    check_balanced(events)
    assert [(e.kind, e.domain, e.message) for e in events if e.kind in ("push", "pop")] == [
        ("push", "mine", "tail"), ("pop", "mine", None),
    ]  # fmt: skip


def test_marker_around_no_op_is_named_when_nothing_is_selected():
    def empty_marker(x):
        with torch.cuda.nvtx.range("nothing"):
            z = x
        return z + 1

    jitted = thunder.jit(empty_marker, transforms=[NvtxProfileTransform("each marker <nothing>")])
    with pytest.warns(NvtxRegionsWarning, match="recorded no op"):
        jitted(torch.randn(3))


def test_explain_and_range_tree_show_marker_ranges():
    model, x = make_toy(), toy_input()
    jitted = thunder.jit(model)
    jitted(x).sum().backward()
    explanation = explain(jitted, "each marker <layer*, mlp> and forward")
    text = str(explanation)
    assert "one range per marker occurrence" in text
    assert f"torch.cuda.nvtx marker pushed at {__file__}:{ToyBlock.forward.__code__.co_firstlineno + 1}" in text
    assert "nvtx marker pushed at" in text and "domain 'mine'" in text
    tree = explanation.range_tree() if hasattr(explanation, "range_tree") else None
    from nvtx_regions.report.rangeart import draw_ranges

    drawn = draw_ranges(explanation)
    assert "layer0" in drawn and "mlp" in drawn
    del tree


def test_explain_names_fusions_that_cross_a_marker():
    """thunder's torch.compile executor fuses this whole function (it fused every op tried on the
    CPU), so the fusion crosses the marker: the marker has no op of its own, and explain() says why."""

    def crossing(x, w):
        y = x.sin()
        with torch.cuda.nvtx.range("inside"):
            y = (y.cos() * 2) @ w
        return y + 1

    jitted = thunder.jit(crossing, executors=["torchcompile"])
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    torch.testing.assert_close(jitted(x, w), crossing(x, w))
    view = forward_view(jitted)
    (fusion,) = [p for p, op in enumerate(view.ops) if op.is_fusion]
    from nvtx_regions.selection.markers import crossing_fusions

    (inside,) = view.marker_log.pushed
    assert crossing_fusions(view, inside) == [fusion] and view.marker_stacks[fusion] == ()
    text = str(explain(jitted, "each marker <inside>"))
    assert "whose ops are all inside fusions that also hold ops outside it" in text, text
    assert f"#{fusion} {view.ops[fusion].name}" in text


def test_eager_annotate_adds_nothing_for_marker_rules(nvtx_capture):
    from nvtx_regions.eager import annotate

    model, x = make_toy(), toy_input()
    with nvtx_capture() as plain:
        model(x)
    with annotate(model, "each marker <*> and forward") as handle:
        with nvtx_capture() as annotated:
            model(x)
    assert _nvtx_calls(annotated) == _nvtx_calls(plain) and handle.messages == []


def test_compare_lines_markers_up_row_by_row(nvtx_capture, tmp_path):
    """The same spec on both sides: `annotate()` adds nothing, the transform re-emits; `nvtx-regions compare`
    then finds every marker the same number of times in each capture."""
    import subprocess

    from nvtx_regions.capture import write_chrome_trace
    from nvtx_regions.report.compare import compare
    from nvtx_regions.eager import annotate

    spec = "each marker <*> and forward"
    model, x = make_toy(), toy_input()
    jitted = thunder.jit(make_toy(), transforms=[NvtxProfileTransform(spec)])
    jitted(x)  # compile outside the capture
    with annotate(model, spec), nvtx_capture() as eager:
        for _ in range(3):
            model(x)
    with nvtx_capture() as compiled:
        for _ in range(3):
            jitted(x)
    write_chrome_trace(eager, tmp_path / "eager.json")
    write_chrome_trace(compiled, tmp_path / "thunder.json")
    rows = compare(tmp_path / "eager.json", tmp_path / "thunder.json")
    assert {row.name for row in rows} == {"layer0", "layer1", "attn0", "attn1", "mlp", "inner", "project"}
    assert all(row.count_a == row.count_b > 0 for row in rows), rows
    cli = subprocess.run(
        [sys.executable, "-m", "nvtx_regions", "compare", str(tmp_path / "eager.json"), str(tmp_path / "thunder.json")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    table = [line.split()[:3] for line in cli.stdout.splitlines()[1:]]
    assert table == [[row.name, str(row.count_a), str(row.count_b)] for row in rows]
    assert dict((name, int(n)) for name, n, _ in table) == {
        "layer0": 3, "attn0": 3, "mlp": 6, "inner": 6, "project": 6, "layer1": 3, "attn1": 3,
    }  # fmt: skip
