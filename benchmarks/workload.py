"""The benchmark's workload: a small nanoGPT training step under thunder, and
the transform variants it is compiled with.

Compiling one size once and replaying only the end for each variant keeps
the full run within minutes. Post-optimization transforms are the last
step of a thunder compilation: thunder 0.2.6 (`apply_transforms_and_build_cache_entry`,
thunder/__init__.py:594-630) hands them the final forward and backward traces,
then only builds the callables and the cache entry. `compile_base` compiles the
model once with a transform that records those two traces and changes nothing;
`build_variant` gives them to a variant's transform and builds the callables
and the cache entry exactly as that code does, then installs the entry in a new
`thunder.jit` of the same model, which then runs it from its cache. Interpreting
the model and optimizing its traces (minutes at 32 layers) is thus paid once
per size, not once per variant. `tests/test_benchmarks.py` checks that a
replayed variant generates the same code as a real compilation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import thunder
import torch
from thunder.core.trace import TraceTag
from thunder.core.transform_common import Transform
from thunder.common import transform_to_torch_types
from thunder.core.compile_data import compile_data_and_stats
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
    # Builds with no transform besides `none`: A/A controls, whose overhead against
    # `none` shows how much two identical builds differ (memory layout, noise).
    "none_again": None,
    "none_third": None,
}


def make_transform(variant: str) -> Any | None:
    spec = VARIANTS[variant]
    if spec is None:
        return None
    if spec == "thunder":
        return ThunderNvtxTransform()
    return NvtxProfileTransform(select=spec)


def make_model(layers: int, *, seed: int = 0) -> tuple[GPT, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    config = GPTConfig(block_size=BLOCK, vocab_size=VOCAB, n_layer=layers, n_head=HEADS, n_embd=EMBD, dropout=0.0)
    model = GPT(config)
    x = torch.randint(0, VOCAB, (BATCH, BLOCK))
    y = torch.randint(0, VOCAB, (BATCH, BLOCK))
    return model, x, y


class Recorder(Transform):
    """Keeps the traces thunder hands post-optimization transforms; changes nothing."""

    def __init__(self) -> None:
        from nvtx_regions.attribution.recording import install_module_recorder

        install_module_recorder()  # as NvtxProfileTransform does: the traces carry module calls
        self.calls: list[tuple[Any, dict]] = []

    def transform_trace_post_optimization(self, trace, **kwargs):
        self.calls.append((trace, kwargs))
        return trace


@dataclass
class Base:
    """One size compiled once: the traces post-optimization transforms get, and the cache entry."""

    model: GPT
    x: torch.Tensor
    y: torch.Tensor
    jitted: Any
    entry: Any  # thunder's CacheEntry of the compilation
    forward: Any  # the final forward trace, before post-optimization transforms
    backward: Any
    options: dict  # what thunder passed along (executors_list)
    seconds: float


@dataclass
class Compiled:
    """One variant of one size, built and run once."""

    variant: str
    jitted: Any
    transform: Any | None
    step: Callable[[], None]
    build_seconds: float  # transform + code generation + one step
    forward: Any  # the variant's final traces
    backward: Any
    bsyms: tuple[int, int]  # forward and backward
    ranges: tuple[int, int]  # NVTX ranges per call of the forward and backward traces


def count_ranges(trace: Any) -> int:
    """NVTX ranges one call of a final trace opens (ours, or thunder's transform's)."""
    n = 0
    for bsym in trace.bound_symbols:
        name = bsym.sym.name
        if name == "nvtx_range_push" or (name.startswith("nvtx_regions_") and "_push" in name):
            n += 1
    return n


def compile_base(layers: int) -> Base:
    model, x, y = make_model(layers)
    recorder = Recorder()
    started = time.perf_counter()
    jitted = thunder.jit(model, transforms=[recorder])
    _, loss = jitted(x, y)
    loss.backward()
    seconds = time.perf_counter() - started
    (forward, options), (backward, _) = recorder.calls
    if TraceTag.BACKWARD not in backward.tags:
        raise RuntimeError("expected thunder to hand post-optimization transforms a forward, then a backward trace")
    (entry,) = thunder.compile_stats(jitted).interpreter_cache
    return Base(model, x, y, jitted, entry, forward, backward, options, seconds)


def build_variant(base: Base, variant: str) -> Compiled:
    """A jitted module of `base.model` whose cache holds the base compilation with `variant`'s transform."""
    transform = make_transform(variant)
    started = time.perf_counter()
    forward, backward = base.forward, base.backward
    # In the base compilation's context, as thunder/__init__.py:594-630 runs.
    with compile_data_and_stats(thunder.compile_data(base.jitted), thunder.compile_stats(base.jitted)):
        if transform is not None:
            forward = transform.transform_trace_post_optimization(forward, **base.options)
            backward = transform.transform_trace_post_optimization(backward, **base.options)
        backward_fn = backward.python_callable()
        computation_fn = transform_to_torch_types(forward).python_callable()
    entry = base.entry._replace(
        computation_fn=computation_fn,
        computation_traces=[*base.entry.computation_traces, forward],
        backward_fn=backward_fn,
        backward_traces=[*base.entry.backward_traces, backward],
    )
    jitted = thunder.jit(base.model)
    thunder.compile_stats(jitted).interpreter_cache.append(entry)

    def step() -> None:
        _, loss = jitted(base.x, base.y)
        loss.backward()

    step()
    if thunder.cache_misses(jitted):
        raise RuntimeError(f"{variant}: the replayed cache entry was not used")
    compiled = Compiled(
        variant,
        jitted,
        transform,
        step,
        time.perf_counter() - started,
        forward,
        backward,
        (len(forward.bound_symbols), len(backward.bound_symbols)),
        (count_ranges(forward), count_ranges(backward)),
    )
    if isinstance(transform, NvtxProfileTransform):
        reported = tuple(r.ranges for r in transform.reports)
        if reported != compiled.ranges:
            raise AssertionError(f"{variant}: reports say {reported} ranges, the traces have {compiled.ranges}")
    return compiled


def at_depth(depth: int, fn: Callable[[], None]) -> None:
    """Call `fn` under `depth` extra Python frames (one 104-byte frame each on CPython 3.11)."""
    if depth == 0:
        return fn()
    return at_depth(depth - 1, fn)
