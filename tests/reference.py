"""A plain reference evaluator of the selector language, and a reader of
annotated traces. Written from the language reference, not from the package:
per bound symbol, with linear scans, no bitsets and no indexes.
"""

from __future__ import annotations

import fnmatch
import functools
import json
from dataclasses import dataclass, field

from thunder.core.proxies import CollectionProxy, Proxy
from thunder.core.trace import TraceTag
from thunder.dev_utils.utils import NON_COMPUTATION_PRIMS

from nvtx_regions.language import tree as T

# The bound symbols the language reference says never get a range.
NON_COMPUTE = {
    "update_aliases", "clear_mutable_collection", "unpack_parameter", "unpack_buffer",
    "unpack_submodule", "python_return", "python_del", "return", "del", "comment",
}  # fmt: skip


def is_compute(bsym) -> bool:
    name = bsym.sym.name
    if bsym.sym.id in NON_COMPUTATION_PRIMS or name in NON_COMPUTE:
        return False
    return not name.startswith(("unpack_", "nvtx_regions_", "nvtx_range_"))


class RefError(Exception):
    """The reference's verdict that the spec must raise SelectorError on this trace.

    `kind` says which: "order" (a region ends before it starts: RegionOrderError)
    or "overlap" (two regions overlap without nesting: any other SelectorError).
    """

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


@dataclass
class Expected:
    op_ranges: list  # (bsym, bsym, message)
    region_ranges: list  # (first bsym, last bsym, message)
    # Every range in the order its push runs: by first op; at the same op,
    # regions before the op's own range, the longer region first, and regions
    # of the same extent in rule order.
    push_order: list = field(default_factory=list)

    @property
    def all(self):
        return self.op_ranges + self.region_ranges


def one_line(bsym) -> str:
    lines = [l for l in bsym.python(indent=0, print_depth=1) if not l.lstrip().startswith("#")]
    return " ".join(l.strip() for l in lines)


