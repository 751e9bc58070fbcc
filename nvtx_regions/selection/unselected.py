"""No silent nothing: find the rules that selected nothing, and say why.

A `RuleTally` gathers the plans of some traces (one compilation: a forward
trace and its backward, if one follows; or, under ThunderFX, every subgraph
seen so far) and reports each rule that produced no range, naming the rule
and, for names that are in none of those traces, the nearest names that are.
"""

from __future__ import annotations

import difflib
import fnmatch
import warnings
from dataclasses import dataclass, field

from .compile import CompiledRule, CompiledSpec
from ..core.errors import NvtxRegionsWarning, SelectorError
from .plan import Plan
from ..attribution.traceview import TraceView
from ..core.globs import class_matcher, path_matcher
from .markers import crossing_fusions
from ..language.tree import ClassIn, EachClass, EachMarker, EachModule, MarkerIn, ModuleIn, OpIn, Proxy, Reads, Source, walk

__all__ = ["RuleTally", "op_hint"]

# Ops that thunder 0.2.6 decomposes before the trace a transform sees, so that
# their name is in no trace: name -> the ops that run instead.
DECOMPOSED = {"gelu": ("erf", "mul", "add")}
# The one place for a selection that covers a decomposed op as a whole, named
# in its hint: e.g. "gelu": "class <GELU>" once module selection exists.
WHOLE_SELECTION: dict[str, str] = {"gelu": "class <GELU> (the GELU modules' ops)"}


def op_hint(glob: str, op_names: list[str]) -> str:
    """Advice for an op pattern that matches nothing: the op's name in the trace, or why it has none."""
    last = glob.rsplit(".", 1)[-1]
    if last != glob and any(fnmatch.fnmatchcase(name, last) for name in op_names):
        # The printed trace calls e.g. torch.nn.functional.linear; the op is named linear.
        return f"; ops go by their symbol's name, not the callable the trace prints: write {last!r}"
    if glob in DECOMPOSED:
        parts = ", ".join(DECOMPOSED[glob])
        alternative = f", or write {WHOLE_SELECTION[glob]}" if glob in WHOLE_SELECTION else ""
        return f"; thunder decomposes {glob} into {parts}, so no op is named {glob!r}: select those ops{alternative}"
    return ""


