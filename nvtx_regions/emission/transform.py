"""`NvtxProfileTransform`: the thunder transform that turns a spec's plan into
push and pop bound symbols in the optimized forward and backward traces.

This module holds the configuration and thunder's entry point; the trace
rewrite is `rewrite`, and the "selected nothing" bookkeeping is
`nothing_selected`. A trace in which the spec selects nothing is returned as is.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import time
import warnings
import weakref
from dataclasses import dataclass
from typing import Any

import nvtx  # noqa: F401  (imported here so the first transform does not pay for it)

from ..internals.versions import require_thunder

require_thunder("NvtxProfileTransform (the thunder backend)")

from thunder.core.symbol import BoundSymbol  # noqa: E402
from thunder.core.trace import TraceCtx, TraceProvenance, TraceTag  # noqa: E402
from thunder.core.transform_common import Transform  # noqa: E402

from ..internals.thunder import ignored_jit_keyword
from ..attribution.recording import install_module_recorder
from ..attribution.traceview import TraceView, one_line
from ..core.calls import chain_message
from ..core.errors import NotRunYetError, NvtxRegionsWarning, SelectorError
from ..runtime.handle import SpecHandle
from ..core.naming import DEFAULT_DOMAIN
from ..language.parse import given_spec, spec_from_arguments
from ..language.tree import Spec, render
from ..selection.compile import compile_spec
from ..selection.explanation import Explanation, explain_views
from ..selection.plan import Plan, make_plan
from ..selection.support import restrict
from .nothing_selected import NothingSelectedCheck
from .rewrite import annotate_trace
from ..runtime.clock import watch_step_gates
from ..runtime.domain import Domain
from ..runtime.ranges import GeneratedRanges
from ..runtime.sinks import NVTX_ONLY, chosen_sinks

MESSAGE_STYLES = ("python", "module")

__all__ = ["NvtxProfileTransform", "TraceReport", "compiled_by", "explain_traces", "traces_of"]

# Memory stays bounded however often thunder recompiles: a transform keeps the
# reports of its latest traces; counts of ranges cover every trace.
REPORTS_KEPT = 100


@dataclass(frozen=True)
class TraceReport:
    """What the transform did to one trace."""

    trace_name: str
    phase: str
    bound_symbols: int  # in the trace it was given
    ranges: int
    ranges_per_rule: tuple[int, ...]
    seconds: float
    plan: Plan
    # (depth, message) of each range, in push order: what one call of the trace
    # emits when no gate is closed. Depth 0 is outermost within this trace; None: a start/end range.
    ranges_emitted: tuple[tuple[int | None, str], ...] = ()


class NvtxProfileTransform(Transform, SpecHandle):
    """Wrap the ops and regions a spec selects in NVTX ranges.

    Args:
        select: spec text, e.g. ``"op in <linear, nvFusion*>"`` or
            ``"attn: between t3..t9"``.
        spec: path of a ``.nvtx`` file. With both, the file's rules come first,
            then `select`'s, as if appended to the file. With neither, the spec
            is ``all``: every compute op gets a range, as thunder's own transform
            does.
        domain: NVTX domain of the ranges (default ``"nvtx_regions"``);
            ``None`` is NVTX's default domain, the one ``torch.cuda.nvtx`` uses.
        strict: raise `SelectorError` instead of warning when a rule selects
            nothing.
        messages: what a per-op range says. ``"python"`` (default): the op's
            line of Python, as thunder's transform does. ``"module"``: the
            module path and the op's name, e.g.
            ``transformer.h.0.attn.c_attn: linear``.
        emit: where the ranges go: ``"nvtx"``, ``"record_function"``
            (torch.profiler's ranges) or both, as a tuple (None:
            ``$NVTX_REGIONS_EMIT``, else NVTX). ``each marker`` ranges go
            there too.

    `reports` holds a `TraceReport` for each of the latest `REPORTS_KEPT`
    traces transformed. A copy (`copy.deepcopy`, `pickle`) is the
    configuration only and starts with no reports.

    Raises `SelectorSyntaxError` for text that does not parse and
    `SelectorError` for a spec file that cannot be read, right here.

    When a rule selects nothing, a `NvtxRegionsWarning` names it once per
    compilation: after the backward trace when one follows, else after the
    forward trace. Under ThunderFX (one transform shared by many subgraphs)
    the check waits for `check()`, since a rule may match only some
    subgraphs.
    """

    def __init__(
        self,
        select: str | None = None,
        *,
        spec: str | os.PathLike[str] | None = None,
        domain: str | None = DEFAULT_DOMAIN,
        strict: bool = False,
        messages: str = "python",
        emit: Any = None,
    ) -> None:
        if select is not None and not isinstance(select, str):
            raise TypeError(f"select= takes spec text (str), not {type(select).__name__}")
        if domain is not None and not isinstance(domain, str):
            raise TypeError(f"domain= takes a str or None, not {type(domain).__name__}")
        if messages not in MESSAGE_STYLES:
            raise ValueError(f"messages= is one of {', '.join(map(repr, MESSAGE_STYLES))}, not {messages!r}")
        self.messages = messages
        self.sinks = chosen_sinks(emit, where="NvtxProfileTransform")
        self.select = select
        self.spec_path = None if spec is None else os.fspath(spec)
        self.domain_name = domain
        self.strict = bool(strict)
        # Without a spec: `all`, a range per op, as thunder's own NVTX transform gives.
        self._setup(given_spec(select, self.spec_path, default="all", where="NvtxProfileTransform", strict=self.strict, stacklevel=2))

    def _setup(self, spec: Spec) -> None:
        """Compile `spec` and start with no traces seen (from `__init__` and from a copy)."""
        # Module attribution needs the modules running while thunder traces,
        # which starts after this (or after unpickling): record them from now on.
        install_module_recorder()
        self.spec: Spec = spec
        self.hold(restrict(compile_spec(spec), "thunder"), Domain(self.domain_name, self.sinks), strict=self.strict)
        watch_step_gates(self.compiled.rules)
        text = render(self.spec).replace("\n", "; ")
        if len(text) > 200:
            text = text[:200] + f"... ({len(self.spec.rules)} rules)"
        self._summary = json.dumps(text, ensure_ascii=False)  # for provenance
        self._marker_domains: dict[str | None, Domain] = {}  # the users' own domains of `each marker` ranges
        # The latest REPORTS_KEPT traces; the tally (`hold`) counts every trace seen.
        self.reports: collections.deque[TraceReport] = collections.deque(maxlen=REPORTS_KEPT)
        self._nothing_selected = NothingSelectedCheck(self)
        self._last_forward: TraceView | None = None
        self._copied = False  # set when this configuration is copied or pickled
        self._runtimes: weakref.WeakSet[GeneratedRanges] = weakref.WeakSet()  # of the traces annotated
        self.removed = False
        self.live_until_exit()

    @property
    def strict(self) -> bool:
        """Raise `SelectorError` instead of warning when a rule selects nothing; may be changed at any time."""
        return self._strict

    @strict.setter
    def strict(self, value: bool) -> None:
        self._strict = bool(value)

    # -- copies are configuration ---------------------------------------------

    # What nvtx_regions.compile's thunder.jit returned with this transform in it (`compiled_by`); None otherwise.
    _compiled_into: "weakref.ref[Any] | None" = None

    def __getstate__(self) -> dict[str, Any]:
        """A copy or pickle holds the configuration only: the parsed spec (a spec
        file is not read again), domain, strictness and message style. It starts unused, with
        no reports, as if just created; the original keeps its own."""
        self._copied = True
        return {"select": self.select, "spec_path": self.spec_path, "domain": self.domain_name,
                "strict": self.strict, "spec": self.spec, "messages": self.messages, "sinks": self.sinks}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.select, self.spec_path = state["select"], state["spec_path"]
        self.domain_name, self.strict = state["domain"], state["strict"]
        self.messages = state.get("messages", "python")
        self.sinks = state.get("sinks", NVTX_ONLY)
        self._setup(state["spec"])
        self._copied = True

    def __repr__(self) -> str:
        args = []
        if self.select is not None:
            args.append(repr(self.select))
        if self.spec_path is not None:
            args.append(f"spec={self.spec_path!r}")
        if self.domain_name != DEFAULT_DOMAIN:
            args.append(f"domain={self.domain_name!r}")
        if self.strict:
            args.append("strict=True")
        if self.messages != "python":
            args.append(f"messages={self.messages!r}")
        if self.sinks != NVTX_ONLY:
            args.append(f"emit={self.sinks!r}")
        return f"nvtx_regions.NvtxProfileTransform({', '.join(args)})"

    # -- thunder entry point -------------------------------------------------

    def transform_trace_post_optimization(self, trace: TraceCtx, **kwargs: Any) -> TraceCtx:
        started = time.perf_counter()
        view = TraceView.from_trace(trace)
        if view.phase == "backward":
            # thunder transforms a compilation's backward right after its forward.
            view.forward, self._last_forward = self._last_forward, None
        else:
            self._last_forward = view
        plan = make_plan(self.compiled, view, self.domain_name)
        if view.phase == "forward" and view.marker_log is not None and view.marker_log.open:
            _warn_left_open(view.marker_log.open, plan)
        if plan.empty or self.removed:
            result, emitted = trace, []
        else:
            op_message = functools.partial(self._op_message, view)
            result, emitted, runtime = annotate_trace(trace, plan, self.compiled, self.domain, op_message, self._domain_of)
            self._runtimes.add(runtime)
        seconds = time.perf_counter() - started
        if result is not trace:
            result.set_provenance(
                TraceProvenance(
                    f"nvtx_regions: {len(plan.ranges)} NVTX ranges for spec {self._summary} "
                    f"(took {seconds * 1000:.2f} milliseconds)"
                )
            )
        self.reports.append(
            TraceReport(
                view.name, view.phase, view.length, len(plan.ranges), plan.ranges_per_rule, seconds, plan, tuple(emitted)
            )
        )
        self._nothing_selected.add(view, plan, augmented_forward=TraceTag.AUGMENTED_FORWARD in trace.tags)
        return result

    def remove(self) -> None:
        """Emit no range from now on: the traces annotated so far run on without theirs, and traces
        transformed from now on are left as they are. Removing twice is harmless."""
        self.removed = True
        for runtime in list(self._runtimes):
            runtime.silence()
        self.release_installs()

    def check(self) -> None:
        """Report rules that selected nothing in any trace this transform has seen.

        Under ThunderFX, call it after the first step (once every subgraph
        has compiled); elsewhere the check runs by itself per compilation.
        """
        self._nothing_selected.check()

    @classmethod
    def report_at_exit(cls, handles: list[Any]) -> None:
        """The ThunderFX subgraphs compiled since `check()` (`emission.nothing_selected`), then the
        transforms thunder never handed a trace."""
        for transform in handles:
            transform._nothing_selected.at_exit()
        _warn_never_called(handles)

    @property
    def _traces_seen(self) -> int:
        return self._nothing_selected.traces_seen

    def explain(self, select: str | None = None, *, spec: str | os.PathLike[str] | None = None, max_ops: int = 12) -> Explanation:
        """What each rule of this transform's spec (or of `select`/`spec`) selects in the last forward
        and backward traces of the function `nvtx_regions.compile` jitted with it."""
        jitted = self._compiled_into() if self._compiled_into is not None else None
        if jitted is None:
            raise SelectorError(
                "explain(): this NvtxProfileTransform knows no function it compiled (nvtx_regions.compile records "
                "it); pass the thunder.jit function to nvtx_regions.explain instead"
            )
        given = spec_from_arguments(select, spec)
        return explain_traces(traces_of(jitted), self.spec if given is None else given, max_ops=max_ops)

    # -- internals -------------------------------------------------------------

    def _domain_of(self, name: str | None) -> Domain:
        """The `Domain` of a user's marker's domain `name`, kept for the transform's life."""
        found = self._marker_domains.get(name)
        if found is None:
            found = self._marker_domains[name] = Domain(name, self.sinks)
        return found

    def _op_message(self, view: TraceView, index: int, bsym: BoundSymbol) -> str:
        if self.messages == "python":
            return one_line(bsym)
        where = chain_message(view.module_chains[view.position_of(index)])
        return f"{where}: {bsym.sym.name}" if where else bsym.sym.name


