"""The NVTX ranges of nsys reports and captures, read together and summarized
per range, per rule (NVTX category), per module (forward and backward side by
side), and GPU-projected time where a report holds CUDA kernels.

`nvtx-regions report` prints `render_report`; the functions are the library
form of the same summary.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..capture.chrome import RangeRecord
from ..capture.summary import summarize
from ..core.errors import CaptureFileError
from ..core.naming import ANY_DOMAIN, BACKWARD_SUFFIX, in_domain
from ..core.table import text_table
from .chrome_trace import load_chrome_trace
from .nsys_report import REPORT_SUFFIXES, NsysReport, read_report

__all__ = ["ModuleRow", "load_records", "module_range", "module_rows", "render_modules", "render_report"]

_MODULE_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*")


def load_records(paths: Sequence[str], *, domain: Any = ANY_DOMAIN) -> tuple[list[RangeRecord], list[NsysReport]]:
    """The ranges of every file in `paths` (nsys reports or capture JSON), and the nsys reports read.

    domain: keep only this NVTX domain's ranges (None: the default domain,
    whose records carry ``domain=None``; the default, `ANY_DOMAIN`: every
    domain). Raises `CaptureFileError` for a file that cannot be read.
    """
    records: list[RangeRecord] = []
    reports: list[NsysReport] = []
    for path in paths:
        if str(path).endswith(REPORT_SUFFIXES):
            report = read_report(path)
            reports.append(report)
            found: Iterable[RangeRecord] = report.ranges
        elif str(path).endswith(".json"):
            found = (r for r in load_chrome_trace(path) if isinstance(r, RangeRecord))
        else:
            raise CaptureFileError(
                f"{path}: not a report this reads: pass an Nsight Systems report "
                f"({', '.join(REPORT_SUFFIXES)}) or a capture from 'nvtx-regions capture -o FILE.json'"
            )
        records += [r for r in found if in_domain(r.domain, domain)]
    return records, reports


@dataclass(frozen=True)
class ModuleRow:
    """One module's ranges: durations (ns) of its forward and backward ranges, in order."""

    domain: str | None
    module: str
    forward: tuple[int, ...]
    backward: tuple[int, ...]


def module_range(record: RangeRecord) -> tuple[str, str] | None:
    """(module path, "forward" or "backward") when `record` is a module range (see `module_rows`), else None."""
    message = record.message or ""
    backward = message.endswith(BACKWARD_SUFFIX)
    name = message[: -len(BACKWARD_SUFFIX)] if backward else message
    if not _MODULE_PATH.fullmatch(name) or message == record.category_name:
        return None
    return name, "backward" if backward else "forward"


def module_rows(records: Iterable[RangeRecord]) -> list[ModuleRow]:
    """The module ranges among `records`, one row per (domain, module path), in order of first start.

    A module range's message is a module path (``transformer.h.0``, or the
    root module's class name), plus ``" (backward)"`` for its backward range,
    and differs from its NVTX category's name (a region's range is named
    after its label, which is also its category's name).
    """
    found: dict[tuple[str | None, str], tuple[int, list[int], list[int]]] = {}
    for record in records:
        module = module_range(record)
        if module is None:
            continue
        name, backward = module[0], module[1] == "backward"
        key = (record.domain, name)
        first, forward, back = found.get(key) or found.setdefault(key, (record.start_ns, [], []))
        if record.start_ns < first:
            found[key] = (record.start_ns, forward, back)
        (back if backward else forward).append(record.duration_ns)
    rows = sorted(found.items(), key=lambda item: item[1][0])
    return [ModuleRow(domain, name, tuple(fwd), tuple(bwd)) for (domain, name), (_, fwd, bwd) in rows]


def _cells(durations: Sequence[int]) -> list[str]:
    if not durations:
        return ["0", "-", "-"]
    return [str(len(durations)), str(sum(durations)), f"{statistics.median(durations):.1f}"]


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Numbers right-aligned, the name last, as nsys prints its tables."""
    return text_table(head, rows, "r" * (len(head) - 1) + "l", rule=True)


def render_modules(rows: Sequence[ModuleRow]) -> str:
    """Forward and backward module ranges side by side (times in ns)."""
    if not rows:
        return "(no module ranges: no `each module` / `each class` rule emitted any)"
    head = ["Fwd n", "Fwd Total (ns)", "Fwd Med (ns)", "Bwd n", "Bwd Total (ns)", "Bwd Med (ns)", "Module"]
    return _table(head, [[*_cells(r.forward), *_cells(r.backward), f"{r.domain or ''}:{r.module}"] for r in rows])


def _gpu_section(reports: Sequence[NsysReport]) -> str:
    if not reports:
        return ""
    with_gpu = [r for r in reports if r.gpu_ns is not None]
    if not with_gpu:
        return (
            "GPU-projected time: none, the report holds no CUDA kernels (no GPU, or CUDA not traced); "
            "CPU times only"
        )
    per: dict[tuple[str | None, str | None], tuple[list[int], list[int]]] = {}
    for report in with_gpu:
        for record, gpu in zip(report.ranges, report.gpu_ns or ()):
            cpu_list, gpu_list = per.setdefault((record.domain, record.message), ([], []))
            cpu_list.append(record.duration_ns)
            if gpu is not None:
                gpu_list.append(gpu)
    head = ["Instances", "CPU Total (ns)", "CPU Med (ns)", "GPU n", "GPU Proj Total (ns)", "GPU Proj Med (ns)", "Range"]
    rows = [
        [*_cells(cpu), *_cells(gpu), f"{domain or ''}:{message or ''}"]
        for (domain, message), (cpu, gpu) in sorted(per.items(), key=lambda item: -sum(item[1][0]))
    ]
    kernels = sum(r.kernels for r in with_gpu)
    return f"GPU-projected time per range ({kernels} CUDA kernels; as nsys's nvtxgpuproj):\n" + _table(head, rows)


def render_report(records: Sequence[RangeRecord], reports: Sequence[NsysReport] = ()) -> str:
    """The four sections for `records` (see the module docstring)."""
    parts = [
        "Per range:\n" + str(summarize(records)),
        "Per rule (NVTX category):\n" + str(summarize(records, by="label")),
        "Per module, forward and backward:\n" + render_modules(module_rows(records)),
    ]
    gpu = _gpu_section(reports)
    if gpu:
        parts.append(gpu)
    return "\n\n".join(parts)
