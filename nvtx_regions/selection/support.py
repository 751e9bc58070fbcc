"""Which constructs of the language each backend can express: one table, and the rules it leaves out.

`SUPPORT` has one row per node type of the spec tree and per kind of
compiled rule; a row names, per backend that cannot express the construct,
why. Every backend reads its refusals from here (`restrict`), and
docs/reference/backends.md is this table (a test renders it and compares).

A backend runs every rule it can express. A rule it cannot express becomes an
`UnsupportedRule` there: no range, never "selected nothing", and one
`NvtxRegionsWarning` per run names all such rules, why, and which backends
can run them (`report_unsupported`; with ``strict=True`` a `SelectorError`).
Errors in the spec's text are not refusals: `compile_spec` raises them on
every backend alike.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace
from typing import ClassVar

from ..core.errors import NvtxRegionsWarning, SelectorError
from ..core.profiling import BACKENDS
from ..language import tree as T
from ..language.tree import render, walk
from .compile import CompiledRule, CompiledSpec, EachMarkerRule, EachRule, OpRule, RegionRule, RuleRanges
from .view import View

__all__ = [
    "Construct", "SUPPORT", "BACKEND_NAMES", "UnsupportedRule", "why_not", "restrict", "report_unsupported",
]  # fmt: skip

# How messages and docs name each backend.
BACKEND_NAMES = {"eager": "eager PyTorch", "thunder": "thunder", "inductor": "Inductor"}

_EAGER = "eager PyTorch runs module calls, not a trace of ops"
_INDUCTOR_PROXIES = "an Inductor graph has no thunder proxy names"
_INDUCTOR_MARKERS = (
    "the model's own markers (torch.cuda.nvtx, nvtx, record_function) stay in the compiled graph under NvtxInductor "
    "(a marker pushed and popped in one graph, with a constant message); one that cannot is left out with a warning"
)


@dataclass(frozen=True)
class Construct:
    """One row of the table: how the docs write the construct, and per backend why it cannot express it
    (a backend not in `why_not` can). A reason reads after the construct's text: ``'op in <x>' <why>``."""

    text: str
    why_not: dict[str, str] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)  # per backend that can: what to know there


SUPPORT: dict[type, Construct] = {
    # Filters.
    T.OpIn: Construct("`op in <...>`", {"eager": f"selects ops by name; {_EAGER}"}),
    T.ModuleIn: Construct("`module <...>`", notes={"eager": "only as the scope of an `each` rule"}),
    T.ClassIn: Construct("`class <...>`", notes={"eager": "only as the scope of an `each` rule"}),
    T.Source: Construct("`source <file:line>`", {
        "eager": f"selects ops by the source line that recorded them; {_EAGER}",
        "inductor": "selects ops by source line, and no source line survives per Inductor kernel (fused kernels "
                    "and backward kernels have none): select by 'module <...>' or 'op in <...>'",
    }),  # fmt: skip
    T.Reads: Construct("`reads <...>`", {
        "eager": f"selects ops by the values they read; {_EAGER}",
        "inductor": f"names thunder proxies; {_INDUCTOR_PROXIES}: select by 'op in <...>' or module",
    }),  # fmt: skip
    T.MarkerIn: Construct(
        "`marker <...>`", {"eager": f"selects ops inside the model's own markers; {_EAGER}"},
        notes={"inductor": _INDUCTOR_MARKERS},
    ),
    T.Forward: Construct("`forward`"),
    T.Backward: Construct("`backward`"),
    T.All: Construct("`all`", {"eager": f"selects every op; {_EAGER}"}),
    T.BackwardOf: Construct("`backward of (...)`", {
        "eager": f"maps backward ops to the forward ops they are traced to; {_EAGER}",
        "inductor": "maps backward ops to forward ops, and Inductor's backward kernels are not tied one by one to "
                    "forward kernels: write 'backward and module <...>' for a module's backward kernels",
    }),  # fmt: skip
    T.Not: Construct("`not`", {"eager": f"combines op filters; {_EAGER}"}),
    T.And: Construct("`and`"),
    T.Or: Construct("`or`", {"eager": f"combines op filters; {_EAGER}"}),
    T.EachModule: Construct("`each module <...>`"),
    T.EachClass: Construct("`each class <...>`"),
    T.EachMarker: Construct(
        "`each marker <...>`",
        notes={"eager": "adds no range: the model's own markers run as written", "inductor": _INDUCTOR_MARKERS},
    ),
    # Regions and their ends.
    T.Between: Construct("`between A..B`", {"eager": f"is a region between two ops; {_EAGER}"}),
    T.Proxy: Construct("a proxy name as a region's end (`t3`)", {
        "eager": f"is a value of a trace; {_EAGER}",
        "inductor": f"is a thunder proxy name; {_INDUCTOR_PROXIES}: mark the region's ends with first(...)/last(...), "
                    "e.g. 'between first(module <h.0>)..last(module <h.1>)'",
    }),  # fmt: skip
    T.First: Construct("`first(...)`", {"eager": f"is the first op of a selection; {_EAGER}"}),
    T.Last: Construct("`last(...)`", {"eager": f"is the last op of a selection; {_EAGER}"}),
    # Run-time gates.
    T.RankIn: Construct("`rank in <...>`"),
    T.Steps: Construct("`steps a..b`"),
    # Kinds of rule (`selection.compile`).
    OpRule: Construct("a rule of one range per selected op (neither `each` nor a lone `between`)", {
        "eager": f"gives one range per selected op; {_EAGER}: write 'each module <...>' or 'each class <...>' for "
                 "one range per module call",
    }),  # fmt: skip
    RegionRule: Construct("a rule of one range per region (a lone `between`)", {"eager": f"gives one range per region of ops; {_EAGER}"}),
    EachRule: Construct("a rule of one range per module call (`each module`, `each class`)"),
    EachMarkerRule: Construct("a rule of one range per marker occurrence (`each marker`)"),
}


