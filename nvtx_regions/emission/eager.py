"""A spec's ranges on the module calls of an eager `torch.nn.Module`, as hooks.

    import nvtx_regions
    with nvtx_regions.annotate(model, "each module <transformer.h.*>"):
        model(idx, targets)[1].backward()

Which module gets which range comes from the same engine as on the thunder
and Inductor backends: `compile_spec`, then `make_plan` over the view of the
model's module tree (`emission.eager_view`), one view per pass. So the ranges
have the messages, nesting, domain, colours and categories that
`NvtxProfileTransform` and `NvtxInductor` give the same spec, and an eager
profile compares with a thunder or an Inductor one range by range
(``nvtx-regions compare``). A forward range is the module's path
(``transformer.h.0``; the root module's class name); its backward range adds
``" (backward)"``.

Eager runs ``each module <...>`` and ``each class <...>`` rules, joined with
``and`` to ``forward`` / ``backward``, to ``module <...>`` / ``class <...>``
(only modules at or below a matching path in ``model.named_modules()``) and
to the run-time gates ``rank in <...>`` and ``steps a..b`` (read as each module
call starts, for its forward and the backward that follows it). An
``each marker <...>`` rule adds nothing: the model's own markers run in eager
as written, which is what the thunder side re-emits. Rules that select ops of
a trace are left out, with one `NvtxRegionsWarning` naming them
(`selection.support`; ``strict=True``: `SelectorError`), and the rest runs.

How the ranges are made, and the promises that follow (the module-hook front
end, `runtime.module_ranges`, which `NvtxInductor` shares for the calls that
run outside its graphs):
- forward: a forward pre-hook pushes, a forward hook registered with
  ``always_call=True`` pops, so a module that raises still pops its range;
- backward, without torch's full backward hooks (they wrap every input and
  output in a Python autograd function, and cost 9 to 14% of a launch-bound GPU
  step), from pre-hooks on autograd nodes (`runtime.backward_hooks`): the range
  opens when the node that computed the call's outputs is about to run, and
  closes when the call's own backward is done: each tensor argument that needs
  a gradient reaches the call as an alias (``tensor[...]``, one C++ autograd
  node), whose node runs once this call has given it all its gradient. So
  siblings that read one input (a gated MLP's ``gate`` and ``up``, attention's
  ``q``, ``k`` and ``v``, experts, a norm and the residual add beside it) close
  each in turn, none around another; the range of the call that consumed an
  output closes before the range of the call that produced it opens. A tensor
  nested in an argument (a tuple, a list, a dict) ends the range where its
  whole gradient is done. A call none of whose inputs needs a gradient
  (an embedding of token ids, usually the root) keeps its range open until the
  range around it closes or the backward ends;
- a module called twice per step (shared weights) gets two ranges each way;
- ranges nest, and the NVTX stack of each thread stays balanced: ranges a
  failed backward (or an interrupted forward) left open on a thread are popped
  at the root's next forward call on that thread, at the end of a `nvtx_regions.steps` step, or
  by `remove()`;
- gates (``steps a..b``, ``rank in <...>``) read the one step clock
  (`runtime.clock`), as on every backend;
- `remove()` removes every module hook, and restores each module's hook
  dicts exactly; hooks already on autograd nodes of a graph not yet run
  backward do nothing more than open and close an empty range;
- under Dynamo the hooks do nothing, so they never break a graph of a plain
  ``torch.compile`` (a layer compiled on its own, say): the module calls
  inside compiled code get no range from them, and one `NvtxRegionsWarning`
  per annotation names the compiled module and the way to their ranges
  (nvtx_regions' backend). Dynamo never compiles a hook as a frame of its
  own (`internals.dynamo.run_outside_dynamo`), so a hook that runs outside
  compiled code, around a compiled module, keeps its range.

On CUDA, autograd runs backward on its own threads: the backward ranges are
pushed and popped there (their gates were read at the forward, by the one
clock), and ranges a failed backward left there are popped there before the
next backward's first range (`runtime.hook_ranges`).
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from ..core.errors import NvtxRegionsWarning
from ..runtime.handle import HANDLE, SpecHandle, take_model
from ..core.naming import DEFAULT_DOMAIN, class_name, module_call_name, range_message
from ..core.profiling import DEFAULT_SELECT
from ..language.parse import given_spec, spec_from_arguments
from ..language.tree import render
from ..selection.compile import CompiledSpec, EachMarkerRule, compile_spec
from ..selection.explanation import Explanation, explain_views
from ..selection.plan import make_plan
from ..selection.support import report_unsupported, restrict
from .eager_view import module_views
from ..internals.compiled_markers import keeps_markers
from ..internals.dynamo import called_while_traced, run_outside_dynamo, traced_self
from ..internals.frames import outside_package
from ..internals.inductor_origins import model_modules
from ..runtime.clock import watch_step_gates
from ..runtime.domain import Domain
from ..runtime.module_ranges import HookTarget, ModuleRanges, hook_targets
from ..runtime.sinks import NVTX_ONLY, chosen_sinks

__all__ = ["annotate", "EagerAnnotation"]


class EagerAnnotation(SpecHandle):
    """The hooks `annotate` put on a model. `remove()` takes them off; also a context manager.

    `explain()` says what each rule selected; `messages` lists the ranges of a step.
    One owner per model (`runtime.handle.take_model`): it is the model's ``nvtx_regions_backend`` (what
    `nvtx_regions.explain(model)` reads, as on an Inductor-compiled model), and a new one on the
    same model removes the last one first, so a notebook cell run again does not stack hooks; an
    Inductor backend that took the model lets go of it (and the other way round, with a warning).
    """

    def __init__(
        self, model: Any, compiled: CompiledSpec, domain: str | None, *, strict: bool = False, sinks: tuple[str, ...] = NVTX_ONLY
    ) -> None:
        self.model = model
        self.hold(restrict(compiled, "eager"), Domain(domain, sinks), strict=strict)
        watch_step_gates(self.compiled.rules)
        self._traced = self._traced_hook()
        self._front = ModuleRanges(self.domain, on_traced=self._traced, alias_inputs=True)
        self._handles: list[Any] = []  # the root's pre-hook's
        self._targets: list[HookTarget] = []
        report_unsupported(self.compiled, strict=strict, stacklevel=3)
        # One owner per model: an annotation made before on it, or an Inductor backend's hooks, come off.
        take_model(model, self, stacklevel=outside_package())
        try:
            self._install()
            self._report_unselected()
        except BaseException:
            self.remove()
            raise
        setattr(model, HANDLE, self)

    # -- public ----------------------------------------------------------------

    @property
    def messages(self) -> list[tuple[str, str]]:
        """(pass, message) of every range a step emits per module call, in module order."""
        out = []
        for target in self._targets:
            name = module_call_name(target.path, class_name(type(target.module())))
            out += [("forward", range_message(name, "forward"))] * len(target.forward)
            out += [("backward", range_message(name, "backward"))] * len(target.backward)
        return out

    def explain(
        self, select: str | None = None, *, spec: str | os.PathLike[str] | None = None, max_ops: int = 12
    ) -> Explanation:
        """What each rule of this annotation's spec (or of `select`/`spec`) selects in the model's module tree."""
        given = spec_from_arguments(select, spec)
        compiled = self.compiled if given is None else restrict(compile_spec(given), "eager")
        plans = self._plans if given is None else None
        modules = len(self.views[0].ops)
        header = f"annotate({type(self.model).__name__}): {modules} module{'s' * (modules != 1)}, forward and backward"
        return explain_views(
            compiled, self.views, unit="module", plans=plans, header=header, max_ops=max_ops, domain=self.domain_name
        )

    def __repr__(self) -> str:
        return f"annotate({type(self.model).__name__}, {'; '.join(render(r) for r in self.compiled.spec.rules)!r})"

    def let_go(self, model: Any) -> None:
        """Another annotation or backend took the model: this one is removed."""
        self.remove()

    def remove(self) -> None:
        """Remove every hook and restore each module's hook state; pop ranges left open on this thread."""
        if self._front.ranges.removed:
            return
        self.removed = True
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if vars(self.model).get(HANDLE) is self:
            delattr(self.model, HANDLE)
        self._front.remove()
        self.release_installs()

    def __deepcopy__(self, memo: Any) -> EagerAnnotation:
        # A deep copy of the model (an EMA copy, say) copies its hook dicts, whose hooks are bound
        # to this annotation (a thread-local stack cannot be copied). They do nothing on the copy's
        # modules: the copy has no range until it is annotated or compiled itself.
        return self

    def __enter__(self) -> EagerAnnotation:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    # -- which modules get which ranges ---------------------------------------

    def _traced_hook(self) -> Any:
        """What the hooks call when Dynamo traces them: `_note_traced`, called for real at trace time."""
        self._traced_warned = False
        annotation = self

        def traced() -> bool:  # called for real by Dynamo, tracing a hook of this annotation
            annotation._note_traced()
            return True

        return called_while_traced(traced)

    def _install(self) -> None:
        import torch

        self._compiling = torch.compiler.is_compiling
        run_outside_dynamo(EagerAnnotation._root_pre_hook)
        self.views = module_views(self.model)
        self._plans = [make_plan(self.compiled, view, self.domain_name) for view in self.views]
        self._targets = hook_targets(self.compiled, self.views, self._plans, self.domain)
        # The root's pre-hook runs first, before any range of the root is pushed.
        self._handles.append(self.model.register_forward_pre_hook(self._root_pre_hook, prepend=True))
        for target in self._targets:
            self._front.hook(target)

    def _note_traced(self) -> None:
        """Dynamo traces a hook of this annotation: warn once, naming the compiled module, unless the
        trace is for a backend of ours (its graphs hold the spec's ranges)."""
        if self._traced_warned or keeps_markers():
            return
        self._traced_warned = True
        where = "code that calls modules of this model"
        traced = traced_self()
        if traced is not None:
            found = next((path for path, module in model_modules(self.model) if module is traced), None)
            if found is not None:
                where = f"the forward of {found or type(self.model).__name__}"
        warnings.warn(
            f"nvtx_regions.annotate({type(self.model).__name__}): Dynamo (torch.compile) compiles {where} with a "
            "backend that is not nvtx_regions', so the modules called inside what it compiles get no range from this "
            "annotation: its hooks do nothing there, as tracing them would break the graph. For their ranges, "
            "compile with nvtx_regions' backend, backend=nvtx_regions.NvtxInductor(spec, model=model) "
            "(docs/how-to/layer-by-layer.md), or nvtx_regions.compile(model, spec) in place of annotate",
            NvtxRegionsWarning,
            stacklevel=2,
        )

    def _report_unselected(self) -> None:
        """Warn (with `strict`, raise `SelectorError`) for each rule that selected no module call, as
        every backend does (`say_unselected`); `each marker` rules add nothing in eager, by design."""
        for view, plan in zip(self.views, self._plans):
            self.tally.add(plan, view)
        self.say_unselected(f"the module calls of this {type(self.model).__name__}", skip=(EachMarkerRule,), stacklevel=4)

    # -- the root's hook ------------------------------------------------------

    def _root_pre_hook(self, module: Any, args: Any) -> None:
        if self._compiling():  # under Dynamo: nothing (see the module doc)
            self._traced()
            return
        if module is self.model:  # not a deep copy's
            self._front.recover_at_root()


