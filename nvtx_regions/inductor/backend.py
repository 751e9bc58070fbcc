"""`NvtxInductor`: a ``torch.compile`` backend that compiles with Inductor and puts a spec's
NVTX ranges into the Python wrapper Inductor generates, after fusion.

    model = torch.compile(model, backend=NvtxInductor("each module <transformer.h.*>"))

Promises:
- The compile is Inductor's (``compile_fx``, with `options` as ``torch.compile(options=)`` takes
  them): same kernels, same graph breaks (none added), same numerics. The wrapper only gains the range lines.
- One backend object serves every graph ``torch.compile`` hands it (graph breaks, recompiles) and
  the forward and backward graph of each.
- Messages, domain, categories and colours are those of ``nvtx_regions.eager.annotate`` and
  ``NvtxProfileTransform`` for the same spec (``transformer.h.0``, ``transformer.h.0 (backward)``):
  an Inductor profile compares with an eager or a thunder one module by module.
- Inductor's caches (FX graph, AOTAutograd) key the graph by the spec, the domain, the graph's module
  stacks and this build of nvtx_regions too (a do-nothing post-grad pass whose ``uuid()`` names them),
  so a cache hit returns code with this spec's ranges for these modules, placed by this build, and a
  plain ``torch.compile`` never gets them.
- Every ``torch.compile`` option gives the default mode's ranges, but: without a Python wrapper
  (``cpp_wrapper``/AOTInductor) a graph gets none; a CUDA graph (``mode="reduce-overhead"``) runs
  its wrapper only to warm up and record. One `NvtxRegionsWarning` says either.
- Made on a torch that lacks a part of Inductor it reaches into, it raises `UnsupportedTorchError`
  naming what is missing (`internals.inductor_reaches`).
- Rules with no meaning under Inductor are left out, named once in one `NvtxRegionsWarning`
  (`inductor.check`, `selection.support`); rules that select nothing in any graph compiled so far
  warn once. ``strict=True`` makes either a `SelectorError`, raised where the caller can catch it:
  by the compiled model's call (or its backward), not inside Dynamo's compile.
- What each rule selected is counted from what each wrapper's header says as
  it loads (`placement`): the warnings, ``strict`` and `explain` are the same
  whether Inductor compiled a graph or its cache served it.
- Never a wrong name. Where Dynamo compiled a submodule's code on its own (a
  graph break inside it), one graph serves every instance of that class: its
  ranges are named per call after the instance it runs for
  (`inductor.instances`). Where that instance cannot be known, the graph gets no
  range, and one warning names the module, the reason and the way out. A module
  call that runs outside every graph (it spans a graph break, or Dynamo runs
  its caller uncompiled) gets its ``each`` ranges from hooks (`inductor.outside`).
- The model's own markers (``torch.cuda.nvtx.range_push``/``range_pop``/``range``,
  ``nvtx.annotate``/``push_range``/``pop_range``, ``torch.profiler.record_function``) cause
  no graph break, ``fullgraph=True`` too: they come out in the wrapper around the kernels of
  the ops they were around, in their own domain and sink (`placement`), and Inductor compiles
  the graph without them (the kernels of a plain ``torch.compile``). ``each marker <...>``
  re-emits them in `emit`'s sinks too. A marker that cannot be carried (pushed in one graph
  and popped in another, a message not known when compiling) is left out, named in a warning
  (`internals.compiled_markers`).
- Without a spec, the spec is ``each module <**>``, as for `compile` and `annotate`.
- One owner per model: a backend given a model (`model=`, `adopt`) takes it, and an annotation of it
  comes off (and the other way round): each range once (`runtime.handle.take_model`).
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..runtime.handle import SpecHandle
from ..core.errors import NvtxRegionsWarning, SelectorError
from ..core.naming import DEFAULT_DOMAIN, class_name
from ..core.profiling import DEFAULT_SELECT
from ..internals import compiled_markers, dynamo, marker_nodes
from ..internals import inductor as internals
from ..internals.autograd import autograd_internals
from ..internals.frames import outside_package
from ..language.parse import given_spec, spec_from_arguments
from ..runtime.clock import watch_step_gates
from ..runtime.domain import Domain
from ..language.tree import render
from ..selection.plan import Plan, make_plan
from ..runtime.ranges import name_backward, set_instance
from ..runtime.sinks import chosen_sinks
from .check import check_spec, left_out_message
from .instances import FrameRoot, Models, frame_root, same_class, structure
from .kernels import KernelView, inside_call, kernel_view, rebase, view_from_literal, view_literal
from . import dynamo_events, loaded
from .loaded import build_digest
from .outside import EveryModel, above
from .placement import placement

if TYPE_CHECKING:
    from ..selection.explanation import Explanation

__all__ = ["NvtxInductor", "PlacedGraph"]


@dataclass(frozen=True)
class PlacedGraph:
    """One graph this backend placed ranges in (in this process): its kernels and its plan."""

    number: int  # the graph's number among those torch.compile gave this backend
    view: KernelView
    plan: Plan


CUDA_GRAPHS = (
    "CUDA graphs (mode='reduce-overhead', triton.cudagraphs) replay the graphs Inductor captures without their Python "
    "wrappers, so their ranges come only in the calls that warm up and record each CUDA graph, not in its replays (a "
    "graph it does not capture gets its ranges every call). Compile without mode='reduce-overhead' for a range on every call"
)


class NvtxInductor(SpecHandle):
    """A ``torch.compile`` backend: Inductor, with the ranges of `select` (spec text) and/or `spec`
    (a ``.nvtx`` file) in the generated wrapper (see the module doc); with neither, ``each module <**>``.

    `domain`: the NVTX domain (None: NVTX's default one). `emit`: where the ranges go,
    ``"nvtx"``, ``"record_function"`` (torch.profiler) or both (`runtime.sinks`; None:
    ``$NVTX_REGIONS_EMIT``, else NVTX). `options`: Inductor
    options, as ``torch.compile(options=)``. `model`: the model ``torch.compile``
    compiles (`nvtx_regions.compile` passes it): module paths are then its
    ``named_modules()`` paths even where Dynamo compiles a submodule's
    ``forward`` on its own after a graph break; without it, paths start at the
    compiled frame's module. `graphs` lists what was placed.
    """

    keeps_user_markers = True  # Dynamo keeps the user's markers in what it traces for us (`compiled_markers`)

    def __init__(
        self,
        select: str | None = None,
        *,
        spec: Any = None,
        domain: str | None = DEFAULT_DOMAIN,
        strict: bool = False,
        options: dict[str, Any] | None = None,
        model: Any = None,
        emit: Any = None,
    ) -> None:
        if model is not None and not callable(getattr(model, "named_modules", None)):
            raise TypeError(
                f"NvtxInductor(model=...) takes the torch.nn.Module that torch.compile compiles, for its module "
                f"paths; got {type(model).__name__}. Pass the module, or leave model out when compiling a function"
            )
        internals.check_reaches()
        # Before Dynamo traces: the user's markers then stay in its graphs (`compiled_markers`).
        compiled_markers.install()
        sinks = chosen_sinks(emit, where="NvtxInductor")
        parsed = given_spec(select, spec, default=DEFAULT_SELECT, where="NvtxInductor", strict=strict, stacklevel=2)
        self.hold(check_spec(parsed, strict=strict, stacklevel=2), Domain(domain, sinks), strict=strict)
        watch_step_gates(self.compiled.rules)
        self.spec = parsed
        self.options = dict(options or {})
        # The models compiled, weakly (`adopt`); their module paths name the ranges.
        self._models = Models()
        # The model's paths name the ranges too (they decide a message where the frame is a submodule's).
        self._tree = None if model is None else structure(model)
        self.graphs: list[PlacedGraph] = []
        self._calls: dict[tuple[str, str], int] = {}  # (Dynamo's module call key, its path there) -> call number
        self._graph_numbers = 0
        self._lock = threading.Lock()
        self.removed = False
        self._said: set[str] = set()  # what was already warned about (once each)
        self.notes: list[str] = []  # what those warnings said: what got no range, and why
        self._first_calls: set[int] = set()  # the graphs called at least once
        self._carried: dict[int, tuple] = {}  # per graph number: the user's markers its Dynamo graph carried
        self._unreported = False  # a graph loaded since the rules' selections were last said
        self._first_call: tuple[int, str | None] | None = None  # the first call's graph and instance
        self.live_until_exit()
        text = "\n".join(render(rule) for rule in parsed.rules)
        tree = self._tree or ""
        digest = hashlib.sha256(f"{build_digest()}\0{domain!r}\0{self.sinks}\0{text}\0{tree}".encode()).hexdigest()[:24]
        self.cache_key = f"nvtx_regions:{digest}"
        loaded.register(self.cache_key, self)
        # Per model: the hooks that give its calls outside every graph (a graph break) their ranges, shared
        # by the backends of this key (a backend per layer).
        self.outside = EveryModel.of(self.cache_key, self, self.compiled, domain, self.sinks)
        if model is not None:
            self.adopt(model)
        dynamo_events.watch()

    @property
    def _paths(self) -> dict[str, str] | None:
        return None if self._tree is None else self._models.paths

    def adopt(self, model: Any) -> None:
        """Compile `model` too, a model of the structure (module paths and classes) of the one this
        backend was made for: Dynamo then reuses for it the code compiled for the others, as for a
        plain ``torch.compile``, and its ranges are named the same. Held weakly: its hooks and names
        go with it. Raises `ValueError` for a model of another structure."""
        if self._tree is None or structure(model) != self._tree:
            raise ValueError(
                f"{self!r}.adopt(): {type(model).__name__} has other module paths or classes than the model this "
                "backend was made for; make a backend for it: NvtxInductor(..., model=that_model)"
            )
        self._models.add(model)
        self.outside.take(model, self, lambda text: self._say("uncompiled", f"{self!r}: {text}"))

    def let_go(self, model: Any) -> None:
        """An annotation or another backend took `model`: its hooks of this backend come off (its graphs
        keep their ranges)."""
        self.outside.discard(model)

    def __repr__(self) -> str:
        return f"NvtxInductor({'; '.join(render(r) for r in self.spec.rules)!r}, domain={self.domain_name!r})"

    def __deepcopy__(self, memo: dict[int, Any]) -> NvtxInductor:
        # One backend serves every graph, and what it placed is its record: a copy (lightning
        # deep-copies torch.compile's arguments) is the same backend.
        return self

    def __call__(self, gm: Any, example_inputs: Any, *, mode: str | None = None, options: dict | None = None) -> Any:
        """Compile one Dynamo graph with Inductor, placing the ranges in its forward and backward wrappers.

        `mode` and `options` are what ``torch.compile(backend=..., mode=, options=)`` passes on;
        `options` adds to (and overrides) the constructor's.
        """
        if self.removed:  # Inductor's compile, nothing placed (the user's markers are dropped)
            patches = {**internals.mode_options(mode), **self.options, **(options or {})}
            return internals.compile_fx(gm, example_inputs, config_patches=patches)
        internals.install()
        dynamo_events.compiled_for_us(self)
        taken = marker_nodes.take_markers(gm)
        for problem in taken.problems:
            self._say(
                f"marker:{problem.where}",
                f"{self!r}: the marker at {problem.where} gets no range under torch.compile: {problem.why}. Push "
                "and pop it in the same compiled function with a message known when compiling (a str), or run "
                "that code eagerly (torch.compiler.disable)",
            )
        config = internals.inductor_config()
        patches = {**internals.mode_options(mode), **self.options, **(options or {})}
        if internals.may_replay_cuda_graphs(patches, example_inputs):
            self._say("cuda graphs", f"{self!r}: {CUDA_GRAPHS}")
        theirs = patches.get("post_grad_custom_post_pass", config.post_grad_custom_post_pass)
        key = f"{self.cache_key}:{internals.module_digest(gm)}"
        patches["post_grad_custom_post_pass"] = internals.cache_key_pass(key, theirs)
        with self._lock:
            number = self._graph_numbers
            self._graph_numbers += 1
            self._carried[number] = taken.markers
        frame = None if self._tree is None else frame_root(gm, example_inputs, self._models)
        # A module's call compiled on its own, to its return (`layer.compile()`): its range is in its graph.
        whole = frame is not None and frame.why_not is None and dynamo.whole_frame(gm)
        self.outside.compiling(dynamo.traced_self() if whole else None, whole)

        def inner_compile(graph: Any, inputs: Any, **kwargs: Any) -> Any:
            phase = "backward" if kwargs.get("is_backward") else "forward"
            if self._cannot_place(kwargs, config):
                return internals.compile_fx_inner(graph, inputs, **kwargs)
            inference = bool(kwargs.get("is_inference"))
            place = lambda kernels: self._place(number, phase, kernels, inference, frame, whole)  # noqa: E731
            with internals.placing(phase, place), loaded.compiling_as(self, number):
                return internals.compile_fx_inner(graph, inputs, **kwargs)

        with loaded.compiling_as(self, number):
            compiled = internals.compile_fx(gm, example_inputs, inner_compile=inner_compile, config_patches=patches)
        if frame is None or frame.fixed or frame.why_not is not None:
            frame = None
        before = None if frame is None else functools.partial(self._before, frame)
        return dynamo.around(compiled, before, functools.partial(self._after, number))

    def remove(self) -> None:
        """Emit no range from now on: the wrappers compiled for this backend run on without theirs and
        its hooks on the calls outside every graph come off (unless another `NvtxInductor` alive, of
        the same spec and model, shares them: its key), and graphs compiled from now on get none.
        Nothing more is said at exit. Removing twice is harmless."""
        if self.removed:
            return
        self.removed = True
        loaded.release(self)
        self.outside.release(self)
        self.release_installs()

    def _before(self, frame: FrameRoot, args: tuple[Any, ...]) -> str | None:
        """Before a call of a graph whose code serves several module instances: the one it runs for,
        which the call's forward code takes (`set_instance`) and `_after` gives its backward."""
        instance = frame.instance(args)
        if instance is None:
            self._say(
                f"unknown:{frame.cls}",
                f"{self!r}: a graph of {frame.cls}.forward (compiled on its own) ran for a {frame.cls} of none of "
                "the models this backend was given, so its calls get no NVTX range: compile each model with "
                "nvtx_regions.compile, or give it to the backend (NvtxInductor(model=...), adopt())",
            )
        set_instance(instance)
        return instance

    def _after(self, number: int, outputs: Any, instance: str | None) -> None:
        """After a call of graph `number`: its backward's instance; and when to say what each rule
        selected in the graphs loaded since it was last said: at the end of the backward of a graph's
        first call, or at the next call of the very first graph called, for the same module (a step
        went by). The same moment whether Inductor compiled the graphs or its cache served them."""
        if instance is not None and outputs is not None:
            node = dynamo.backward_node(outputs)
            if node is not None:
                name_backward(node, instance)
        if outputs is None:  # the call raised
            return
        if number not in self._first_calls:
            self._first_calls.add(number)
            dynamo.on_backward(outputs, self._at_backward_end)
        if self._first_call is None:
            self._first_call = (number, instance)
        elif self._unreported and self._first_call == (number, instance):
            self._complete()  # the first call again: a step went by (a model without backward)

    def _at_backward_end(self) -> None:
        autograd_internals().queue_callback(dynamo.run_outside_dynamo(self._complete))

    def _complete(self) -> None:
        self._unreported = False
        outsides = self.outside.all()
        if outsides and self.graphs:
            # What no graph holds ran outside torch.compile (or was not called): hooks from now on. The
            # graphs of every backend of this key count (a backend per layer: the others' layers).
            seen = self.outside.in_graphs
            self.outside.need(path for path in outsides[0].selected if path and path not in seen)
        self.outside.first_step_over()
        if "no wrapper" in self._said and not self.graphs:
            return  # no graph could hold a range (a C++ wrapper): said once already
        # The calls that ran outside every graph had their ranges from hooks: their rules selected.
        for rules in self.outside.ranges_from_hooks().values():
            for rule in rules:
                self.tally.ranges[rule] = max(self.tally.ranges[rule], 1)
        self._report()

    def _say(self, what: str, message: str) -> None:
        """Warn `message` once per `what` for this backend."""
        with self._lock:
            if what in self._said:
                return
            self._said.add(what)
            self.notes.append(message.removeprefix(f"{self!r}: "))
        warnings.warn(message, NvtxRegionsWarning, stacklevel=outside_package())

    def _cannot_place(self, kwargs: dict[str, Any], config: Any) -> bool:
        """Whether this graph gets no Python wrapper run per call (warning once if so)."""
        why = internals.no_python_wrapper(kwargs, config)
        if why is not None:
            self._say("no wrapper", f"{self!r}: no NVTX range can be placed in this graph: {why}; it compiles without "
                      "ranges. Compile without that option to get the ranges")  # fmt: skip
        return why is not None

    def _place(self, number: int, phase: str, kernels: list[Any], inference: bool, frame: FrameRoot | None, whole: bool) -> Any:
        """The lines a wrapper gains: its ranges, and a header that reports its view as it loads.
        `whole`: the graph is the whole call of `frame`'s root, whose range it then holds too."""
        view = kernel_view(kernels, phase, f"graph {number} ({phase})", self._calls, self._paths)  # type: ignore[arg-type]
        root = None if frame is None or frame.why_not is not None else frame.root
        if whole and frame is not None:
            view = inside_call(view, frame.root, frame.cls)
        views = self._views(view, frame)
        plans = [make_plan(self.compiled, v, self.domain_name) for v in views]
        left_out = frame.why_not if frame is not None else None
        report = (self.cache_key, number, phase, inference, root, left_out, view_literal(view), whole)
        if left_out is not None:
            return placement(Plan(phase, view.name, (), ()), view, self.compiled, self.domain_name, report=report, sinks=self.sinks)  # type: ignore[arg-type]
        instances = None
        if frame is not None and not frame.fixed:
            instances = {instance: (p, v) for instance, v, p in zip(frame.candidates, views, plans)}
        return placement(plans[0], views[0], self.compiled, self.domain_name, report=report, instances=instances, sinks=self.sinks)

    def _views(self, view: KernelView, frame: FrameRoot | None) -> list[KernelView]:
        """`view` as each module instance that runs its graph sees it (`inductor.instances`)."""
        if frame is None or frame.fixed:
            return [view]
        if frame.why_not is not None:
            return []
        return [rebase(view, frame.root, instance, f"{view.name} as {instance}") for instance in frame.candidates]

    def _loaded(self, report: tuple) -> None:
        """A wrapper of this backend's loaded (compiled now, or served by the cache): count what each
        rule selected in it, and say what was left out (see the module doc)."""
        _, number, phase, inference, root, left_out, literal, whole = report
        number = loaded.current_number(self, number)
        view = view_from_literal(literal)
        view.name = f"graph {number} ({phase})"
        frame = None
        model = self._models.any()
        if root is not None and model is not None:
            modules = dict(internals.model_modules(model))
            candidates = same_class(modules, root)
            frame = FrameRoot(root, class_name(type(modules[root])) if candidates else "?", candidates)
        views = [view] if frame is None else self._views(view, frame)
        if phase == "forward":
            self._around_no_kernel(number, view)
        if left_out is not None:
            views = []
            self._say(f"left out:{left_out}", f"{self!r}: {left_out_message(root, view, left_out)}")
        if frame is not None and self._tree is not None:
            # The root's calls span the graph break (unless its graph is its whole call), and so do the
            # calls of every module above it.
            self.outside.need(p for c in frame.candidates for p in above(c) if not (whole and p in frame.candidates))
        with self._lock:
            for v in views:
                plan = make_plan(self.compiled, v, self.domain_name)
                self.graphs.append(PlacedGraph(number, v, plan))
                self.tally.add(plan, v)
            self._unreported = True
        if views:
            self.outside.held(call.path for v in views for op in v.ops if op.chain for call in op.chain)

    def _around_no_kernel(self, number: int, view: KernelView) -> None:
        """Say which markers of graph `number` no kernel of its forward `view` is inside."""
        seen = {marker for op in view.ops for marker in op.markers}
        for marker in self._carried.get(number, ()):
            if marker not in seen:
                self._say(
                    f"no kernel:{marker.place}",
                    f"{self!r}: the marker {marker_nodes.describe(marker)} at {marker.place} is around no kernel "
                    "of the compiled graph (Inductor compiled its ops to none: views, constants, or ops it removed), "
                    "so it gets no range: put it around ops that compute",
                )

    def _report(self) -> None:
        # At run time (`_after`), outside Dynamo's compile, which would wrap a SelectorError in its own.
        where = "the graphs compiled so far"
        if self._tree is None and any(placed.view.classes for placed in self.graphs):  # a module's part compiled
            where += (" (this NvtxInductor was given no model=, so module paths start at the module each graph "
                      "compiles; NvtxInductor(spec, model=model) names them from the whole model)")  # fmt: skip
        self.say_unselected(where, stacklevel=3)

    @classmethod
    def report_at_exit(cls, handles: list[Any]) -> None:
        """Say what each rule selected in the graphs loaded since it was last said (a model called once,
        without gradients)."""
        for backend in handles:
            if backend._unreported:
                try:
                    backend._complete()
                except SelectorError as error:
                    warnings.warn(str(error), NvtxRegionsWarning, stacklevel=1)

    def explain(
        self, select: str | None = None, *, spec: str | os.PathLike[str] | None = None, max_ops: int = 12
    ) -> Explanation:
        """What each rule of this backend's spec (or of `select`/`spec`) selected in each graph placed
        so far (`inductor.explain`); ``str()`` of it reads as a report."""
        from .explain import explain_graphs

        return explain_graphs(self, spec_from_arguments(select, spec), max_ops=max_ops)
