"""`NvtxProfileTransform`: the thunder transform that turns a spec's plan into
push and pop bound symbols in the optimized forward and backward traces.

The trace changes only by gaining bound symbols: one push and one pop per
range (the first push and the last pop of a trace also start and end the call,
see `runtime`). Pops are placed right after the range's last bound symbol, so
every pop comes before the ``return``. A trace in which the spec selects
nothing is returned as is.
"""

from __future__ import annotations

import atexit
import collections
import json
import os
import sys
import time
import warnings
import weakref
from dataclasses import dataclass
from typing import Any

import nvtx  # noqa: F401  (imported here so the first transform does not pay for it)
from thunder.core.prims import OpTags
from thunder.core.symbol import BoundSymbol, Symbol
from thunder.core.trace import TraceCtx, TraceProvenance, TraceTag, from_trace
from thunder.core.transform_common import Transform

from ..selection.unselected import RuleTally
from ..selection.compile import CompiledSpec, compile_spec
from ..core.errors import NvtxRegionsWarning, SelectorError
from ..language.parse import combine, parse
from ..selection.plan import Plan, make_plan
from ..core.calls import chain_message
from ..core.markers import RECORD_FUNCTION
from .runtime import DEFAULT_DOMAIN, Domain, Group, TraceRuntime, next_serial, rule_color
from ..attribution.thunder_internals import attached_as as _attached_as
from ..attribution.thunder_internals import backward_follows as _backward_follows
from ..attribution.thunder_internals import install_module_recorder
from ..attribution.thunder_internals import is_thunderfx_subgraph as _is_thunderfx_subgraph
from ..attribution.traceview import TraceView
from ..language.tree import Spec, render

# Module attribution needs the modules running while thunder traces: record
# them for every function jitted after this import.
install_module_recorder()

MESSAGE_STYLES = ("python", "module")

__all__ = ["NvtxProfileTransform", "TraceReport"]

_UNSET: Any = object()
# Memory stays bounded however often thunder recompiles: a transform keeps the
# reports of its latest traces, and the views of its latest ThunderFX subgraphs
# for the hints of check(); counts of ranges cover every trace.
REPORTS_KEPT = 100
VIEWS_KEPT = 32


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
    # emits when no gate is closed. Depth 0 is outermost within this trace.
    ranges_emitted: tuple[tuple[int, str], ...] = ()


def _printer(template: str):
    def python_printer(bsym: BoundSymbol, out_printables, arg_printables, kwarg_printables) -> str:
        return template.format(name=bsym.sym.name, args=bsym.args)

    return python_printer


def _symbol(name: str, template: str) -> Symbol:
    # DONT_DCE: these have no outputs, and a later dead-code pass must keep them.
    return Symbol(name=name, id=name, meta=None, is_prim=True, tags=(OpTags.DONT_DCE,), python_printer=_printer(template))


def one_line(bsym: BoundSymbol) -> str:
    """The bound symbol's own Python line(s), without its header or subsymbols."""
    lines = [line for line in bsym.python(indent=0, print_depth=1) if not line.lstrip().startswith("#")]
    return " ".join(line.strip() for line in lines)


