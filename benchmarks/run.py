"""Benchmark nvtx_regions against thunder's own NVTX transform, on CPU.

    .venv/bin/python benchmarks/run.py            # full run, ~5 min on 2 cores
    .venv/bin/python benchmarks/run.py --smoke    # every section, 0 layers, < 1 min
    .venv/bin/python benchmarks/run.py --json results.json
    .venv/bin/python benchmarks/run.py --from-json results.json   # the report again, nothing measured

Prints a Markdown report (the tables of BENCHMARKS.md) on stdout, progress on
stderr. Sections:

1. Run-time cost per NVTX range of a nanoGPT training step (forward and
   backward), every compute op selected, ours and thunder's, with no NVTX tool
   and with a counting tool attached; and across Python stack depths.
2. `op in <linear>` against `all`: cost per range, and per op not selected.
3. Transform (compile-time) cost per bound symbol, and its growth with size.
4. Language cost: parse + compile per rule, plan per bound symbol per rule.

Sections 1-3 run in worker processes (`worker.py`): the tool must be attached
before a process's first NVTX call. The workers compile side by side but time
one at a time (a file lock), and within a worker the variants are interleaved.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import language  # noqa: E402
import stats  # noqa: E402

# ours / thunder's run-time cost per range, by worker mode (issue 16: no tool, tool attached)
TARGET_RANGE_RATIO = {"plain": 0.20, "tool": 0.40}
TARGET_LINEARITY = 0.25  # |growth of transform time / growth of bsyms - 1|
TARGET_RULE_US = 50.0  # parse + compile per rule
TARGET_PLAN_US = 2.0  # plan per bound symbol per rule
TARGET_FIXED_RATIO = 0.8  # our fixed cost per call / thunder's cost per range


def machine() -> dict:
    model = platform.processor() or "?"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return {"cpu": model, "cores": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}


def run_workers(args: argparse.Namespace, layers: str) -> dict[str, dict]:
    from nvtx_regions.capture import build_tool

    tool = str(build_tool())
    # A tool set here (e.g. by the test session's capture plugin) must not reach the plain worker.
    drop = ("NVTX_INJECTION64_PATH", "NVTX_REGIONS_CAPTURE_MODE", "NVTX_REGIONS_CAPTURE_DIR")
    base_env = {k: v for k, v in os.environ.items() if k not in drop}
    envs = {
        "plain": base_env,
        "tool": {**base_env, "NVTX_INJECTION64_PATH": tool, "NVTX_REGIONS_CAPTURE_MODE": "count"},
        "verify": {**base_env, "NVTX_INJECTION64_PATH": tool, "NVTX_REGIONS_CAPTURE_MODE": "events"},
    }
    modes = [m for m in ("plain", "tool", "verify") if m not in args.skip]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="nvtx_regions_bench-") as tmp:
        lock = os.path.join(tmp, "timing.lock")
        procs = {}
        for mode in modes:
            argv = [sys.executable, str(HERE / "worker.py"), "--mode", mode, "--layers", layers,
                    "--lock", lock, "--out", os.path.join(tmp, f"{mode}.json")]
            if args.smoke:
                argv.append("--smoke")
            procs[mode] = subprocess.Popen(argv, env=envs[mode], stdout=sys.stderr)
        failed = []
        for mode, proc in procs.items():
            if proc.wait() != 0:
                failed.append(f"{mode} (exit {proc.returncode})")
            path = Path(tmp, f"{mode}.json")
            if path.exists():
                results[mode] = json.loads(path.read_text())
        if failed:
            raise SystemExit(f"benchmark workers failed: {', '.join(failed)}")
    return results


# ---------------------------------------------------------------- analysis


def cost(size: dict, variant: str, clock: str = "cpu", estimator=stats.paired_ns) -> dict:
    """`variant`'s overhead per step against `none` and per range, with 90% intervals over resampled rounds."""
    times = size["step_ns"][clock]
    rounds = len(times["none"])
    ranges = sum(size["ranges"][variant])

    def overhead(indexes):
        return estimator(times, variant, indexes=indexes)

    value = overhead(range(rounds))
    low, high = stats.bootstrap(overhead, rounds)
    out = {"ranges": ranges, "overhead_us": value / 1e3, "overhead_ci_us": (low / 1e3, high / 1e3)}
    if ranges:
        out["ns_per_range"], out["ci"] = value / ranges, (low / ranges, high / ranges)
    return out