@dataclass
class RuleTally:
    spec: CompiledSpec
    views: list[TraceView] = field(default_factory=list)
    ranges: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ranges = [0] * len(self.spec.rules)

    def add(self, plan: Plan, view: TraceView | None = None) -> None:
        """Count `plan`'s ranges; `view`, when given, lets `report` suggest names."""
        if view is not None:
            self.views.append(view)
        for number, count in enumerate(plan.ranges_per_rule):
            self.ranges[number] += count

    def unselected(self) -> list[CompiledRule]:
        return [rule for rule in self.spec.rules if self.ranges[rule.number] == 0]

    def report(self, *, strict: bool, where: str) -> None:
        """Warn (or with `strict`, raise `SelectorError`) for each rule that selected nothing."""
        problems = []
        for rule in self.unselected():
            reason = self.reason(rule)
            problems.append(f"{rule.describe()} selected nothing in {where}{'; ' + reason if reason else ''}")
        if not problems:
            return
        if strict:
            raise SelectorError("; ".join(problems))
        for problem in problems:
            warnings.warn(problem, NvtxRegionsWarning, stacklevel=4)

    def reason(self, rule: CompiledRule) -> str:
        """Why `rule` may have selected nothing: its names that are in none of the traces."""
        op_names = sorted({op.name for view in self.views for op in view.ops})
        notes = []
        for part in walk(rule.rule.expr):
            if isinstance(part, Proxy):
                if not any(
                    view.region_start(part.name) is not None or view.region_end(part.name) is not None
                    for view in self.views
                ):
                    candidates = sorted({n for view in self.views for n in view.proxy_names})
                    notes.append(self._missing(f"proxy {part.name!r}", part.name, candidates, verb="is produced by no compute op and is no argument"))
            elif isinstance(part, OpIn):
                for glob in part.globs:
                    if not any(fnmatch.fnmatchcase(name, glob) for name in op_names):
                        notes.append(self._missing(f"op {glob!r}", glob, op_names) + op_hint(glob, op_names))
            elif isinstance(part, (ModuleIn, EachModule, ClassIn, EachClass)):
                notes.extend(self._module_reasons(part))
            elif isinstance(part, Source):
                notes.append(self._source_reason(part))
            elif isinstance(part, (MarkerIn, EachMarker)):
                notes.extend(self._marker_reasons(part))
            elif isinstance(part, Reads):
                names = sorted({n for view in self.views for n in view.by_read})
                for glob in part.globs:
                    if not any(fnmatch.fnmatchcase(name, glob) for name in names):
                        notes.append(self._missing(f"read {glob!r}", glob, names))
        return "; ".join(notes)

    def _module_reasons(self, part: ModuleIn | EachModule | ClassIn | EachClass) -> list[str]:
        by_path = isinstance(part, (ModuleIn, EachModule))
        classes: dict[str, str] = {}
        for view in self.views:
            classes.update(view.module_classes)
        if not classes:
            return [
                "no op of these traces has a module: nvtx_regions records modules while thunder traces, "
                "so import nvtx_regions.emission.transform (or create the NvtxProfileTransform) before the first call"
            ]
        names = sorted(p for p in classes if p) if by_path else sorted(set(classes.values()))
        what = "module" if by_path else "class"
        notes = []
        for glob in part.globs:
            matches = path_matcher((glob,)) if by_path else class_matcher((glob,))
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
            if isinstance(part, (EachModule, EachClass)) and never and len(never) == len(hits):
                shown = ", ".join(never[:3])
                notes.append(
                    f"{what} {glob!r} matches {shown}, whose forward never runs by itself (a container such as "
                    "ModuleList, or its ops are all inside fusions that span other modules); "
                    f"write 'each module <{never[0]}.*>' for its children, or 'module <{never[0]}>' for its ops"
                )
            elif never and len(never) == len(hits):
                notes.append(
                    f"{what} {glob!r} matches {', '.join(never[:3])}, but no op is attributed to it: its ops may be "
                    "fused with other modules' (a fusion belongs to the deepest module containing all its parts)"
                )
        return notes

    def _marker_reasons(self, part: MarkerIn | EachMarker) -> list[str]:
        pushed = []
        for view in self.views:
            log = view.marker_log
            if log is not None:
                pushed.extend(log.pushed)
        if not pushed:
            return [
                "no marker was pushed in these traces: nvtx_regions records the model's own torch.cuda.nvtx, nvtx "
                "and record_function markers while thunder traces, so import nvtx_regions.emission.transform (or "
                "create the NvtxProfileTransform) before the first call; under ThunderFX torch.compile runs them "
                "outside thunder"
            ]
        with_ops = {m for view in self.views for stack in view.marker_stacks for m in stack}
        messages = sorted({m.message or "" for m in pushed})
        notes = []
        for glob in part.globs:
            hits = [m for m in pushed if fnmatch.fnmatchcase(m.message or "", glob)]
            if not hits:
                notes.append(self._missing(f"marker {glob!r}", glob, messages))
            elif not any(m in with_ops for m in hits):
                fused = [
                    f"#{p} {view.ops[p].name}" for view in self.views for m in hits for p in crossing_fusions(view, m)
                ]
                if fused:
                    notes.append(
                        f"marker {glob!r} matches {hits[0].message!r} ({hits[0].place}), whose ops are all inside "
                        f"fusions that also hold ops outside it ({', '.join(fused[:3])}); a fusion stays outside "
                        "a marker it crosses, as for module calls"
                    )
                else:
                    notes.append(
                        f"marker {glob!r} matches {hits[0].message!r} ({hits[0].place}), around which thunder "
                        "recorded no op (nothing to time there)"
                    )
        return notes

    def _source_reason(self, part: Source) -> str:
        lines = sorted({line for view in self.views for found in view.source_lines for line in found})
        if not lines:
            return f"source <{part.text()}> selects forward ops only, and these traces have no source lines (backward ops carry none)"
        files = sorted({name for name, _ in lines})
        same = [line for name, line in lines if fnmatch.fnmatchcase(name, part.file) or fnmatch.fnmatchcase(name, "*/" + part.file)]
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

    @staticmethod
    def _missing(what: str, name: str, candidates: list[str], verb: str = "matches nothing") -> str:
        close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.5)
        hint = f" (nearest: {', '.join(close)})" if close else ""
        return f"{what} {verb} in these traces{hint}"
