"""Benchmark nvtx_regions against thunder's own NVTX transform, on CPU.

    .venv/bin/python benchmarks/run.py            # full run, ~15 min on 2 cores
    .venv/bin/python benchmarks/run.py --smoke    # every section, 0 layers, < 1 min
    .venv/bin/python benchmarks/run.py --json results.json

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

TARGET_RANGE_RATIO = 1 / 3  # ours / thunder's run-time cost per range
TARGET_LINEARITY = 0.25  # |growth of transform time / growth of bsyms - 1|
TARGET_RULE_US = 50.0  # parse + compile per rule
TARGET_PLAN_US = 2.0  # plan per bound symbol per rule


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
    from nvtx_regions.testing import build_tool

    tool = str(build_tool())
    base_env = {k: v for k, v in os.environ.items() if k not in ("NVTX_INJECTION64_PATH", "NVTX_REGIONS_CAPTURE_MODE")}
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


def runtime_rows(size: dict, variants: tuple[str, ...], clock: str = "cpu") -> list[dict]:
    """Cost per range of each variant against `none`, with a 90% interval from resampled rounds."""
    times = size["step_ns"][clock]
    rounds = len(times["none"])
    rows = []
    for variant in variants:
        ranges = sum(size["ranges"][variant])
        if not ranges:
            continue

        def cost(indexes, v=variant, r=ranges):
            return stats.per_range_ns({k: stats.pick(times[k], indexes) for k in ("none", v)}, v, r)

        rows.append(
            {
                "variant": variant,
                "ranges": ranges,
                "step_ms": stats.median(times[variant]) / 1e6,
                "overhead_us": (stats.median(times[variant]) - stats.median(times["none"])) / 1e3,
                "ns_per_range": cost(range(rounds)),
                "ci": stats.bootstrap(cost, rounds),
            }
        )
    return rows


def ratio_with_ci(size: dict, a: str, b: str, clock: str = "cpu") -> tuple[float, tuple[float, float]]:
    times = size["step_ns"][clock]
    rounds = len(times["none"])
    ra, rb = sum(size["ranges"][a]), sum(size["ranges"][b])

    def ratio(indexes):
        sub = {k: stats.pick(times[k], indexes) for k in ("none", a, b)}
        denominator = stats.per_range_ns(sub, b, rb)
        return stats.per_range_ns(sub, a, ra) / denominator if denominator else float("inf")

    return ratio(range(rounds)), stats.bootstrap(ratio, rounds)


def fit_sizes(sizes: list[dict], clock: str = "cpu") -> dict[str, tuple[float, float]]:
    """Per transform: (ns per range, µs per step) of overhead = fixed + slope × ranges, over the sizes."""
    if len(sizes) < 2:
        return {}
    fits = {}
    for variant in ("ours", "thunder"):
        xs = [sum(size["ranges"][variant]) for size in sizes]
        ys = [stats.median(size["step_ns"][clock][variant]) - stats.median(size["step_ns"][clock]["none"])
              for size in sizes]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
        fits[variant] = (slope, (my - slope * mx) / 1e3)
    return fits


def sweep_summary(size: dict, clock: str = "cpu") -> dict:
    """ns per range at each depth; at the re-timed depths, from the re-timing."""
    sweep = size["depth_sweep"]
    ns = {v: list(times) for v, times in sweep["ns"][clock].items()}
    confirmed = {int(i): t[clock] for i, t in sweep.get("confirmed", {}).items()}
    first = {v: {} for v in ns}
    for i, times in confirmed.items():
        for v in ns:
            first[v][i] = ns[v][i]
            ns[v][i] = times[v]
    out = {
        "depths": sweep["depths"],
        "frame_bytes": sweep["frame_bytes"],
        "rounds": len(ns["none"][0]),
        "confirmed": sorted(confirmed),
        "confirm_rounds": len(next(iter(confirmed.values()))["none"]) if confirmed else 0,
    }
    for variant in ("ours", "thunder"):
        ranges = sum(size["ranges"][variant])
        out[variant] = [(stats.median(v) - stats.median(n)) / ranges for v, n in zip(ns[variant], ns["none"])]
        out[variant + "_first"] = {
            i: (stats.median(first[variant][i]) - stats.median(first["none"][i])) / ranges for i in confirmed
        }
    out["none_ms"] = [stats.median(n) / 1e6 for n in ns["none"]]
    return out


def fmt_ci(ci: tuple[float, float], digits: int = 0) -> str:
    return f"[{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"


def verdict(ok: bool) -> str:
    return "**met**" if ok else "**missed**"


def report(results: dict, lang: list[dict], plan: dict, info: dict) -> tuple[str, dict]:
    lines: list[str] = []
    summary: dict = {"targets": {}}
    out = lines.append
    out("# nvtx_regions benchmark results\n")
    out(f"- date: {info['date']}")
    out(f"- command: `{info['command']}`")
    m = info["machine"]
    plain = results.get("plain", {})
    out(f"- machine: {m['cpu']}, {m['cores']} cores; Python {m['python']}; torch {plain.get('torch', '?')}; "
        f"thunder {plain.get('thunder', '?')}; {m['platform']}")
    out(f"- torch threads: {plain.get('threads', '?')}; gc off while timing; variants interleaved per round "
        "(order rotated every round); medians; 90% intervals from resampling rounds")
    out("- times are this thread's CPU time (`time.thread_time_ns`: user + system, so page faults and mmap "
        "count) unless marked wall clock (`time.perf_counter_ns`); other people's jobs share these 2 cores")
    out(f"- load average at start / end: {info['load'][0]} / {info['load'][1]}")
    out(f"- model: thunder.tests.nanogpt_model GPT, n_embd 16, 2 heads, block 16, vocab 64, batch 2; "
        "step = forward + loss.backward()")
    out(f"- total time: {info['seconds']:.0f} s\n")

    # 1. run-time cost
    out("## 1. Run-time cost per NVTX range (every compute op selected)\n")
    ratios_ok = []
    for mode, title in (("plain", "no NVTX tool"), ("tool", "capture tool attached, count mode")):
        if mode not in results:
            continue
        out(f"### {title}\n")
        out("| layers | bsyms fwd+bwd | ranges ours / thunder's | step none (ms) | ours ns/range [90%] | "
            "thunder ns/range [90%] | ours / thunder [90%] | target ≤ 0.33 | ours / thunder, wall clock [90%] |")
        out("|---|---|---|---|---|---|---|---|---|")
        for size in results[mode]["sizes"]:
            rows = {r["variant"]: r for r in runtime_rows(size, ("ours", "thunder"))}
            ratio, ci = ratio_with_ci(size, "ours", "thunder")
            ok = ratio <= TARGET_RANGE_RATIO
            ratios_ok.append(ok)
            wall, wall_ci = ratio_with_ci(size, "ours", "thunder", "wall")
            summary["targets"][f"range_ratio_{mode}_{size['layers']}"] = ratio
            summary["targets"][f"range_ratio_wall_{mode}_{size['layers']}"] = wall
            out(f"| {size['layers']} | {sum(size['bsyms']['none'])} | {rows['ours']['ranges']} / "
                f"{rows['thunder']['ranges']} | {stats.median(size['step_ns']['cpu']['none']) / 1e6:.2f} | "
                f"{rows['ours']['ns_per_range']:.0f} {fmt_ci(rows['ours']['ci'])} | "
                f"{rows['thunder']['ns_per_range']:.0f} {fmt_ci(rows['thunder']['ci'])} | "
                f"{ratio:.2f} {fmt_ci(ci, 2)} | {verdict(ok)} | {wall:.2f} {fmt_ci(wall_ci, 2)} |")
        out(f"\nRounds per size: {', '.join(str(s['rounds']) for s in results[mode]['sizes'])}.\n")
        fits = fit_sizes(results[mode]["sizes"])
        if fits:
            out("Least-squares fit over the sizes, overhead per step = fixed + slope × ranges:\n")
            out("| transform | slope (ns/range) | fixed (µs/step) |")
            out("|---|---|---|")
            for variant, (slope, fixed) in fits.items():
                out(f"| {variant} | {slope:.0f} | {fixed:.1f} |")
                summary["targets"][f"slope_{mode}_{variant}"] = slope
            out(f"\nSlope ratio ours / thunder: {fits['ours'][0] / fits['thunder'][0]:.2f}\n")
        if mode == "tool":
            out("Calls the tool counted in one step (sanity check):\n")
            out("| layers | variant | push | pop | expected ranges | ok |")
            out("|---|---|---|---|---|---|")
            for size in results[mode]["sizes"]:
                for variant, c in size["counts"].items():
                    ok = c["push"] == c["pop"] == c["expected"]
                    out(f"| {size['layers']} | {variant} | {c['push']} | {c['pop']} | {c['expected']} | "
                        f"{'yes' if ok else '**NO**'} |")
                    summary["targets"][f"counts_ok_{size['layers']}_{variant}"] = ok
            out("")
    if "verify" in results:
        out("### Messages (capture tool in events mode, one step)\n")
        out("| layers | variant | pushes / expected | pops | messages and order equal the traces' | domains | "
            "nesting problems |")
        out("|---|---|---|---|---|---|---|")
        for size in results["verify"]["sizes"]:
            for variant, v in size["verify"].items():
                out(f"| {size['layers']} | {variant} | {v['pushes']} / {v['expected_pushes']} | {v['pops']} | "
                    f"{'yes' if v['messages_equal'] else '**NO** ' + repr(v['first_mismatch'])[:120]} | "
                    f"{', '.join(v['domains'])} | {len(v['balance_problems'])} |")
                summary["targets"][f"messages_ok_{variant}"] = v["messages_equal"] and not v["balance_problems"]
        out("")

    for mode, title in (("plain", "no NVTX tool"), ("tool", "tool attached")):
        for size in results.get(mode, {}).get("sizes", []):
            if "depth_sweep" not in size:
                continue
            sweep = sweep_summary(size)
            depths = sweep["depths"]
            out(f"### Stack depth sweep, {title}, {size['layers']} layers\n")
            out(f"The step runs under d extra Python frames ({sweep['frame_bytes']} bytes each), d in "
                f"range({depths[0]}, {depths[-1] + 1}, {depths[1] - depths[0] if len(depths) > 1 else 1}): "
                f"{len(depths)} depths, {sweep['rounds']} interleaved rounds each (none, ours, thunder's); then the "
                f"3 worst depths of each transform re-timed with {sweep['confirm_rounds']} rounds (depths "
                f"{', '.join(str(depths[i]) for i in sweep['confirmed'])}), and those values used. "
                "ns per range (CPU time):\n")
            out("| variant | min | median | max | max / median | depth of max | re-timed depths: first → re-timed |")
            out("|---|---|---|---|---|---|---|")
            for variant in ("ours", "thunder"):
                values = sweep[variant]
                med = stats.median(values)
                worst = max(range(len(values)), key=values.__getitem__)
                retimed = ", ".join(
                    f"{depths[i]}: {sweep[variant + '_first'][i]:.0f} → {values[i]:.0f}" for i in sweep["confirmed"]
                )
                out(f"| {variant} | {min(values):.0f} | {med:.0f} | {values[worst]:.0f} | "
                    f"{values[worst] / med if med else float('nan'):.2f} | {depths[worst]} | {retimed} |")
                summary["targets"][f"sweep_{mode}_{variant}_max_over_median"] = values[worst] / med if med else math.nan
            none = sweep["none_ms"]
            out(f"| (step with no transform, ms) | {min(none):.2f} | {stats.median(none):.2f} | {max(none):.2f} | "
                f"{max(none) / stats.median(none):.2f} | {depths[max(range(len(none)), key=none.__getitem__)]} | |\n")

    # 2. op in <linear> vs all
    if "plain" in results:
        out("## 2. Ops not selected cost nothing: `op in <linear>` against `all` (no tool)\n")
        out("Overheads are per step against `none`; `none again` is a second jit with no transform (an A/A "
            "control: its overhead is the noise floor). \"Per op not selected\" is (linear's overhead − its "
            "ranges × all's cost per range) / (ops all selects that linear does not).\n")
        out("| layers | ranges linear / all | overhead linear (µs/step) [90%] | predicted from all's ns/range (µs) | "
            "overhead none again (µs/step) [90%] | ns/range linear [90%] | ns/range all [90%] | "
            "ns per op not selected [90%] |")
        out("|---|---|---|---|---|---|---|---|")
        for size in results["plain"]["sizes"]:
            rows = {r["variant"]: r for r in runtime_rows(size, ("ours", "ours_linear"))}
            lin, full = rows.get("ours_linear"), rows["ours"]
            if lin is None:
                continue
            unselected = full["ranges"] - lin["ranges"]
            times = size["step_ns"]["cpu"]
            rounds = len(times["none"])

            def per_unselected(indexes, lr=lin["ranges"], fr=full["ranges"], n=unselected, times=times):
                sub = {k: stats.pick(times[k], indexes) for k in ("none", "ours", "ours_linear")}
                linear = stats.median(sub["ours_linear"]) - stats.median(sub["none"])
                return (linear - lr * stats.per_range_ns(sub, "ours", fr)) / n

            def overhead(indexes, variant, times=times):
                return (stats.median(stats.pick(times[variant], indexes))
                        - stats.median(stats.pick(times["none"], indexes))) / 1e3

            value = per_unselected(range(rounds))
            summary["targets"][f"unselected_ns_{size['layers']}"] = value
            aa = "n/a"
            if "none_again" in times:
                aa = (f"{overhead(range(rounds), 'none_again'):.1f} "
                      f"{fmt_ci(stats.bootstrap(lambda i: overhead(i, 'none_again'), rounds), 1)}")
            out(f"| {size['layers']} | {lin['ranges']} / {full['ranges']} | {lin['overhead_us']:.1f} "
                f"{fmt_ci(stats.bootstrap(lambda i: overhead(i, 'ours_linear'), rounds), 1)} | "
                f"{lin['ranges'] * full['ns_per_range'] / 1e3:.1f} | {aa} | "
                f"{lin['ns_per_range']:.0f} {fmt_ci(lin['ci'])} | {full['ns_per_range']:.0f} {fmt_ci(full['ci'])} | "
                f"{value:.1f} {fmt_ci(stats.bootstrap(per_unselected, rounds), 1)} |")
        out("")

    # 3. transform cost
    if "plain" in results:
        out("## 3. Transform (compile-time) cost, every op selected (no tool)\n")
        out("Time in `transform_trace_post_optimization` for the forward and backward traces together, "
            "rerun on the traces thunder gave the transform, ours and thunder's interleaved, median of reps.\n")
        out("| layers | bsyms in | ours (ms) | thunder (ms) | ours µs/bsym | thunder µs/bsym | ours / thunder | "
            "target ≤ 1 | in-situ at compile, ours / thunder (ms) |")
        out("|---|---|---|---|---|---|---|---|---|")
        per = {}
        for size in results["plain"]["sizes"]:
            bsyms = size["transform_ns_bsyms"]
            ours = stats.median(size["transform_seconds"]["ours"])
            theirs = stats.median(size["transform_seconds"]["thunder"])
            per[size["layers"]] = (ours, theirs, bsyms)
            ok = ours <= theirs
            summary["targets"][f"transform_ratio_{size['layers']}"] = ours / theirs
            situ = size["in_situ_transform"]
            out(f"| {size['layers']} | {bsyms} | {ours * 1e3:.1f} | {theirs * 1e3:.1f} | {ours / bsyms * 1e6:.1f} | "
                f"{theirs / bsyms * 1e6:.1f} | {ours / theirs:.2f} | {verdict(ok)} | "
                f"{situ['ours']['seconds'] * 1e3:.1f} / {situ['thunder']['seconds'] * 1e3:.1f} |")
        sizes = sorted(per)
        if len(sizes) >= 2:
            small, big = sizes[-2], sizes[-1]
            out(f"\nLinearity, {big} layers against {small}:\n")
            out("| transform | time ratio | bsym ratio | time ratio / bsym ratio | target within ±25% |")
            out("|---|---|---|---|---|")
            bsym_ratio = per[big][2] / per[small][2]
            for k, name in ((0, "ours"), (1, "thunder")):
                growth = per[big][k] / per[small][k]
                rel = growth / bsym_ratio
                summary["targets"][f"linearity_{name}"] = rel
                out(f"| {name} | {growth:.2f} | {bsym_ratio:.2f} | {rel:.2f} | "
                    f"{verdict(abs(rel - 1) <= TARGET_LINEARITY) if name == 'ours' else '(reference)'} |")
        out("")

    # 4. language
    if not lang:
        return "\n".join(lines), summary
    out("## 4. Language cost\n")
    out("Specs of varied rules (op globs, quoted names, reads, betweens of proxies and first()/last(), labels, "
        "and/or/not, rank/steps gates, comments); median of reps; the parser is built once before "
        f"(first parse in a process: {lang[0]['first_parse_s'] * 1e3:.0f} ms).\n")
    out("| rules | parse µs/rule | compile µs/rule | parse+compile µs/rule | target ≤ 50 |")
    out("|---|---|---|---|---|")
    for row in lang:
        per_rule = row["total_s"] / row["rules"] * 1e6
        summary["targets"][f"rule_us_{row['rules']}"] = per_rule
        out(f"| {row['rules']} | {row['parse_s'] / row['rules'] * 1e6:.1f} | "
            f"{row['compile_s'] / row['rules'] * 1e6:.1f} | {per_rule:.1f} | {verdict(per_rule <= TARGET_RULE_US)} |")
    per_bsym_rule = plan["seconds"] / plan["bsyms"] / plan["rules"] * 1e6
    summary["targets"]["plan_us_per_bsym_rule"] = per_bsym_rule
    out(f"\nPlan: `make_plan` over a synthetic forward trace of {plan['bsyms']} compute bound symbols with "
        f"{plan['rules']} rules (3 nested regions, op/reads/boolean rules, one gated), fresh view per rep: "
        f"{plan['seconds'] * 1e3:.0f} ms, {plan['ranges']} ranges, **{per_bsym_rule:.2f} µs per bsym per rule** "
        f"(target ≤ {TARGET_PLAN_US:.0f}: {verdict(per_bsym_rule <= TARGET_PLAN_US)}).\n")
    return "\n".join(lines), summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="every section at 0 layers (embeddings, final norm, head, loss) and small specs (< 1 min)")
    parser.add_argument("--layers", help="comma-separated model sizes (default 2,8,32; smoke: 1)")
    parser.add_argument("--skip", nargs="*", default=[], choices=("plain", "tool", "verify", "language"),
                        help="leave out workers or the language section")
    parser.add_argument("--json", help="also write the raw numbers here")
    args = parser.parse_args()
    started = time.perf_counter()
    load_start = " ".join(f"{x:.2f}" for x in os.getloadavg())
    layers = args.layers or ("0" if args.smoke else "2,8,32")

    results = run_workers(args, layers)
    if "language" in args.skip:
        lang, plan = [], {}
    else:
        print("[language] parse/compile and plan costs", file=sys.stderr, flush=True)
        lang = language.parse_compile_cost((1, 100) if args.smoke else (1, 100, 10_000), budget=0.5 if args.smoke else 2.0)
        plan = language.plan_cost(10_000 if args.smoke else 100_000, reps=3 if args.smoke else 5)
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
