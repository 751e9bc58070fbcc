"""One benchmark process: compile the variants of each size, time them, write JSON.

    python benchmarks/worker.py --mode plain|tool|verify --layers 2,8,32 --out result.json [--smoke] [--lock FILE]

plain: no NVTX tool. Run-time cost (every op, `op in <linear>`), the stack-depth
    sweep at the smallest size, and transform (compile-time) cost.
tool: the capture tool attached in count mode (`run.py` sets
    NVTX_INJECTION64_PATH and NVTX_REGIONS_CAPTURE_MODE=count). Run-time cost,
    the depth sweep, and per-step push/pop counts checked against the traces.
verify: the capture tool in events mode at one size: the messages, domains and
    nesting one step emits, checked against the traces.

Workers may run side by side. With --lock, compiling holds a shared lock and
timing an exclusive one, so compilations overlap but nothing runs while a
worker times.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import gc
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

_MODE = sys.argv[sys.argv.index("--mode") + 1] if "--mode" in sys.argv[:-1] else None
if __name__ == "__main__" and _MODE in ("tool", "verify"):
    # Before torch or nvtx make their first NVTX call: NVTX picks its tool then.
    from nvtx_regions.testing import attach

    attach(mode="count" if _MODE == "tool" else "events")

import stats  # noqa: E402

STARTED = time.perf_counter()
SUSPECTS = 4  # depths re-timed per transform after the sweep


def log(mode: str, message: str) -> None:
    print(f"[{mode} {time.perf_counter() - STARTED:6.1f}s] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def locked(path: str | None, *, exclusive: bool):
    if path is None:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def rounds_for(step_seconds: float, variants: int, budget: float, low: int, high: int) -> int:
    return max(low, min(high, int(budget / (variants * max(step_seconds, 1e-4)))))


def transform_reruns(inputs: dict[int, list], budget: float, smoke: bool) -> dict[str, dict]:
    """CPU seconds in transform_trace_post_optimization over each size's traces, ours and thunder's.

    Every rep runs both transforms on every size, in an order that alternates,
    so that sizes and transforms are compared within the same stretch of time.
    """
    from thunder.dev_utils.nvtx_profile_transform import NvtxProfileTransform as ThunderNvtxTransform

    from nvtx_regions import NvtxProfileTransform

    ours, theirs = NvtxProfileTransform(), ThunderNvtxTransform()
    seconds = {layers: {"ours": [], "thunder": []} for layers in inputs}
    started = time.perf_counter()
    rep = 0
    while True:
        order = [(layers, name, t) for layers in inputs for name, t in (("ours", ours), ("thunder", theirs))]
        if rep % 2:
            order.reverse()
        gc.collect()
        for layers, name, transform in order:
            gc.disable()
            try:
                begin = time.thread_time_ns()
                for trace in inputs[layers]:
                    transform.transform_trace_post_optimization(trace)
                elapsed = time.thread_time_ns() - begin
            finally:
                gc.enable()
            if rep:  # the first rep warms up
                seconds[layers][name].append(elapsed / 1e9)
        ours.reports.clear()
        rep += 1
        spent = time.perf_counter() - started
        if rep > (1 if smoke else 5) and (smoke or rep > 20 or spent > budget):
            break
    return {str(layers): {"bsyms": sum(len(t.bound_symbols) for t in traces), **seconds[layers]}
            for layers, traces in inputs.items()}


def push_messages(trace) -> list[tuple[str | None, str]]:
    """(domain, message) of each push in a final trace, in order: what one call should emit."""
    out = []
    for bsym in trace.bound_symbols:
        name = bsym.sym.name
        if name == "nvtx_range_push":
            out.append((None, bsym.args[0]))
        elif name.startswith("nvtx_regions_") and "_push" in name:
            out.append(("nvtx_regions", json.loads(bsym.args[1])))
    return out


def measure_size(mode: str, layers: int, args: argparse.Namespace) -> dict:
    variants = {
        "plain": ["none", "ours", "thunder", "ours_linear", "none_again", "none_third"],
        "tool": ["none", "ours", "thunder"],
        "verify": ["ours"] if args.smoke else ["ours", "thunder"],
    }[mode]
    result: dict = {"layers": layers}
    with locked(args.lock, exclusive=False):
        import thunder  # noqa: F401  (seconds of import: with the compilations, not the timings)

        import workload

        base = workload.compile_base(layers)
        log(mode, f"{layers} layers: compiled in {base.seconds:.1f}s")
        compiled = {}
        for variant in variants:
            compiled[variant] = c = workload.build_variant(base, variant)
            log(mode, f"{layers} layers: built {variant} in {c.build_seconds:.1f}s, bsyms {c.bsyms}, ranges {c.ranges}")
    result["compile_seconds"] = base.seconds
    result["bsyms"] = {v: c.bsyms for v, c in compiled.items()}
    result["ranges"] = {v: c.ranges for v, c in compiled.items()}
    result["build_seconds"] = {v: c.build_seconds for v, c in compiled.items()}

    with locked(args.lock, exclusive=True):
        if mode == "verify":
            result["verify"] = verify_messages(compiled)
            return result

        steps = {v: c.step for v, c in compiled.items()}
        if mode == "tool":
            result["counts"] = count_calls(compiled)
        probe = stats.interleaved({"none": steps["none"]}, 5, warmup=2)
        step_seconds = stats.median(probe["cpu"]["none"]) / 1e9
        budget = (args.budget if mode == "plain" else args.budget * 2 / 3) if not args.smoke else 1.5
        rounds = rounds_for(step_seconds, len(steps), budget, 10 if args.smoke else 60, 800)
        log(mode, f"{layers} layers: timing {len(steps)} variants x {rounds} rounds (step ~{step_seconds * 1e3:.1f} ms)")
        result["rounds"] = rounds
        result["step_ns"] = stats.interleaved(steps, rounds, warmup=3 if args.smoke else 10)

        if layers == args.sweep_layers:
            result["depth_sweep"] = depth_sweep(mode, layers, steps, args.smoke)

        if mode == "plain":
            args.transform_inputs[layers] = [base.forward, base.backward]
    del compiled, steps, base
    gc.collect()
    return result


def depth_sweep(mode: str, layers: int, steps: dict, smoke: bool) -> dict:
    """Step times of none, ours and thunder's under 0..159 extra Python frames, interleaved per depth."""
    import workload

    depths = list(range(0, 160, 60)) if smoke else list(range(0, 160))
    per_depth = 1 if smoke else 7
    log(mode, f"{layers} layers: stack-depth sweep, {len(depths)} depths x {per_depth} rounds")
    names = ("none", "ours", "thunder")
    sweep: dict[str, dict[str, list[list[int]]]] = {c: {v: [] for v in names} for c in ("cpu", "wall")}
    gc.collect()
    gc.disable()
    try:
        for depth in depths:
            calls = {v: (lambda s=steps[v], d=depth: workload.at_depth(d, s)) for v in names}
            times = stats.interleaved(calls, per_depth, warmup=1, manage_gc=False)
            for clock in sweep:
                for v in names:
                    sweep[clock][v].append(times[clock][v])
    finally:
        gc.enable()
    # Re-time the worst depths of ours and of thunder's with more rounds, so that
    # a jump is told from a noisy sample.
    suspects: set[int] = set()
    for v in ("ours", "thunder"):
        cost = [stats.paired_ns({"v": t, "none": n}, "v") for t, n in zip(sweep["cpu"][v], sweep["cpu"]["none"])]
        suspects.update(sorted(range(len(depths)), key=cost.__getitem__)[-SUSPECTS:])
    confirmed = {}
    for i in sorted(suspects):
        calls = {v: (lambda s=steps[v], d=depths[i]: workload.at_depth(d, s)) for v in names}
        confirmed[str(i)] = stats.interleaved(calls, 3 if smoke else 21, warmup=1)
    log(mode, f"{layers} layers: re-timed depths {[depths[i] for i in sorted(suspects)]}")
    code = workload.at_depth.__code__
    return {
        "depths": depths,
        "ns": sweep,
        "confirmed": confirmed,
        # _PyInterpreterFrame on 3.11: 9 words of header, then locals and the value stack.
        "frame_bytes": 8 * (code.co_nlocals + code.co_stacksize + 9),
    }