_warned_left_open: set[tuple[str, int] | None] = set()


def _warn_left_open(markers: tuple[Any, ...], plan: Plan) -> None:
    """Warn once per line about `each marker` ranges whose marker the traced function never popped."""
    emitted = {planned.marker for planned in plan.ranges if planned.marker is not None}
    for marker in markers:
        if marker not in emitted or marker.where in _warned_left_open:
            continue
        _warned_left_open.add(marker.where)
        filename, line = marker.where or ("<unknown>", 0)
        warnings.warn_explicit(
            f"the NVTX marker {marker.message!r} is still open when the compiled function returns (the caller "
            "pops it, or nothing does); under thunder its re-emitted range ends after its last op, so that every "
            "range the transform pushes is popped in the same call",
            NvtxRegionsWarning,
            filename,
            line,
        )


def traces_of(jitted: Any) -> list[TraceCtx]:
    """The last forward trace of a ``thunder.jit`` function, and its last backward trace if any."""
    import thunder

    try:
        forward = thunder.last_traces(jitted)
    except TypeError:  # thunder: "doesn't seem to have been called yet"
        forward = None
    if not forward:
        raise NotRunYetError("explain(): the compiled function has not run yet; call it once first")
    traces = [forward[-1]]
    backward = thunder.last_backward_traces(jitted)
    if backward:
        traces.append(backward[-1])
    return traces


