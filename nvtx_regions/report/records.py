"""The NVTX ranges of nsys reports and captures (`report.reader`), summarized
per range, per rule (NVTX category), per module (forward and backward side by
side), and GPU-projected time where a report holds CUDA kernels.

`nvtx-regions report` prints `render_report`; the functions are the library
form of the same summary. The per-range and per-rule tables are
`capture.summary`'s, in nsys's integer nanoseconds; the others give
durations as every table of ours does (`report.numbers`).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..capture.chrome import RangeRecord
from ..capture.summary import summarize
from ..core import naming
from ..core.naming import read_range_message
from ..core.table import text_table
from .numbers import format_duration
from .reader import Ranges

__all__ = ["ModuleRow", "module_range", "continues", "module_rows", "render_modules", "render_report"]

# A module path: names of attributes or of a container's items (a Sequential's ``0``, ``layers.0``).
_MODULE_PATH = re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*")


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
    name, phase, _ = read_range_message(message)
    if not _MODULE_PATH.fullmatch(name) or message == record.category_name:
        return None
    return name, phase


def continues(record: RangeRecord) -> bool:
    """Whether `record` is a later part of a module call's range (``... (backward, continued)``: the
    compiler ran other modules' work between the call's own), whose time is the call's."""
    return naming.continues(record.message or "")


def call_times(records: Sequence[RangeRecord], key, durations: Sequence[int | None]) -> dict[int, int | None]:
    """Per record that is a call's range (`key(record)` not None, not `continues`), by index: its
    duration in `durations` plus those of the call's later parts (the latest call of the same key in
    the same process that started before each; a part without one is left out). A part's duration
    None (no GPU time) adds nothing."""
    totals: dict[int, int | None] = {}
    latest: dict[tuple, int] = {}
    for index in sorted(range(len(records)), key=lambda i: records[i].start_ns):
        record = records[index]
        row = key(record)
        if row is None:
            continue
        owner = (row, record.pid, record.domain)
        if not continues(record):
            totals[index] = durations[index]
            latest[owner] = index
        elif owner in latest and durations[index] is not None:
            first = latest[owner]
            totals[first] = durations[index] if totals[first] is None else totals[first] + durations[index]
    return totals


def module_rows(records: Iterable[RangeRecord]) -> list[ModuleRow]:
    """The module ranges among `records`, one row per (domain, module path), in order of first start.

    A module range's message is a module path (``transformer.h.0``; ``0``, a
    ``Sequential``'s first item; or the root module's class name), plus ``" (backward)"`` for its backward range,
    and a call's time is that of its range with its later parts' (`continues`),
    and differs from its NVTX category's name (a region's range is named
    after its label, which is also its category's name).
    """
    found: dict[tuple[str | None, str], tuple[int, list[int], list[int]]] = {}
    records = list(records)
    totals = call_times(records, module_range, [record.duration_ns for record in records])
    for index, record in enumerate(records):
        module = module_range(record)
        if module is None or index not in totals:
            continue
        name, backward = module[0], module[1] == "backward"
        key = (record.domain, name)
        first, forward, back = found.get(key) or found.setdefault(key, (record.start_ns, [], []))
        if record.start_ns < first:
            found[key] = (record.start_ns, forward, back)
        (back if backward else forward).append(totals[index])
    rows = sorted(found.items(), key=lambda item: item[1][0])
    return [ModuleRow(domain, name, tuple(fwd), tuple(bwd)) for (domain, name), (_, fwd, bwd) in rows]


def _cells(durations: Sequence[int]) -> list[str]:
    """n, total and median of `durations` (ns)."""
    if not durations:
        return ["0", "-", "-"]
    return [str(len(durations)), format_duration(sum(durations)), format_duration(statistics.median(durations))]


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Numbers right-aligned, the name last, as nsys prints its tables."""
    return text_table(head, rows, "r" * (len(head) - 1) + "l", rule=True)


def render_modules(rows: Sequence[ModuleRow]) -> str:
    """Forward and backward module ranges side by side: count, total and median time of each."""
    if not rows:
        return "(no module ranges: no `each module` / `each class` rule emitted any)"
    head = ["Fwd n", "Fwd Total", "Fwd Med", "Bwd n", "Bwd Total", "Bwd Med", "Module"]
    return _table(head, [[*_cells(r.forward), *_cells(r.backward), f"{r.domain or ''}:{r.module}"] for r in rows])


def _gpu_section(ranges: Ranges) -> str:
    reports = [file for file in ranges.files if file.nsys]
    if not reports:
        return ""
    with_gpu = [file for file in reports if file.gpu_ns is not None]
    if not with_gpu:
        return (
            "GPU-projected time: none, the report holds no CUDA kernels (no GPU, or CUDA not traced); "
            "CPU times only"
        )
    per: dict[tuple[str | None, str | None], tuple[list[int], list[int]]] = {}
    for file in with_gpu:
        for record, gpu in zip(file.records, file.gpu_ns or ()):
            cpu_list, gpu_list = per.setdefault((record.domain, record.message), ([], []))
            cpu_list.append(record.duration_ns)
            if gpu is not None:
                gpu_list.append(gpu)
    head = ["Instances", "CPU Total", "CPU Med", "GPU n", "GPU Proj Total", "GPU Proj Med", "Range"]
    rows = [
        [*_cells(cpu), *_cells(gpu), f"{domain or ''}:{message or ''}"]
        for (domain, message), (cpu, gpu) in sorted(per.items(), key=lambda item: -sum(item[1][0]))
    ]
    kernels = sum(file.kernels for file in with_gpu)
    return f"GPU-projected time per range ({kernels} CUDA kernels; as nsys's nvtxgpuproj):\n" + _table(head, rows)


def render_report(ranges: Ranges) -> str:
    """The four sections for `ranges` (see the module docstring); the last only where an nsys report was read."""
    records = ranges.records
    parts = [
        "Per range:\n" + str(summarize(records)),
        "Per rule (NVTX category):\n" + str(summarize(records, by="label")),
        "Per module, forward and backward:\n" + render_modules(module_rows(records)),
    ]
    gpu = _gpu_section(ranges)
    if gpu:
        parts.append(gpu)
    return "\n\n".join(parts)