class Reference:
    def __init__(self, trace, forward: "Reference | None" = None):
        self.trace = trace
        self.ops = [b for b in trace.bound_symbols if is_compute(b)]
        self.phase = "backward" if TraceTag.BACKWARD in trace.tags else "forward"
        args = [*trace.args, *trace.kwargs.values()]
        self.args = {a.name for a in args if isinstance(a, Proxy) and not isinstance(a, CollectionProxy)}
        self.forward = forward

    @staticmethod
    def reads(op):
        return [p.name for p in op.flat_proxy_args]

    @staticmethod
    def writes(op):
        return [p.name for p in op.flat_proxy_outs]

    def where(self, expr):
        return [i for i in range(len(self.ops)) if self.holds(expr, i)]

    def start(self, point):
        if isinstance(point, T.Proxy):
            for i, op in enumerate(self.ops):
                if point.name in self.writes(op):
                    return i
            if point.name in self.args:
                for i, op in enumerate(self.ops):
                    if point.name in self.reads(op):
                        return i
            return None
        found = self.where(point.expr)
        return (found[0] if isinstance(point, T.First) else found[-1]) if found else None

    def end(self, point):
        if isinstance(point, T.Proxy):
            for i, op in enumerate(self.ops):
                if point.name in self.writes(op):
                    return i
            if point.name in self.args:
                last = None
                for i, op in enumerate(self.ops):
                    if point.name in self.reads(op):
                        last = i
                return last
            return None
        return self.start(point)

    def bounds(self, between):
        s, e = self.start(between.start), self.end(between.end)
        if s is None or e is None:
            return None
        if e < s:
            raise RefError("order")
        return s, e

    def holds(self, expr, i) -> bool:
        op = self.ops[i]
        if isinstance(expr, T.OpIn):
            return any(fnmatch.fnmatchcase(op.sym.name, g) for g in expr.globs)
        if isinstance(expr, T.Reads):
            return any(fnmatch.fnmatchcase(n, g) for n in self.reads(op) for g in expr.globs)
        if isinstance(expr, T.Between):
            b = self.bounds(expr)
            return b is not None and b[0] <= i <= b[1]
        if isinstance(expr, T.Forward):
            return self.phase == "forward"
        if isinstance(expr, T.Backward):
            return self.phase == "backward"
        if isinstance(expr, T.All):
            return True
        if isinstance(expr, (T.RankIn, T.Steps)):
            return True  # gates are decided at run time
        if isinstance(expr, T.BackwardOf):
            if self.phase != "backward" or self.forward is None:
                return False
            return bool(self.origins()[i] & set(self.forward.where(expr.expr)))
        if isinstance(expr, (T.ModuleIn, T.ClassIn)):
            chain = self.chains()[i]
            if not chain:
                return False
            names = {c.path: c.cls for c in chain}
            parts = chain[-1].path.split(".") if chain[-1].path else []
            for n in range(1, len(parts)):
                names.setdefault(".".join(parts[:n]), self.classes().get(".".join(parts[:n])))
            if isinstance(expr, T.ModuleIn):
                return any(path and _path_glob(path, g) for path in names for g in expr.globs)
            return any(cls and fnmatch.fnmatchcase(cls, g) for cls in names.values() for g in expr.globs)
        if isinstance(expr, T.Source):
            for filename, line in _lines(op):
                if expr.first <= line <= expr.last and (
                    fnmatch.fnmatchcase(filename, expr.file) or fnmatch.fnmatchcase(filename, "*/" + expr.file)
                ):
                    return True
            return False
        if isinstance(expr, T.Not):
            return not self.holds(expr.operand, i)
        # Every operand is evaluated (no short circuit): a region that ends before
        # it starts is an error wherever it stands, even where it cannot change the result.
        if isinstance(expr, T.And):
            return all([self.holds(e, i) for e in expr.operands])
        if isinstance(expr, T.Or):
            return any([self.holds(e, i) for e in expr.operands])
        raise TypeError(expr)

    # -- modules, from the documented rules (nvtx_regions.attribution.module_calls), by linear scans --

    def classes(self) -> dict:
        view = self if self.phase == "forward" or self.forward is None else self.forward
        for op in view.ops:
            for b in [op, *op.subsymbols]:
                if hasattr(b.source_filename, "classes"):
                    return b.source_filename.classes
        return {}

    def chains(self) -> list:
        return self._chains

    @functools.cached_property  # the trace does not change
    def _chains(self) -> list:
        if self.phase == "forward":
            return [_recorded(op) for op in self.ops]
        fw = self.forward.chains() if self.forward is not None else []
        return [_common(fw[j] for j in sorted(o)) if o else None for o in self.origins()]

    def origins(self) -> list:
        """Per backward op, the set of forward op positions it is traced to."""
        return self._origins

    @functools.cached_property  # the trace does not change; asked per op, it was quadratic
    def _origins(self) -> list:
        fw = self.forward
        if self.phase != "backward" or fw is None:
            return [set() for _ in self.ops]
        readers = lambda name: {j for j, f in enumerate(fw.ops) if name in fw.reads(f)}
        ret = self.trace.bound_symbols[-1]
        grads = list(ret.args[0]) if ret.sym.name == "python_return" and isinstance(ret.args[0], (tuple, list)) else []
        grad_of = {}
        for arg, g in zip(fw.trace.args, grads):
            if isinstance(arg, Proxy) and isinstance(g, Proxy):
                grad_of.setdefault(g.name, set()).update(readers(arg.name))
        computed = {n for op in self.ops for n in self.writes(op)}
        evidence = []
        for op in self.ops:
            found = set().union(*(grad_of.get(n, set()) for n in self.writes(op)))
            if not found:
                for n in self.reads(op):
                    if n in computed:
                        continue
                    r = readers(n)
                    if not r:
                        r = {j for j, f in enumerate(fw.ops) if n in fw.writes(f)}
                        r = {min(r)} if r else set()
                    found |= r
            evidence.append(found)
        fwc = fw.chains()
        key = lambda o: None if not o else tuple(c.call for c in (_common(fwc[j] for j in sorted(o)) or ()))
        n = len(self.ops)

        def producers(p):
            return [q for q in range(p) if set(self.writes(self.ops[q])) & set(self.reads(self.ops[p]))]

        def consumers(p):
            return [q for q in range(p + 1, n) if set(self.reads(self.ops[q])) & set(self.writes(self.ops[p]))]

        up, down = [None] * n, [None] * n  # (steps, origins)
        for p in range(n):
            if not evidence[p]:
                c = [(1, -q, evidence[q]) if evidence[q] else (up[q][0] + 1, -q, up[q][1]) for q in producers(p) if evidence[q] or up[q]]
                up[p] = min(c, key=lambda t: t[:2])[::2] if c else None
        for p in reversed(range(n)):
            if not evidence[p]:
                c = [(1, q, evidence[q]) if evidence[q] else (down[q][0] + 1, q, down[q][1]) for q in consumers(p) if evidence[q] or down[q]]
                down[p] = min(c, key=lambda t: t[:2])[::2] if c else None
        preferred = []
        for p in range(n):
            sides = [s for s in (up[p], down[p]) if s]
            preferred.append(min(sides, key=lambda s: s[0])[1] if sides and not evidence[p] else None)
        result = [set(e) for e in evidence]
        marks = [p for p in range(n) if evidence[p]]
        if not marks:
            return [set(x or ()) for x in preferred]
        for before, after in [(None, marks[0])] + list(zip(marks, marks[1:])) + [(marks[-1], None)]:
            gap = list(range(0 if before is None else before + 1, n if after is None else after))
            if not gap:
                continue
            if before is None or after is None or key(evidence[before]) == key(evidence[after]):
                split = len(gap) if before is not None else 0
            else:
                a, b = key(evidence[before]), key(evidence[after])
                score = lambda cut: sum(key(preferred[p]) == a for p in gap[:cut]) + sum(key(preferred[p]) == b for p in gap[cut:])
                split = max(range(len(gap) + 1), key=lambda cut: (score(cut), cut))
            for k, p in enumerate(gap):
                side = evidence[before] if (k < split and before is not None) or after is None else evidence[after]
                mine = preferred[p]
                result[p] = set(mine) if mine and key(mine) == key(side) else set(side)
        return result

    def calls(self, by: str, globs, within=()) -> list:
        """(message, first, last) per matching module call, for an `each` rule."""
        found = {}
        for i, chain in enumerate(self.chains()):
            for depth, call in enumerate(chain or ()):
                name = call.path if by == "module" else call.cls
                ok = (_path_glob(name, g) if by == "module" else fnmatch.fnmatchcase(name, g) for g in globs)
                if any(ok) and all(self._inside(chain[: depth + 1], w) for w in within):
                    first, _, d = found.get(call, (i, i, depth))
                    found[call] = (first, i, d)
        suffix = " (backward)" if self.phase == "backward" else ""
        rows = sorted(found.items(), key=lambda kv: (kv[1][0], -kv[1][1], kv[1][2]))
        return [((call.path or call.cls) + suffix, first, last) for call, (first, last, _) in rows]

    def _inside(self, chain, expr) -> bool:
        saved = self.chains
        try:
            self.chains = lambda: [chain]
            return self.holds(expr, 0) if self.ops else False
        finally:
            self.chains = saved

    def expected(self, spec: T.Spec) -> Expected:
        op_ranges, regions = {}, []
        for rule in spec.rules:
            conj = _conjuncts(rule.expr)
            rest = [e for e in conj if not isinstance(e, (T.RankIn, T.Steps))]
            eaches = [e for e in rest if isinstance(e, (T.EachModule, T.EachClass))]
            if eaches:
                phases = [e for e in rest if isinstance(e, (T.Forward, T.Backward))]
                within = [e for e in rest if isinstance(e, (T.ModuleIn, T.ClassIn))]
                if all(self.holds(p, 0) for p in phases) if self.ops else False:
                    by = "module" if isinstance(eaches[0], T.EachModule) else "class"
                    for message, first, last in self.calls(by, eaches[0].globs, within):
                        regions.append(((first, last), message))
                continue
            betweens = [e for e in rest if isinstance(e, T.Between)]
            phases = [e for e in rest if isinstance(e, (T.Forward, T.Backward))]
            if len(betweens) == 1 and len(betweens) + len(phases) == len(rest):
                if all(self.holds(p, 0) for p in phases) if self.ops else False:
                    b = self.bounds(betweens[0])
                    if b is not None:
                        label = rule.label
                        if label is None:
                            label = f"{_point(betweens[0].start)}..{_point(betweens[0].end)}"
                        regions.append((b, label))
                continue
            body = T.And(tuple(rest)) if rest else T.All()
            for i in self.where(body):
                op_ranges[i] = True
        # Regions must nest.
        for (s1, e1), _ in regions:
            for (s2, e2), _ in regions:
                if s1 < s2 <= e1 < e2:
                    raise RefError("overlap")
        ops = [(i, 1, -i, (self.ops[i], self.ops[i], one_line(self.ops[i]))) for i in sorted(op_ranges)]
        spans = [(s, 0, -e, (self.ops[s], self.ops[e], label)) for (s, e), label in regions]
        in_order = sorted(ops + spans, key=lambda item: item[:3])  # stable: same extent keeps rule order
        return Expected(
            [item[3] for item in ops], [item[3] for item in spans], [item[3] for item in in_order]
        )


