"""One front door: the backends from the package top, any spec on any backend, the same
default spec, and one explain type.

- `selection.support` is the one table of what each backend can express; eager and Inductor
  leave out the rules they cannot express, with one `NvtxRegionsWarning` per run (``strict=True``:
  `SelectorError`), and run the rest. docs/reference/backends.md is checked against the table in
  tests/test_docs.py, and the profile table's ``n/a`` in tests/test_profile.py.
- Without a spec, `compile`, `annotate` and `NvtxInductor` run ``each module <**>``;
  `NvtxProfileTransform` runs ``all``.
- `nvtx_regions.explain` takes a thunder function, an `NvtxInductor` or an eager annotation, and
  returns an `Explanation` for each.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

import nvtx_regions
from nvtx_regions import Explanation, NvtxRegionsWarning, SelectorError, parse
from nvtx_regions.core.profiling import BACKENDS, DEFAULT_SELECT
from nvtx_regions.language.tree import NODE_TYPES
from nvtx_regions.selection.compile import EachMarkerRule, EachRule, OpRule, RegionRule, compile_spec
from nvtx_regions.selection.support import SUPPORT, UnsupportedRule, restrict, why_not
from nvtx_regions.testing import check_balanced, flatten, range_tree

sys.path.insert(0, str(Path(__file__).resolve().parent / "workers"))
from inductor_steps import blocks_input, make_blocks  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning")

ROOT = Path(__file__).resolve().parents[1]
REGIONS = ROOT / "examples" / "regions.nvtx"


def shown(page: str, marker: str) -> str:
    """The body of the block marked ``<!-- test: marker -->`` in docs/`page`."""
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    (body,) = re.findall(rf"<!-- test: {re.escape(marker)} -->\n```\w*\n(.*?)```", text, flags=re.S)
    return body


def page_example(page: str, contains: str) -> str:
    """The `run` example of docs/`page` that contains `contains`."""
    (code,) = [body for body in re.findall(r"<!-- test: run -->\n```python\n(.*?)```", (ROOT / "docs" / page).read_text(encoding="utf-8"), flags=re.S) if contains in body]
    return code


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.head(torch.relu(self.encoder(x)))


def _messages(events) -> list[str]:
    check_balanced(events)
    return [m for _, _, m in flatten([n for roots in range_tree(events).values() for n in roots])]


# ------------------------------------------------------------------ the table


def test_the_table_has_a_row_for_every_construct_and_thunder_runs_them_all():
    assert set(SUPPORT) == set(NODE_TYPES) | {OpRule, RegionRule, EachRule, EachMarkerRule}
    for construct in SUPPORT.values():
        assert set(construct.why_not) <= set(BACKENDS) - {"thunder"}
        assert set(construct.notes) <= set(BACKENDS) - set(construct.why_not)


def test_each_backend_leaves_out_what_the_table_says():
    compiled = compile_spec(parse(REGIONS.read_text(encoding="utf-8"), filename=str(REGIONS)))
    left_out = {b: [r.rule.label for r in restrict(compiled, b).rules if not r.applies] for b in BACKENDS}
    assert left_out == {"eager": ["embed", "attn0", "matmuls"], "thunder": [], "inductor": []}
    (rule,) = [r for r in restrict(compiled, "eager").rules if r.rule.label == "attn0"]
    assert isinstance(rule, UnsupportedRule) and rule.plan(None).ranges == 0
    assert rule.problem() == (
        f"rule 'attn0: between first(module <transformer.h.0.attn>)..last(module <transformer.h.0.attn>) and forward' "
        f"({REGIONS}:15): not supported under eager PyTorch: 'between first(module <transformer.h.0.attn>)..last(module "
        "<transformer.h.0.attn>)' is a region between two ops; eager PyTorch runs module calls, not a trace of ops; "
        "thunder and Inductor can run it"
    )
    # The reason is the first construct, outer first, that the backend cannot express.
    (marker,) = compile_spec(parse("op in <mm> and not marker <x>")).rules
    assert why_not(marker, "inductor") is None  # the model's own markers survive torch.compile (NvtxInductor)
    assert why_not(marker, "eager").startswith("'op in <mm>' selects ops by name")
    assert why_not(marker, "thunder") is None


def test_the_warning_the_backends_page_shows_is_the_real_one():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    with pytest.warns(NvtxRegionsWarning) as record:
        nvtx_regions.annotate(model, "each class <Linear>\nop in <gelu>").remove()
    assert [str(w.message) for w in record] == [shown("reference/backends.md", "warning").rstrip("\n")]
    assert "op in <gelu>" in page_example("reference/backends.md", "catch_warnings")


def test_the_eager_explanation_the_api_page_shows_is_the_real_one(capsys):
    exec(compile(page_example("reference/api.md", "nvtx_regions.explain(handle)"), "api.md", "exec"), {})
    assert capsys.readouterr().out == shown("reference/api.md", "explain eager")


# ------------------------------------------------------------------ any spec on eager, through compile()


def test_compile_eager_warns_once_and_runs_the_rest(nvtx_capture, monkeypatch):
    monkeypatch.delenv("NVTX_REGIONS_BACKEND", raising=False)
    model = Net()
    with pytest.warns(NvtxRegionsWarning) as record:
        compiled = nvtx_regions.compile(model, "op in <linear>\nmid: between first(op in <relu>)..last(op in <relu>)\neach module <*>", backend="eager")
    (warning,) = record
    assert str(warning.message).startswith("2 rules of the spec are left out under eager PyTorch, and the rest runs")
    assert warning.filename == __file__ or warning.filename.endswith("backends.py")
    with nvtx_capture() as events:
        compiled(torch.randn(4, 8)).sum().backward()
    assert _messages(events) == ["encoder", "head", "head (backward)", "encoder (backward)"]
    with pytest.raises(SelectorError, match=r"^rule 'op in <linear>' \(<select>:1\): not supported under eager PyTorch: "):
        nvtx_regions.compile(Net(), "op in <linear>\neach module <*>", backend="eager", strict=True)


# ------------------------------------------------------------------ no spec


def test_without_a_spec_eager_and_inductor_run_each_module():
    from nvtx_regions import NvtxInductor, annotate

    default = parse(DEFAULT_SELECT).rules
    assert default == parse("each module <**>").rules
    with annotate(Net()) as handle:
        assert handle.compiled.spec.rules == default
        assert handle.messages == [("forward", "encoder"), ("backward", "encoder (backward)"),
                                   ("forward", "head"), ("backward", "head (backward)")]  # fmt: skip
    assert NvtxInductor().spec.rules == default


@pytest.mark.thunder
def test_the_thunder_transform_alone_defaults_to_every_op():
    from nvtx_regions import NvtxProfileTransform

    assert NvtxProfileTransform().spec.rules == parse("all").rules


# ------------------------------------------------------------------ a spec without rules


def no_rules(where: str, given: str, default: str) -> str:
    return (
        f"{where}({given}): the spec has no rules (only blank lines and comments), so it selects nothing, "
        f"and no range will be emitted; write a rule, or leave select and spec out for the default spec, {default!r}"
    )


@pytest.mark.parametrize(
    "backend, where, default",
    [
        ("eager", "annotate", DEFAULT_SELECT),
        pytest.param("thunder", "NvtxProfileTransform", "all", marks=pytest.mark.thunder),
        ("inductor", "NvtxInductor", DEFAULT_SELECT),
    ],
)  # fmt: skip
def test_a_spec_without_rules_warns_on_every_backend_and_strict_raises(backend, where, default, monkeypatch, tmp_path):
    """docs/reference/errors.md: a spec with no rules warns, with one text on every backend, through compile()."""
    monkeypatch.delenv("NVTX_REGIONS_BACKEND", raising=False)
    comments = tmp_path / "comments.nvtx"
    comments.write_text("# only a comment\n\n", encoding="utf-8")
    for given, arguments in (("select=''", {"select": ""}), (f"spec={str(comments)!r}", {"spec": comments})):
        with pytest.warns(NvtxRegionsWarning) as caught:
            nvtx_regions.compile(Net(), backend=backend, **arguments)
        ours = [str(w.message) for w in caught if issubclass(w.category, NvtxRegionsWarning)]
        assert ours == [no_rules(where, given, default)]
    with pytest.raises(SelectorError) as raised:
        nvtx_regions.compile(Net(), "", backend=backend, strict=True)
    assert str(raised.value) == no_rules(where, "select=''", default)


# ------------------------------------------------------------------ no backend


@pytest.mark.thunder
def test_without_a_backend_compile_uses_inductor_even_with_thunder_installed(monkeypatch):
    """thunder runs only when named: with lightning-thunder installed, compile(model) is torch.compile."""
    import thunder

    from nvtx_regions import NvtxInductor
    from nvtx_regions.backends import default_backend
    from nvtx_regions.internals.versions import thunder_installed

    monkeypatch.delenv("NVTX_REGIONS_BACKEND", raising=False)
    assert thunder_installed()
    given = []
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: given.append(kwargs) or model)
    monkeypatch.setattr(thunder, "jit", lambda *args, **kwargs: pytest.fail("thunder.jit was called without backend='thunder'"))
    model = Net()
    assert nvtx_regions.compile(model) is model
    assert default_backend() == "inductor"
    (kwargs,) = given
    assert isinstance(kwargs["backend"], NvtxInductor) and kwargs["backend"].spec.rules == parse(DEFAULT_SELECT).rules


# ------------------------------------------------------------------ Inductor: the rest runs, the default, explain


@pytest.fixture(scope="module")
def inductor_runs(tmp_path_factory):
    """The two-block model under NvtxInductor: with no spec, and with a spec one rule of which Inductor cannot
    express; each compiled into a fresh cache and run twice under capture. Returns {name: (backend, events)}."""
    from nvtx_regions import NvtxInductor
    from nvtx_regions.capture import is_attached
    from nvtx_regions.testing import capture

    if not is_attached():
        pytest.skip("the NVTX capture tool is not attached in this process")
    patch = pytest.MonkeyPatch()
    patch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("inductor_cache")))
    patch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "1")
    found = {}
    try:
        for name, spec in (("default", None), ("mixed", "each module <blocks.*>\nattn: between t3..t9")):
            torch._dynamo.reset()
            if spec is None:
                backend = NvtxInductor()
            else:
                with pytest.warns(NvtxRegionsWarning, match="^1 rule of the spec is left out under Inductor") as seen:
                    backend = NvtxInductor(spec)
                assert len(seen) == 1
            compiled = torch.compile(make_blocks(), backend=backend)
            compiled(blocks_input()).sum().backward()
            with capture() as events:
                for _ in range(2):
                    compiled(blocks_input()).sum().backward()
            found[name] = (backend, list(events))
    finally:
        patch.undo()
    return found


def test_inductor_runs_the_rules_it_can_express(inductor_runs):
    _, events = inductor_runs["mixed"]
    assert _messages(events) == ["blocks.0", "blocks.1", "blocks.1 (backward)", "blocks.0 (backward)"] * 2


def test_inductor_without_a_spec_gives_module_ranges_eager_gives_too(inductor_runs, nvtx_capture):
    from nvtx_regions import annotate

    _, events = inductor_runs["default"]
    model = make_blocks()
    with annotate(model), nvtx_capture() as eager_events:
        for _ in range(2):
            model(blocks_input()).sum().backward()
    ours, eagers = _messages(events), _messages(eager_events)
    assert {"blocks.0", "blocks.1", "head", "blocks.0 (backward)", "head (backward)"} <= set(ours) <= set(eagers)


def test_one_explain_type_for_every_backend(inductor_runs):
    from nvtx_regions import annotate, explain

    backend, _ = inductor_runs["mixed"]
    found = explain(backend)
    assert type(found) is Explanation and type(backend.explain()) is Explanation
    text = str(found)
    assert text.startswith("NvtxInductor('each module <blocks.*>; attn: between t3..t9', domain='nvtx_regions'): 2 graph(s)")
    assert "rule 'attn: between t3..t9' (<select>:2): not supported under Inductor: 't3' is a thunder proxy name" in text
    assert "  backward 'graph 0 (backward)': 2 ranges\n    blocks.1 (backward): kernels #" in text
    assert [rule.applies for rule in found.rules] == [True, False] and set(found.unsupported) == {1}
    # Another spec against the same graphs.
    other = explain(backend, "each module <hed>")
    assert other.reasons == {0: "module 'hed' matches nothing in these graphs (nearest: head)"}  # Inductor's words
    with annotate(make_blocks(), "each class <Block>") as handle:
        found = explain(handle)
        assert type(found) is Explanation and str(found) == str(handle.explain())
        assert "    blocks.1 (backward): modules #" in str(found)
        assert [call[0] for call in found.traces[0][0].calls] == ["blocks.0", "blocks.1"]


# ------------------------------------------------------------------ compile() of a function


def test_inductor_compiles_a_function_and_model_must_be_a_module(nvtx_capture, monkeypatch, tmp_path):
    """torch.compile takes a function as well as a module: compile() passes no module tree then, and
    its op rules give a range per kernel; NvtxInductor(model=) given anything but a module says what it takes."""
    from nvtx_regions import NvtxInductor

    monkeypatch.delenv("NVTX_REGIONS_BACKEND", raising=False)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))

    def scaled(x):
        return torch.relu(x) * 2

    torch._dynamo.reset()
    compiled = nvtx_regions.compile(scaled, "op in <*>", backend="inductor")
    x = torch.randn(4, 8)
    expected = scaled(x)
    with nvtx_capture() as events:
        result = compiled(x)
    assert torch.equal(result, expected)
    check_balanced(events)
    pushed = [e.message for e in events if e.domain == "nvtx_regions" and e.kind == "push"]
    assert len(pushed) == 1 and "relu" in pushed[0], pushed  # one fused kernel, one range
    with pytest.raises(TypeError, match=r"^NvtxInductor\(model=\.\.\.\) takes the torch\.nn\.Module .* got function\. "):
        NvtxInductor(model=scaled)


# ------------------------------------------------------------------ "selected nothing" in each backend's words


def test_inductor_says_graphs_and_kernels_and_why_no_kernel_has_a_module(monkeypatch, tmp_path):
    """A compiled function has no module calls: the reason names Dynamo and the way out, not thunder."""
    from nvtx_regions import NvtxInductor

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    backend = NvtxInductor("each module <*>")
    compiled = torch.compile(lambda x: torch.relu(x) * 2, backend=backend)
    with torch.no_grad(), pytest.warns(NvtxRegionsWarning) as caught:
        # Said at the second call: a call without gradients may be followed by more graphs of one step.
        compiled(torch.randn(4, 8))
        compiled(torch.randn(4, 8))
    (message,) = [str(w.message) for w in caught if issubclass(w.category, NvtxRegionsWarning)]
    assert message == (
        "rule 'each module <*>' (<select>:1) selected nothing in the graphs compiled so far; "
        "Dynamo recorded no module call for the kernels of these graphs (a function was compiled, not a module): "
        "compile the model itself, with nvtx_regions.compile(model, backend='inductor') or NvtxInductor(model=model)"
    )
    assert "thunder" not in message


def test_eager_says_module_calls():
    from nvtx_regions import annotate, explain

    with annotate(Net()) as handle:
        assert explain(handle, "each module <encodr>").reasons == {
            0: "module 'encodr' matches nothing in the model's module calls (nearest: encoder)"
        }


@pytest.mark.thunder
def test_thunder_says_traces():
    import thunder

    from nvtx_regions import NvtxProfileTransform, explain

    jitted = thunder.jit(Net(), transforms=[NvtxProfileTransform("each module <*>")])
    jitted(torch.randn(2, 8))
    assert explain(jitted, "each module <encodr>").reasons == {
        0: "module 'encodr' matches nothing in these traces (nearest: encoder)"
    }


def test_one_row_of_words_per_backend():
    from nvtx_regions.selection.unselected import WORDS

    assert set(WORDS) == set(BACKENDS)
    assert [restrict(compile_spec(parse("all")), name).backend for name in BACKENDS] == list(BACKENDS)


@pytest.mark.parametrize(
    "value, message",
    [
        ("", "$NVTX_REGIONS_SPEC is set but empty: name a .nvtx spec file there, or unset it for the default spec, 'each module <**>'"),
        ("  ", "$NVTX_REGIONS_SPEC is set but empty"),
        ("no/such.nvtx", "$NVTX_REGIONS_SPEC='no/such.nvtx': no/such.nvtx: no such spec file; check the path"),
    ],
    ids=["empty", "blank", "missing"],
)
def test_a_bad_spec_in_the_environment_is_refused_naming_the_variable(monkeypatch, value, message):
    monkeypatch.setenv("NVTX_REGIONS_SPEC", value)
    with pytest.raises(nvtx_regions.SelectorError) as error:
        nvtx_regions.compile(torch.nn.Linear(2, 2), backend="eager")
    assert str(error.value).startswith(message), str(error.value)


def test_a_spec_in_the_environment_is_used(monkeypatch, tmp_path):
    spec = tmp_path / "linear.nvtx"
    spec.write_text("each class <Linear>\n")
    monkeypatch.setenv("NVTX_REGIONS_SPEC", str(spec))
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    compiled = nvtx_regions.compile(model, backend="eager")
    assert "each class <Linear>" in str(nvtx_regions.explain(compiled))