def ratio(size: dict, a: str = "ours", b: str = "thunder", clock: str = "cpu", estimator=stats.paired_ns):
    """(a's cost per range) / (b's), with a 90% interval over resampled rounds."""
    times = size["step_ns"][clock]
    rounds = len(times["none"])
    ra, rb = sum(size["ranges"][a]), sum(size["ranges"][b])

    def value(indexes):
        theirs = estimator(times, b, indexes=indexes) / rb
        return (estimator(times, a, indexes=indexes) / ra) / theirs if theirs else float("inf")

    return value(range(rounds)), stats.bootstrap(value, rounds)


def fit_sizes(sizes: list[dict], clock: str = "cpu") -> dict[str, tuple[float, float]]:
    """Per transform: (ns per range, µs per step) of overhead = fixed + slope × ranges, over the sizes."""
    if len(sizes) < 2:
        return {}
    fits = {}
    for variant in ("ours", "thunder"):
        xs = [sum(size["ranges"][variant]) for size in sizes]
        ys = [stats.paired_ns(size["step_ns"][clock], variant) for size in sizes]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        fits[variant] = (slope, (my - slope * mx) / 1e3)
    return fits


def sweep_summary(size: dict, clock: str = "cpu") -> dict:
    """ns per range at each depth (paired against none at that depth); re-timed depths use the re-timing."""
    sweep = size["depth_sweep"]
    names = ("none", "ours", "thunder")
    ns = sweep["ns"][clock]
    per_depth = [{v: ns[v][i] for v in names} for i in range(len(sweep["depths"]))]
    confirmed = {int(i): t[clock] for i, t in sweep.get("confirmed", {}).items()}
    out = {
        "depths": sweep["depths"],
        "frame_bytes": sweep["frame_bytes"],
        "rounds": len(ns["none"][0]),
        "confirmed": sorted(confirmed),
        "confirm_rounds": len(next(iter(confirmed.values()))["none"]) if confirmed else 0,
    }
    for variant in ("ours", "thunder"):
        ranges = sum(size["ranges"][variant])
        out[variant] = [stats.paired_ns(times, variant) / ranges for times in per_depth]
        out[variant + "_first"] = {i: out[variant][i] for i in confirmed}
        for i, times in confirmed.items():
            out[variant][i] = stats.paired_ns(times, variant) / ranges
    out["none_ms"] = [stats.median(times["none"]) / 1e6 for times in per_depth]
    return out


def fmt_ci(ci: tuple[float, float], digits: int = 0) -> str:
    return f"[{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"


def verdict(ok: bool) -> str:
    return "**met**" if ok else "**missed**"


