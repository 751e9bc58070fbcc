"""No silent nothing: find the rules that selected nothing, and say why.

A `RuleTally` gathers the plans of some traces (all that a handle's backend
placed, `runtime.handle.SpecHandle.tally`; or one thunder compilation: a
forward trace and its backward, if one follows) and reports each rule that
produced no range, naming the rule
and, for names that are in none of those traces, the nearest names that are.
Each message speaks the words of the backend the spec was compiled for
(`CompiledSpec.backend`): one row of `WORDS` per backend.
"""

from __future__ import annotations

import difflib
import warnings
from dataclasses import dataclass, field

from .compile import CompiledRule, CompiledSpec, EachRule
from ..core.errors import NvtxRegionsWarning, SelectorError
from .plan import Plan
from .view import View
from ..core.globs import name_matcher, path_matcher, source_matcher
from ..language.tree import (
    ClassIn, EachClass, EachMarker, EachModule, MarkerIn, ModuleIn, OpIn, Proxy, Reads, Source, Visitor, conjuncts, walk,
)  # fmt: skip
from .markers import crossing_fusions

__all__ = ["RuleTally", "Words", "WORDS", "op_hint", "report_unselected", "nearest"]


@dataclass(frozen=True)
class Words:
    """How one backend's messages name what selection looked at."""

    within: str  # where a name was looked for: "in these traces"
    op: str  # one selectable unit: "op"
    no_module: str  # why no unit has a module, and the way out
    op_hints: bool  # whether thunder's op names (`op_hint`) apply


WORDS = {
    "thunder": Words(
        "in these traces", "op",
        "no op of these traces has a module: nvtx_regions records modules while thunder traces, "
        "so create the NvtxProfileTransform before thunder.jit or its first call",
        op_hints=True,
    ),
    "inductor": Words(
        "in these graphs", "kernel",
        "Dynamo recorded no module call for the kernels of these graphs (a function was compiled, not a module): "
        "compile the model itself, with nvtx_regions.compile(model, backend='inductor') or NvtxInductor(model=model)",
        op_hints=False,
    ),
    "eager": Words(
        "in the model's module calls", "module call",
        "the model called no submodule: eager ranges are per module call, so give the model's own modules",
        op_hints=False,
    ),
}  # fmt: skip
# A spec compiled for no backend (`compile_spec` alone) is the whole language, thunder's.
_UNRESTRICTED = "thunder"

# Ops that thunder decomposes before the trace a transform sees (when
# gradients are needed), so that their name is in no trace: name -> the ops
# that run instead. Checked on thunder 0.2.6 / torch 2.11 by
# tests/test_reliability.py::test_decomposed_ops_table_matches_thunder.
DECOMPOSED = {
    "gelu": ("erf", "mul", "add"),
    "relu": ("gt", "where"),
    "leaky_relu": ("gt", "mul", "where"),
    "relu6": ("gt", "lt", "where"),
    "hardtanh": ("gt", "lt", "where"),
    "sigmoid": ("neg", "exp", "add", "reciprocal"),
    "dropout": ("uniform", "lt", "mul"),
}
# A selection that covers a decomposed op as a whole (the ops of the modules
# that call it), named in its hint.
WHOLE_SELECTION: dict[str, str] = {
    name: f"class <{cls}> (the {cls} modules' ops)"
    for name, cls in {
        "gelu": "GELU", "relu": "ReLU", "leaky_relu": "LeakyReLU", "relu6": "ReLU6",
        "hardtanh": "Hardtanh", "sigmoid": "Sigmoid", "dropout": "Dropout",
    }.items()
}  # fmt: skip


def op_hint(glob: str, op_names: list[str]) -> str:
    """Advice for an op pattern that matches nothing: the op's name in the trace, or why it has none."""
    last = glob.rsplit(".", 1)[-1]
    if last != glob and any(map(name_matcher((last,)), op_names)):
        # The printed trace calls e.g. torch.nn.functional.linear; the op is named linear.
        return f"; ops go by their symbol's name, not the callable the trace prints: write {last!r}"
    if glob in DECOMPOSED:
        parts = ", ".join(DECOMPOSED[glob])
        alternative = f", or write {WHOLE_SELECTION[glob]}" if glob in WHOLE_SELECTION else ""
        return f"; thunder decomposes {glob} into {parts}, so no op is named {glob!r}: select those ops{alternative}"
    return ""


def nearest(name: str, candidates: list[str]) -> str:
    """`` (nearest: a, b, c)`` naming up to three candidates close to `name`, or ``""``."""
    close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.5)
    return f" (nearest: {', '.join(close)})" if close else ""


