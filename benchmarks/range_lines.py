"""What recovery bookkeeping would cost per range, on any Python (no torch, no thunder).

    python benchmarks/range_lines.py            # any interpreter: 3.11, 3.12, ...

Times generated functions shaped like transformed traces, with the NVTX calls
replaced by the C no-ops the runtime uses when no tool is attached (``{}.get``
and ``id``), so only the lines' own cost shows:

- ``bare``: ``push(attributes, domain)`` / ``pop(domain)``, no bookkeeping: the
  lines now (a failed call finds where it stopped from its traceback, see
  runtime/ranges.py);
- ``progress list``: the lines before issue 16, ``...; progress.append(0)`` /
  ``...; progress.pop()``;
- ``plain store``: the lines of issue 21, a push followed by ``call.pushed =
  attributes`` and ``call.pops = 0``, a pop by ``call.pops = 1``: stores into
  slots of a per-call object.

A small, cache-resident function: it shows the lines' own cost, not what a
large trace adds through the cache.

Prints ns per range (a push line and a pop line) for each, and the extra cost
of each kind of bookkeeping over ``bare``; median of interleaved repeats.
"""

from __future__ import annotations

import platform
import statistics
import sys
import time

RANGES = 2000
REPEATS = 41


class Call:
    __slots__ = ("pushed", "pops")  # as issue 21's per-call object


def build(kind: str):
    lines = ["def step(push, pop, attributes, domain):", "  progress = []", "  call = Call()"]
    for k in range(RANGES):
        if kind == "bare":
            lines += ["  push(attributes, domain)", "  pop(domain)"]
        elif kind == "progress list":
            lines += ["  push(attributes, domain); progress.append(0)", "  pop(domain); progress.pop()"]
        else:  # as issue 21's emission/rewrite.py wrote them
            lines += ["  push(attributes, domain)", "  call.pushed = attributes", "  call.pops = 0", "  pop(domain)", "  call.pops = 1"]
    namespace: dict = {"Call": Call}
    exec(compile("\n".join(lines), f"<{kind}>", "exec"), namespace)
    return namespace["step"]


def main() -> int:
    kinds = ("bare", "progress list", "plain store")
    steps = {kind: build(kind) for kind in kinds}
    push, pop, attributes, domain = {}.get, id, object(), None
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    for repeat in range(REPEATS + 3):
        for kind in kinds[repeat % 3 :] + kinds[: repeat % 3]:
            started = time.perf_counter_ns()
            steps[kind](push, pop, attributes, domain)
            if repeat >= 3:  # warm-up (and 3.11+'s specialization) first
                times[kind].append((time.perf_counter_ns() - started) / RANGES)
    medians = {kind: statistics.median(values) for kind, values in times.items()}
    print(f"Python {platform.python_version()}: ns per range (push line + pop line), median of {REPEATS}")
    print()
    print("| lines | ns per range | bookkeeping over bare |")
    print("| --- | ---: | ---: |")
    for kind in kinds:
        extra = "" if kind == "bare" else f"{medians[kind] - medians['bare']:.1f}"
        print(f"| {kind} | {medians[kind]:.1f} | {extra} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