def report(results: dict, lang: list[dict], plan: dict, info: dict) -> tuple[str, dict]:
    lines: list[str] = []
    targets: dict = {}
    out = lines.append
    plain = results.get("plain", {})
    m = info["machine"]
    out("# nvtx_regions benchmark results\n")
    out(f"- date: {info['date']}; command: `{info['command']}`; total time {info['seconds']:.0f} s")
    out(f"- machine: {m['cpu']}, {m['cores']} cores; Python {m['python']}; torch {plain.get('torch', '?')}; "
        f"thunder {plain.get('thunder', '?')}; {m['platform']}; load average at start / end: "
        f"{info['load'][0]} / {info['load'][1]}")
    out("- model: thunder.tests.nanogpt_model GPT, n_embd 16, 2 heads, block 16, vocab 64, batch 2; "
        "step = forward + loss.backward(); each size compiled once, each variant built from that compilation "
        "(see benchmarks/workload.py)")
    out(f"- timing: torch threads {plain.get('threads', '?')}; gc off while timing; variants interleaved, one "
        "step each per round, order rotated every round; CPU time of the thread (`time.thread_time_ns`: user + "
        "system) unless marked wall clock. Overhead = median over rounds of (variant − none in the same round); "
        "[90%] = percentile interval from resampling rounds")
    compile_s = ", ".join(f"{s['layers']} layers {s['compile_seconds']:.0f} s" for s in plain.get("sizes", []))
    if compile_s:
        out(f"- thunder compilation of each size (plain worker, sharing the machine with the others): {compile_s}")
    out("")

    # 1. run-time cost
    out("## 1. Run-time cost per NVTX range, every compute op selected\n")
    for mode, title in (("plain", "no NVTX tool"), ("tool", "capture tool attached, count mode")):
        if mode not in results:
            continue
        sizes = results[mode]["sizes"]
        out(f"### {title}\n")
        out("| layers | bsyms fwd+bwd | ranges ours / thunder's | step, none (ms) | ours ns/range [90%] | "
            f"thunder ns/range [90%] | ours / thunder [90%] | target ≤ {TARGET_RANGE_RATIO[mode]:.2f} | same, difference of medians | "
            "same, wall clock |")
        out("|---|---|---|---|---|---|---|---|---|---|")
        for size in sizes:
            ours, theirs = cost(size, "ours"), cost(size, "thunder")
            value, ci = ratio(size)
            by_medians, _ = ratio(size, estimator=stats.median_diff_ns)
            wall, _ = ratio(size, clock="wall")
            targets[f"range_ratio_{mode}_{size['layers']}"] = value
            targets[f"range_ratio_medians_{mode}_{size['layers']}"] = by_medians
            targets[f"ours_ns_per_range_{mode}_{size['layers']}"] = ours["ns_per_range"]
            targets[f"thunder_ns_per_range_{mode}_{size['layers']}"] = theirs["ns_per_range"]
            out(f"| {size['layers']} | {sum(size['bsyms']['none'])} | {ours['ranges']} / {theirs['ranges']} | "
                f"{stats.median(size['step_ns']['cpu']['none']) / 1e6:.2f} | "
                f"{ours['ns_per_range']:.0f} {fmt_ci(ours['ci'])} | {theirs['ns_per_range']:.0f} {fmt_ci(theirs['ci'])} | "
                f"{value:.2f} {fmt_ci(ci, 2)} | {verdict(value <= TARGET_RANGE_RATIO[mode])} | {by_medians:.2f} | "
                f"{wall:.2f} |")
        out(f"\nRounds per size: {', '.join(str(s['rounds']) for s in sizes)}.\n")
        fits = fit_sizes(sizes)
        if fits:
            out("Least-squares fit over the sizes, overhead per step = fixed + slope × ranges:\n")
            out("| transform | slope (ns/range) | fixed (µs/step) |")
            out("|---|---|---|")
            for variant, (slope, fixed) in fits.items():
                out(f"| {variant} | {slope:.0f} | {fixed:.1f} |")
                targets[f"slope_{mode}_{variant}"] = slope
            out(f"\nSlope ratio ours / thunder: {fits['ours'][0] / fits['thunder'][0]:.2f}\n")
        if mode == "tool":
            out("Calls the tool counted in one step (sanity check):\n")
            out("| layers | variant | push | pop | expected ranges | ok |")
            out("|---|---|---|---|---|---|")
            for size in sizes:
                for variant, c in size["counts"].items():
                    ok = c["push"] == c["pop"] == c["expected"]
                    targets[f"counts_ok_{size['layers']}_{variant}"] = ok
                    out(f"| {size['layers']} | {variant} | {c['push']} | {c['pop']} | {c['expected']} | "
                        f"{'yes' if ok else '**NO**'} |")
            out("")
    if "verify" in results:
        out("### Messages (capture tool in events mode, one step)\n")
        out("| layers | variant | pushes / expected | pops | messages, in order, equal the traces' | domains | "
            "nesting problems |")
        out("|---|---|---|---|---|---|---|")
        for size in results["verify"]["sizes"]:
            for variant, v in size["verify"].items():
                targets[f"messages_ok_{variant}"] = v["messages_equal"] and not v["balance_problems"]
                same = "yes" if v["messages_equal"] else "**NO** " + repr(v["first_mismatch"])[:120]
                out(f"| {size['layers']} | {variant} | {v['pushes']} / {v['expected_pushes']} | {v['pops']} | "
                    f"{same} | {', '.join(v['domains'])} | {len(v['balance_problems'])} |")
        out("")

    for mode, title in (("plain", "no NVTX tool"), ("tool", "tool attached")):
        for size in results.get(mode, {}).get("sizes", []):
            if "depth_sweep" not in size:
                continue
            sweep = sweep_summary(size)
            depths = sweep["depths"]
            step = depths[1] - depths[0] if len(depths) > 1 else 1
            out(f"### Stack depth sweep, {title}, {size['layers']} layers\n")
            out(f"The step runs under d extra Python frames ({sweep['frame_bytes']} bytes each), d in "
                f"range({depths[0]}, {depths[-1] + 1}, {step}), {sweep['rounds']} interleaved rounds per depth "
                f"(none, ours, thunder's); then the 4 worst depths of each transform are re-timed with "
                f"{sweep['confirm_rounds']} rounds and those values used. ns per range:\n")
            out("| variant | min | median | max | max / median | depth of max | re-timed depths: first → re-timed |")
            out("|---|---|---|---|---|---|---|")
            for variant in ("ours", "thunder"):
                values = sweep[variant]
                med = stats.median(values)
                worst = max(range(len(values)), key=values.__getitem__)
                retimed = ", ".join(
                    f"{depths[i]}: {sweep[variant + '_first'][i]:.0f} → {values[i]:.0f}" for i in sweep["confirmed"]
                )
                targets[f"sweep_{mode}_{variant}_max_over_median"] = values[worst] / med if med else math.nan
                out(f"| {variant} | {min(values):.0f} | {med:.0f} | {values[worst]:.0f} | "
                    f"{values[worst] / med if med else math.nan:.2f} | {depths[worst]} | {retimed} |")
            none = sweep["none_ms"]
            out(f"| (step, none, ms) | {min(none):.2f} | {stats.median(none):.2f} | {max(none):.2f} | "
                f"{max(none) / stats.median(none):.2f} | {depths[max(range(len(none)), key=none.__getitem__)]} | |\n")

    # 2. op in <linear> vs all
    if "plain" in results:
        out("## 2. Ops not selected cost nothing: `op in <linear>` against `all` (no tool)\n")
        out("Overhead per step against `none`. `none again` and `none third` are more builds with no transform, "
            "A/A controls: their overheads show how much identical builds differ. \"Per op not selected\" = "
            "(linear's overhead − its ranges × all's ns/range) / (ops all selects and linear does not); it also "
            "charges to those ops the fixed cost per call of an annotated trace (the guard that closes what a "
            "call that raises left open is a Python call), so it is an upper-bound style figure.\n")
        out("| layers | ranges linear / all | ops not selected | overhead linear (µs) [90%] | overhead none again; "
            "none third (µs) [90%] | ns/range linear [90%] | ns/range all [90%] | ns per op not selected [90%] |")
        out("|---|---|---|---|---|---|---|---|")
        for size in results["plain"]["sizes"]:
            if "ours_linear" not in size["step_ns"]["cpu"]:
                continue
            lin, full = cost(size, "ours_linear"), cost(size, "ours")
            controls = [cost(size, v) for v in ("none_again", "none_third") if v in size["step_ns"]["cpu"]]
            aa = [f"{c['overhead_us']:.1f} {fmt_ci(c['overhead_ci_us'], 1)}" for c in controls] or ["n/a"]
            times = size["step_ns"]["cpu"]
            rounds = len(times["none"])
            unselected = full["ranges"] - lin["ranges"]

            def per_unselected(indexes, times=times, lr=lin["ranges"], fr=full["ranges"], n=unselected):
                all_per_range = stats.paired_ns(times, "ours", indexes=indexes) / fr
                return (stats.paired_ns(times, "ours_linear", indexes=indexes) - lr * all_per_range) / n

            value = per_unselected(range(rounds))
            targets[f"unselected_ns_{size['layers']}"] = value
            out(f"| {size['layers']} | {lin['ranges']} / {full['ranges']} | {unselected} | {lin['overhead_us']:.1f} "
                f"{fmt_ci(lin['overhead_ci_us'], 1)} | {'; '.join(aa)} | "
                f"{lin['ns_per_range']:.0f} {fmt_ci(lin['ci'])} | {full['ns_per_range']:.0f} {fmt_ci(full['ci'])} | "
                f"{value:.1f} {fmt_ci(stats.bootstrap(per_unselected, rounds), 1)} |")
        out("")

    # 3. transform cost
    reruns = plain.get("transform_reruns")
    if reruns:
        out("## 3. Transform (compile-time) cost, every op selected (no tool)\n")
        out("CPU time in `transform_trace_post_optimization` for the forward and backward traces together, on the "
            "traces thunder hands post-optimization transforms; ours and thunder's, all sizes, interleaved in "
            f"each of {len(next(iter(reruns.values()))['ours'])} reps; median.\n")
        out("| layers | bsyms in | ours (ms) | thunder (ms) | ours µs/bsym | thunder µs/bsym | ours / thunder | "
            "target ≤ 1 |")
        out("|---|---|---|---|---|---|---|---|")
        per = {}
        for layers, row in sorted(reruns.items(), key=lambda item: int(item[0])):
            ours, theirs, bsyms = stats.median(row["ours"]), stats.median(row["thunder"]), row["bsyms"]
            per[int(layers)] = (ours, theirs, bsyms)
            targets[f"transform_ratio_{layers}"] = ours / theirs
            out(f"| {layers} | {bsyms} | {ours * 1e3:.1f} | {theirs * 1e3:.1f} | {ours / bsyms * 1e6:.1f} | "
                f"{theirs / bsyms * 1e6:.1f} | {ours / theirs:.2f} | {verdict(ours <= theirs)} |")
        sizes = sorted(per)
        if len(sizes) >= 2:
            small, big = sizes[-2], sizes[-1]
            bsym_ratio = per[big][2] / per[small][2]
            out(f"\nLinearity, {big} layers against {small}:\n")
            out("| transform | time ratio | bsym ratio | time ratio / bsym ratio | target 1 ± 0.25 |")
            out("|---|---|---|---|---|")
            for k, name in ((0, "ours"), (1, "thunder")):
                rel = per[big][k] / per[small][k] / bsym_ratio
                targets[f"linearity_{name}"] = rel
                out(f"| {name} | {per[big][k] / per[small][k]:.2f} | {bsym_ratio:.2f} | {rel:.2f} | "
                    f"{verdict(abs(rel - 1) <= TARGET_LINEARITY) if name == 'ours' else '(reference)'} |")
        out("")

    # 4. language
    if lang:
        out("## 4. Language cost\n")
        out("Specs of varied rules (op globs, quoted names, reads, betweens of proxies and of first()/last(), "
            "labels, and/or/not, rank/steps gates, comments); CPU time, median of reps; the LALR parser is built "
            f"before (first parse in a process: {lang[0]['first_parse_s'] * 1e3:.0f} ms).\n")
        out("| rules | reps | parse µs/rule | compile µs/rule | parse+compile µs/rule | same, fastest rep | "
            "target ≤ 50 |")
        out("|---|---|---|---|---|---|---|")
        for row in lang:
            per_rule = row["total_s"] / row["rules"] * 1e6
            targets[f"rule_us_{row['rules']}"] = per_rule
            out(f"| {row['rules']} | {row['reps']} | {row['parse_s'] / row['rules'] * 1e6:.1f} | "
                f"{row['compile_s'] / row['rules'] * 1e6:.1f} | {per_rule:.1f} | "
                f"{row['total_min_s'] / row['rules'] * 1e6:.1f} | {verdict(per_rule <= TARGET_RULE_US)} |")
        per_bsym_rule = plan["seconds"] / plan["bsyms"] / plan["rules"] * 1e6
        targets["plan_us_per_bsym_rule"] = per_bsym_rule
        out(f"\nPlan: `make_plan` over a synthetic forward trace of {plan['bsyms']} compute bound symbols with "
            f"{plan['rules']} rules (3 nested regions, op/reads/boolean rules, one gated), a fresh view per rep: "
            f"median of {plan['reps']} reps {plan['seconds'] * 1e3:.0f} ms (fastest {plan['min_seconds'] * 1e3:.0f} ms), "
            f"{plan['ranges']} ranges: **{per_bsym_rule:.2f} µs per bsym per rule** (fastest "
            f"{plan['min_seconds'] / plan['bsyms'] / plan['rules'] * 1e6:.2f}; target ≤ {TARGET_PLAN_US:.0f}: "
            f"{verdict(per_bsym_rule <= TARGET_PLAN_US)}).\n")

    # 5. fixed cost per call
    fixed = {mode: results[mode]["fixed_cost"] for mode in ("plain", "tool") if "fixed_cost" in results.get(mode, {})}
    if fixed:
        out("## 5. Fixed cost per call of a trace\n")
        out("A one-op function (`x * 2`, 4 floats) with our transform selecting its one op: the call's "
            "guard (which closes what a call that raises left open), then the one range's push and pop lines, so the "
            "overhead against no transform is the fixed cost per call and one range. thunder's transform on the same function gives its cost per range (push + pop). The "
            "computation functions are called directly (no prologue); CPU time per call, median over rounds of "
            "paired differences (see benchmarks/fixed_cost.py).\n")
        out("| tool | rounds × calls | none (ns/call) | ours, fixed (ns/call) [90%] | thunder, per range (ns) [90%] | "
            f"ours / thunder [90%] | target ≤ {TARGET_FIXED_RATIO:g} |")
        out("|---|---|---|---|---|---|---|")
        for mode, f in fixed.items():
            times = f["ns"]["cpu"]
            rounds = len(times["none"])
            ours = stats.paired_ns(times, "ours")
            theirs = stats.paired_ns(times, "thunder")
            ours_ci = stats.bootstrap(lambda i: stats.paired_ns(times, "ours", indexes=i), rounds)
            theirs_ci = stats.bootstrap(lambda i: stats.paired_ns(times, "thunder", indexes=i), rounds)
            value = ours / theirs if theirs else math.inf
            ratio_ci = stats.bootstrap(
                lambda i: stats.paired_ns(times, "ours", indexes=i) / (stats.paired_ns(times, "thunder", indexes=i) or math.nan),
                rounds,
            )
            targets[f"fixed_ns_{mode}"] = ours
            targets[f"fixed_ratio_{mode}"] = value
            out(f"| {'attached (count mode)' if mode == 'tool' else 'none'} | {rounds} × {f['batch']} | "
                f"{stats.median(times['none']):.0f} | {ours:.0f} {fmt_ci(ours_ci)} | {theirs:.0f} {fmt_ci(theirs_ci)} | "
                f"{value:.2f} {fmt_ci(ratio_ci, 2)} | {verdict(value <= TARGET_FIXED_RATIO)} |")
        out("")
    return "\n".join(lines), {"targets": targets}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="every section at 0 layers (embeddings, final norm, head, loss) and small specs (< 1 min)")
    parser.add_argument("--layers", help="comma-separated model sizes (default 2,8,32; smoke: 1)")
    parser.add_argument("--skip", nargs="*", default=[], choices=("plain", "tool", "verify", "language"),
                        help="leave out workers or the language section")
    parser.add_argument("--json", help="also write the raw numbers here")
    parser.add_argument("--from-json", metavar="FILE", help="measure nothing: print the report of the raw numbers --json wrote")
    args = parser.parse_args()
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        print(report(saved["workers"], saved["language"], saved["plan"], saved["info"])[0])
        return
    started = time.perf_counter()
    load_start = " ".join(f"{x:.2f}" for x in os.getloadavg())
    layers = args.layers or ("0" if args.smoke else "2,8,32")

    results = run_workers(args, layers)
    if "language" in args.skip:
        lang, plan = [], {}
    else:
        print("[language] parse/compile and plan costs", file=sys.stderr, flush=True)
        lang = language.parse_compile_cost((1, 100) if args.smoke else (1, 100, 10_000), budget=0.5 if args.smoke else 2.0)
        plan = language.plan_cost(10_000 if args.smoke else 100_000, reps=3 if args.smoke else 7)
    info = {
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "command": " ".join([Path(sys.executable).name, "benchmarks/run.py", *sys.argv[1:]]),
        "machine": machine(),
        "seconds": time.perf_counter() - started,
        "load": (load_start, " ".join(f"{x:.2f}" for x in os.getloadavg())),
    }
    text, summary = report(results, lang, plan, info)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"info": info, "workers": results, "language": lang, "plan": plan,
                                               "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