def report_unselected(problems: list[str], *, strict: bool, stacklevel: int) -> None:
    """Say that rules selected nothing: one `NvtxRegionsWarning` per problem, or
    with `strict` one `SelectorError` naming them all.

    `stacklevel` counts from the caller of this function, as for `warnings.warn`.
    Thunder traces and eager hooks report through here alike.
    """
    if not problems:
        return
    if strict:
        raise SelectorError("; ".join(problems))
    for problem in problems:
        warnings.warn(problem, NvtxRegionsWarning, stacklevel=stacklevel + 1)


@dataclass
class RuleTally:
    spec: CompiledSpec
    views: list[View] = field(default_factory=list)
    ranges: list[int] = field(default_factory=list)
    reported: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.ranges = [0] * len(self.spec.rules)

    def add(self, plan: Plan, view: View | None = None) -> None:
        """Count `plan`'s ranges; `view`, when given, lets `report` suggest names."""
        if view is not None:
            self.views.append(view)
        for number, count in enumerate(plan.ranges_per_rule):
            self.ranges[number] += count

    def unselected(self) -> list[CompiledRule]:
        """The rules that selected nothing, among those the backend runs (`CompiledRule.applies`)."""
        return [rule for rule in self.spec.rules if rule.applies and self.ranges[rule.number] == 0]

    def report(
        self, *, strict: bool, where: str, once: bool = False, skip: tuple[type, ...] = (), stacklevel: int = 3
    ) -> None:
        """Warn (or with `strict`, raise `SelectorError`) for each rule that selected nothing;
        with `once`, only for the rules not reported by an earlier call; never for rules of the
        classes in `skip` (eager's `each marker`: the markers run as written there).
        `stacklevel` counts from the caller of this method, as for `warnings.warn`."""
        problems = []
        for rule in self.unselected():
            if (once and rule.number in self.reported) or isinstance(rule, skip):
                continue
            self.reported.add(rule.number)
            reason = self.reason(rule)
            problems.append(f"{rule.describe()} selected nothing in {where}{'; ' + reason if reason else ''}")
        report_unselected(problems, strict=strict, stacklevel=stacklevel + 1)

    def reason(self, rule: CompiledRule) -> str:
        """Why `rule` may have selected nothing: its names that are in none of the traces, in the
        words of the backend the spec was compiled for."""
        if isinstance(rule, EachRule) and rule.each.never:
            return "'forward and backward' is never true"
        why = _WhyNothing(self.views, WORDS[self.spec.backend or _UNRESTRICTED])
        notes = [note for part in walk(rule.rule.expr) for note in why.visit(part)]
        if not notes and isinstance(rule, EachRule) and any(isinstance(p, (ModuleIn, ClassIn)) for p in conjuncts(rule.rule.expr)):
            notes.append("its 'module <...>' / 'class <...>' scope excludes every module it matches")
        return "; ".join(notes)


