"""torchrun worker for tests/test_entry_points.py and tests/test_runtime_gates.py.

    python -m torch.distributed.run --standalone --nproc_per_node=2 distributed_worker.py MODE...

Modes, run in this order, each with its own transform and NVTX domain (its name):
- ddp: thunder.distributed.ddp(thunder.jit(mlp, transforms=[t])), 2 steps; and
  the error of ddp(mlp), a module not jitted yet.
- fsdp: thunder.distributed.fsdp(thunder.jit(mlp, transforms=[t]), device=cpu), 2 steps;
  and the error of fsdp(mlp, device=cpu).
- each: thunder.distributed.fsdp(thunder.jit(open_llama, transforms=[t])) with
  `each module <transformer.h.*>`, 2 steps, with block_reference's ranges and
  findings for its traces (issue 16).
- gates: thunder.jit(mlp, transforms=[t]) with rank and step gates, 3 steps.
Rank 0 prints one `regions_kit.emit` line with every rank's results (``ranks``).
"""

from __future__ import annotations

import copy
import sys
import threading
import warnings

import thunder
import torch
import torch.distributed as dist
from regions_kit import emit, mlp, open_llama, open_llama_inputs, reports

import nvtx_regions
from nvtx_regions import NvtxProfileTransform

# Collectives as thunder 0.2.6's torch executor names them.
DISTRIBUTED_SPEC = """
op in <linear, matmul>
collectives: between first(op in <torch_all_*, torch_reduce_scatter*>)..last(op in <torch_wait*>)
"""
GATES_SPEC = """
rank0: rank in <0> and between first(op in <linear>)..last(op in <linear>)
op in <linear>
rank in <1> and steps 1.. and op in <matmul>
"""


def inputs(rank: int) -> torch.Tensor:
    return torch.randn(3, 8, generator=torch.Generator().manual_seed(10 + rank))


def main(modes: list[str]) -> None:
    warnings.simplefilter("ignore", UserWarning)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    x = inputs(rank)
    out: dict = {"rank": rank}

    if "ddp" in modes:
        from thunder.distributed import ddp

        try:  # thunder 0.2.6 wraps jitted modules only: jit first, with the transform, then ddp
            ddp(mlp())
        except TypeError as error:
            out["ddp_of_plain_module"] = str(error)

        t = NvtxProfileTransform(DISTRIBUTED_SPEC, domain="ddp")
        reference = mlp()
        model = ddp(thunder.jit(mlp(), transforms=[t]))
        for _ in range(2):
            y = model(x)
            y.sum().backward()
        # DDP averages gradients over ranks: the reference sees every rank's input.
        for r in range(world):
            (reference(inputs(r)).sum() * 2 / world).backward()
        grads_match = all(
            torch.allclose(p.grad, q.grad, atol=1e-5) for p, q in zip(model.parameters(), reference.parameters())
        )
        out["ddp"] = reports(t)
        out["ddp_matches_reference"] = grads_match and torch.allclose(y, reference(x), atol=1e-5)

    if "fsdp" in modes:
        from thunder.distributed import fsdp

        try:
            fsdp(mlp(), device=torch.device("cpu"))
        except TypeError as error:
            out["fsdp_of_plain_module"] = str(error)

        t = NvtxProfileTransform(DISTRIBUTED_SPEC, domain="fsdp")
        model = mlp()
        reference = copy.deepcopy(model)  # fsdp shards the module's own parameters
        sharded = fsdp(thunder.jit(model, transforms=[t]), device=torch.device("cpu"))
        for _ in range(2):
            y = sharded(x)
            y.sum().backward()
        out["fsdp"] = reports(t)
        out["fsdp_matches_reference"] = torch.allclose(y, reference(x), atol=1e-5)

    if "modules" in modes:  # module paths are the user's, without the wrappers' prefixes
        from thunder.distributed import ddp, fsdp

        for name, wrap in (("ddp", ddp), ("fsdp", lambda m: fsdp(m, device=torch.device("cpu")))):
            t = NvtxProfileTransform("each module <*>", domain=f"{name}_modules", messages="module")
            model = wrap(thunder.jit(mlp(), transforms=[t]))
            for _ in range(2):
                model(x).sum().backward()
            out[f"{name}_modules"] = reports(t)

    if "each" in modes:
        import block_reference
        from thunder.core.transform_common import Transform
        from thunder.distributed import fsdp

        from nvtx_regions.attribution.traceview import TraceView

        class Recorder(Transform):
            def __init__(self):
                self.traces = []

            def transform_trace_post_optimization(self, trace, **kwargs):
                self.traces.append(trace)
                return trace

        recorder = Recorder()
        t = NvtxProfileTransform("each module <transformer.h.*>", domain="fsdp_each", messages="module")
        sharded = fsdp(thunder.jit(open_llama(), transforms=[recorder, t]), device=torch.device("cpu"))
        for _ in range(2):
            sharded(*open_llama_inputs()).sum().backward()
        forward, backward = (TraceView.from_trace(trace) for trace in recorder.traces)
        backward.forward = forward
        cotangents = {p.name for p in recorder.traces[1].args[1]}
        out["fsdp_each"] = reports(t)
        out["fsdp_each_reference"] = []
        for view in (forward, backward):
            expected = block_reference.reference_ranges(view, cotangents)
            out["fsdp_each_reference"].append({
                "ranges": {str(b): [view.ops[first].index, view.ops[last].index] for b, (first, last) in expected.items()},
                "problems": block_reference.problems(view, expected, cotangents),
            })  # fmt: skip

    if "gates" in modes:
        t = NvtxProfileTransform(GATES_SPEC, domain="gates")
        jm = thunder.jit(mlp(), transforms=[t])
        for _ in nvtx_regions.steps(range(3), domain="gates_steps"):  # the step clock
            jm(x).sum().backward()
        out["gates"] = reports(t)
        out["gates_cache_misses"] = thunder.cache_misses(jm)

    # One line from rank 0: lines that two processes write at once can interleave.
    out["tid"] = threading.get_native_id()
    everyone: list = [None] * world
    dist.all_gather_object(everyone, out)
    if rank == 0:
        emit(ranks=everyone)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