def explain_traces(traces: list[Any], spec: Spec, *, max_ops: int = 12) -> Explanation:
    """What each rule of `spec` selects in thunder `traces` (forward first)."""
    compiled = restrict(compile_spec(spec), "thunder")
    views: list[TraceView] = []
    for trace in traces:
        view = TraceView.from_trace(trace)
        if view.phase == "backward":
            view.forward = next((v for v in reversed(views) if v.phase == "forward"), None)
        views.append(view)
    return explain_views(compiled, views, max_ops=max_ops)


def compiled_by(transform: NvtxProfileTransform, jitted: Any) -> None:
    """Note that `nvtx_regions.compile` put `transform` in ``thunder.jit(model, transforms=)``, which
    returned `jitted`: at exit, a transform that got no trace is then told apart as a model never
    called or one thunder failed to compile, not a transform passed in the wrong place."""
    transform._compiled_into = weakref.ref(jitted)


# The way out when thunder cannot compile a model: the same ranges from another backend.
OTHER_BACKEND = "nvtx_regions.compile(model, backend='inductor') gives the same module ranges under torch.compile"


def _compile_outcome(transform: NvtxProfileTransform) -> str:
    """Why a transform of `nvtx_regions.compile` got no trace, from thunder's count of compilations
    begun (``thunder.cache_misses``: counted before tracing, so a count above 0 with no trace here
    means that every compilation raised before our transform ran)."""
    jitted = transform._compiled_into() if transform._compiled_into is not None else None
    try:
        import thunder

        begun = None if jitted is None else thunder.cache_misses(jitted)
    except AttributeError:  # no compile statistics: cannot tell
        begun = None
    ours = f"{transform!r} (made by nvtx_regions.compile(backend='thunder'))"
    if begun == 0:
        return (
            f"{ours} got no trace: the model that compile() returned was never called, so no NVTX range was emitted; "
            "call what compile() returns"
        )
    if begun:
        return (
            f"thunder failed to compile the model ({begun} attempt{'s' * (begun != 1)}, each raising its error at the call), "
            f"so {ours} got no trace and no NVTX range was emitted: thunder's failure, not the spec's; {OTHER_BACKEND}"
        )
    return (
        f"{ours} got no trace, so no NVTX range was emitted: the model that compile() returned was never called "
        f"(call what compile() returns), or thunder failed to compile it (its error was raised at the call; {OTHER_BACKEND})"
    )


