"""Reaches into Dynamo's and AOTAutograd's run time: how a compiled graph is called, its autograd
node, Dynamo's recompile limit, the profiler calls it drops, and the frames Dynamo skips.

Checked on torch 2.11 and 2.14 (`inductor_reaches.TESTED_TORCH`); each entry says what breaks
without it.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from . import installs
from .installs import Undo

__all__ = [
    "around", "backward_node", "handle_markers", "called_while_traced", "marked_outside_dynamo", "on_backward",
    "recompile_limit_hits",
    "run_outside_dynamo", "traced_function", "traced_self", "tracing_for", "whole_frame",
]  # fmt: skip


def around(compiled: Any, before: Callable[[tuple[Any, ...]], Any] | None, after: Callable[[Any, Any], None]) -> Any:
    """`compiled` (what ``compile_fx`` returned) called with `before(args)` first (unless None) and
    `after(outputs, what before returned)` last (outputs None where the call raised). Dynamo calls it with the graph's inputs as
    positional arguments (2.11, 2.14: ``compile_fx``'s result boxes them itself).

    The function returned calls what `compiled` wraps: ``compile_fx``'s result is a
    ``torch._dynamo.disable`` wrapper, which sets the eval frame on each call (2.8, 2.11, 2.14.1).
    Dynamo wraps what a backend returns in its own (``OutputGraph``), and for a plain compile unwraps
    the inner one (``innermost_fn``), so each call sets it once; and the function returned, marked
    (`run_outside_dynamo`), runs what it calls outside Dynamo wherever it is called."""
    from torch._dynamo.eval_frame import innermost_fn

    compiled = innermost_fn(compiled)
    if before is None:

        def run_then(*args: Any) -> Any:
            outputs = compiled(*args)
            after(outputs, None)
            return outputs

        return run_outside_dynamo(run_then)

    def run(*args: Any) -> Any:
        token = before(args)
        try:
            outputs = compiled(*args)
        except BaseException:
            after(None, token)  # a call cut short (activation checkpointing stops its recompute so)
            raise
        after(outputs, token)
        return outputs

    return run_outside_dynamo(run)


def on_backward(outputs: Any, hook: Callable[[], None]) -> bool:
    """Call `hook` on the thread that runs the backward of this call of a compiled graph, just before
    its compiled backward runs: a pre-hook of its node (`backward_node`). False where there is none
    (nothing needs a gradient)."""
    node = backward_node(outputs)
    if node is None:
        return False
    node.register_prehook(run_outside_dynamo(lambda grad_outputs: hook()))
    return True


def backward_node(outputs: Any) -> Any:
    """The autograd node that runs the compiled backward of this call of a compiled graph (whose
    `outputs` these are): AOTAutograd's ``CompiledFunctionBackward``, which the graph's outputs that
    need a gradient share, and which is the current node (`internals.autograd`) while that backward
    runs (2.8, 2.11, 2.14.1). None where no output has it (nothing needs a gradient)."""
    for output in outputs if isinstance(outputs, (list, tuple)) else (outputs,):
        node = getattr(output, "grad_fn", None)
        if node is not None and node.name() == "CompiledFunctionBackward":
            return node
    return None


_limit_callbacks: list[Callable[[str, Any, str], None]] = []


def recompile_limit_hits(callback: Callable[[str, Any, str], None]) -> None:
    """Call ``callback(limit name, its value, the user's function)`` (`traced_function`'s name) each
    time Dynamo gives up compiling a function because it hit a recompile limit (after which the
    function runs eagerly); a callback listens once, however often it is passed.

    Heard where Dynamo decides it, not from its log, which the user's log level can silence
    (``torch._logging.set_logs(dynamo=logging.ERROR)``): the module global
    ``exceeds_recompile_limit(cache_size, compile_id)`` of ``torch._dynamo.convert_frame``, called by
    ``_compile``'s ``_compile_inner`` with the frame's ``code`` in its locals (2.8, 2.11, 2.14.1), is
    wrapped, one change of `installs`; the closure is ``_compile``'s argument (`_compile_closure`). Without it, a
    model past the limit runs without ranges and nothing says so."""
    installs.make("the wrapped torch._dynamo.convert_frame.exceeds_recompile_limit", _wrap_recompile_limit)
    if callback not in _limit_callbacks:
        _limit_callbacks.append(callback)


def _wrap_recompile_limit(undo: Undo) -> None:
    import sys

    from torch._dynamo import config, convert_frame

    original = convert_frame.exceeds_recompile_limit

    @functools.wraps(original)  # its signature too, which `inductor_reaches` checks
    def exceeds_recompile_limit(*args: Any, **kwargs: Any) -> Any:
        exceeded, limit = result = original(*args, **kwargs)
        code = sys._getframe(1).f_locals.get("code") if exceeded else None
        if code is not None:
            function = _user_function(code, _compile_closure())
            for listener in list(_limit_callbacks):
                listener(str(limit), getattr(config, str(limit), None), function)
        return result

    undo.setattr(convert_frame, "exceeds_recompile_limit", run_outside_dynamo(exceeds_recompile_limit))
    undo.then(_limit_callbacks.clear)


def _compile_closure() -> Any:
    """The ``closure`` argument of the ``_compile`` of torch/_dynamo/convert_frame.py that runs on
    this thread, up the stack (2.8, 2.11, 2.14.1: a parameter; 2.8's translator does not keep it),
    or None outside it."""
    import sys

    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_compile" and frame.f_code.co_filename.endswith("convert_frame.py"):
            return frame.f_locals.get("closure")
        frame = frame.f_back
    return None


def _user_function(code: Any, closure: Any) -> str:
    """The user's function that Dynamo compiles as `code` (with `closure`, its cells), named with its
    file and line: ``Block.forward (/path/model.py:12)``. Where `code` is Dynamo's own wrapper
    (``external_utils.wrap_inline``'s ``inner``, which ``torch.compile`` of a module compiles where it
    skips the module's forward itself, 2.8 to 2.14.1), the function or module it wraps, from its
    closure: else every module would be named ``'inner' (torch/_dynamo/external_utils.py:67)``."""
    if code.co_filename.endswith("external_utils.py"):
        for cell in closure or ():
            wrapped = getattr(cell, "cell_contents", None)
            inner = _code_of(getattr(wrapped, "forward", wrapped))
            if inner is not None:
                code = inner
                break
    return f"{getattr(code, 'co_qualname', code.co_name)} ({code.co_filename}:{code.co_firstlineno})"


def outside_compiles(put_on: Callable[[], None], take_off: Callable[[], None]) -> Callable[[], None]:
    """Call `take_off()` as each Dynamo compile starts and `put_on()` as it ends, from the compile under
    way now (if any: its end puts on) until the function returned is called. So hooks put on this way are
    never traced into a graph, and Dynamo adds no guard on them: they run only where code runs in
    Python. Through ``torch._dynamo.callback.callback_handler``'s start and end callbacks, which Dynamo
    runs around each frame it compiles (2.8, 2.11, 2.14.1; a compile inside another runs them once)."""
    from torch._dynamo.callback import callback_handler

    def start(_: Any) -> None:
        take_off()

    def end(_: Any) -> None:
        put_on()

    callback_handler.register_start_callback(run_outside_dynamo(start))
    callback_handler.register_end_callback(run_outside_dynamo(end))

    def stop() -> None:
        for remove, callback in ((callback_handler.remove_start_callback, start), (callback_handler.remove_end_callback, end)):
            try:
                remove(callback)
            except ValueError:  # stopped already
                pass

    return stop


# The code of every function `run_outside_dynamo` marked: what the tests walk (`marked_outside_dynamo`).
_marked: set[Any] = set()


def run_outside_dynamo(function: Callable[..., Any]) -> Callable[..., Any]:
    """`function` itself, marked so that Dynamo's frame evaluation never compiles it, nor anything it
    calls, where it runs in Python: the one way every hook and callback nvtx_regions installs is made.

    ``torch._C._dynamo.eval_frame.set_code_exec_strategy(code, FrameExecStrategy(SKIP, SKIP))`` on its
    code object (2.8, 2.11, 2.14.1: what ``torch._dynamo.eval_frame.skip_code`` does for the frame
    alone, and Dynamo itself for a frame past its recompile limit): the frame runs as Python, and the
    frames it calls run with Dynamo's eval frame off, as under ``torch.compiler.disable``, at no cost
    per call (the mark is on the code). A hook's closures share one code object.

    Dynamo still traces through `function` where code it compiles calls it (a module hook inside a
    compiled forward): each hook returns at once there, on ``torch.compiler.is_compiling()`` first.

    Without it, a hook that runs in Python inside a compiled call (the compiled model's own forward
    hooks run so; a module's hooks across a graph break too) has Dynamo compile what it calls as
    frames of their own: with ``fullgraph=True`` one that Dynamo cannot trace (a generator, a weak
    dictionary's ``values()``) raises in the user's call, and without it each costs a compile that
    makes no graph."""
    from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy

    code = _code_of(function)
    if code not in _marked:
        set_code_exec_strategy(code, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP))
        _marked.add(code)
    return function


def marked_outside_dynamo(function: Any) -> bool:
    """Whether `function` (a function, a bound method, or an object whose ``__call__`` is one) was
    made by `run_outside_dynamo`."""
    return _code_of(function) in _marked or _code_of(type(function).__call__) in _marked


def _code_of(function: Any) -> Any:
    """The code object of a function or a bound method (None for anything else)."""
    return getattr(function, "__code__", None) or getattr(getattr(function, "__func__", None), "__code__", None)


def _translator() -> Any:
    from torch._dynamo import symbolic_convert

    return getattr(symbolic_convert.tls, "current_tx", None)


def traced_function() -> str | None:
    """The function whose frame Dynamo is tracing on this thread (a backend is called while it
    does), as `recompile_limit_hits` names it (`_user_function`); None outside Dynamo's tracing."""
    tx = _translator()
    code = None if tx is None else getattr(tx, "f_code", None)
    return None if code is None else _user_function(code, _compile_closure())


def traced_self() -> Any:
    """The first argument of the frame that the Dynamo trace in progress on this thread compiles (the
    module whose ``forward`` it is, for a compiled module), or None. The outermost translator (the end
    of the inlining translators' ``parent`` chain) keeps the frame's real locals in ``f_locals`` (2.8,
    2.11, 2.14). Without it, the warning that a plain ``torch.compile`` traces eager hooks could not
    name the module."""
    tx = _translator()
    while getattr(tx, "parent", None) is not None:
        tx = tx.parent
    code, f_locals = getattr(tx, "f_code", None), getattr(tx, "f_locals", None)
    if code is None or not code.co_argcount or not isinstance(f_locals, dict):
        return None
    return f_locals.get(code.co_varnames[0])


def called_while_traced(function: Callable[[], Any]) -> Callable[[], Any]:
    """`function` (no arguments), which Dynamo, tracing a call to it, calls for real and whose result it
    takes as a constant: ``torch._dynamo.assume_constant_result`` (2.8, 2.11, 2.14; no graph break, no
    guard). Without it, code run under Dynamo could not tell, at trace time, what is being traced."""
    import torch

    return torch._dynamo.assume_constant_result(function)


def whole_frame(gm: Any) -> bool:
    """Whether `gm`, handed to a backend now, is the whole code of the frame Dynamo traces: the frame's
    own code (not a resume function after a graph break, ``torch_dynamo_resume_in_...``) traced to its
    return, no graph break cutting it (``gm.compile_subgraph_reason.graph_break``, set by Dynamo's
    ``OutputGraph`` before it calls the backend: 2.8, 2.11, 2.14). Without it, a module compiled on its
    own (``layer.compile()``) could not have its own call's range in its graph."""
    reason = getattr(gm, "compile_subgraph_reason", None)
    tx = _translator()
    code = None if tx is None else getattr(tx, "f_code", None)
    if reason is None or code is None or getattr(reason, "graph_break", True):
        return False
    return not code.co_name.startswith("torch_dynamo_resume_in_")


def tracing_for() -> Any:
    """The backend that the Dynamo trace in progress on this thread compiles for, unwrapped (the object
    passed as ``torch.compile(backend=)``), or None outside Dynamo's tracing.

    Dynamo keeps the translator it is running in ``symbolic_convert.tls.current_tx`` and the
    backend in its ``output.compiler_fn``, wrapped by ``WrapBackendDebug`` (``_torchdynamo_orig_backend``;
    ``_torchdynamo_orig_callable`` on 2.8),
    ``torch.compile``'s ``_TorchCompileWrapper`` (``compiler_fn``) and, under DDP, the
    ``DDPOptimizer``'s ``compile_fn`` (its ``backend_compile_fn``) (2.8, 2.11, 2.14). Without it, what
    nvtx_regions does while Dynamo traces (the user's markers kept in the graph, ``record_function``
    captured) would change every other model's ``torch.compile`` too."""
    tx = _translator()
    backend = None if tx is None else getattr(tx.output, "compiler_fn", None)
    for _ in range(8):  # a few wrappers deep at most
        inner = getattr(backend, "_torchdynamo_orig_backend", None) or getattr(backend, "_torchdynamo_orig_callable", None)
        if inner is None and type(backend).__name__ == "_TorchCompileWrapper":
            inner = backend.compiler_fn
        if inner is None and getattr(backend, "__name__", None) == "compile_fn":
            inner = getattr(getattr(backend, "__self__", None), "backend_compile_fn", None)
        if inner is None:
            return backend
        backend = inner
    return backend


def handle_markers(
    undo: Undo, traced: dict[Any, Callable[..., Any]], keeps: Callable[[], bool], met: dict[Any, Callable[[], None]]
) -> None:
    """Where Dynamo traces for a backend that keeps the user's markers (`keeps()`, asked as it meets one),
    each call in the code it traces of a function or class ``f`` of another library (``torch.cuda.nvtx``'s
    and the nvtx package's markers) calls ``traced[f]`` instead, with the same arguments; for any other
    backend, ``f`` as before, with the same graph break. Nothing of those libraries is replaced, so the
    guards of other code that Dynamo compiled, which check those functions, stay true: no recompile of
    theirs; and a reference taken before (``from nvtx import push_range``) is traced the same.

    Through the one place where Dynamo traces a call written in the code (its ``CALL`` instructions):
    ``InstructionTranslatorBase.call_function(fn, args, kwargs)``, which reads the callee from the
    variable `fn` as ``fn.fn`` (a Python function) or else ``fn.value`` (a torch function, a class, a
    Cython function) and calls ``fn.call_function`` (2.8, 2.11, 2.14.1). It is wrapped, recorded in
    `undo`: it looks the callee up by identity (one dict look-up per call Dynamo traces) and, for one of
    `traced` while `keeps()`, calls the stand-in's variable, made by ``SourcelessBuilder.create`` (no
    guard); for every other call it goes on as before. Calls Dynamo makes itself (a ``with``
    statement's ``__enter__``) are not seen: a stand-in returns its own context manager.

    `met`: functions Dynamo traces as it would, ``met[f]()`` called where it meets a call of ``f``
    while `keeps()` (``record_function``, which 2.8's Dynamo drops: heard where Dynamo traces it, not
    from its log, which the user's log levels and handlers can silence)."""
    from torch._dynamo.symbolic_convert import InstructionTranslatorBase
    from torch._dynamo.variables.builder import SourcelessBuilder

    by_id = {id(function): (function, stand_in, None) for function, stand_in in traced.items()}
    by_id.update({id(function): (function, None, heard) for function, heard in met.items()})
    call = InstructionTranslatorBase.call_function

    @functools.wraps(call)  # its signature too, which `inductor_reaches` checks
    def call_function(tx: Any, fn: Any, args: Any, kwargs: Any) -> Any:
        callee = fn.fn if hasattr(fn, "fn") else getattr(fn, "value", None)  # as Dynamo reads it there
        found = by_id.get(id(callee))
        if found is not None and found[0] is callee and keeps():
            _, stand_in, heard = found
            if heard is not None:
                heard()
            else:
                fn = SourcelessBuilder.create(tx, stand_in)
        return call(tx, fn, args, kwargs)

    undo.setattr(InstructionTranslatorBase, "call_function", call_function)