def _text(node: object) -> str:
    if isinstance(node, T.Proxy):
        return node.name
    if isinstance(node, (T.First, T.Last)):
        return f"{type(node).__name__.lower()}({render(node.expr)})"
    return render(node)  # type: ignore[arg-type]


def _nodes(expr: T.Expr) -> list[object]:
    """Every node of `expr`, the endpoints of its regions too, outer first."""
    found: list[object] = []
    for node in walk(expr):
        found.append(node)
        if isinstance(node, T.Between):
            found += [point for point in (node.start, node.end) if isinstance(point, (T.First, T.Last))]
    return found


def why_not(rule: CompiledRule, backend: str) -> str | None:
    """Why `backend` cannot express `rule` (its first construct that it cannot, outer first), or None."""
    for node in _nodes(rule.rule.expr):
        why = SUPPORT[type(node)].why_not.get(backend)
        if why is not None:
            return f"{_text(node)!r} {why}"
    why = SUPPORT[type(rule)].why_not.get(backend)
    return None if why is None else f"a rule that {why}"


@dataclass(frozen=True)
class UnsupportedRule(CompiledRule):
    """A rule the backend cannot express: no range there, and no "selected nothing" report."""

    backend: str
    why: str  # what `why_not` says
    original: CompiledRule  # the rule as compiled for the backends that can run it

    applies: ClassVar[bool] = False

    @property
    def ranges_text(self) -> str:  # type: ignore[override]
        return f"not supported under {BACKEND_NAMES[self.backend]}: {self.why}"

    def problem(self) -> str:
        """The rule, why not here, and which backends can run it."""
        others = [BACKEND_NAMES[b] for b in BACKENDS if b != self.backend and why_not(self.original, b) is None]
        can = f"{' and '.join(others)} can run it" if others else "no backend can run it"
        return f"{self.describe()}: {self.ranges_text}; {can}"

    def plan(self, view: View) -> RuleRanges:
        return RuleRanges(0)


def restrict(compiled: CompiledSpec, backend: str) -> CompiledSpec:
    """`compiled` for `backend`: each rule it cannot express replaced by an `UnsupportedRule` (same
    number), and `backend` recorded, so that messages about it speak the backend's words."""
    if backend not in BACKEND_NAMES:
        raise ValueError(f"{backend!r} is not a backend; choose one of {', '.join(BACKENDS)}")
    rules = []
    for rule in compiled.rules:
        why = why_not(rule, backend)
        rules.append(rule if why is None else UnsupportedRule(rule.rule, rule.number, rule.gate, rule.filename, backend, why, rule))
    return replace(compiled, rules=tuple(rules), backend=backend)


def report_unsupported(compiled: CompiledSpec, *, strict: bool, stacklevel: int) -> list[str]:
    """Say, once, which rules of `compiled` (from `restrict`) are left out: one `NvtxRegionsWarning`
    naming them all, one line each, or with `strict` a `SelectorError` (the same lines). Returns the
    problems (one per rule).

    `stacklevel` counts from the caller of this function, as for `warnings.warn`.
    """
    left_out = [rule for rule in compiled.rules if isinstance(rule, UnsupportedRule)]
    problems = [rule.problem() for rule in left_out]
    if not problems:
        return problems
    if strict:
        raise SelectorError("\n".join(problems))
    where = BACKEND_NAMES[left_out[0].backend]
    these = "1 rule of the spec is" if len(problems) == 1 else f"{len(problems)} rules of the spec are"
    warnings.warn(
        f"{these} left out under {where}, and the rest runs (strict=True makes this a SelectorError):\n  "
        + "\n  ".join(problems),
        NvtxRegionsWarning,
        stacklevel=stacklevel + 1,
    )
    return problems