def count_calls(compiled: dict) -> dict:
    """Push/pop calls the tool counted in one step of each variant."""
    from nvtx_regions.testing import capture

    counts = {}
    for variant, c in compiled.items():
        with capture() as events:
            c.step()
        counts[variant] = {k: events.counts.get(k, 0) for k in ("push", "pop", "register_string")}
        counts[variant]["expected"] = sum(c.ranges)
    return counts


def verify_messages(compiled: dict) -> dict:
    """One step per variant with events recorded: messages in order, domains and nesting."""
    from nvtx_regions.testing import balance_problems, capture

    out = {}
    for variant, c in compiled.items():
        expected = push_messages(c.forward) + push_messages(c.backward)
        with capture() as events:
            c.step()
        got = [(e.domain, e.message) for e in events if e.kind == "push"]
        pops = sum(1 for e in events if e.kind == "pop")
        mismatch = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), None)
        out[variant] = {
            "expected_pushes": len(expected),
            "pushes": len(got),
            "pops": pops,
            "messages_equal": got == expected,
            "first_mismatch": None if mismatch is None else [mismatch, got[mismatch], expected[mismatch]],
            "balance_problems": [str(p) for p in balance_problems(events)][:3],
            "domains": sorted({str(d) for d, _ in got}),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("plain", "tool", "verify"), required=True)
    parser.add_argument("--layers", default="2,8,32")
    parser.add_argument("--sweep-layers", type=int, default=None, help="size of the depth sweep (default: smallest)")
    parser.add_argument("--budget", type=float, default=24.0, help="seconds of step timing per size (plain)")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--lock")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    sizes = [int(s) for s in args.layers.split(",")]
    if args.sweep_layers is None:
        args.sweep_layers = min(sizes)
    if args.mode == "verify":
        sizes = [min(sizes)]

    with locked(args.lock, exclusive=False):
        import thunder
        import torch

    # One thread: steady timings on a small shared machine; the model is tiny anyway.
    torch.set_num_threads(1)

    out = {
        "mode": args.mode,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "thunder": getattr(thunder, "__version__", "?"),
        "threads": torch.get_num_threads(),
        "tool": os.environ.get("NVTX_INJECTION64_PATH"),
        "capture_mode": os.environ.get("NVTX_REGIONS_CAPTURE_MODE"),
        "sizes": [],
    }
    args.transform_inputs = {}
    for layers in sizes:
        out["sizes"].append(measure_size(args.mode, layers, args))
        Path(args.out).write_text(json.dumps(out))
    if args.mode in ("plain", "tool"):
        import fixed_cost

        with locked(args.lock, exclusive=True):
            log(args.mode, "fixed cost per call")
            out["fixed_cost"] = fixed_cost.measure(10 if args.smoke else 200, 50 if args.smoke else 400)
        Path(args.out).write_text(json.dumps(out))
    if args.transform_inputs:
        with locked(args.lock, exclusive=True):
            log(args.mode, f"transform reruns over sizes {list(args.transform_inputs)}")
            out["transform_reruns"] = transform_reruns(args.transform_inputs, 25.0, args.smoke)
        Path(args.out).write_text(json.dumps(out))
    log(args.mode, "done")


if __name__ == "__main__":
    main()