class _WhyNothing(Visitor):
    """Per node of a rule: the names it uses that are in none of `views`, and what to write instead."""

    def __init__(self, views: list[View], words: Words) -> None:
        self.views = views
        self.words = words
        self.op_names = sorted({op.name for view in views for op in view.ops})

    def _nothing(self, part: object) -> list[str]:
        return []

    # Nodes that name nothing of a trace; their operands are visited on their own.
    visit_Forward = visit_Backward = visit_All = visit_RankIn = visit_Steps = _nothing
    visit_Not = visit_And = visit_Or = visit_BackwardOf = visit_Between = _nothing
    visit_First = visit_Last = _nothing

    def visit_Proxy(self, part: Proxy) -> list[str]:
        if any(view.region_start(part.name) is not None or view.region_end(part.name) is not None for view in self.views):
            return []
        candidates = sorted({n for view in self.views for n in view.proxy_names})
        return [self._missing(f"proxy {part.name!r}", part.name, candidates, verb="is produced by no compute op and is no argument")]

    def visit_OpIn(self, part: OpIn) -> list[str]:
        return [
            self._missing(f"op {glob!r}", glob, self.op_names) + (op_hint(glob, self.op_names) if self.words.op_hints else "")
            for glob in part.globs
            if not any(map(name_matcher((glob,)), self.op_names))
        ]

    def visit_Reads(self, part: Reads) -> list[str]:
        names = sorted({n for view in self.views for n in view.by_read})
        return [self._missing(f"read {glob!r}", glob, names) for glob in part.globs if not any(map(name_matcher((glob,)), names))]

    def visit_Source(self, part: Source) -> list[str]:
        return [self._source_reason(part)]

    def visit_ModuleIn(self, part: ModuleIn) -> list[str]:
        return self._module_reasons(part.globs, by_path=True, each=False)

    def visit_EachModule(self, part: EachModule) -> list[str]:
        return self._module_reasons(part.globs, by_path=True, each=True)

    def visit_ClassIn(self, part: ClassIn) -> list[str]:
        return self._module_reasons(part.globs, by_path=False, each=False)

    def visit_EachClass(self, part: EachClass) -> list[str]:
        return self._module_reasons(part.globs, by_path=False, each=True)

    def visit_MarkerIn(self, part: MarkerIn | EachMarker) -> list[str]:
        pushed = [m for view in self.views if view.marker_log is not None for m in view.marker_log.pushed]
        if not pushed:
            return [
                "no marker was pushed in these traces: nvtx_regions records the model's own torch.cuda.nvtx, nvtx "
                "and record_function markers while thunder traces, so create the NvtxProfileTransform before "
                "thunder.jit or its first call; under ThunderFX torch.compile runs them "
                "outside thunder"
            ]
        with_ops = {m for view in self.views for stack in view.marker_stacks for m in stack}
        messages = sorted({m.message or "" for m in pushed})
        notes = []
        for glob in part.globs:
            hits = [m for m in pushed if name_matcher((glob,))(m.message or "")]
            if not hits:
                notes.append(self._missing(f"marker {glob!r}", glob, messages))
            elif not any(m in with_ops for m in hits):
                fused = [f"#{p} {view.ops[p].name}" for view in self.views for m in hits for p in crossing_fusions(view, m)]
                where = f"marker {glob!r} matches {hits[0].message!r} ({hits[0].place}), "
                if fused:
                    notes.append(
                        where + f"whose ops are all inside fusions that also hold ops outside it ({', '.join(fused[:3])}); "
                        "a fusion stays outside a marker it crosses, as for module calls"
                    )
                else:
                    notes.append(where + "around which thunder recorded no op (nothing to time there)")
        return notes

    visit_EachMarker = visit_MarkerIn

    def _module_reasons(self, globs: tuple[str, ...], *, by_path: bool, each: bool) -> list[str]:
        classes: dict[str, str] = {}
        for view in self.views:
            classes.update(view.module_classes)
        if not classes:
            return [self.words.no_module]
        names = sorted(p for p in classes if p) if by_path else sorted(set(classes.values()))
        what = "module" if by_path else "class"
        notes = []
        for glob in globs:
            matches = path_matcher((glob,)) if by_path else name_matcher((glob,))
            hits = [n for n in names if matches(n)]
            if not hits:
                notes.append(self._missing(f"{what} {glob!r}", glob, names))
                continue
            called = {
                (call.path if by_path else call.cls)
                for view in self.views
                for chain in view.module_chains
                if chain
                for call in chain
            }
            never = [n for n in hits if n not in called]
            if each and never and len(never) == len(hits):
                shown = ", ".join(never[:3])
                notes.append(
                    f"{what} {glob!r} matches {shown}, whose forward never runs by itself (a container such as "
                    "ModuleList, or its ops are all inside fusions that span other modules); "
                    f"write 'each module <{never[0]}.*>' for its children, or 'module <{never[0]}>' for its ops"
                )
            elif never and len(never) == len(hits):
                notes.append(
                    f"{what} {glob!r} matches {', '.join(never[:3])}, but no {self.words.op} is attributed to it: its ops may be "
                    "fused with other modules' (a fusion belongs to the deepest module containing all its parts)"
                )
        return notes

    def _source_reason(self, part: Source) -> str:
        lines = sorted({line for view in self.views for found in view.source_lines for line in found})
        if not lines:
            return f"source <{part.text()}> selects forward ops only, and these traces have no source lines (backward ops carry none)"
        files = sorted({name for name, _ in lines})
        in_file = source_matcher(part.file)
        same = [line for name, line in lines if in_file(name)]
        if not same:
            short = sorted({name.rsplit("/", 1)[-1] for name in files})
            return self._missing(f"source file {part.file!r}", part.file, short)
        if any(part.first <= line <= part.last for line in same):
            return (
                f"ops were recorded at {part.text()} in the forward trace, but the rule excludes them there; "
                "backward ops have no source line (use 'backward of (source <...>)' for their backward)"
            )
        near = sorted(set(same), key=lambda n: min(abs(n - part.first), abs(n - part.last)))[:3]
        return (
            f"no op was recorded at {part.text()} (nearest recorded lines of that file: {', '.join(map(str, sorted(near)))}); "
            "backward ops have no source line"
        )


    def _missing(self, what: str, name: str, candidates: list[str], verb: str = "matches nothing") -> str:
        return f"{what} {verb} {self.words.within}{nearest(name, candidates)}"