class NvtxProfileTransform(Transform):
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
    ) -> None:
        if select is not None and not isinstance(select, str):
            raise TypeError(f"select= takes spec text (str), not {type(select).__name__}")
        if domain is not None and not isinstance(domain, str):
            raise TypeError(f"domain= takes a str or None, not {type(domain).__name__}")
        if messages not in MESSAGE_STYLES:
            raise ValueError(f"messages= is one of {', '.join(map(repr, MESSAGE_STYLES))}, not {messages!r}")
        self.messages = messages
        self.select = select
        self.spec_path = None if spec is None else os.fspath(spec)
        self.domain_name = domain
        self.strict = bool(strict)
        self._setup(combine(select, self.spec_path) or parse("all"))
        if not self.spec.rules:
            given = f"spec={self.spec_path!r}" if select is None else f"select={select!r}"
            message = (
                f"NvtxProfileTransform({given}): the spec has no rules, so no range will be emitted; "
                "write 'all' for a range per op, or leave the transform out to profile nothing"
            )
            if self.strict:
                raise SelectorError(message)
            warnings.warn(message, NvtxRegionsWarning, stacklevel=2)

    def _setup(self, spec: Spec) -> None:
        """Compile `spec` and start with no traces seen (from `__init__` and from a copy)."""
        self.spec: Spec = spec
        self.compiled: CompiledSpec = compile_spec(spec)
        text = render(self.spec).replace("\n", "; ")
        if len(text) > 200:
            text = text[:200] + f"... ({len(self.spec.rules)} rules)"
        self._summary = json.dumps(text, ensure_ascii=False)  # for provenance
        self.domain = Domain(self.domain_name)
        self._marker_domains: dict[str | None, Domain] = {}  # the users' own domains of `each marker` ranges
        # The latest REPORTS_KEPT traces; check() counts every trace seen, in _ranges_seen.
        self.reports: collections.deque[TraceReport] = collections.deque(maxlen=REPORTS_KEPT)
        self._ranges_seen = [0] * len(self.compiled.rules)
        self._compilation: RuleTally | None = None
        self._last_forward: TraceView | None = None
        self._subgraphs: RuleTally | None = None
        self._checked_at = 0  # how many traces `check()` last covered
        self._traces_seen = 0
        self._copied = False  # set when this configuration is copied or pickled
        _created.add(self)

    # -- copies are configuration ---------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        """A copy or pickle holds the configuration only: the parsed spec (a spec
        file is not read again), domain, strictness and message style. It starts unused, with
        no reports, as if just created; the original keeps its own."""
        self._copied = True
        return {"select": self.select, "spec_path": self.spec_path, "domain": self.domain_name,
                "strict": self.strict, "spec": self.spec, "messages": self.messages}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.select, self.spec_path = state["select"], state["spec_path"]
        self.domain_name, self.strict = state["domain"], state["strict"]
        self.messages = state.get("messages", "python")
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
        return f"nvtx_regions.NvtxProfileTransform({', '.join(args)})"

    # -- thunder entry point -------------------------------------------------

    def transform_trace_post_optimization(self, trace: TraceCtx, **kwargs: Any) -> TraceCtx:
        started = time.perf_counter()
        self._traces_seen += 1
        view = TraceView.from_trace(trace)
        if view.phase == "backward":
            # thunder transforms a compilation's backward right after its forward.
            view.forward, self._last_forward = self._last_forward, None
        else:
            self._last_forward = view
        plan = make_plan(self.compiled, view, self.domain_name)
        if view.phase == "forward" and view.marker_log is not None and view.marker_log.open:
            _warn_left_open(view.marker_log.open, plan)
        emitted: list[tuple[int, str]] = []
        result = trace if plan.empty else self._annotate(trace, plan, emitted, view)
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
        self._ranges_seen = [a + b for a, b in zip(self._ranges_seen, plan.ranges_per_rule)]
        self._tally(trace, view, plan)
        return result

    def check(self) -> None:
        """Report rules that selected nothing in any trace this transform has seen.

        Under ThunderFX, call it after the first step (once every subgraph
        has compiled); elsewhere the check runs by itself per compilation.
        """
        if not self._traces_seen:
            raise SelectorError("check(): this transform has not seen a trace yet; call the compiled function first")
        self._checked_at = self._traces_seen
        tally = RuleTally(self.compiled)
        tally.ranges = list(self._ranges_seen)
        if self._subgraphs is not None:
            tally.views = list(self._subgraphs.views)
        tally.report(strict=self.strict, where=f"any of the {self._traces_seen} traces seen")

    # -- internals -------------------------------------------------------------

    def _tally(self, trace: TraceCtx, view: TraceView, plan: Plan) -> None:
        if _is_thunderfx_subgraph():
            if self._subgraphs is None:
                self._subgraphs = RuleTally(self.compiled)
                atexit.register(_check_at_exit, weakref.ref(self))
            self._subgraphs.add(plan, view)
            # Views only feed the nearest-name hints; the latest ones are enough.
            del self._subgraphs.views[:-VIEWS_KEPT]
            return
        if view.phase == "backward":
            tally = self._compilation or RuleTally(self.compiled)
            self._compilation = None
            tally.add(plan, view)
            tally.report(strict=self.strict, where="the forward and backward traces of this compilation")
            return
        if self._compilation is not None:
            # The previous forward's backward never came.
            pending, self._compilation = self._compilation, None
            pending.report(strict=self.strict, where="the forward trace of the previous compilation")
        tally = RuleTally(self.compiled)
        tally.add(plan, view)
        if TraceTag.AUGMENTED_FORWARD in trace.tags and _backward_follows():
            self._compilation = tally
        else:
            tally.report(strict=self.strict, where="the forward trace of this compilation")

    def _op_message(self, view: TraceView, index: int, bsym: BoundSymbol) -> str:
        if self.messages == "python":
            return one_line(bsym)
        where = chain_message(view.module_chains[view.position_of(index)])
        return f"{where}: {bsym.sym.name}" if where else bsym.sym.name

    def _domain_of(self, name: Any) -> Domain:
        """The `Domain` of `name` (this transform's own, or a user's marker's), kept for the transform's life."""
        if name == self.domain_name:
            return self.domain
        found = self._marker_domains.get(name)
        if found is None:
            found = self._marker_domains[name] = Domain(name)
        return found

    def _annotate(self, trace: TraceCtx, plan: Plan, emitted: list[tuple[int, str]], view: TraceView) -> TraceCtx:
        serial = next_serial()
        prefix = f"nvtx_regions_{serial}"
        # One group per (gate, domain): its push and pop globals, and the global holding its domain argument.
        groups: dict[Any, Group] = {}
        domain_globals: dict[Any, str] = {}
        for planned in plan.ranges:
            domain = planned.domain(self.domain_name)
            key = (planned.gate, domain)
            if key not in groups:
                n = len(groups)
                if domain not in domain_globals:
                    domain_globals[domain] = f"{prefix}_domain" + (f"_{len(domain_globals)}" if domain_globals else "")
                groups[key] = Group(
                    f"{prefix}_push_{n}", f"{prefix}_pop_{n}", planned.gate, self._domain_of(domain), domain_globals[domain]
                )
        enter_name, exit_name = f"{prefix}_push_enter", f"{prefix}_pop_exit"
        progress = f"{prefix}_open"
        runtime = TraceRuntime(
            self.domain, list(groups.values()), enter_name=enter_name, exit_name=exit_name, progress_name=progress
        )
        functions = runtime.initial_globals()
        # Each push and pop also records itself in the call's progress list (see runtime).
        pushes_by_group = {
            key: _symbol(g.push_name, "{name}({args[0]}, " + f"{g.domain_name}); {progress}.append({n})" + "  # {args[1]}")
            for n, (key, g) in enumerate(groups.items())
        }
        pops_by_group = {
            key: _symbol(g.pop_name, "{name}(" + f"{g.domain_name}); {progress}.pop()") for key, g in groups.items()
        }
        # The trace's first push and last pop also start and end the call (see runtime).
        enter = _symbol(enter_name, f"{progress} = " + "{name}(globals(), {args[0]})  # {args[1]}")
        exit_ = _symbol(exit_name, "{args[0]}({args[1]}); " + f"{progress}.calls.remove({progress})")

        bsyms = trace.bound_symbols
        pushes: dict[int, list[BoundSymbol]] = {}
        pops: dict[int, list[BoundSymbol]] = {}
        pop_domain: dict[int, str] = {}  # id of a pop -> the global holding its domain argument
        open_ends: dict[Any, list[int]] = {}  # per domain: ends of the ranges enclosing the current one
        for number, planned in enumerate(plan.ranges):
            marker = planned.marker
            if marker is not None or planned.label is not None:
                message = planned.label
            else:
                message = self._op_message(view, planned.start, bsyms[planned.start])
            domain = planned.domain(self.domain_name)
            ends = open_ends.setdefault(domain, [])
            while ends and ends[-1] < planned.start:
                ends.pop()
            emitted.append((len(ends), message))
            ends.append(planned.end)
            rule = self.compiled.rules[planned.rules[0]]
            group = groups[(planned.gate, domain)]
            if marker is not None and marker.form != RECORD_FUNCTION:
                # The user's own marker, as the user pushed it: message and colour, no category.
                attributes = group.domain.attributes(message, color=marker.color)
            else:
                attributes = group.domain.attributes(
                    message, color=rule_color(rule.number), category=rule.rule.label or rule.rule.text or render(rule.rule)
                )
            attr_name = f"{prefix}_attr_{number}"
            context = {
                group.push_name: functions[group.push_name],
                group.pop_name: functions[group.pop_name],
                group.domain_name: functions[group.domain_name],
            }
            if number == 0:
                push = BoundSymbol(
                    enter,
                    args=(attr_name, json.dumps(message, ensure_ascii=False)),
                    kwargs={},
                    output=None,
                    _call_ctx={enter_name: runtime.enter, attr_name: attributes, **context},
                )
            else:
                push = BoundSymbol(
                    pushes_by_group[(planned.gate, domain)],
                    args=(attr_name, json.dumps(message, ensure_ascii=False)),
                    kwargs={},
                    output=None,
                    _call_ctx={attr_name: attributes, **context},
                )
            pushes.setdefault(planned.start, []).append(push)
            pop = BoundSymbol(pops_by_group[(planned.gate, domain)], args=(), kwargs={}, output=None, _call_ctx=context)
            pop_domain[id(pop)] = group.domain_name
            pops.setdefault(planned.end, []).insert(0, pop)
        # The trace's last pop: at the latest end, the last of that list (the outermost range).
        end_pops = pops[max(pops)]
        last_pop = end_pops[-1]
        end_pops[-1] = BoundSymbol(
            exit_, args=(last_pop.sym.name, pop_domain[id(last_pop)]), kwargs={}, output=None, _call_ctx=last_pop._call_ctx
        )

        new_bsyms: list[BoundSymbol] = []
        for index, bsym in enumerate(bsyms):
            new_bsyms.extend(pushes.get(index, ()))
            new_bsyms.append(bsym)
            new_bsyms.extend(pops.get(index, ()))
        annotated = from_trace(trace)
        annotated.bound_symbols = new_bsyms
        return annotated


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


# Every transform alive, to tell at exit which ones thunder never called.
_created: "weakref.WeakSet[NvtxProfileTransform]" = weakref.WeakSet()


def _warn_never_called() -> None:
    """At exit: warn once about transforms that are alive and were never handed a trace.

    A transform held by nothing is gone by then (it was never attached, or
    was dropped with its jitted function) and is not reported. A copy, or one
    whose configuration was copied or pickled, is reported only when it sits
    in a thunder.jit keyword that thunder ignores: another copy may have done the work.
    """
    described = []
    for transform in list(_created):
        if transform._traces_seen:
            continue
        attached = _attached_as(transform)
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


atexit.register(_warn_never_called)


def _check_at_exit(ref: "weakref.ref[NvtxProfileTransform]") -> None:
    # ThunderFX gives no "all subgraphs compiled" moment; warn at exit rather than never.
    transform = ref()
    if transform is not None and transform._traces_seen > transform._checked_at:
        try:
            transform.check()
        except SelectorError as error:
            print(f"nvtx_regions: {error}", file=sys.stderr)