def _path_glob(path: str, glob: str) -> bool:
    """Module glob: `*` within one dotted component, `**` any number of them."""
    def match(parts, pats):
        if not pats:
            return not parts
        if pats[0] == "**":
            return any(match(parts[k:], pats[1:]) for k in range(len(parts) + 1))
        return bool(parts) and fnmatch.fnmatchcase(parts[0], pats[0]) and match(parts[1:], pats[1:])

    return bool(path) and match(path.split("."), glob.split("."))


def _recorded(bsym):
    calls = getattr(bsym.source_filename, "calls", None)
    if calls is not None and not getattr(bsym.sym, "is_fusion", False):
        return calls
    return _common([_recorded(s) for s in bsym.subsymbols] + ([calls] if calls is not None else []))


def _common(chains):
    """The longest common prefix by module path; of two calls of one module, the earlier."""
    result = None
    for chain in chains:
        if chain is None:
            continue
        if result is None:
            result = list(chain)
            continue
        k = 0
        while k < min(len(result), len(chain)) and result[k].path == chain[k].path:
            if chain[k].call < result[k].call:
                result[k] = chain[k]
            k += 1
        result = result[:k]
    return None if result is None else tuple(result)


def _lines(bsym):
    if getattr(bsym.sym, "is_fusion", False) or bsym.source_positions is None:
        for sub in bsym.subsymbols:
            yield from _lines(sub)
    elif bsym.source_filename:
        yield str(bsym.source_filename), bsym.source_positions.lineno


