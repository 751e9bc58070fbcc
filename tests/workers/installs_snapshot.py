"""A process that uses nvtx_regions on every backend, removes every handle, and compares the process
with itself before: run by tests/test_installs.py under the capture tool.

Prints one JSON line: the snapshot entries that differ while the handles live (the positive control),
those that differ after the last ``remove()`` (none is right), and whether a compile after that made
its changes again. Its ranges (domain ``again``) are checked by the test in the captured events.
"""

from __future__ import annotations

import gc
import json
import logging
import sys

import nvtx
import torch

import nvtx_regions
from nvtx_regions.internals import installs

WITH_THUNDER = "--thunder" in sys.argv


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        with torch.cuda.nvtx.range("marked"):  # a marker of each form, kept in our compiled graphs
            x = self.proj(x)
        with nvtx.annotate("annotated"):
            return torch.relu(x)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(2))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def _ids(owner) -> dict[str, int]:
    return {name: id(value) for name, value in vars(owner).items() if callable(value) or isinstance(value, (staticmethod, classmethod))}


def snapshot() -> dict[str, object]:
    """What nvtx_regions may change outside its own objects, each object by identity."""
    from torch._dynamo import callback, convert_frame
    from torch._dynamo.symbolic_convert import InstructionTranslatorBase
    from torch._dynamo.variables.torch import TorchInGraphFunctionVariable
    from torch._inductor.codegen.cpp import CppScheduling
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen
    from torch._inductor.scheduler import Scheduler
    from torch.optim import optimizer

    taken: dict[str, object] = {
        "torch.cuda.nvtx": _ids(torch.cuda.nvtx),
        "nvtx": _ids(nvtx),
        "nvtx.nvtx": _ids(sys.modules["nvtx.nvtx"]),
        "nvtx.annotate": _ids(nvtx.annotate),
        "torch._dynamo.convert_frame": _ids(convert_frame),
        "InstructionTranslatorBase": _ids(InstructionTranslatorBase),
        "Scheduler": _ids(Scheduler),
        "CppScheduling": _ids(CppScheduling),
        "PythonWrapperCodegen": _ids(PythonWrapperCodegen),
        "torch._dynamo.config": {  # by type too: ours for capture_profiler_record_function is an int, 0
            key: (type(value).__qualname__, value)
            for key, value in torch._dynamo.config.get_config_copy().items()
            if isinstance(value, (bool, int, float, str, type(None)))
        },
        "Dynamo's handlers of torch functions": {
            repr(key): id(value) for key, value in TorchInGraphFunctionVariable._get_handlers().items()
        },
        "optimizer hooks": [list(optimizer._global_optimizer_pre_hooks), list(optimizer._global_optimizer_post_hooks)],
        "module hooks": [len(getattr(torch.nn.modules.module, name)) for name in dir(torch.nn.modules.module) if name.startswith("_global_") and name.endswith("hooks")],
        "Dynamo's compile callbacks": [
            [id(f) for f in getattr(callback.callback_handler, name, [])] for name in ("start_callbacks", "end_callbacks")
        ],
        "loggers": {
            name: [[id(f) for f in logger.filters], [id(h) for h in logger.handlers]]
            for name, logger in sorted(logging.Logger.manager.loggerDict.items())
            if isinstance(logger, logging.Logger) and (logger.filters or logger.handlers)
        },
    }
    if WITH_THUNDER:
        from thunder.common import CompileData
        from thunder.core.jit_ext import _general_jit_lookaside_map
        from thunder.core.trace import TraceCtx
        from thunder.dynamo.compiler import ThunderCompiler

        taken["thunder lookasides"] = {repr(key): id(value) for key, value in _general_jit_lookaside_map.items()}
        for cls in (TraceCtx, ThunderCompiler, CompileData):
            taken[cls.__name__] = _ids(cls)
    return taken


def differ(one: dict, other: dict) -> list[str]:
    return sorted(key for key in one.keys() | other.keys() if one.get(key) != other.get(key))


def step(model, optimizer, x) -> None:
    out = model(x)
    (out[0] if isinstance(out, tuple) else out).sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def main() -> None:
    x = torch.randn(4, 8)
    # Torch's own first-use changes (its loggers' handlers, lazy imports) happen here, before the snapshot.
    plain = torch.compile(Net())
    step(plain, torch.optim.SGD(plain.parameters(), lr=0.1), x)
    if WITH_THUNDER:
        import thunder

        thunder.jit(Net())(x).sum().backward()
    gc.collect()
    before = snapshot()

    handles = []
    for backend in ("eager", "inductor"):
        model = Net()
        compiled = nvtx_regions.compile(model, "each module <blocks.*> and steps 1..9", backend=backend)
        handles.append(compiled.nvtx_regions_backend)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in nvtx_regions.steps(range(2)):
            step(compiled, optimizer, x)
    if WITH_THUNDER:
        import thunder

        from nvtx_regions import NvtxProfileTransform

        transform = NvtxProfileTransform("each module <blocks.*>")
        handles.append(transform)
        thunder.jit(Net(), transforms=[transform])(x).sum().backward()
    during = snapshot()

    for handle in handles:
        handle.remove()
    gc.collect()
    after = snapshot()

    model = Net()
    compiled = nvtx_regions.compile(model, "each module <blocks.*>", backend="inductor", domain="again")
    compiled(x).sum().backward()
    print(json.dumps({"during": differ(before, during), "after": differ(before, after),
                      "made again": sorted(name for name in installs._made)}))  # fmt: skip


if __name__ == "__main__":
    main()
