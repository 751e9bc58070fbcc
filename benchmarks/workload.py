"""The benchmark's workload: a small nanoGPT training step under thunder, and
the transform variants it is compiled with.

All variants of one size wrap the same `GPT` module, so they share parameters
and inputs. `shared_initial_trace` lets them share thunder's initial trace
too: interpreting the model's Python is most of a compilation (about 4 s per
layer here) and does not depend on post-optimization transforms, so
interpreting it once per size instead of once per variant is what keeps the
full run within minutes. The generated code is the same as without sharing
(checked by `tests/test_benchmarks.py`).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import thunder
import torch
from thunder.dev_utils.nvtx_profile_transform import NvtxProfileTransform as ThunderNvtxTransform
from thunder.tests.nanogpt_model import GPT, GPTConfig

from nvtx_regions import NvtxProfileTransform

# Tiny on purpose: a step is a few ms, mostly Python, so per-range costs show.
BATCH, BLOCK, VOCAB, HEADS, EMBD = 2, 16, 64, 2, 16

# name -> spec given to our transform (None: no transform; "thunder": thunder's own).
VARIANTS = {
    "none": None,
    "ours": "all",
    "thunder": "thunder",
    "ours_linear": "op in <linear>",
    "none_again": None,  # a second jit with no transform: the A/A control
}


class RecordingTransform(NvtxProfileTransform):
    """Our transform, keeping the traces it was given (for the compile-cost reruns)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.inputs: list[Any] = []

    def transform_trace_post_optimization(self, trace, **kwargs):
        self.inputs.append(trace)
        return super().transform_trace_post_optimization(trace, **kwargs)


class TimedThunderTransform(ThunderNvtxTransform):
    """thunder's NVTX transform, timed like ours times itself (`seconds` per trace)."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds: list[float] = []

    def transform_trace_post_optimization(self, trace, **kwargs):
        started = time.perf_counter()
        result = super().transform_trace_post_optimization(trace, **kwargs)
        self.seconds.append(time.perf_counter() - started)
        return result


def make_transform(variant: str) -> Any | None:
    spec = VARIANTS[variant]
    if spec is None:
        return None
    if spec == "thunder":
        return TimedThunderTransform()
    return RecordingTransform(select=spec)


def make_model(layers: int, *, seed: int = 0) -> tuple[GPT, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    config = GPTConfig(block_size=BLOCK, vocab_size=VOCAB, n_layer=layers, n_head=HEADS, n_embd=EMBD, dropout=0.0)
    model = GPT(config)
    x = torch.randint(0, VOCAB, (BATCH, BLOCK))
    y = torch.randint(0, VOCAB, (BATCH, BLOCK))
    return model, x, y


@contextlib.contextmanager
def shared_initial_trace() -> Iterator[None]:
    """Within the block, thunder interprets each module once; later jits of it reuse the traces.

    thunder 0.2.6 looks `thunder_general_jit` up in `thunder`'s globals at each
    compilation. The result's traces are only read afterwards, except for their
    name sets and counters (`from_trace` shares them), which are restored
    before each reuse so every compilation starts from the same state.
    """
    original = thunder.thunder_general_jit
    cache: dict[Any, tuple[Any, Any, list]] = {}

    def general_jit(fn, args, kwargs, /, **options):
        flat = [*args, *kwargs.values()]
        key = (id(fn), tuple((type(a), getattr(a, "shape", None), getattr(a, "dtype", None)) for a in flat))
        if key not in cache:
            result = original(fn, args, kwargs, **options)
            traces = [result.prologue_trace, result.computation_trace, result.epilogue_trace]
            state = [(t, set(t.names), t.name_ctr, t.obj_name_ctr) for t in traces if t is not None]
            cache[key] = (fn, result, state)  # fn: keep it alive so its id stays unique
        _, result, state = cache[key]
        for trace, names, name_ctr, obj_name_ctr in state:
            trace.names, trace.name_ctr, trace.obj_name_ctr = set(names), name_ctr, obj_name_ctr
        return result

    thunder.thunder_general_jit = general_jit
    try:
        yield
    finally:
        thunder.thunder_general_jit = original


@dataclass
class Compiled:
    """One variant of one size, compiled and run once."""

    variant: str
    jitted: Any
    transform: Any | None
    step: Callable[[], None]
    compile_seconds: float
    bsyms: tuple[int, int]  # final forward and backward traces
    ranges: tuple[int, int]  # NVTX ranges per call of the forward and backward traces
    transform_seconds: float = 0.0  # in transform_trace_post_optimization, both traces
    transform_bsyms: int = 0  # bound symbols of the traces the transform was given
    inputs: list = field(default_factory=list)  # the traces the transform was given


def count_ranges(trace: Any) -> int:
    """NVTX ranges one call of a final trace opens (ours, or thunder's transform's)."""
    n = 0
    for bsym in trace.bound_symbols:
        name = bsym.sym.name
        if name == "nvtx_range_push" or (name.startswith("nvtx_regions_") and "_push" in name):
            n += 1
    return n


def compile_variant(model: GPT, x: torch.Tensor, y: torch.Tensor, variant: str) -> Compiled:
    transform = make_transform(variant)
    started = time.perf_counter()
    jitted = thunder.jit(model, transforms=[transform] if transform is not None else [])

    def step() -> None:
        _, loss = jitted(x, y)
        loss.backward()

    step()
    seconds = time.perf_counter() - started
    forward = thunder.last_traces(jitted)[-1]
    backward = thunder.last_backward_traces(jitted)[-1]
    compiled = Compiled(
        variant,
        jitted,
        transform,
        step,
        seconds,
        (len(forward.bound_symbols), len(backward.bound_symbols)),
        (count_ranges(forward), count_ranges(backward)),
    )
    if isinstance(transform, RecordingTransform):
        reports = transform.reports
        ranges = tuple(r.ranges for r in reports)
        if ranges != compiled.ranges:
            raise AssertionError(f"{variant}: reports say {ranges} ranges, the traces have {compiled.ranges}")
        compiled.transform_seconds = sum(r.seconds for r in reports)
        compiled.transform_bsyms = sum(r.bound_symbols for r in reports)
        compiled.inputs = list(transform.inputs)
    elif isinstance(transform, TimedThunderTransform):
        compiled.transform_seconds = sum(transform.seconds)
    return compiled


def at_depth(depth: int, fn: Callable[[], None]) -> None:
    """Call `fn` under `depth` extra Python frames (one 104-byte frame each on CPython 3.11)."""
    if depth == 0:
        return fn()
    return at_depth(depth - 1, fn)
