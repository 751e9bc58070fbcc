"""What `inductor` reaches into in torch, and a check that the installed torch has it all.

No version gate: `check_reaches` (run when an `NvtxInductor` is made, and by
`inductor.install`, never at import) looks for each part in `REACHES`, and
raises `UnsupportedTorchError` naming every part missing, the torch found and
the releases checked (`TESTED_TORCH`). A part is looked up as code, not
called: a method the class itself defines with the parameters used, an
attribute the class's code sets on its instances, a dataclass field, a
function's keywords. What Inductor records on FX nodes (module stacks) is data
that only a compile shows; without it rules select nothing, and warn so.
"""

from __future__ import annotations

import dis
from dataclasses import dataclass
from typing import Any, Callable, Iterator

__all__ = ["TESTED_TORCH", "UnsupportedTorchError", "Reach", "REACHES", "missing_reaches", "check_reaches"]

# The torch releases (major.minor) on which every entry of this module was checked, by the tests.
TESTED_TORCH = ("2.11", "2.14")


class UnsupportedTorchError(RuntimeError):
    """The installed torch lacks a part of Inductor that placing ranges reaches into (`REACHES`)."""


def _find(module: str, path: str = "") -> Any:
    """The object `path` (dotted) of the module `module`; raises ImportError or AttributeError."""
    import importlib

    found = importlib.import_module(module)
    for part in filter(None, path.split(".")):
        found = getattr(found, part)
    return found


def _has(module: str, path: str) -> bool:
    """Whether the module `module` has the object `path` (dotted), whatever its value."""
    _find(module, path)
    return True


def _takes(function: Any, *names: str) -> bool:
    """Whether `function` has parameters of these names."""
    import inspect

    parameters = inspect.signature(function).parameters
    return all(name in parameters for name in names)


def _method(module: str, cls: str, name: str, *parameters: str) -> bool:
    """Whether the class `cls` itself (not a base) defines the method `name`, taking `parameters`:
    what `install` wraps must be the class's own."""
    return _takes(vars(_find(module, cls))[name], "self", *parameters)


def _codes(code: Any) -> Iterator[Any]:
    yield code
    for constant in code.co_consts:
        if hasattr(constant, "co_code"):
            yield from _codes(constant)


def _assigns(cls: Any, attribute: str) -> bool:
    """Whether code of `cls` (or a base) sets ``self.<attribute>``: an attribute its instances get
    in ``__init__`` or a helper, which the class itself does not have."""
    for klass in cls.__mro__[:-1]:
        for value in vars(klass).values():
            code = getattr(getattr(value, "__func__", value), "__code__", None)
            for inner in _codes(code) if code is not None else ():
                if attribute in inner.co_names and any(
                    i.opname == "STORE_ATTR" and i.argval == attribute for i in dis.get_instructions(inner)
                ):
                    return True
    return False


def _fields(cls: Any, *names: str) -> bool:
    import dataclasses

    return all(name in {field.name for field in dataclasses.fields(cls)} for name in names)


def _inner_compile_keywords() -> bool:
    """``compile_fx_inner`` takes ``is_backward`` and ``is_inference`` (2.11, 2.14: keys of the
    TypedDict ``_CompileFxKwargs`` its ``**kwargs`` are typed with)."""
    compile_fx = _find("torch._inductor.compile_fx")
    names = ("is_backward", "is_inference")
    typed = getattr(getattr(compile_fx, "_CompileFxKwargs", None), "__annotations__", {})
    return all(name in typed for name in names) or _takes(compile_fx.compile_fx_inner, *names)


def _writes_wrapper_lines() -> bool:
    """``PythonWrapperCodegen._generate`` writes each `WrapperLine` among the lines with ``line.codegen(code)``
    (2.11, 2.14), where ``code`` is an `IndentedBuffer`."""
    wrapper = _find(_WRAPPER)
    generate = vars(wrapper.PythonWrapperCodegen)["_generate"].__code__
    return isinstance(wrapper.WrapperLine, type) and any(
        {"WrapperLine", "codegen"} <= set(code.co_names) for code in _codes(generate)
    )


@dataclass(frozen=True)
class Reach:
    """One part of torch that placing ranges needs: its name as torch spells it, what breaks
    without it, and a check that this torch has it (`present`; raising counts as absent)."""

    name: str
    without: str
    present: Callable[[], bool]


_CPP = "torch._inductor.codegen.cpp"
_WRAPPER = "torch._inductor.codegen.wrapper"

