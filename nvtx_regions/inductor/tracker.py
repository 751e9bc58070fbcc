"""Call time: what a `NvtxInductor`'s wrappers report as they load, and what each call of their code
runs for.

A wrapper's header hands its `header.GraphRecord` to `graph_loaded` when it
loads, whether Inductor compiled it now or its cache served it. The record
names its backend by the backend's cache key: the same text in every
process, so a wrapper served by the cache reaches the backend of this process
with that key. While a backend compiles, it is the one told first (two
backends of the same spec and model share a key). That backend's `Tracker`
then builds the graph's views and plans from the record, counts what each
rule selected, and says what was left out, the same on a compile and on a
cache hit.

Around each call of a graph (`internals.dynamo.around`) the tracker finds the
module instance the call runs for (`before`), names the call's backward after
it (`after`), and decides when a step went by: then what each rule selected
in the graphs loaded since is said (`complete`), and the calls that no graph
holds get hooks (`inductor.outside`).

The wrappers' ranges are kept per key, weakly, for `release`.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core.errors import NvtxRegionsWarning
from ..core.naming import class_name
from ..internals import dynamo, marker_nodes
from ..internals import inductor as internals
from ..internals.autograd import autograd_internals
from ..internals.frames import outside_package
from ..runtime.ranges import name_backward, set_instance
from ..selection.compile import CompiledSpec
from ..selection.plan import Plan, make_plan
from . import state
from .check import left_out_message
from .instances import FrameRoot, Models, instance_views, same_class
from .kernels import KernelView
from .outside import EveryModel, above

if TYPE_CHECKING:
    from ..selection.unselected import RuleTally
    from .header import GraphRecord

__all__ = ["Notices", "PlacedGraph", "Tracker", "register", "compiling_as", "current_number", "graph_loaded", "release"]


def register(key: str, backend: Any) -> None:
    """`backend` (with a ``tracker``) is told of the wrappers whose record names `key`."""
    state.backends[key] = backend
    state.alive.add(backend)


def graph_loaded(record: GraphRecord, ranges: Any) -> None:
    """Tell the backend of `record` (by its key) that its wrapper loaded, with `ranges`, its runtime
    (`runtime.ranges.GeneratedRanges`)."""
    state.loaded_ranges.setdefault(record.key, weakref.WeakSet()).add(ranges)
    current = getattr(state.compiling, "backend", None)
    backend = current if current is not None and current.cache_key == record.key else state.backends.get(record.key)
    if backend is not None:
        backend.tracker.loaded(record, current_number(backend, record.number))


def release(backend: Any) -> None:
    """`backend` is removed: unless another backend alive and not removed has its key, the wrappers
    loaded for that key emit no range from now on (`GeneratedRanges.silence`)."""
    state.alive.discard(backend)
    if state.backends.get(backend.cache_key) is backend:
        del state.backends[backend.cache_key]
    others = [b for b in state.alive if b.cache_key == backend.cache_key]
    if others:
        state.backends[backend.cache_key] = others[-1]
        return
    for ranges in list(state.loaded_ranges.pop(backend.cache_key, ())):
        ranges.silence()


def current_number(backend: Any, default: int) -> int:
    """The number of the graph `backend` is compiling on this thread, or `default`."""
    return state.compiling.number if getattr(state.compiling, "backend", None) is backend else default


class compiling_as:
    """While on, `graph_loaded` tells `backend` first, and the graph being compiled is `number`."""

    def __init__(self, backend: Any, number: int) -> None:
        self.backend, self.number = backend, number

    def __enter__(self) -> None:
        self.saved = (getattr(state.compiling, "backend", None), getattr(state.compiling, "number", None))
        state.compiling.backend, state.compiling.number = self.backend, self.number

    def __exit__(self, *exc: Any) -> None:
        state.compiling.backend, state.compiling.number = self.saved


@dataclass(frozen=True)
class PlacedGraph:
    """One graph a backend placed ranges in (in this process), as one module instance runs it: its
    kernels and its plan."""

    number: int  # the graph's number among those torch.compile gave the backend
    view: KernelView
    plan: Plan


class Notices:
    """A backend's warnings, each said once: `say` warns ``"<backend>: <text>"`` the first time for
    its `what`; `texts` keeps what was said, for `explain`."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.texts: list[str] = []
        self._said: set[str] = set()
        self._lock = threading.Lock()

    def __contains__(self, what: str) -> bool:
        return what in self._said

    def say(self, what: str, text: str) -> None:
        with self._lock:
            if what in self._said:
                return
            self._said.add(what)
            self.texts.append(text)
        warnings.warn(f"{self.prefix}: {text}", NvtxRegionsWarning, stacklevel=outside_package())


