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
  it loads (`tracker`): the warnings, ``strict`` and `explain` are the same
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
  the ops they were around, in their own domain and sink (`placer`), and Inductor compiles
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
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..runtime.handle import SpecHandle
from ..core.errors import NvtxRegionsWarning, SelectorError
from ..core.naming import DEFAULT_DOMAIN
from ..core.profiling import DEFAULT_SELECT
from ..internals import compiled_markers, dynamo, marker_nodes
from ..internals import inductor as internals
from ..language.parse import given_spec, spec_from_arguments
from ..runtime.clock import watch_step_gates
from ..runtime.domain import Domain
from ..language.tree import render
from ..runtime.sinks import chosen_sinks
from .check import check_spec
from .instances import Models, frame_root, structure
from . import dynamo_events, tracker
from .outside import EveryModel
from .placer import Placer
from .tracker import Notices, PlacedGraph, Tracker

if TYPE_CHECKING:
    from ..selection.explanation import Explanation

__all__ = ["NvtxInductor"]


@functools.cache
def build_digest() -> str:
    """A digest of this build of nvtx_regions: the path and bytes of every ``.py`` file of the
    package and of its grammar, read once per process.

    Any of them may decide what a wrapper gets (attribution, selection, module paths, the lines,
    what they call), so it is part of the cache key: a wrapper cached by any other build is a miss
    (a key over the files that write the lines only once replayed a wrapper with no ranges).
    """
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted([*package.rglob("*.py"), *package.glob("grammar/*.lark")]):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


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
        self.removed = False
        # The models compiled, weakly (`adopt`); their module paths name the ranges.
        self._models = Models()
        # The model's paths name the ranges too (they decide a message where the frame is a submodule's).
        self._tree = None if model is None else structure(model)
        self.notices = Notices(repr(self))
        self.live_until_exit()
        text = "\n".join(render(rule) for rule in parsed.rules)
        tree = self._tree or ""
        digest = hashlib.sha256(f"{build_digest()}\0{domain!r}\0{self.sinks}\0{text}\0{tree}".encode()).hexdigest()[:24]
        self.cache_key = f"nvtx_regions:{digest}"
        # Per model: the hooks that give its calls outside every graph (a graph break) their ranges, shared
        # by the backends of this key (a backend per layer).
        self.outside = EveryModel.of(self.cache_key, self, self.compiled, domain, self.sinks)
        # Neither holds the backend: it goes, with what it installed, when the user drops it.
        models = None if model is None else self._models  # none: paths start at each graph's frame
        self.placer = Placer(self.compiled, self.domain_name, self.sinks, self.cache_key, models)
        self.tracker = Tracker(self.compiled, self.domain_name, self.tally, self.strict, self.outside, models, self.notices)
        tracker.register(self.cache_key, self)
        if model is not None:
            self.adopt(model)
        dynamo_events.watch()

    @property
    def graphs(self) -> list[PlacedGraph]:
        """The graphs placed in this process (compiled here or served by Inductor's cache), each as
        every module instance that runs it sees it."""
        return self.tracker.graphs

    @property
    def notes(self) -> list[str]:
        """What this backend's warnings said: what got no range, and why."""
        return self.notices.texts

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
        self.outside.take(model, self, lambda text: self.notices.say("uncompiled", text))

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
        """Compile one Dynamo graph with Inductor, placing the ranges in its forward and backward wrappers
        (`placer`), and track its calls (`tracker`).

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
            self.notices.say(
                f"marker:{problem.where}",
                f"the marker at {problem.where} gets no range under torch.compile: {problem.why}. Push "
                "and pop it in the same compiled function with a message known when compiling (a str), or run "
                "that code eagerly (torch.compiler.disable)",
            )
        config = internals.inductor_config()
        patches = {**internals.mode_options(mode), **self.options, **(options or {})}
        if internals.may_replay_cuda_graphs(patches, example_inputs):
            self.notices.say("cuda graphs", CUDA_GRAPHS)
        theirs = patches.get("post_grad_custom_post_pass", config.post_grad_custom_post_pass)
        key = f"{self.cache_key}:{internals.module_digest(gm)}"
        patches["post_grad_custom_post_pass"] = internals.cache_key_pass(key, theirs)
        number = self.placer.number_next()
        self.tracker.carried(number, taken.markers)
        frame = None if self._tree is None else frame_root(gm, example_inputs, self._models)
        # A module's call compiled on its own, to its return (`layer.compile()`): its range is in its graph.
        whole = frame is not None and frame.why_not is None and dynamo.whole_frame(gm)
        self.outside.compiling(dynamo.traced_self() if whole else None, whole)

        def inner_compile(graph: Any, inputs: Any, **kwargs: Any) -> Any:
            phase = "backward" if kwargs.get("is_backward") else "forward"
            if self._cannot_place(kwargs, config):
                return internals.compile_fx_inner(graph, inputs, **kwargs)
            inference = bool(kwargs.get("is_inference"))
            place = lambda kernels: self.placer.place(number, phase, kernels, inference, frame, whole)  # noqa: E731
            with internals.placing(phase, place), tracker.compiling_as(self, number):
                return internals.compile_fx_inner(graph, inputs, **kwargs)

        with tracker.compiling_as(self, number):
            compiled = internals.compile_fx(gm, example_inputs, inner_compile=inner_compile, config_patches=patches)
        if frame is None or frame.fixed or frame.why_not is not None:
            frame = None
        before = None if frame is None else functools.partial(self.tracker.before, frame)
        return dynamo.around(compiled, before, functools.partial(self.tracker.after, number))

    def remove(self) -> None:
        """Emit no range from now on: the wrappers compiled for this backend run on without theirs and
        its hooks on the calls outside every graph come off (unless another `NvtxInductor` alive, of
        the same spec and model, shares them: its key), and graphs compiled from now on get none.
        Nothing more is said at exit. Removing twice is harmless."""
        if self.removed:
            return
        self.removed = True
        tracker.release(self)
        self.outside.release(self)
        self.release_installs()

    def _cannot_place(self, kwargs: dict[str, Any], config: Any) -> bool:
        """Whether this graph gets no Python wrapper run per call (warning once if so)."""
        why = internals.no_python_wrapper(kwargs, config)
        if why is not None:
            self.notices.say("no wrapper", f"no NVTX range can be placed in this graph: {why}; it compiles without "
                             "ranges. Compile without that option to get the ranges")  # fmt: skip
        return why is not None

    @classmethod
    def report_at_exit(cls, handles: list[Any]) -> None:
        """Say what each rule selected in the graphs loaded since it was last said (a model called once,
        without gradients)."""
        for backend in handles:
            if backend.tracker.unreported:
                try:
                    backend.tracker.complete()
                except SelectorError as error:
                    warnings.warn(str(error), NvtxRegionsWarning, stacklevel=1)

    def explain(
        self, select: str | None = None, *, spec: str | os.PathLike[str] | None = None, max_ops: int = 12
    ) -> Explanation:
        """What each rule of this backend's spec (or of `select`/`spec`) selected in each graph placed
        so far (`inductor.explain`); ``str()`` of it reads as a report."""
        from .explain import explain_graphs

        return explain_graphs(self, spec_from_arguments(select, spec), max_ops=max_ops)
