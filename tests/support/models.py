"""The small models and inputs of the tests, and real thunder CPU traces of an MLP and a small
GPT, forward and backward, with the default executors and with torch.compile fusions.

torch and thunder are imported when first used: conftest imports this module.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def make_mlp():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4)
    )


def mlp_inputs():
    import torch

    torch.manual_seed(1)
    return (torch.randn(5, 8),)


def plain_gpt(n_layer: int = 2):
    """`examples/gpt.py`'s small GPT: thunder's nanoGPT's modules, parameters and initial values,
    in plain PyTorch, for the tests that need no thunder."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    from gpt import small_gpt

    return small_gpt(n_layer)


def make_gpt(n_layer: int = 2):
    """thunder's nanoGPT (``thunder.tests.nanogpt_model``), for the thunder tests: their traces
    and source lines are that file's."""
    import torch
    from thunder.tests.nanogpt_model import GPT, GPTConfig

    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=n_layer, n_head=2, n_embd=32, dropout=0.0))


def gpt_inputs():
    import torch

    torch.manual_seed(1)
    return torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))


def loss_of(output):
    return output[1] if isinstance(output, tuple) else output.sum()


# (model name, executors): GPT with torch.compile fusions uses one layer, since
# each compile of it costs tens of seconds on these CPUs.
CONFIGS = {
    ("mlp", None): (make_mlp, mlp_inputs),
    ("mlp", "torchcompile"): (make_mlp, mlp_inputs),
    ("gpt", None): (make_gpt, gpt_inputs),
    ("gpt", "torchcompile"): (functools.partial(make_gpt, 1), gpt_inputs),
}


class Recorder:
    """A thunder transform that keeps the traces post-optimization transforms get."""

    def __new__(cls):
        from thunder.core.transform_common import Transform

        from nvtx_regions.attribution.recording import install_module_recorder

        install_module_recorder()  # as NvtxProfileTransform does: its traces carry module calls and markers

        class _Recorder(Transform):
            def __init__(self):
                self.traces = []

            def transform_trace_post_optimization(self, trace, **kwargs):
                self.traces.append(trace)
                return trace

        return _Recorder()


@functools.lru_cache(maxsize=None)
def compiled(model: str, executors: str | None, select: str | None = "<none>"):
    """Jit a fresh model (with an NvtxProfileTransform of `select`, or with a
    `Recorder` for "<none>"), run forward and backward once. Returns (jitted,
    transform, output, grads, forward trace, backward trace); for "<none>" the
    traces are those post-optimization transforms receive."""
    import thunder

    from nvtx_regions import NvtxProfileTransform

    make, inputs = CONFIGS[(model, executors)]
    net = make()
    transforms = [Recorder()] if select == "<none>" else [NvtxProfileTransform(select)]
    options = {"executors": [executors]} if executors else {}
    jitted = thunder.jit(net, transforms=transforms, **options)
    out = jitted(*inputs())
    loss_of(out).backward()
    grads = [p.grad.clone() for p in net.parameters()]
    if select == "<none>":
        forward, backward = transforms[0].traces
    else:
        forward, backward = thunder.last_traces(jitted)[-1], thunder.last_backward_traces(jitted)[-1]
    return jitted, transforms[0], out, grads, forward, backward
