"""Run examples/quickstart.py under NVTX capture and print the ranges it emitted.

    python examples/print_ranges.py                        # spec: examples/regions.nvtx
    python examples/print_ranges.py --select "op in <linear>"

No GPU or Nsight needed: `capture_subprocess` injects a small NVTX tool into
the child process. Arguments go to quickstart.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

from nvtx_regions.testing import capture_subprocess, check_balanced, range_tree


def show(ranges, width: int = 80) -> None:
    for r in ranges:
        text = r.message or ""
        text = text if len(text) <= width else text[: width - 3] + "..."
        print(f"{'  ' * (r.depth + 1)}{text}")
        show(r.children, width)


def main(argv: list[str]) -> None:
    quickstart = Path(__file__).with_name("quickstart.py")
    result = capture_subprocess([sys.executable, str(quickstart), *argv], timeout=600).check()
    for process in result.processes.values():
        check_balanced(process.events)  # every push popped, per thread and domain
        domains = {e.domain for e in process.events if e.kind == "push"}
        for domain in sorted(domains, key=str):
            for tid, roots in range_tree(process.events, domain=domain).items():
                print(f"pid {process.pid}, thread {tid}, domain {domain!r}:")
                show(roots)


if __name__ == "__main__":
    main(sys.argv[1:])