def _conjuncts(expr) -> list:
    """A rule's top-level `and` operands; a parenthesized `and` among them is the same conjunction."""
    if not isinstance(expr, T.And):
        return [expr]
    return [part for operand in expr.operands for part in _conjuncts(operand)]


def _point(point) -> str:
    return point.name if isinstance(point, T.Proxy) else f"{'first' if isinstance(point, T.First) else 'last'}({T.render(point.expr)})"


def read_annotated(original, annotated):
    """The ranges of an annotated trace as (first bsym inside, last bsym inside, message), in push order.

    Asserts the structural promises: original bound symbols kept in order
    (by identity), balanced and nested pushes/pops, at most one gates line,
    before the first range, and the return stays last.
    """
    ours = [b.sym.name.startswith("nvtx_regions_") for b in annotated.bound_symbols]
    kept = [b for b, o in zip(annotated.bound_symbols, ours) if not o]
    assert len(kept) == len(original.bound_symbols)
    assert all(a is b for a, b in zip(kept, original.bound_symbols)), "original bound symbols changed"
    if original.bound_symbols and original.bound_symbols[-1].sym.name == "python_return":
        assert annotated.bound_symbols[-1] is original.bound_symbols[-1], "return is not last"
    stack, ranges, seen = [], [], 0
    own = [b for b, o in zip(annotated.bound_symbols, ours) if o]
    enters = [b for b in own if b.sym.name == "nvtx_regions_enter"]
    # The call's gates, where a range has one, are decided once, before its first range.
    assert len(enters) <= 1 and (not enters or own[0] is enters[0])
    for bsym, own in zip(annotated.bound_symbols, ours):
        if not own:
            seen += 1
        elif bsym.sym.name == "nvtx_regions_enter":
            continue
        elif "_push" in bsym.sym.name:
            stack.append((seen, json.loads(bsym.args[1]), len(ranges)))
            ranges.append(None)  # filled at its pop
        else:
            assert stack, "pop without push"
            first, message, slot = stack.pop()
            assert seen > first, "empty range"
            ranges[slot] = (original.bound_symbols[first], original.bound_symbols[seen - 1], message)
    assert not stack, "pushes never popped"
    return ranges


def as_keys(ranges):
    return sorted((id(a), id(b), m) for a, b, m in ranges)


def in_order(ranges):
    return [(id(a), id(b), m) for a, b, m in ranges]
