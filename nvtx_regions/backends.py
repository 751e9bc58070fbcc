"""One line that chooses how a model runs and puts the spec's NVTX ranges in it.

    import nvtx_regions
    model = nvtx_regions.compile(model, "each module <transformer.h.*>", backend="thunder")
    for step in nvtx_regions.steps(range(10)):
        loss = model(idx, targets)[1]
        loss.backward()

`compile` gives, for the same spec and with the same range names:

- ``"eager"``: the model itself, with `nvtx_regions.annotate` hooks
  (``model.nvtx_regions_backend.remove()`` takes the hooks off, and compiling the model again
  replaces them);
- ``"thunder"``: ``thunder.jit(model, transforms=[NvtxProfileTransform(...)])``
  (lightning-thunder is an optional dependency: ``pip install 'nvtx_regions[thunder]'``);
- ``"inductor"``: ``torch.compile(model, backend=NvtxInductor(...))``.

On every backend what it returns carries the spec's handle (`runtime.handle.SpecHandle`: the
annotation, the transform, the backend) as ``nvtx_regions_backend``: ``.explain()`` on it, or
`nvtx_regions.explain` on what was returned, says what each rule selected.

The backend may be left to ``nvtx-regions profile``, which runs the script
once per backend with ``NVTX_REGIONS_BACKEND`` set (and the spec in
``NVTX_REGIONS_SPEC``), so the script needs no branch per backend.

`steps` marks each training step with a range, ``step 0``, ``step 1``, ...,
so that a report tells the compile step and other warm-up steps from the
measured ones, the same way for every backend.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from .runtime.handle import HANDLE
from .core.naming import DEFAULT_DOMAIN
from .core.errors import SelectorError, SelectorSyntaxError
from .core.profiling import BACKENDS, DEFAULT_SELECT, ENV_BACKEND, ENV_SPEC
from .language.parse import load

__all__ = ["compile", "steps", "default_backend", "BACKENDS", "ENV_BACKEND", "ENV_SPEC", "DEFAULT_SELECT"]

T = TypeVar("T")


def default_backend() -> str:
    """The backend when neither ``backend=`` nor ``$NVTX_REGIONS_BACKEND`` names one: ``"inductor"``
    (``torch.compile``), whether or not lightning-thunder is installed; thunder runs only when named."""
    return "inductor"


def _backend(backend: str | None) -> str:
    chosen = backend if backend is not None else os.environ.get(ENV_BACKEND) or default_backend()
    if chosen not in BACKENDS:
        where = "backend=" if backend is not None else f"${ENV_BACKEND}="
        raise ValueError(f"nvtx_regions.compile(): {where}{chosen!r} is not a backend; choose one of {', '.join(BACKENDS)}")
    if backend is not None and os.environ.get(ENV_BACKEND) and os.environ[ENV_BACKEND] != backend:
        raise ValueError(
            f"nvtx_regions.compile(): backend={backend!r}, but ${ENV_BACKEND} asks for {os.environ[ENV_BACKEND]!r} "
            "(nvtx-regions profile sets it for each run); leave backend= unset so that the command chooses"
        )
    return chosen


def _spec_from_environment() -> str | None:
    """The spec file ``$NVTX_REGIONS_SPEC`` names (None where it is not set), checked now so that an
    error names the variable: an empty value, or a file that cannot be read."""
    value = os.environ.get(ENV_SPEC)
    if value is None:
        return None
    if not value.strip():
        raise SelectorError(
            f"${ENV_SPEC} is set but empty: name a .nvtx spec file there, or unset it for the default spec, {DEFAULT_SELECT!r}"
        )
    try:
        load(value)
    except SelectorSyntaxError:
        raise  # it names the file, its line and column
    except SelectorError as error:
        raise SelectorError(f"${ENV_SPEC}={value!r}: {error}") from None
    return value


def compile(
    model: Any,
    select: str | None = None,
    *,
    spec: str | os.PathLike[str] | None = None,
    backend: str | None = None,
    domain: str | None = DEFAULT_DOMAIN,
    strict: bool = False,
    thunder: Mapping[str, Any] | None = None,
    inductor: Mapping[str, Any] | None = None,
    emit: Any = None,
    within: Any = None,
) -> Any:
    """`model` compiled by `backend`, with the NVTX ranges the spec selects; returns what to call.

    select, spec, domain, strict, emit: as for `NvtxProfileTransform` (`emit`: where the ranges
    go, ``"nvtx"``, ``"record_function"`` for torch.profiler, or both). With neither
    `select` nor `spec`, the spec is the file in ``$NVTX_REGIONS_SPEC`` when
    set (``nvtx-regions profile`` sets it), else ``each module <**>``; an empty
    value, or a file that cannot be read, is a `SelectorError` naming the variable.
    backend: ``"eager"``, ``"thunder"`` or ``"inductor"``; None takes
    ``$NVTX_REGIONS_BACKEND``, else `default_backend()`: ``"inductor"``, even
    where lightning-thunder is installed (thunder runs only when named). A backend given here that
    differs from ``$NVTX_REGIONS_BACKEND`` is a `ValueError`: the command's
    run would otherwise measure another backend than it names.
    thunder: keyword arguments of ``thunder.jit`` (its ``transforms`` run
    before ours); inductor: keyword arguments of ``torch.compile``, where
    ``options`` goes to the Inductor backend. Only the chosen backend's are
    used, so one call serves every backend. Eager has no compiler and no
    arguments. A rule the chosen backend cannot express (eager: rules that
    select trace ops, such as `op in` and `between`) is left out with one
    `NvtxRegionsWarning` naming it (`strict=True`: `SelectorError`), and the
    rest of the spec runs.
    ``thunder.jit`` and ``torch.compile`` compile on the model's first call,
    so the first step is the compile step.
    within: the whole model, where `model` is a part of it compiled on its own (a layer, as
    ``model.layers[i] = nvtx_regions.compile(layer, spec, within=model)``; Inductor only): the
    ranges carry the whole model's paths (``model.layers.0.mlp``, not the part's ``mlp``), and
    every part compiled with the same `within` and spec shares one backend, as Dynamo needs.
    """
    chosen = _backend(backend)
    if within is not None:
        _check_within(model, within, chosen)
    if select is None and spec is None:
        spec = _spec_from_environment()
        select = DEFAULT_SELECT if spec is None else None
    if chosen == "eager":
        from .emission.eager import annotate

        annotate(model, select, spec=spec, domain=domain, strict=strict, emit=emit)
        return model
    if chosen == "thunder":
        from .internals.versions import require_thunder

        thunder_module = require_thunder("nvtx_regions.compile(backend='thunder')")
        from .emission.transform import NvtxProfileTransform, compiled_by

        arguments = dict(thunder or {})
        ours = NvtxProfileTransform(select, spec=spec, domain=domain, strict=strict, emit=emit)
        arguments["transforms"] = [*(arguments.get("transforms") or ()), ours]
        jitted = thunder_module.jit(model, **arguments)
        compiled_by(ours, jitted)  # so that the exit warning can tell thunder's failure from a misplaced transform
        _hang(jitted, ours)
        return jitted
    import torch

    arguments = dict(inductor or {})
    options = arguments.pop("options", None)
    # A function (torch.compile takes those too) has no module tree of its own to name paths by.
    tree = within if within is not None else model if isinstance(model, torch.nn.Module) else None
    compiler = _shared_backend(tree, select, spec=spec, domain=domain, strict=strict, options=options, emit=emit)
    compiled = torch.compile(model, backend=compiler, **arguments)
    _hang(compiled, compiler)
    if within is None and tree is not None and callable(getattr(tree, "generate", None)):
        object.__setattr__(compiled, "generate", _generate(tree, compiler, arguments))
    return compiled


def _check_within(model: Any, within: Any, backend: str) -> None:
    """`ValueError` unless `within` is a module that holds `model`, for the Inductor backend."""
    if backend != "inductor":
        raise ValueError(
            f"nvtx_regions.compile(within=...) names the parts of a model compiled one by one with Inductor; "
            f"backend={backend!r} takes the whole model: nvtx_regions.compile(model, spec, backend={backend!r})"
        )
    modules = getattr(within, "modules", None)
    if not callable(modules) or not any(module is model for module in modules()):
        raise ValueError(
            f"nvtx_regions.compile(within=...): the {type(within).__name__} given does not hold the "
            f"{type(model).__name__} compiled; pass the whole model that the part belongs to"
        )


def _generate(model: Any, compiler: Any, arguments: dict[str, Any]) -> Any:
    """`model.generate` (Hugging Face's, or any other that calls the model) with the model's
    ``forward`` compiled by `compiler`, as Hugging Face compiles for generation
    (``model.forward = torch.compile(model.forward)``).

    Without it, ``compiled.generate`` reaches the wrapped model's ``generate``, which calls the
    model uncompiled: no range. Hugging Face's own compile of the forward is turned off
    (``disable_compile=True``): it would compile around ours, and Dynamo ignores a compiled function
    inside another's compile, ranges and all."""
    import functools

    import torch

    forward = None

    @functools.wraps(model.generate)
    def generate(*args: Any, **kwargs: Any) -> Any:
        nonlocal forward
        if forward is None:
            forward = torch.compile(model.forward, backend=compiler, **arguments)
        if hasattr(model, "generation_config"):  # Hugging Face's generate, which takes the option
            kwargs.setdefault("disable_compile", True)
        own = vars(model).get("forward")
        model.forward = forward
        try:
            return model.generate(*args, **kwargs)
        finally:
            if own is None:
                del model.forward
            else:
                model.forward = own

    return generate


# The backends `compile` made, weakly, by what they were made with: models of one structure compiled
# with the same spec and options share one, so Dynamo reuses its code for each of them, as it does
# for a plain torch.compile, instead of compiling again per backend object (its BACKEND_MATCH guard)
# and giving up past its recompile limit.
_backends: "weakref.WeakValueDictionary[tuple, Any]" = weakref.WeakValueDictionary()


def _shared_backend(model: Any, select: str | None, *, spec: Any, options: Any, **kwargs: Any) -> Any:
    """The `NvtxInductor` for `model` (None: a function) with these arguments: one made before for a
    model of the same structure, alive and not removed, else a new one."""
    from .inductor import NvtxInductor
    from .internals.inductor import model_modules
    from .runtime.sinks import chosen_sinks

    if model is None:
        return NvtxInductor(select, spec=spec, options=options, emit=kwargs.pop("emit"), **kwargs)
    text = None
    if spec is not None:
        try:
            text = Path(spec).read_bytes()
        except OSError:
            text = None  # NvtxInductor says what is wrong with it
    structure = tuple((path, type(module)) for path, module in model_modules(model))
    sinks = chosen_sinks(kwargs["emit"], where="nvtx_regions.compile")
    key = (select, None if spec is None else os.fspath(spec), text, kwargs["domain"], kwargs["strict"], sinks,
           repr(sorted((options or {}).items())), structure)  # fmt: skip
    found = _backends.get(key) if text is not None or spec is None else None
    if found is not None and not found.removed:
        found.adopt(model)
        return found
    backend = NvtxInductor(select, spec=spec, options=options, model=model, **kwargs)
    _backends[key] = backend
    return backend


def _hang(compiled: Any, handle: Any) -> None:
    """Put `handle` on what `compile` returns, never on the user's model: ``OptimizedModule`` (and
    thunder's module) forward ``setattr`` to the model they wrap, so a second compile of the same
    model would otherwise give the first one's result the second one's handle."""
    object.__setattr__(compiled, HANDLE, handle)


def steps(iterable: Iterable[T], *, domain: str | None = DEFAULT_DOMAIN, emit: Any = None) -> Iterator[T]:
    """Each item of `iterable`, the loop body around it inside an NVTX range ``step N`` (N from 0).

    While item N's body runs, the step clock (`runtime.clock`) is at N: the
    ``steps a..b`` gates of every backend read it, so step N is this loop's
    N-th iteration whatever the backend compiles or recompiles meanwhile.
    The range is pushed before an item is handed out and popped when the loop
    asks for the next one, or when it ends (``break`` and exceptions too:
    the generator is closed then). Its NVTX category is ``nvtx_regions.steps``
    (one row in a per-rule summary). In torch.profiler (``emit="record_function"``)
    the range is named as torch's own ``profile.step()`` names a step,
    ``ProfilerStep#N``, so that HTA and TensorBoard find each step as an iteration. `domain`: the spec's NVTX domain, so that
    ``nvtx-regions profile`` (and nsys's domain filter) sees the steps; `emit`: where they go,
    as for `compile` (None: ``$NVTX_REGIONS_EMIT``, else NVTX). Ranges
    that a failed eager backward left open in the step are closed before it ends.
    """
    from .runtime.clock import StepLoop
    from .runtime.domain import Domain, calls_of
    from .runtime.ranges import close_left_open
    from .runtime.sinks import chosen_sinks

    marks = Domain(domain, chosen_sinks(emit, where="steps"))
    calls = calls_of(marks)
    loop = StepLoop()
    try:
        for number, item in enumerate(iterable):
            loop.at(number)
            calls.push(marks.step_attributes(number), calls.domain_argument)
            try:
                yield item
            finally:
                close_left_open()  # what a failed eager backward left open, inside this step
                calls.pop()
    finally:
        loop.close()
