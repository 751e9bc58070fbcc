"""Cost of the selector language: parse + compile per rule, and planning per bound symbol per rule.

Needs neither thunder nor torch: the plan runs on a synthetic `TraceView`.
"""

from __future__ import annotations

import gc
import time

import stats

# Varied rules: op globs, quoted names, reads, betweens (proxies, first/last),
# labels, boolean combinations, run-time gates, comments. {i} and {j} vary per rule.
RULE_TEMPLATES = (
    "op in <linear, nvFusion*>",
    "attn_{i}: between t{i}..t{j}",
    "(op in <mul*, add> or reads <t{i}>) and not backward",
    'l{i}: op in <"layer_norm", sdpa*> and forward',
    "between first(op in <linear>)..last(op in <gelu*>)",
    "op in <matmul, bmm> and rank in <0, 1> and steps 3..10",
    '"region {i}": between t{i}..last(op in <add*>)',
    "not (op in <to*> or op in <reshape>) and reads <t{i}*>",
    "op in <x{i}_*>  # a comment",
    "backward and op in <cross_entropy*, softmax> and steps {i}..",
)


def make_spec(rules: int) -> str:
    return "\n".join(RULE_TEMPLATES[i % len(RULE_TEMPLATES)].format(i=i, j=i + 7) for i in range(rules))


def _time(fn, reps: int) -> list[float]:
    out = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(reps):
            started = time.thread_time_ns()
            fn()
            out.append((time.thread_time_ns() - started) / 1e9)
    finally:
        gc.enable()
    return out


def parse_compile_cost(sizes: tuple[int, ...], *, budget: float = 2.0) -> list[dict]:
    """Median CPU seconds to parse, to compile, and both, for specs of each number of rules."""
    from nvtx_regions import parse
    from nvtx_regions.selection.compile import compile_spec

    started = time.perf_counter()
    parse("op in <linear>")  # builds the LALR parser once per process
    first_parse = time.perf_counter() - started
    results = []
    for rules in sizes:
        text = make_spec(rules)
        spec = parse(text)
        assert len(spec.rules) == rules, (rules, len(spec.rules))
        compile_spec(spec)
        started = time.perf_counter()
        parse(text)
        once = time.perf_counter() - started
        reps = max(3, min(2000, int(budget / 2 / max(once, 1e-6))))
        parse_s = stats.median(_time(lambda: parse(text), reps))
        compile_s = stats.median(_time(lambda: compile_spec(spec), reps))
        totals = _time(lambda: compile_spec(parse(text)), reps)
        results.append(
            {"rules": rules, "reps": reps, "parse_s": parse_s, "compile_s": compile_s, "total_s": stats.median(totals),
             "total_min_s": min(totals), "first_parse_s": first_parse}
        )
    return results


# The planner's benchmark spec: 10 rules of every kind, regions nested
# (first/last gelu ⊃ mlp ⊃ inner), one rule gated at run time.
PLAN_RULES = (
    "op in <linear>",
    "op in <nvFusion*, sdpa>",
    "mlp: between t1000..t{big}",
    "inner: between t2000..t3000",
    "reads <t5*>",
    "(op in <add> or op in <mul>) and not reads <t1*>",
    "between first(op in <gelu>)..last(op in <gelu>)",
    "op in <layer_norm> and forward",
    "not op in <reshape, matmul, softmax, linear, add, mul, gelu, layer_norm, sdpa>",
    "op in <matmul> and rank in <0> and steps 2..",
)
OP_NAMES = ("linear", "add", "mul", "gelu", "layer_norm", "sdpa", "reshape", "nvFusion0", "matmul", "softmax")


def synthetic_view(n: int):
    """A forward `TraceView` of `n` compute ops: op i writes t{i}, reads t{i-1} and t{i-5}."""
    from nvtx_regions.attribution.traceview import Op, TraceView

    ops = []
    for i in range(n):
        reads = tuple(f"t{k}" for k in (i - 1, i - 5) if k >= 0) or ("x",)
        name = OP_NAMES[(i * 7 + i // 10) % len(OP_NAMES)]
        ops.append(Op(i, name, reads, (f"t{i}",), is_fusion=name.startswith("nvFusion")))
    return lambda: TraceView(ops=ops, phase="forward", args=frozenset({"x"}), name="synthetic", length=n)


def plan_cost(bsyms: int, *, reps: int = 7) -> dict:
    """Median CPU seconds of `make_plan` for the 10 `PLAN_RULES` over a fresh synthetic view of `bsyms` ops.

    A fresh view per rep, so the indexes it builds lazily (by name, by read,
    producers) are part of the cost, as they are per trace in the transform.
    """
    from nvtx_regions import parse
    from nvtx_regions.selection.compile import compile_spec
    from nvtx_regions.selection.plan import make_plan

    spec = compile_spec(parse("\n".join(PLAN_RULES).format(big=int(bsyms * 0.9))))
    new_view = synthetic_view(bsyms)
    plan = make_plan(spec, new_view())
    times = []
    for _ in range(reps):
        view = new_view()
        gc.collect()
        gc.disable()
        try:
            started = time.thread_time_ns()
            make_plan(spec, view)
            times.append((time.thread_time_ns() - started) / 1e9)
        finally:
            gc.enable()
    return {
        "bsyms": bsyms,
        "rules": len(PLAN_RULES),
        "reps": reps,
        "seconds": stats.median(times),
        "min_seconds": min(times),
        "ranges": len(plan.ranges),
        "ranges_per_rule": list(plan.ranges_per_rule),
    }