def _warn_never_called(transforms: list[NvtxProfileTransform]) -> None:
    """At exit: warn once about `transforms` (those alive) that were never handed a trace.

    A transform held by nothing is gone by then (it was never attached, or
    was dropped with its jitted function) and is not reported. A copy, or one
    whose configuration was copied or pickled, is reported only when it sits
    in a thunder.jit keyword that thunder ignores: another copy may have done the work.
    A transform that `nvtx_regions.compile` attached is reported on its own, with
    why it got no trace (`_compile_outcome`): there, where it sits is right.
    """
    described = []
    for transform in transforms:
        if transform._traces_seen:
            continue
        if transform._compiled_into is not None:
            warnings.warn(
                _compile_outcome(transform),
                NvtxRegionsWarning,
                stacklevel=1,
            )
            continue
        attached = ignored_jit_keyword(transform)
        if attached:
            described.append(f"{transform!r} (passed to thunder.jit({attached[0]}) as {attached[1]}=, which thunder ignores)")
        elif not transform._copied:
            described.append(repr(transform))
    if not described:
        return
    unused, described = len(described), described[:5]
    more = f" and {unused - 5} more" if unused > 5 else ""
    warnings.warn(
        f"thunder never handed a trace to {'; '.join(described)}{more}, so no NVTX range was emitted: "
        "pass a transform as thunder.jit(model, transforms=[t]) "
        "or thunder.core.transforms.add_transform(jitted, transform=t)",
        NvtxRegionsWarning,
        stacklevel=1,
    )