def annotate(
    model: Any,
    select: str | None = None,
    *,
    spec: Any = None,
    domain: str | None = DEFAULT_DOMAIN,
    strict: bool = False,
    emit: Any = None,
) -> EagerAnnotation:
    """Put NVTX ranges on the module calls of an eager `model` that the spec selects.

    `select`, `spec` (a ``.nvtx`` file) and `domain` mean what they mean for
    `NvtxProfileTransform`; with neither `select` nor `spec` the spec is
    ``each module <**>`` (every module). `emit`: where the ranges go, ``"nvtx"``,
    ``"record_function"`` (torch.profiler) or both (None: ``$NVTX_REGIONS_EMIT``, else
    NVTX). Returns an `EagerAnnotation`:
    call ``remove()`` or use it as a context manager.

    Raises `SelectorSyntaxError` for text that does not parse and
    `SelectorError` for a spec error (as every backend does). Rules that eager
    cannot express (they select ops of a trace) are left out with one
    `NvtxRegionsWarning` naming them; a rule that matches no module of
    `model` gets a `NvtxRegionsWarning` with the nearest module names.
    `strict=True` makes both a `SelectorError`, and no hooks stay.
    """
    if select is not None and not isinstance(select, str):
        raise TypeError(f"select= takes spec text (str), not {type(select).__name__}")
    if domain is not None and not isinstance(domain, str):
        raise TypeError(f"domain= takes a str or None, not {type(domain).__name__}")
    if not hasattr(model, "named_modules") or not hasattr(model, "register_forward_pre_hook"):
        raise TypeError(f"annotate() takes a torch.nn.Module, not {type(model).__name__}")
    sinks = chosen_sinks(emit, where="annotate")
    parsed = given_spec(select, spec, default=DEFAULT_SELECT, where="annotate", strict=bool(strict), stacklevel=2)
    return EagerAnnotation(model, compile_spec(parsed), domain, strict=bool(strict), sinks=sinks)
