"""One owner per model (issue 49, item 3): a model held by an annotation and by an Inductor backend
gets each range once a step, from the handle that took it last (`runtime.handle.take_model`), and a
backend never given to ``torch.compile`` says so instead of blaming Dynamo.

Each scenario counts the ranges of every step, the compiling one too, with the NVTX capture. The
positive control runs the first scenario with `take_model` made a no-op (two owners, as before this
rule): every block range then comes twice, so the count can fail.
"""

from __future__ import annotations

import collections
import warnings

import pytest
import torch

import nvtx_regions
from nvtx_regions.core.errors import NvtxRegionsWarning
from nvtx_regions.inductor import NvtxInductor
from nvtx_regions.testing import all_ranges

SPEC = "each module <blocks.*>"
ONCE = {"blocks.0": 1, "blocks.1": 1, "blocks.1 (backward)": 1, "blocks.0 (backward)": 1}


class OwnedBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.fc(x))


# Class names of their own: backends of one spec and model structure (class names included) share
# their hooks and their graphs' records (`inductor.outside.EveryModel`), across tests too.
class OwnedNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([OwnedBlock(), OwnedBlock()])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def _counts(call, capture, steps: int = 3) -> list[dict[str, int]]:
    x = torch.randn(4, 8, requires_grad=True)
    seen = []
    for _ in range(steps):
        with capture() as events:
            call(x).sum().backward()
        seen.append(dict(collections.Counter(r.message for r in all_ranges(events) if r.message.startswith("blocks"))))
    return seen


def _hooks(model) -> list[int]:
    """How many hooks each module of `model` carries, forward and pre-forward."""
    return [len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()]


def _annotation_then_layers(model, spec: str = SPEC):
    nvtx_regions.annotate(model, spec)
    for index, block in enumerate(list(model.blocks)):
        model.blocks[index] = nvtx_regions.compile(block, spec, backend="inductor", within=model)
    return model


def test_an_annotation_and_per_layer_compiles_give_each_range_once(nvtx_capture):
    """annotate(model), then each layer compiled within the model: the backend takes the model, the
    annotation's hooks come off, one warning names both."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = _annotation_then_layers(OwnedNet())
        seen = _counts(model, nvtx_capture)
    assert seen == [ONCE] * 3
    ours = [str(w.message) for w in caught if issubclass(w.category, NvtxRegionsWarning)]
    assert len(ours) == 1 and "one owner per model" in ours[0] and "annotate(OwnedNet" in ours[0], ours
    assert "NvtxInductor('each module <blocks.*>'" in ours[0]
    torch._dynamo.reset()


def test_two_owners_give_every_range_twice(nvtx_capture, monkeypatch):
    """The positive control: with `take_model` a no-op, the same scenario gives each range twice."""
    import nvtx_regions.emission.eager as eager
    import nvtx_regions.inductor.outside as outside

    for module in (eager, outside):
        monkeypatch.setattr(module, "take_model", lambda *args, **kwargs: None)
    # A spec of its own: the backends of one spec and model structure share their hooks' state.
    seen = _counts(_annotation_then_layers(OwnedNet(), "each module <blocks.[01]>"), nvtx_capture)
    assert seen == [{name: 2 for name in ONCE}] * 3
    torch._dynamo.reset()


def test_a_backend_never_given_to_torch_compile_says_so(nvtx_capture):
    """NvtxInductor(spec, model=model) made after an annotation and never given to torch.compile: it
    takes the model (a warning names both), its hooks give each range once, and the model's first
    call says that no torch.compile ran, not that Dynamo compiled no graph."""
    model = OwnedNet()
    spec = "each module <blocks.?>"  # a spec of its own: backends of one spec and model share their hooks
    nvtx_regions.annotate(model, spec)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        unused = NvtxInductor(spec, model=model)
        seen = _counts(model, nvtx_capture)
    assert seen == [ONCE] * 3
    ours = [str(w.message) for w in caught if issubclass(w.category, NvtxRegionsWarning)]
    assert len(ours) == 2 and "one owner per model" in ours[0], ours
    assert "ran without torch.compile: Dynamo compiled nothing in it" in ours[1], ours
    assert "Dynamo compiled no graph" not in ours[1]
    unused.remove()
    assert sum(_hooks(model)) == 0


def test_a_backend_given_to_torch_compile_takes_the_model(nvtx_capture):
    """The same backend given to torch.compile takes the model from the annotation (one warning); each
    range once, the compiling step too."""
    model = OwnedNet()
    nvtx_regions.annotate(model, SPEC)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        backend = NvtxInductor(SPEC, model=model)
        compiled = torch.compile(model, backend=backend)
        seen = _counts(compiled, nvtx_capture)
    assert seen == [ONCE] * 3
    ours = [str(w.message) for w in caught if issubclass(w.category, NvtxRegionsWarning)]
    assert len(ours) == 1 and "one owner per model" in ours[0], ours
    assert getattr(model, "nvtx_regions_backend", None) is None  # the annotation is gone
    backend.remove()
    torch._dynamo.reset()


def test_an_annotation_made_after_a_compile_takes_the_model(nvtx_capture):
    """Compiled and run, then annotated: the annotation takes the model (one warning), and the compiled
    model's ranges still come once a step."""
    model = OwnedNet()
    compiled = nvtx_regions.compile(model, SPEC, backend="inductor")
    assert _counts(compiled, nvtx_capture, steps=2) == [ONCE] * 2
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        annotation = nvtx_regions.annotate(model, SPEC)
        assert _counts(compiled, nvtx_capture, steps=2) == [ONCE] * 2
        assert _counts(model, nvtx_capture, steps=1) == [ONCE]
    ours = [str(w.message) for w in caught if issubclass(w.category, NvtxRegionsWarning)]
    assert len(ours) == 1 and "annotate(OwnedNet" in ours[0] and "now gives the ranges" in ours[0], ours
    annotation.remove()
    torch._dynamo.reset()


@pytest.mark.parametrize("twice", ["annotate", "compile"])
def test_the_same_kind_again_replaces_without_a_word(nvtx_capture, twice):
    """A notebook cell run twice: annotating again, or compiling again with another spec, replaces the
    first owner without a warning, and each range comes once."""
    model = OwnedNet()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if twice == "annotate":
            nvtx_regions.annotate(model, "each module <blocks.0>")
            nvtx_regions.annotate(model, SPEC)
            call = model
        else:
            nvtx_regions.compile(model, "each module <blocks.0>", backend="inductor")
            call = nvtx_regions.compile(model, SPEC, backend="inductor")
        seen = _counts(call, nvtx_capture)
    assert seen == [ONCE] * 3
    assert [str(w.message) for w in caught if issubclass(w.category, NvtxRegionsWarning)] == []
    torch._dynamo.reset()
