"""Every reach into torch's Inductor, Dynamo and AOTAutograd internals, in one place.

Checked on torch 2.11 and 2.14 (CPU, Python wrapper): `TESTED_TORCH`. Each
entry says what breaks without it, and `inductor_reaches.REACHES` lists what
`check_reaches` looks for in the installed torch before anything is patched
(no version gate: a torch that has every reach is used, one that lacks any
is refused, naming what it lacks).

Where ranges go: Inductor writes the Python wrapper of a graph (the ``call``
function that runs its kernels in order) as a list of lines,
``PythonWrapperCodegen.lines``, and turns them into text in ``_generate``.
Three methods are wrapped (`install`), and act only while `placing` is on
for the graph being compiled (a plain ``torch.compile`` in the same process
sees no change):
- ``Scheduler.enter_context(node)`` (``_inductor/scheduler.py``) runs before
  each final, fused scheduler node is generated. The wrapper appends a
  `_NodeMark` with the node's FX origins to the lines. Without it: which
  lines belong to which node is unknown.
- ``CppScheduling.flush`` (``_inductor/codegen/cpp.py``) writes the call of a
  CPU kernel group (``kernel_group.scheduled_nodes``: the nodes generated
  since the last flush). It runs after the *next* node's ``enter_context``
  (an extern kernel's), so a group's call sits under the next node's mark.
  The wrapper brackets the flush with a `_FlushMark` (the group's own nodes)
  and a `_FlushEnd`. Without it: a block's residual-add kernel is counted in
  the next block. (The Triton flush writes nothing; its nodes' calls follow
  their marks.)
- ``PythonWrapperCodegen.run_wrapper_ir_passes`` (``codegen/wrapper.py``)
  plans memory on the lines just before they become text. The wrapper takes
  the marks out first (so memory planning sees exactly the lines it would
  see without us), runs it, hands the kernels it found to the placer, and
  inserts the placer's lines at their indices (planning replaces lines in
  place and only drops trailing ones, so indices stay valid), and its header
  lines after the wrapper's ``header``.

Which FX nodes a kernel came from: a scheduler node's IR nodes carry
``get_origins()``, every FX node whose lowering made them, including the
nodes Inductor inlined into them. An extern kernel's origins include the
unrealized inputs inlined into its arguments (a Linear's ``mm`` lists the
norm before it), so an extern kernel is taken from its own FX node,
``get_origin_node()``, where Inductor recorded one (`_kernel`).

Which module an FX node came from: Dynamo records the module calls running
when a node was traced in ``node.meta["nn_module_stack"]`` (key -> (path
as Dynamo's source names it, e.g. ``L['self'].transformer.h.0``, class)).
AOTAutograd copies a forward node's stack to the backward nodes of the same
``seq_nr`` as ``meta["fwd_nn_module_stack"]`` (``_functorch/_aot_autograd/
utils.py``); pattern rewrites keep ``nn_module_stack`` but not that, and
gradient-accumulation adds carry neither. These are data, not code: a torch
that stopped recording them would compile, and the rules would select
nothing (and warn so).

The FX graph cache (``codecache.py``) stores the generated wrapper, and its
key covers neither the wrapper's code generation nor the nodes' module
stacks (two blocks with the same graph share an entry). AOTAutograd's cache
(``_functorch/_aot_autograd/autograd_cache.py``) keys by the Dynamo graph
and the Inductor config alike. A custom post-grad pass that does nothing,
whose ``uuid()`` names the spec, the graph's module stacks and the build of
nvtx_regions (`cache_key_pass`, `module_digest`; the backend's key), makes an
annotated graph and a plain one, graphs of different modules, and wrappers of
different builds, separate entries of both caches (their keys include
``config.post_grad_custom_post_pass.uuid()``).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from .inductor_origins import (
    Origin, called_module, graph_module_stacks, model_modules, model_tensors, module_digest, module_path, module_paths,
    node_origin, static_nodes,
)  # fmt: skip
from .inductor_reaches import TESTED_TORCH, UnsupportedTorchError, check_reaches
from . import installs
from .installs import Undo

__all__ = [
    "TESTED_TORCH", "UnsupportedTorchError", "check_reaches", "Origin", "WrapperKernel", "Placement",
    "install", "uninstall", "placing", "cache_key_pass", "compile_fx", "compile_fx_inner",
    "inductor_config", "mode_options", "module_path", "module_digest", "module_paths", "called_module",
    "graph_module_stacks", "model_modules", "model_tensors", "no_python_wrapper",
]  # fmt: skip


def no_python_wrapper(kwargs: dict[str, Any], config: Any) -> str | None:
    """Why a graph that ``compile_fx_inner`` compiles with `kwargs` and Inductor's `config` gets no
    Python wrapper, or None: ``cpp_wrapper`` (AOTInductor too) or ``fx_wrapper`` (2.8, 2.11, 2.14)."""
    if bool(kwargs.get("cpp_wrapper")) or bool(config.cpp_wrapper) or bool(getattr(config, "fx_wrapper", False)):
        return "cpp_wrapper/AOTInductor (or fx_wrapper) generates no Python wrapper to place them in"
    return None


def may_replay_cuda_graphs(patches: dict[str, Any], example_inputs: Any) -> bool:
    """Whether Inductor may capture a graph compiled with the options `patches` and these inputs as a
    CUDA graph, whose replays run its kernels without its Python wrapper: CUDA graphs asked for
    (``mode="reduce-overhead"`` is the option ``triton.cudagraphs``; or that config) and an input on a
    CUDA device. Inductor captures no graph whose inputs are all on the CPU, and decides for the
    others as it compiles (``cudagraph_post_compile``: 2.8, 2.11, 2.14), where the graphs it does not
    capture run their wrapper every call."""
    from torch._inductor import config

    if not patches.get("triton.cudagraphs", config.triton.cudagraphs):
        return False
    return any(getattr(tensor, "is_cuda", False) for tensor in example_inputs)


def compile_fx(*args: Any, **kwargs: Any) -> Any:
    """``torch._inductor.compile_fx.compile_fx``: what ``torch.compile(backend="inductor")`` runs (2.11, 2.14)."""
    from torch._inductor.compile_fx import compile_fx as inductor

    return inductor(*args, **kwargs)


def compile_fx_inner(*args: Any, **kwargs: Any) -> Any:
    """``compile_fx_inner``: compiles one forward or backward graph, through the FX graph cache (2.11, 2.14).
    Its keyword ``is_backward`` says which; ``cpp_wrapper`` whether a C++ wrapper is generated."""
    from torch._inductor.compile_fx import compile_fx_inner as inner

    return inner(*args, **kwargs)


def inductor_config() -> Any:
    """``torch._inductor.config`` (2.11, 2.14): options such as ``cpp_wrapper`` and ``triton.cudagraphs``."""
    from torch._inductor import config

    return config


def mode_options(mode: str | None) -> dict[str, Any]:
    """The Inductor options of a ``torch.compile`` mode (``torch._inductor.list_mode_options``, 2.11, 2.14):
    ``"reduce-overhead"`` is ``{"triton.cudagraphs": True}``."""
    if mode is None or mode == "default":
        return {}
    from torch._inductor import list_mode_options

    return dict(list_mode_options(mode))


@dataclass(frozen=True)
class WrapperKernel:
    """One kernel call of a generated wrapper: its lines are ``first``..``last`` of the planned lines."""

    name: str  # as the wrapper calls it: ``cpp_fused_add_0``, ``extern_kernels.addmm``, ``aten.mm``
    origins: tuple[Origin, ...]
    first: int
    last: int


@dataclass(frozen=True)
class Placement:
    """What the placer adds to one wrapper: lines before/after planned line indices, header lines,
    lines first in ``call``, and the global whose ``close_after(traceback)`` a ``try``/``except``
    around the other lines calls when they raise (`error`: the except clause's name)."""

    before: dict[int, list[str]]
    after: dict[int, list[str]]
    header: list[str]
    prelude: list[str]
    guard: str
    error: str


@dataclass
class _Active:
    phase: str
    place: Callable[[list[WrapperKernel]], Placement | None]


class _NodeMark:
    __slots__ = ("origins",)

    def __init__(self, origins: tuple[Any, ...]) -> None:
        self.origins = origins


class _FlushMark(_NodeMark):
    __slots__ = ()


class _FlushEnd:
    __slots__ = ()


_state = threading.local()


@contextmanager
def placing(phase: str, place: Callable[[list[WrapperKernel]], Placement | None]) -> Iterator[None]:
    """While on, the wrappers generated on this thread get `place`'s lines (`install` must have run)."""
    previous = getattr(_state, "active", None)
    _state.active = _Active(phase, place)
    try:
        yield
    finally:
        _state.active = previous


def _active() -> _Active | None:
    return getattr(_state, "active", None)


def _node_origins(node: Any) -> tuple[Any, ...]:
    """The FX nodes a scheduler node came from, in graph order (what ``enter_context`` reads, 2.11, 2.14)."""
    found: dict[Any, None] = {}
    for part in node.get_nodes():
        if part.node is not None:
            for origin in part.node.get_origins():
                found[origin] = None
    return tuple(found)


PLACEMENT = "Inductor's code generation"  # the change's name in `installs`


def install() -> None:
    """Wrap the three Inductor methods (see the module doc), one change of `installs`; once until it is
    put back. `uninstall` puts it back."""
    installs.make(PLACEMENT, _wrap)


def _wrap(undo: Undo) -> None:
    check_reaches()
    from torch._inductor.codegen.cpp import CppScheduling
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen
    from torch._inductor.scheduler import Scheduler
    from torch._inductor.virtualized import V

    enter_context = Scheduler.enter_context
    flush = CppScheduling.flush
    passes = PythonWrapperCodegen.run_wrapper_ir_passes

    def marked_enter_context(self: Any, node: Any) -> None:
        if _active() is not None:
            V.graph.wrapper_code.lines.append(_NodeMark(_node_origins(node)))
        return enter_context(self, node)

    def marked_flush(self: Any) -> None:
        if _active() is None:
            return flush(self)
        lines = V.graph.wrapper_code.lines
        found: dict[Any, None] = {}
        for node in self.kernel_group.scheduled_nodes:
            found.update(dict.fromkeys(_node_origins(node)))
        lines.append(_FlushMark(tuple(found)))
        try:
            return flush(self)
        finally:
            lines.append(_FlushEnd())

    def placed_passes(self: Any, is_inference: bool) -> None:
        active = _active()
        if active is None or type(self) is not PythonWrapperCodegen:
            self.lines = [line for line in self.lines if not isinstance(line, (_NodeMark, _FlushEnd))]
            return passes(self, is_inference)
        kernels = _split(self, active.phase)
        passes(self, is_inference)
        placement = active.place(kernels)
        if placement is not None:
            _insert(self, placement)

    undo.setattr(Scheduler, "enter_context", marked_enter_context)
    undo.setattr(CppScheduling, "flush", marked_flush)
    undo.setattr(PythonWrapperCodegen, "run_wrapper_ir_passes", placed_passes)


def uninstall() -> None:
    """Restore the three methods `install` wrapped."""
    installs.put_back(PLACEMENT)


def _kernel(line: Any) -> tuple[str, tuple[Any, ...] | None] | None:
    """The kernel a wrapper line calls and, for an extern kernel, the FX node it is the result of;
    None for a line that calls none (memory planning, comments).

    An extern kernel's ``origins`` hold every FX node inlined into its arguments: a Linear's
    ``mm`` lists the norm that feeds it, so by its origins it belongs to their common parent.
    Its ``origin_node`` is the node whose lowering made it (2.11, 2.14: set by
    ``ir.assign_origin_node`` for a result that is not a view; None for a fallback's
    multi-output kernel, which keeps its origins).
    """
    from torch._inductor.codegen import wrapper

    if isinstance(line, wrapper.KernelCallLine):
        return line.kernel_name, None
    if isinstance(line, (wrapper.ExternKernelOutLine, wrapper.ExternKernelAllocLine)):
        node = line.node
        name = getattr(node, "python_kernel_name", None) or node.get_kernel_name()
        own = node.get_origin_node()
        return str(name).removeprefix("torch.ops."), None if own is None else (own,)
    return None


def _split(wrapper: Any, phase: str) -> list[WrapperKernel]:
    """Take the marks out of `wrapper.lines` and return its kernel calls with their origins."""
    kept: list[Any] = []
    kernels: list[list[Any]] = []  # [name, origins, first, last]
    current: tuple[Any, ...] = ()
    outer: list[tuple[Any, ...]] = []
    run: list[Any] | None = None  # the kernel of the current run of lines, once it calls one
    start = 0  # where the current run of lines (since the last mark) starts
    for line in wrapper.lines:
        if isinstance(line, (_NodeMark, _FlushEnd)):
            if isinstance(line, _FlushMark):
                outer.append(current)
                current = line.origins
            elif isinstance(line, _NodeMark):
                current = line.origins
            else:
                current = outer.pop() if outer else ()
            run, start = None, len(kept)
            continue
        called = _kernel(line)
        index = len(kept)
        kept.append(line)
        if called is not None and run is None:
            name, own = called
            run = [name, own or current, start, index]
            kernels.append(run)
        elif run is not None:
            run[3] = index
    wrapper.lines = kept
    origins_of: dict[Any, Origin] = {}
    static_in: dict[int, set[Any]] = {}

    def convert(nodes: tuple[Any, ...]) -> tuple[Origin, ...]:
        out = []
        for node in nodes:
            if node not in origins_of:
                static = False
                graph = getattr(node, "graph", None)
                if graph is not None:
                    if id(graph) not in static_in:
                        static_in[id(graph)] = static_nodes(graph, phase)
                    static = node in static_in[id(graph)]
                origins_of[node] = node_origin(node, phase, static)
            out.append(origins_of[node])
        return tuple(out)

    # A kernel's lines run from the mark before it (its allocations, its comment) to the
    # next mark (its asserts, the frees after it).
    return [WrapperKernel(name, convert(nodes), first, last) for name, nodes, first, last in kernels]


def _insert(wrapper: Any, placement: Placement) -> None:
    """`placement`'s lines into `wrapper`: its ``call`` body becomes the prelude, then ``try:`` and
    the body with the range lines, then the ``except`` (pseudo-lines that indent: `WrapperLine`
    codegen into the body's `IndentedBuffer`, 2.11 and 2.14)."""
    from torch._inductor.codegen.wrapper import WrapperLine

    class Try(WrapperLine):
        def codegen(self, code: Any) -> None:
            code.writeline("try:")
            code.do_indent()

    class Except(WrapperLine):
        def codegen(self, code: Any) -> None:
            code.do_unindent()
            code.writeline(f"except BaseException as {placement.error}:")
            code.do_indent()
            code.writeline(f"{placement.guard}.close_after({placement.error}.__traceback__)")
            code.writeline("raise")
            code.do_unindent()

    for line in placement.header:
        wrapper.header.writeline(line)
    if not placement.before and not placement.after:
        return
    lines = wrapper.lines
    out: list[Any] = [*placement.prelude, Try()]
    for index, line in enumerate(lines):
        out.extend(placement.before.get(index, ()))
        out.append(line)
        out.extend(placement.after.get(index, ()))
    for index in sorted(i for i in (*placement.before, *placement.after) if i >= len(lines)):
        # Memory planning dropped trailing lines: what was to follow them goes last.
        out.extend(placement.before.get(index, ()))
        out.extend(placement.after.get(index, ()))
    wrapper.lines = [*out, Except()]


def cache_key_pass(key: str, theirs: Any = None) -> Any:
    """A do-nothing post-grad pass whose ``uuid()`` is `key` (with `theirs`'s, a user's own pass,
    which it runs): set as ``post_grad_custom_post_pass``, it keys the FX graph cache by the spec."""
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class NvtxRegionsCacheKey(CustomGraphPass):
        def __call__(self, graph: Any) -> None:
            if theirs is not None:
                theirs(graph)

        def uuid(self) -> Any:
            if theirs is None:
                return key
            inner = theirs.uuid() if isinstance(theirs, CustomGraphPass) else None
            return None if inner is None else (key, inner)

    return NvtxRegionsCacheKey()
