"""Every way people pass ``torch.compile`` options (issue 52): the ranges of eager in every step.

A small model whose blocks push their own markers (``torch.cuda.nvtx`` and the nvtx package), one
spec, and each way of compiling it with `NvtxInductor`: `nvtx_regions.compile`,
``torch.compile(backend=NvtxInductor(...))``, ``module.compile(...)`` and a bare function that calls
the model, each with ``fullgraph=True``, ``dynamic``, each ``mode`` and ``options``. Each step, the
compile step 0 included, must give eager's names and counts, in every domain.

Nothing of ours is ever compiled by Dynamo as a frame: every hook and callback nvtx_regions installs
is made by `internals.dynamo.run_outside_dynamo`, and a fullgraph compiled call that runs them (in
Python, as a compiled model's own hooks run, and traced, as its submodules' do) hands Dynamo no
frame of our package. The old mechanism (``skip_code`` on the hook alone) is the positive control.
"""

from __future__ import annotations

import collections
import gc
import logging
import subprocess
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from support.inductor import own_inductor_cache
import nvtx_regions
from nvtx_regions import NvtxInductor, NvtxRegionsWarning
from nvtx_regions.capture import is_attached
from nvtx_regions.eager import annotate
from nvtx_regions.internals import dynamo as our_dynamo
from nvtx_regions.testing import capture, check_balanced

PACKAGE = Path(nvtx_regions.__file__).resolve().parent
SPEC = "each module <blocks.*>"
STEPS = 3

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning")


@pytest.fixture(scope="module", autouse=True)
def inductor_cache(tmp_path_factory):
    """This module's own Inductor cache, and one compile thread."""
    with own_inductor_cache(tmp_path_factory.mktemp("inductor_cache")) as directory:
        yield directory


def _needs_capture() -> None:
    if not is_attached():
        pytest.skip("the NVTX capture tool is not attached in this process")


