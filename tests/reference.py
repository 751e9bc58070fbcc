"""A plain reference evaluator of the selector language, and a reader of
annotated traces. Written from the language reference, not from the package:
per bound symbol, with linear scans, no bitsets and no indexes.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, field

from thunder.core.proxies import CollectionProxy, Proxy
from thunder.core.trace import TraceTag
from thunder.dev_utils.utils import NON_COMPUTATION_PRIMS

from nvtx_regions import tree as T

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
            fw = self.forward
            saved = {n for j in fw.where(expr.expr) for n in fw.writes(fw.ops[j]) + fw.reads(fw.ops[j])}
            return any(n in saved for n in self.reads(op))
        if isinstance(expr, T.Not):
            return not self.holds(expr.operand, i)
        # Every operand is evaluated (no short circuit): a region that ends before
        # it starts is an error wherever it stands, even where it cannot change the result.
        if isinstance(expr, T.And):
            return all([self.holds(e, i) for e in expr.operands])
        if isinstance(expr, T.Or):
            return any([self.holds(e, i) for e in expr.operands])
        raise TypeError(expr)

    def expected(self, spec: T.Spec) -> Expected:
        op_ranges, regions = {}, []
        for rule in spec.rules:
            conj = _conjuncts(rule.expr)
            rest = [e for e in conj if not isinstance(e, (T.RankIn, T.Steps))]
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
    (by identity), balanced and nested pushes/pops, the first push enters and
    the last pop exits, and the return stays last.
    """
    ours = [b.sym.name.startswith("nvtx_regions_") for b in annotated.bound_symbols]
    kept = [b for b, o in zip(annotated.bound_symbols, ours) if not o]
    assert len(kept) == len(original.bound_symbols)
    assert all(a is b for a, b in zip(kept, original.bound_symbols)), "original bound symbols changed"
    if original.bound_symbols and original.bound_symbols[-1].sym.name == "python_return":
        assert annotated.bound_symbols[-1] is original.bound_symbols[-1], "return is not last"
    stack, ranges, seen = [], [], 0
    pushes = [b for b, o in zip(annotated.bound_symbols, ours) if o and "_push" in b.sym.name]
    pops = [b for b, o in zip(annotated.bound_symbols, ours) if o and "_pop" in b.sym.name]
    if pushes:
        assert pushes[0].sym.name.endswith("_push_enter") and pops[-1].sym.name.endswith("_pop_exit")
        assert sum(b.sym.name.endswith("_push_enter") for b in pushes) == 1
        assert sum(b.sym.name.endswith("_pop_exit") for b in pops) == 1
    for bsym, own in zip(annotated.bound_symbols, ours):
        if not own:
            seen += 1
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
