"""The corpus of specs kept as data (tests/corpus/*.json): what each spec must
select on a real MLP trace, forward and backward, or the error it must raise."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from support.models import compiled
from nvtx_regions import NvtxProfileTransform, NvtxRegionsWarning, RegionOrderError, SelectorError
from reference import one_line, read_annotated

pytestmark = pytest.mark.thunder  # the whole file needs lightning-thunder

CASES = json.loads((Path(__file__).parent / "corpus/mlp_selections.json").read_text(encoding="utf-8"))["cases"]


def summary(ranges):
    return sorted([a.sym.name, b.sym.name, "<op>" if a is b and m == one_line(a) else m] for a, b, m in ranges)


# Plain ids: spec text (newlines, brackets) does not survive a pytest node id on the command line.
@pytest.mark.parametrize("case", CASES, ids=[f"case{n}" for n in range(len(CASES))])
def test_corpus_selection(case):
    *_, forward, backward = compiled("mlp", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NvtxRegionsWarning)
        transform = NvtxProfileTransform(case["spec"])
        if "error" in case:
            with pytest.raises(SelectorError) as raised:
                transform.transform_trace_post_optimization(forward)
                transform.transform_trace_post_optimization(backward)
            if case["error"] == "RegionOrderError":
                assert isinstance(raised.value, RegionOrderError), raised.value
            else:
                assert case["error"] == "overlap"
                assert not isinstance(raised.value, RegionOrderError) and "overlap without nesting" in str(raised.value)
            return
        for trace, phase in ((forward, "forward"), (backward, "backward")):
            result = transform.transform_trace_post_optimization(trace)
            got = summary(read_annotated(trace, result)) if result is not trace else []
            assert got == case[phase], phase