def make_model(markers: bool = True) -> torch.nn.Module:
    """Two blocks (Linear, GELU, residual, LayerNorm) whose forwards push their own markers (unless not
    `markers`: a plain ``torch.compile`` with ``fullgraph=True`` refuses them), and a head."""
    import nvtx

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(16, 16)
            self.act = torch.nn.GELU()
            self.norm = torch.nn.LayerNorm(16)

        def forward(self, x):
            if not markers:
                return self.norm(x + self.act(self.fc(x)))
            torch.cuda.nvtx.range_push("fc")
            h = self.fc(x)
            torch.cuda.nvtx.range_pop()
            with nvtx.annotate("act", domain="user"):
                h = self.act(h)
            return self.norm(x + h)

    class Blocks(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList([Block(), Block()])
            self.head = torch.nn.Linear(16, 4)

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    torch.manual_seed(0)
    return Blocks()


def _input(batch: int = 4) -> torch.Tensor:
    return torch.randn(batch, 16)


def _names(events) -> collections.Counter:
    """Each range's domain and message, counted (push/pop and start/end ranges alike), after checking
    that every range closes."""
    check_balanced(events)
    return collections.Counter((e.domain, e.message) for e in events if e.kind in ("push", "start"))


def _run_steps(call, *, batches=(4, 4, 4)) -> list[collections.Counter]:
    """`STEPS` training steps of `call`, step 0 the compile step; each step's ranges."""
    _needs_capture()
    steps = []
    for batch in batches[:STEPS]:
        with capture() as events:
            call(_input(batch)).sum().backward()
        steps.append(_names(list(events)))
    return steps


@pytest.fixture(scope="module")
def eager_steps():
    torch.compiler.reset()
    model = make_model()
    with annotate(model, SPEC):
        steps = _run_steps(model)
    expected = collections.Counter(
        {("nvtx_regions", f"blocks.{i}{suffix}"): 1 for i in (0, 1) for suffix in ("", " (backward)")}
        | {(None, "fc"): 2, ("user", "act"): 2}
    )
    assert steps == [expected] * STEPS  # the reference itself, checked
    return steps


def _compiled(way: str, options: dict):
    """A fresh model compiled `way` with `options` (``torch.compile``'s keywords); what to call."""
    torch.compiler.reset()
    model = make_model()
    if way == "nvtx_regions.compile":
        return nvtx_regions.compile(model, SPEC, backend="inductor", inductor=options)
    backend = NvtxInductor(SPEC, model=model)
    if way == "torch.compile":
        return torch.compile(model, backend=backend, **options)
    if way == "module.compile":
        model.compile(backend=backend, **options)
        return model
    if way == "function":

        def step(x):
            return model(x)

        return torch.compile(step, backend=backend, **options)
    raise AssertionError(way)


WAYS = ["nvtx_regions.compile", "torch.compile", "module.compile", "function"]
OPTIONS = {
    "fullgraph": {"fullgraph": True},
    "dynamic": {"dynamic": True},
    "static": {"dynamic": False},
    "default": {"mode": "default"},
    "reduce-overhead": {"mode": "reduce-overhead"},
    "max-autotune-no-cudagraphs": {"mode": "max-autotune-no-cudagraphs"},
    "options": {"options": {"epilogue_fusion": False, "max_autotune": False}},
    "fullgraph+dynamic": {"fullgraph": True, "dynamic": True},
}
# The default run: fullgraph=True each way, and each other option but dynamic (three compiles) the
# front door's way (a compile costs seconds here); the slow tier: every way with every option.
QUICK = [(way, "fullgraph") for way in WAYS] + [("nvtx_regions.compile", name) for name in OPTIONS if name not in ("fullgraph", "dynamic")]
CELLS = [
    pytest.param(way, name, id=f"{way}-{name}", marks=() if (way, name) in QUICK else pytest.mark.slow)
    for way in WAYS
    for name in OPTIONS
]


@pytest.mark.parametrize("way, name", CELLS)
def test_every_way_and_option_gives_eagers_ranges_every_step(eager_steps, way, name):
    options = OPTIONS[name]
    # Shapes that change from step to step under dynamic=True: the ranges of a recompile too.
    batches = (4, 6, 8) if options.get("dynamic") else (4, 4, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NvtxRegionsWarning)  # nothing to say: every range is placed
        call = _compiled(way, options)
        steps = _run_steps(call, batches=batches)
    for step, (got, expected) in enumerate(zip(steps, eager_steps)):
        assert got == expected, f"step {step}: {sorted(got.items(), key=str)} != eager's {sorted(expected.items(), key=str)}"


# -- nothing of ours is compiled by Dynamo as a frame -------------------------------------------------


def _ours(code) -> bool:
    return Path(code.co_filename).resolve().is_relative_to(PACKAGE)


@contextmanager
def frames_dynamo_converts():
    """The code objects of our package whose frames Dynamo's frame evaluation hands to its converter
    (``ConvertFrameAssert.__call__``, which every compile of a frame goes through: 2.8, 2.11, 2.14)."""
    from torch._dynamo.convert_frame import ConvertFrameAssert

    seen: list = []
    original = ConvertFrameAssert.__call__

    def spy(self, frame, *args, **kwargs):
        if _ours(frame.f_code):
            seen.append(frame.f_code)
        return original(self, frame, *args, **kwargs)

    ConvertFrameAssert.__call__ = spy
    try:
        yield seen
    finally:
        ConvertFrameAssert.__call__ = original


def _installed_hooks(models, tensors) -> dict[str, list]:
    """Every hook and callback of our package installed now, by kind: on `models`' modules, torch's
    global module and optimizer hooks, Dynamo's compile callbacks, the loggers' filters, `tensors`'
    hooks and the autograd nodes' pre-hooks (our `_Events`, found among the live objects)."""
    from torch._dynamo.callback import callback_handler
    from torch.nn.modules import module as nn_module
    from torch.optim import optimizer

    from nvtx_regions.runtime.backward_hooks import _Events

    def ours(function) -> bool:
        code = getattr(function, "__code__", None) or getattr(getattr(function, "__func__", None), "__code__", None)
        if code is None:
            code = getattr(type(function).__call__, "__code__", None)
        return code is not None and _ours(code)

    found = collections.defaultdict(list)
    for model in models:
        for module in model.modules():
            for hooks in (module._forward_pre_hooks, module._forward_hooks):
                found["module hooks"] += [h for h in hooks.values() if ours(h)]
    for hooks in (nn_module._global_forward_pre_hooks, nn_module._global_forward_hooks):
        found["global module hooks"] += [h for h in hooks.values() if ours(h)]
    found["optimizer hooks"] = [h for h in optimizer._global_optimizer_post_hooks.values() if ours(h)]
    found["Dynamo callbacks"] = [h for h in [*callback_handler.start_callbacks, *callback_handler.end_callbacks] if ours(h)]
    for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
        found["logger filters"] += [f for f in getattr(logger, "filters", []) if ours(f)]
    from torch._dynamo import convert_frame

    # What hears Dynamo's recompile limit, in place of its log (`internals.dynamo.recompile_limit_hits`).
    found["Dynamo's wrapped functions"] = [f for f in [convert_frame.exceeds_recompile_limit] if ours(f)]
    for tensor in tensors:
        found["tensor hooks"] += [h for h in (tensor._backward_hooks or {}).values() if ours(h)]
    found["autograd node pre-hooks"] = [o for o in gc.get_objects() if type(o) is _Events]
    return found


def _fullgraph_scenario():
    """What installs every kind of hook, run under fullgraph compiled calls: an eager annotation (its
    model called inside a compiled function, its hooks traced, and called as a compiled module, its
    root's hooks run in Python), `nvtx_regions.compile` (hooks for the compile step, the watch of its
    first call, Dynamo's callbacks), a leaf input that needs a gradient, and an optimizer
    step (the step clock), and a module given its input in a tuple (a leaf nested in an argument gets
    a tensor hook). The hooks, looked at before the backward."""

    class TupleIn(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = torch.nn.Linear(16, 16)

        def forward(self, pair):
            return self.inner(pair[0])

    class Holder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.held = TupleIn()

        def forward(self, x):
            return self.held((x,))

    annotated, compiled_model, holder = make_model(markers=False), make_model(), Holder()
    annotation, held = annotate(annotated, SPEC), annotate(holder, "each module <held>")
    inner = torch.compile(lambda x: annotated(x), backend="eager", fullgraph=True)
    outer = torch.compile(annotated, backend="eager", fullgraph=True)
    # A domain of its own: a backend of its own, whose first step (its hooks and Dynamo callbacks) is
    # this one, whatever ran before in this process.
    compiled = nvtx_regions.compile(compiled_model, SPEC, backend="inductor", inductor={"fullgraph": True}, domain="scenario")
    optimizer = torch.optim.SGD(compiled_model.parameters(), lr=0.01)
    hooks = None
    for _ in range(2):
        leaf = torch.randn(4, 16, requires_grad=True)
        losses = [inner(leaf).sum(), outer(leaf).sum(), annotated(leaf).sum(), compiled(leaf).sum(), holder(leaf).sum()]
        hooks = hooks or _installed_hooks([annotated, compiled_model, holder], [leaf])
        sum(losses).backward()
        optimizer.step()
    annotation.remove()
    held.remove()
    return hooks


def test_every_hook_we_install_runs_outside_dynamo_under_fullgraph():
    _needs_capture()
    torch.compiler.reset()
    with warnings.catch_warnings(), frames_dynamo_converts() as seen, capture() as events:
        warnings.simplefilter("ignore", NvtxRegionsWarning)  # the annotation's hooks traced by a plain compile
        hooks = _fullgraph_scenario()
    kinds = ["module hooks", "optimizer hooks", "Dynamo callbacks", "Dynamo's wrapped functions", "tensor hooks", "autograd node pre-hooks"]
    for kind in kinds:
        assert hooks[kind], f"the scenario installed no {kind} of ours: it proves nothing of them"
    unmarked = {kind: found for kind, found in hooks.items() for hook in found if not our_dynamo.marked_outside_dynamo(hook)}
    assert unmarked == {}, "hooks not made by run_outside_dynamo"
    assert seen == [], f"Dynamo compiled frames of ours: {sorted({f'{c.co_name} ({c.co_filename}:{c.co_firstlineno})' for c in seen})}"
    assert _names(list(events))[("nvtx_regions", "blocks.0 (backward)")] > 0  # the hooks ran


_OLD_MECHANISM = """
import sys, warnings
sys.path.insert(0, sys.argv[1])
import torch
from torch._dynamo.eval_frame import skip_code
import nvtx_regions
import nvtx_regions.backends, nvtx_regions.inductor.backend  # every module that makes hooks, imported
from nvtx_regions.internals import dynamo
from test_compile_options import SPEC, _input, frames_dynamo_converts, make_model


def frame_only(function):  # the old mechanism: the hook's own frame skipped, not what it calls
    skip_code(getattr(function, "__code__", None) or function.__func__.__code__)
    return function


original = dynamo.run_outside_dynamo
for module in list(sys.modules.values()):
    if getattr(module, "run_outside_dynamo", None) is original:
        module.run_outside_dynamo = frame_only
warnings.simplefilter("ignore")
with frames_dynamo_converts() as seen:
    try:
        compiled = nvtx_regions.compile(make_model(), SPEC, backend="inductor", inductor={"fullgraph": True})
        compiled(_input()).sum().backward()
    except torch._dynamo.exc.Unsupported as error:
        print("raised:", str(error).splitlines()[0])
print("frames of ours:", len(seen))
"""


@pytest.mark.slow  # a process of its own, compiling: the control runs in CI's slow tier
def test_the_old_mechanism_lets_dynamo_compile_our_frames():
    """The positive control of the test above, in a process of its own: the hooks made by ``skip_code``
    on their own frame alone, as before, hand Dynamo frames of ours, and fullgraph=True raises."""
    result = subprocess.run(
        [sys.executable, "-c", _OLD_MECHANISM, str(Path(__file__).parent)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "raised: Attempt to trace generator" in result.stdout, result.stdout
    frames = int(result.stdout.split("frames of ours:")[1])
    assert frames > 0


def test_reduce_overhead_warns_where_a_cuda_graph_replays(monkeypatch):
    """Where Inductor may capture a graph as a CUDA graph (an input on a CUDA device: none here, so that
    decision is made to say so), one warning says that its ranges come only where the CUDA graph is
    warmed up and recorded. The same on an Inductor cache hit."""
    from nvtx_regions.internals import inductor as internals

    monkeypatch.setattr(internals, "may_replay_cuda_graphs", lambda patches, inputs: "triton.cudagraphs" in patches)
    torch.compiler.reset()
    model = make_model()
    with pytest.warns(NvtxRegionsWarning, match="CUDA graphs .* replays") as seen:
        compiled = nvtx_regions.compile(model, SPEC, backend="inductor", inductor={"mode": "reduce-overhead"})
        compiled(_input()).sum().backward()
        compiled(_input()).sum().backward()
    assert len([w for w in seen if "CUDA graphs" in str(w.message)]) == 1
    torch.compiler.reset()


@pytest.mark.slow
def test_a_cpp_wrapper_gets_one_warning_and_no_range_of_ours():
    """``cpp_wrapper`` generates no Python wrapper: the graph compiles without the spec's ranges, and
    one warning says so."""
    _needs_capture()
    torch.compiler.reset()
    with pytest.warns(NvtxRegionsWarning, match="no NVTX range can be placed in this graph: cpp_wrapper") as seen:
        call = _compiled("torch.compile", {"options": {"cpp_wrapper": True}})
        steps = _run_steps(call)
    assert len([w for w in seen if "no NVTX range can be placed" in str(w.message)]) == 1
    assert all(domain != "nvtx_regions" for step in steps for domain, _ in step), steps
    torch.compiler.reset()
