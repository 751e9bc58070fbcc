"""End to end: each way of handing the transform to thunder, on real models,
forward and backward, with the NVTX calls captured at run time.

Each test runs its models in a child process under `capture_subprocess` and
compares what every thread emitted (message, nesting depth, domain, balance)
with what the transform planned for each trace (`TraceReport.ranges_emitted`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from nvtx_regions.testing import unavailable_reason

_KIT_DIR = str(Path(__file__).resolve().parent / "workers")
if _KIT_DIR not in sys.path:
    sys.path.insert(0, _KIT_DIR)  # regions_kit, shared with the child processes
import regions_kit as kit  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "examples" / "regions.nvtx"

UNAVAILABLE = unavailable_reason()
pytestmark = [pytest.mark.thunder, pytest.mark.skipif(UNAVAILABLE is not None, reason=f"NVTX capture tool unavailable: {UNAVAILABLE}")]


run = kit.run_captured


JIT = """
import thunder, torch
from thunder.core.transforms import add_transform
from nvtx_regions import NvtxProfileTransform
from regions_kit import emit, mlp, reports, small_gpt

# thunder.jit(transforms=[...]), default domain "nvtx_regions"
mlp_t = NvtxProfileTransform("op in <linear, matmul>; mlp: between first(op in <linear>)..last(op in <linear>)")
jm = thunder.jit(mlp(), transforms=[mlp_t])
x = torch.randn(3, 8, requires_grad=True)

# thunder.jit on nanoGPT with the quickstart's spec file
gpt_t = NvtxProfileTransform(spec=SPEC, domain="gpt")
jgpt = thunder.jit(small_gpt(), transforms=[gpt_t])
idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
targets = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(2))

# add_transform on an already jitted module, into NVTX's default domain
add_t = NvtxProfileTransform("op in <linear, matmul>", domain=None)
jadd = add_transform(thunder.jit(mlp()), transform=add_t)

for step in range(2):
    jm(x).sum().backward()
    _, loss = jgpt(idx, targets)
    loss.backward()
    jadd(x).sum().backward()

emit(
    mlp=reports(mlp_t), gpt=reports(gpt_t), add=reports(add_t),
    misses=[thunder.cache_misses(f) for f in (jm, jgpt, jadd)],
)
"""


@pytest.fixture(scope="module")
def jitted():
    """MLP and nanoGPT under thunder.jit, and an MLP under add_transform, 2 steps each."""
    return run(JIT.replace("SPEC", repr(str(SPEC))), timeout=240)


def _steps(reports, steps: int = 2) -> kit.Call:
    forward, backward = reports
    assert (forward["phase"], backward["phase"]) == ("forward", "backward")
    return (kit.planned(forward) + kit.planned(backward)) * steps


def test_jit_mlp_forward_and_backward(jitted):
    out, process = jitted
    forward, _ = out["mlp"]
    assert [r["ranges"] for r in out["mlp"]] == [3, 4]  # mlp region + 2 linears; 4 matmuls
    assert kit.planned(forward)[0] == (0, "mlp")
    assert [depth for depth, _ in kit.planned(forward)] == [0, 1, 1]
    assert out["misses"][0] == 1
    assert kit.captured(process, "nvtx_regions") == {out["tid"]: _steps(out["mlp"])}


def test_jit_gpt_with_spec_file(jitted):
    out, process = jitted
    forward, backward = out["gpt"]
    # examples/regions.nvtx. Forward: 2 embeddings, one range per block (2 layers), attn0 inside
    # block 0 around its 5 linear/matmul/softmax ops, 2 more in block 0, 7 in block 1, the head.
    # Backward: the head's 2 matmuls, then per block (in reverse) its range with 12 matmuls inside.
    assert [r["ranges"] for r in out["gpt"]] == [20, 28]
    depths, messages = zip(*kit.planned(forward))
    assert depths == (0, 0, 0, 1) + (2,) * 5 + (1, 1, 0) + (1,) * 7 + (0,)
    assert ["embedding(" in m for m in messages[:3]] == [True, True, False]
    assert (messages[2], messages[3], messages[11]) == ("transformer.h.0", "attn0", "transformer.h.1")
    bdepths, bmessages = zip(*kit.planned(backward))
    assert [m for m in bmessages if "(backward)" in m] == ["transformer.h.1 (backward)", "transformer.h.0 (backward)"]
    assert bdepths == (0, 0) + ((0,) + (1,) * 12) * 2
    assert out["misses"][1] == 1
    assert kit.captured(process, "gpt") == {out["tid"]: _steps(out["gpt"])}


def test_add_transform_default_nvtx_domain(jitted):
    out, process = jitted
    assert [r["ranges"] for r in out["add"]] == [2, 4]
    assert out["misses"][2] == 1
    assert kit.captured(process, None) == {out["tid"]: _steps(out["add"])}
    # Each transform wrote to its own domain, and to no other.
    assert kit.push_domains(process) == {"nvtx_regions", "gpt", None}


THUNDERFX = """
import thunder, torch
from thunder.dynamo import ThunderCompiler
from nvtx_regions import NvtxProfileTransform
from regions_kit import emit, reports

class TwoPieces(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.a(x))
        torch._dynamo.graph_break()  # two subgraphs, one transform
        return self.b(h)

t = NvtxProfileTransform("op in <linear, matmul>", domain="fx")
backend = ThunderCompiler(transforms=[t])
model = torch.compile(TwoPieces(), backend=backend)
x = torch.randn(3, 8, requires_grad=True)
seen = []
for step in range(2):
    model(x).sum().backward()
    seen.append(len(t.reports))