class Tracker:
    """One backend's call-time record of its graphs (see the module doc): the graphs loaded
    (`graphs`), the user's markers each carried, and the calls seen so far.

    `compiled`, `domain_name`, `tally` and `strict` are the backend's (`runtime.handle.SpecHandle`),
    `outside` its hooks for calls outside its graphs, `models` the models it was given, whose module
    paths name the ranges (None: it was given no ``model=``), and `notices` its warnings."""

    def __init__(
        self, compiled: CompiledSpec, domain_name: str | None, tally: RuleTally, strict: bool, outside: EveryModel,
        models: Models | None, notices: Notices,
    ) -> None:  # fmt: skip
        self.compiled, self.domain_name, self.tally, self.strict = compiled, domain_name, tally, strict
        self.outside, self.models, self.notices = outside, models, notices
        self.graphs: list[PlacedGraph] = []
        self.unreported = False  # a graph loaded since the rules' selections were last said
        self._carried: dict[int, tuple] = {}  # per graph number: the user's markers its Dynamo graph carried
        self._first_calls: set[int] = set()  # the graphs called at least once
        self._first_call: tuple[int, str | None] | None = None  # the first call's graph and instance
        self._lock = threading.Lock()

    def carried(self, number: int, markers: tuple) -> None:
        """Graph `number`'s Dynamo graph carried the user's `markers` (`internals.marker_nodes`)."""
        with self._lock:
            self._carried[number] = markers

    def loaded(self, record: GraphRecord, number: int) -> None:
        """A wrapper of this backend loaded (compiled now, or served by the cache) as graph `number`:
        count what each rule selected in it, and say what was left out (see the module doc)."""
        view = record.kernels(number)
        frame = None
        model = None if self.models is None else self.models.any()
        if record.root is not None and model is not None:
            modules = dict(internals.model_modules(model))
            candidates = same_class(modules, record.root)
            frame = FrameRoot(record.root, class_name(type(modules[record.root])) if candidates else "?", candidates)
        views = [view] if frame is None else instance_views(view, frame)
        if record.phase == "forward":
            self._around_no_kernel(number, view)
        if record.left_out is not None:
            views = []
            self.notices.say(f"left out:{record.left_out}", left_out_message(record.root, view, record.left_out))
        if frame is not None:
            # The root's calls span the graph break (unless its graph is its whole call), and so do the
            # calls of every module above it.
            whole = record.whole
            self.outside.need(p for c in frame.candidates for p in above(c) if not (whole and p in frame.candidates))
        with self._lock:
            for v in views:
                plan = make_plan(self.compiled, v, self.domain_name)
                self.graphs.append(PlacedGraph(number, v, plan))
                self.tally.add(plan, v)
            self.unreported = True
        if views:
            self.outside.held(call.path for v in views for op in v.ops if op.chain for call in op.chain)

    def _around_no_kernel(self, number: int, view: KernelView) -> None:
        """Say which markers of graph `number` no kernel of its forward `view` is inside."""
        seen = {marker for op in view.ops for marker in op.markers}
        for marker in self._carried.get(number, ()):
            if marker not in seen:
                self.notices.say(
                    f"no kernel:{marker.place}",
                    f"the marker {marker_nodes.describe(marker)} at {marker.place} is around no kernel "
                    "of the compiled graph (Inductor compiled its ops to none: views, constants, or ops it removed), "
                    "so it gets no range: put it around ops that compute",
                )

    def before(self, frame: FrameRoot, args: tuple[Any, ...]) -> str | None:
        """Before a call of a graph whose code serves several module instances: the one it runs for,
        which the call's forward code takes (`set_instance`) and `after` gives its backward."""
        instance = frame.instance(args)
        if instance is None:
            self.notices.say(
                f"unknown:{frame.cls}",
                f"a graph of {frame.cls}.forward (compiled on its own) ran for a {frame.cls} of none of "
                "the models this backend was given, so its calls get no NVTX range: compile each model with "
                "nvtx_regions.compile, or give it to the backend (NvtxInductor(model=...), adopt())",
            )
        set_instance(instance)
        return instance

    def after(self, number: int, outputs: Any, instance: str | None) -> None:
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
        elif self.unreported and self._first_call == (number, instance):
            self.complete()  # the first call again: a step went by (a model without backward)

    def _at_backward_end(self) -> None:
        autograd_internals().queue_callback(dynamo.run_outside_dynamo(self.complete))

    def complete(self) -> None:
        """A step went by: hooks for what no graph holds, and what each rule selected is said."""
        self.unreported = False
        outsides = self.outside.all()
        if outsides and self.graphs:
            # What no graph holds ran outside torch.compile (or was not called): hooks from now on. The
            # graphs of every backend of this key count (a backend per layer: the others' layers).
            seen = self.outside.in_graphs
            self.outside.need(path for path in outsides[0].selected if path and path not in seen)
        self.outside.first_step_over()
        if "no wrapper" in self.notices and not self.graphs:
            return  # no graph could hold a range (a C++ wrapper): said once already
        # The calls that ran outside every graph had their ranges from hooks: their rules selected.
        for rules in self.outside.ranges_from_hooks().values():
            for rule in rules:
                self.tally.ranges[rule] = max(self.tally.ranges[rule], 1)
        self._report()

    def _report(self) -> None:
        # At run time (`after`), outside Dynamo's compile, which would wrap a SelectorError in its own.
        where = "the graphs compiled so far"
        if self.models is None and any(placed.view.classes for placed in self.graphs):  # a module's part compiled
            where += (" (this NvtxInductor was given no model=, so module paths start at the module each graph "
                      "compiles; NvtxInductor(spec, model=model) names them from the whole model)")  # fmt: skip
        self.tally.report(strict=self.strict, where=where, once=True, stacklevel=3)