# Every entry checked on torch 2.11 and 2.14 (`TESTED_TORCH`).
REACHES = (
    Reach("torch._inductor.scheduler.Scheduler.enter_context(node)", "which wrapper lines belong to which kernel",
          lambda: _method("torch._inductor.scheduler", "Scheduler", "enter_context", "node")),
    Reach(f"{_CPP}.CppScheduling.flush()", "where a CPU kernel group's call is written",
          lambda: _method(_CPP, "CppScheduling", "flush")),
    Reach(f"{_CPP}.CppScheduling.kernel_group", "which nodes a CPU kernel group holds",
          lambda: _assigns(_find(_CPP, "CppScheduling"), "kernel_group")),
    Reach(f"{_CPP}.KernelGroup.scheduled_nodes", "which nodes a CPU kernel group holds",
          lambda: _assigns(_find(_CPP, "KernelGroup"), "scheduled_nodes")),
    Reach(f"{_WRAPPER}.PythonWrapperCodegen.run_wrapper_ir_passes(is_inference)", "where the range lines go in",
          lambda: _method(_WRAPPER, "PythonWrapperCodegen", "run_wrapper_ir_passes", "is_inference")),
    Reach(f"{_WRAPPER}.PythonWrapperCodegen.lines", "the wrapper's lines, which the ranges go between",
          lambda: _assigns(_find(_WRAPPER, "PythonWrapperCodegen"), "lines")),
    Reach(f"{_WRAPPER}.PythonWrapperCodegen.header", "the wrapper's header, which builds the ranges",
          lambda: _assigns(_find(_WRAPPER, "PythonWrapperCodegen"), "header")),
    Reach(f"{_WRAPPER}.KernelCallLine.kernel_name", "which lines call a generated kernel",
          lambda: _fields(_find(_WRAPPER, "KernelCallLine"), "kernel_name")),
    Reach(f"{_WRAPPER}.ExternKernelOutLine.node", "which lines call an extern kernel",
          lambda: _fields(_find(_WRAPPER, "ExternKernelOutLine"), "node")),
    Reach(f"{_WRAPPER}.ExternKernelAllocLine.node", "which lines call an extern kernel",
          lambda: _fields(_find(_WRAPPER, "ExternKernelAllocLine"), "node")),
    Reach(f"{_WRAPPER}.WrapperLine, written by PythonWrapperCodegen._generate through its codegen(code)",
          "the try/except that closes what a failed call left open", _writes_wrapper_lines),
    Reach("torch._inductor.utils.IndentedBuffer.do_indent(), .do_unindent()", "the try/except's indentation",
          lambda: _method("torch._inductor.utils", "IndentedBuffer", "do_indent") and _method("torch._inductor.utils", "IndentedBuffer", "do_unindent")),
    Reach("torch._inductor.ir.Operation.get_origins(), .get_origin_node()", "which FX nodes a kernel came from",
          lambda: all(callable(_find("torch._inductor.ir", f"Operation.{m}")) for m in ("get_origins", "get_origin_node"))),
    Reach("torch._inductor.virtualized.V.graph", "the graph being generated",
          lambda: _has("torch._inductor.virtualized", "V.graph")),
    Reach("torch._inductor.custom_graph_pass.CustomGraphPass", "the cache key: a cached wrapper could be replayed",
          lambda: callable(_find("torch._inductor.custom_graph_pass", "CustomGraphPass.uuid"))),
    Reach("torch._inductor.config.post_grad_custom_post_pass", "the cache key: a cached wrapper could be replayed",
          lambda: _has("torch._inductor.config", "post_grad_custom_post_pass")),
    Reach("torch._inductor.config.cpp_wrapper", "telling a graph no range can be placed in",
          lambda: _has("torch._inductor.config", "cpp_wrapper")),
    Reach("torch._inductor.config.triton.cudagraphs", "telling where CUDA graph replays run no wrapper",
          lambda: _has("torch._inductor.config", "triton.cudagraphs")),
    Reach("torch._inductor.compile_fx.compile_fx(inner_compile=, config_patches=)", "compiling with the ranges",
          lambda: _takes(_find("torch._inductor.compile_fx", "compile_fx"), "inner_compile", "config_patches")),
    Reach("torch._inductor.compile_fx.compile_fx_inner(is_backward=, is_inference=)", "telling forward from backward",
          _inner_compile_keywords),
    Reach("torch._inductor.list_mode_options(mode)", "the options of torch.compile(mode=...)",
          lambda: _takes(_find("torch._inductor", "list_mode_options"), "mode")),
    Reach("torch._C._dynamo.eval_frame.set_code_exec_strategy(code, _FrameExecStrategy(SKIP, SKIP))",
          "hooks that run in Python inside a compiled call (fullgraph=True: Dynamo's error)",
          lambda: callable(_find("torch._C._dynamo.eval_frame", "set_code_exec_strategy"))
          and hasattr(_find("torch._C._dynamo.eval_frame", "_FrameAction"), "SKIP")),
    Reach("torch._dynamo.convert_frame.exceeds_recompile_limit(cache_size, compile_id)",
          "the notice of a function past Dynamo's recompile limit, whatever the user's log level",
          lambda: _takes(_find("torch._dynamo.convert_frame", "exceeds_recompile_limit"), "cache_size", "compile_id")),
    Reach("torch._dynamo.symbolic_convert.InstructionTranslatorBase.call_function(fn, args, kwargs), "
          "torch._dynamo.variables.builder.SourcelessBuilder.create",
          "the user's markers (torch.cuda.nvtx, nvtx) kept in the compiled code, with no other code's guard broken",
          lambda: _method("torch._dynamo.symbolic_convert", "InstructionTranslatorBase", "call_function", "fn", "args", "kwargs")
          and callable(getattr(_find("torch._dynamo.variables.builder", "SourcelessBuilder"), "create", None))),
)  # fmt: skip


def missing_reaches() -> list[str]:
    """The names of the `REACHES` this torch lacks (empty: all present)."""
    missing = []
    for reach in REACHES:
        try:
            present = reach.present()
        except (ImportError, AttributeError, KeyError, TypeError, ValueError):
            present = False
        if not present:
            missing.append(f"{reach.name} (without it: {reach.without})")
    return missing


_reaches_present = False


def check_reaches() -> None:
    """Raise `UnsupportedTorchError` naming every `REACHES` entry this torch lacks, the torch
    found and the versions checked; once all are found, later calls return at once."""
    global _reaches_present
    if _reaches_present:
        return
    missing = missing_reaches()
    if missing:
        import torch

        raise UnsupportedTorchError(
            f"nvtx_regions.inductor.NvtxInductor places ranges in the Python wrapper Inductor generates, "
            f"through parts of Inductor that torch {torch.__version__} lacks: {'; '.join(missing)}. They were "
            f"checked on torch {' and '.join(TESTED_TORCH)}: install one of those, or annotate eagerly with "
            "nvtx_regions.eager.annotate"
        )
    _reaches_present = True
