"""No silent nothing: warnings per compilation, strict mode, errors that name
rules, and the transform's arguments."""

from __future__ import annotations

import re
import warnings

import pytest
import thunder
import torch

from support.models import make_mlp, mlp_inputs
from nvtx_regions import NvtxProfileTransform, NvtxRegionsWarning, SelectorError, SelectorSyntaxError

pytestmark = pytest.mark.thunder  # the whole file needs lightning-thunder


def run(select=None, *, grad=True, **kwargs):
    transform = NvtxProfileTransform(select, **kwargs)
    jitted = thunder.jit(make_mlp(), transforms=[transform])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", NvtxRegionsWarning)
        if grad:
            jitted(*mlp_inputs()).sum().backward()
        else:
            with torch.no_grad():
                jitted(*mlp_inputs())
    return transform, [str(w.message) for w in caught if issubclass(w.category, NvtxRegionsWarning)]


def test_unselected_rule_warns_once_per_compilation_with_nearest_names():
    _, messages = run("op in <linear>\nop in <lineer>\nbetween t3..t_9_weight")
    assert len(messages) == 2
    assert messages[0].startswith(
        "rule 'op in <lineer>' (<select>:2) selected nothing in the forward and backward traces of this compilation"
    )
    assert "op 'lineer' matches nothing in these traces (nearest: linear)" in messages[0]
    assert "proxy 't_9_weight' is produced by no compute op and is no argument in these traces (nearest: " in messages[1]
    assert re.search(r"nearest: [^)]*t_3_weight", messages[1])


def test_rule_that_matches_only_the_backward_does_not_warn():
    transform, messages = run("backward and op in <matmul>")
    assert messages == []
    assert [r.ranges for r in transform.reports] == [0, 3]


def test_strict_raises_naming_the_rule():
    with pytest.raises(SelectorError, match=r"rule 'op in <lineer>' \(<select>:1\) selected nothing"):
        run("op in <lineer>", strict=True)


def test_no_grad_forward_is_checked_without_waiting_for_a_backward():
    transform, messages = run("backward and op in <matmul>", grad=False)
    # Under no_grad thunder tags the forward AUGMENTED_FORWARD yet sends no backward.
    assert len(transform.reports) == 1
    assert messages == [
        "rule 'backward and op in <matmul>' (<select>:1) selected nothing in the forward trace of this "
        "compilation; op 'matmul' matches nothing in these traces"
    ]


def test_region_that_ends_before_it_starts_raises():
    with pytest.raises(SelectorError, match=r"region ends at input .* before it starts at t_3_weight .*swap the endpoints"):
        run("between t_3_weight..input")


def test_partially_overlapping_regions_raise_naming_both_rules():
    with pytest.raises(SelectorError) as info:
        run("a: between input..t_2_bias\nb: between t_2_weight..t_3_weight")
    message = str(info.value)
    assert "rule 'a: between input..t_2_bias' (<select>:1) and rule 'b: between t_2_weight..t_3_weight' (<select>:2)" in message
    assert "NVTX ranges must nest" in message


def test_same_extent_regions_nest_in_rule_order():
    from reference import one_line

    transform = NvtxProfileTransform("one: between input..t_3_bias\ntwo: between input..t_3_bias\nop in <linear>")
    jitted = thunder.jit(make_mlp(), transforms=[transform])
    jitted(*mlp_inputs())
    first_linear = next(b for b in thunder.last_traces(jitted)[-1].bound_symbols if b.sym.name == "linear")
    assert transform.reports[0].ranges_emitted[:3] == ((0, "one"), (1, "two"), (2, one_line(first_linear)))


@pytest.mark.parametrize(
    "select,message",
    [
        ("not steps 1..2", "'steps 1..2' is decided at run time, so it can only be joined with 'and'"),
        ("op in <linear> or rank in <0>", "'rank in <0>' is decided at run time"),
        ("between first(steps 1..)..last(all)", "'steps 1..' is decided at run time"),
    ],
)
def test_gates_under_not_or_or_raise_at_construction(select, message):
    with pytest.raises(SelectorError, match=re.escape(message)):
        NvtxProfileTransform(select)


def test_syntax_errors_raise_at_construction():
    with pytest.raises(SelectorSyntaxError):
        NvtxProfileTransform("op in <linear")


def test_select_and_spec_together_append_select_after_the_file(tmp_path):
    path = tmp_path / "regions.nvtx"
    path.write_text("# comment\nfile: op in <linear>\n", encoding="utf-8")
    transform = NvtxProfileTransform("extra: op in <mul>", spec=path)
    assert [r.label for r in transform.spec.rules] == ["file", "extra"]
    assert transform.spec.rules[0].describe(transform.spec.filename) == f"rule 'file: op in <linear>' ({path}:2)"
    assert repr(transform) == f"nvtx_regions.NvtxProfileTransform('extra: op in <mul>', spec={str(path)!r})"


def test_missing_spec_file_raises_at_construction(tmp_path):
    with pytest.raises(SelectorError, match="no such spec file"):
        NvtxProfileTransform(spec=tmp_path / "nope.nvtx")


@pytest.mark.parametrize("kwargs", [{"select": 3}, {"select": "all", "domain": 3}])
def test_argument_types_are_checked(kwargs):
    with pytest.raises(TypeError):
        NvtxProfileTransform(**kwargs)


def test_thunderfx_subgraphs_raise_no_false_alarm_and_check_reports():
    from thunder.dynamo import ThunderCompiler

    first, second = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def fn(x):
        y = torch.nn.functional.gelu(first(x))
        torch._dynamo.graph_break()
        return torch.tanh(second(y)).sum()

    # gelu's ops are only in the first subgraph, tanh only in the second.
    transform = NvtxProfileTransform("op in <erf>\nop in <tanh>\nop in <no_such_op>")
    compiled = torch.compile(fn, backend=ThunderCompiler(transforms=[transform]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", NvtxRegionsWarning)
        compiled(torch.randn(2, 4, requires_grad=True)).backward()
    assert not [w for w in caught if issubclass(w.category, NvtxRegionsWarning)]
    assert len(transform.reports) == 4  # two subgraphs, forward and backward each
    with pytest.warns(NvtxRegionsWarning) as caught:
        transform.check()
    assert [str(w.message).split(" selected")[0] for w in caught] == ["rule 'op in <no_such_op>' (<select>:3)"]
    transform.strict = True
    with pytest.raises(SelectorError, match="no_such_op"):
        transform.check()


def test_check_on_a_plain_jit_names_the_nearest_ops_as_each_compilation_does():
    """check() outside ThunderFX reads the transform's tally (the handle's), which keeps the views of
    the latest traces: it says what a misspelt op is near, as the warning of each compilation does."""

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    transform = NvtxProfileTransform("op in <linaer>")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", NvtxRegionsWarning)
        thunder.jit(model, transforms=[transform])(torch.randn(2, 4)).sum().backward()
    each_compilation = [str(w.message) for w in caught if issubclass(w.category, NvtxRegionsWarning)]
    with pytest.warns(NvtxRegionsWarning) as checked:
        transform.check()
    (message,) = [str(w.message) for w in checked]
    assert message.startswith("rule 'op in <linaer>' (<select>:1) selected nothing in any of the 2 traces seen; ")
    assert "linear" in message and message.split("; ", 1)[1] == each_compilation[0].split("; ", 1)[1], (message, each_compilation)