emit(fx=reports(t), subgraphs=len(backend.subgraph_infos), reports_after_step=seen)
"""


def test_thunderfx_subgraphs_share_one_transform():
    out, process = run(THUNDERFX, timeout=180)
    assert out["subgraphs"] == 2
    assert out["reports_after_step"] == [4, 4]  # compiled in step 0 only
    # thunder compiles each subgraph's forward and backward together, in graph order.
    a_fw, a_bw, b_fw, b_bw = out["fx"]
    assert [r["phase"] for r in out["fx"]] == ["forward", "backward"] * 2
    assert [r["ranges"] for r in out["fx"]] == [1, 2, 1, 2]
    assert "_modules_a_" in a_fw["emitted"][0]["message"] and "_modules_b_" in b_fw["emitted"][0]["message"]
    # Autograd runs the backwards in reverse: b's, then a's.
    step = kit.planned(a_fw) + kit.planned(b_fw) + kit.planned(b_bw) + kit.planned(a_bw)
    assert kit.push_domains(process) == {"fx"}
    assert kit.captured(process, "fx") == {out["tid"]: step * 2}


# ---------------------------------------------------------------- torchrun: DDP and FSDP

@pytest.fixture(scope="module")
def distributed():
    """DDP then FSDP of the MLP, 2 steps each, on 2 CPU ranks (gloo); same run as the rank gates test.

    Spec (workers/distributed_worker.py): every linear and matmul, and a
    "collectives" region from the first all-gather/all-reduce/reduce-scatter
    to the last wait.
    """
    return kit.torchrun_workers()


@pytest.mark.slow
def test_distributed_wrappers_take_the_jitted_module(distributed):
    """thunder 0.2.6's ddp() and fsdp() accept a ThunderModule only: jit with the transform, then wrap."""
    outs, _ = distributed
    for rank in (0, 1):
        assert outs[rank]["ddp_of_plain_module"] == (
            "Thunder DDP only works on ThunderModule, got <class 'torch.nn.modules.container.Sequential'>"
        )
        assert outs[rank]["fsdp_of_plain_module"] == (
            "Expected `model` to be of type `thunder.core.module.ThunderModule`, but got Sequential"
        )


@pytest.mark.slow
@pytest.mark.parametrize("wrapper", ["ddp", "fsdp"])
def test_distributed_each_rank(distributed, wrapper):
    outs, ranks = distributed
    for rank in (0, 1):
        out = outs[rank]
        assert out[f"{wrapper}_matches_reference"] is True
        forward, backward = out[wrapper]
        fw, bw = kit.planned(forward), kit.planned(backward)
        # Gradients are all-reduced (DDP) or reduce-scattered (FSDP) after the backward's last matmul.
        assert [d for d, _ in bw] == [0, 0, 0, 0] and bw[-1] == (0, "collectives")
        if wrapper == "ddp":
            assert [d for d, _ in fw] == [0, 0]  # no collectives in the forward
        else:
            # Parameters are all-gathered before the first linear and waited for after it.
            assert [d for d, _ in fw] == [0, 1, 0] and fw[0] == (0, "collectives")
        assert ranks[rank].world_size == 2
        assert kit.captured(ranks[rank], wrapper) == {out["tid"]: _steps(out[wrapper])}
    assert outs[0][wrapper] == outs[1][wrapper]  # same plan on both ranks
    # One domain per mode of the worker; "gates" is test_runtime_gates.py's, "gates_steps" its steps.
    assert kit.push_domains(ranks[0]) == kit.push_domains(ranks[1]) == {
        "ddp", "fsdp", "ddp_modules", "fsdp_modules", "fsdp_each", "gates", "gates_steps"
    }  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("wrapper", ["ddp", "fsdp"])
def test_distributed_module_paths_are_the_users(distributed, wrapper):
    """`each module <*>` on the MLP (Linear, GELU, Linear) under ddp()/fsdp(): paths 0..2, forward and
    backward, on each rank; the collectives thunder inserts belong to no module."""
    outs, ranks = distributed
    for rank in (0, 1):
        forward, backward = outs[rank][f"{wrapper}_modules"]
        assert kit.planned(forward) == [(0, "0"), (0, "1"), (0, "2")]
        # Under FSDP too: recomputed forward values (GELU's) that thunder puts first in
        # the backward are hoisted, and leave the modules' backward ranges apart.
        assert kit.planned(backward) == [(0, "2 (backward)"), (0, "1 (backward)"), (0, "0 (backward)")]
        assert kit.captured(ranks[rank], f"{wrapper}_modules") == {outs[rank]["tid"]: _steps(outs[rank][f"{wrapper}_modules"])}


@pytest.mark.slow
def test_fsdp_each_module_gives_exact_block_ranges(distributed):
    """Issue 16: fsdp(thunder.jit(open_llama)) with `each module <transformer.h.*>`, 2 ranks:
    no SelectorError, one range per block forward and backward, where workers/block_reference.py
    puts it, captured on every rank, every range closed."""
    outs, ranks = distributed
    for rank in (0, 1):
        out = outs[rank]
        for report, reference, suffix in zip(out["fsdp_each"], out["fsdp_each_reference"], ("", " (backward)")):
            assert reference["problems"] == []
            planned = {r["message"]: [r["start"], r["end"]] for r in report["emitted"]}
            assert planned == {f"transformer.h.{b}{suffix}": extent for b, extent in reference["ranges"].items()}
        forward, backward = out["fsdp_each"]
        assert kit.planned(forward) == [(0, "transformer.h.0"), (0, "transformer.h.1")]
        assert kit.planned(backward) == [(0, "transformer.h.1 (backward)"), (0, "transformer.h.0 (backward)")]
        assert kit.captured(ranks[rank], "fsdp_each") == {out["tid"]: _steps(out["fsdp_each"])}
