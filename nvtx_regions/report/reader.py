"""The one reader of a finished run's files: Nsight Systems reports and our captures, as range records.

    ranges = read_ranges(["report.nsys-rep", "timeline.json"], domain="nvtx_regions")
    for record in ranges.records: ...   # capture.chrome.RangeRecord, whichever file it came from
    ranges.gpu_ns                       # per record, its GPU ns (where every file holds CUDA kernels)

A file is read by its name: ``.nsys-rep`` and ``.qdrep`` (exported to SQLite
with ``nsys export`` first) and ``.sqlite`` by `report.nsys_report`,
``.pt.trace.json`` (torch.profiler's traces, as ``nvtx-regions profile --tool
torch`` names them) by `report.torch_trace`, any other ``.json`` by
`report.chrome_trace`. A Chrome trace already loaded (a dict, or
a list of events) is read as a ``.json`` file is. Any other file is a
`CaptureFileError` that names it and the files this reads; so is a file
that is missing or not what its name says (the message names the file and
the fix).

`nvtx-regions report`, `compare` and `profile` read through `read_ranges`;
nothing else chooses a reader by a file's name.

Nothing here imports torch or thunder.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Union

from ..capture.chrome import RangeRecord
from ..core.errors import CaptureFileError
from ..core.naming import ANY_DOMAIN, in_domain
from .chrome_trace import TraceInput, load_chrome_trace
from .nsys_report import REPORT_SUFFIXES, read_report
from .torch_trace import TORCH_SUFFIX, read_torch_trace

__all__ = ["RangeFile", "Ranges", "Source", "SUFFIXES", "read_file", "read_ranges"]

CAPTURE_SUFFIX = ".json"
SUFFIXES = (*REPORT_SUFFIXES, CAPTURE_SUFFIX)
Source = Union[str, "os.PathLike[str]", TraceInput]
"""A file to read (its path), or a Chrome trace already loaded."""


@dataclass(frozen=True)
class RangeFile:
    """The ranges of one file that pass the filters, in the file's order.

    source: the path as given (``<trace>`` for a loaded Chrome trace).
    nsys: whether it is an Nsight Systems report (else a Chrome trace).
    gpu_ns: per record (same order), its GPU time in ns, None where the
    range launched no GPU work; the whole field is None when the file holds
    no CUDA kernels (a capture never does). An nsys report's is projected
    (as nsys's ``nvtxgpuproj``); a torch.profiler trace's (`torch`) is its
    ``gpu_user_annotation``'s. kernels: how many CUDA kernels the file holds.
    """

    source: str
    nsys: bool
    records: tuple[RangeRecord, ...]
    gpu_ns: tuple[int | None, ...] | None = None
    kernels: int = 0
    torch: bool = False


@dataclass(frozen=True)
class Ranges:
    """The ranges of several files read together; `domains`: every domain they hold ranges in, before the filter."""

    files: tuple[RangeFile, ...]
    domains: frozenset[str | None] = frozenset()

    @cached_property
    def records(self) -> tuple[RangeRecord, ...]:
        """Every file's records, file after file."""
        return tuple(record for file in self.files for record in file.records)

    @cached_property
    def gpu_ns(self) -> tuple[int | None, ...] | None:
        """Per record of `records`, its GPU-projected ns (None: no GPU work); None unless every file holds CUDA kernels."""
        if not self.files or any(file.gpu_ns is None for file in self.files):
            return None
        return tuple(ns for file in self.files for ns in file.gpu_ns or ())


def read_file(source: Source, *, domain: Any = ANY_DOMAIN, rank: int | None = None) -> RangeFile:
    """The ranges of one file (or loaded Chrome trace) in `domain`; see `read_ranges`."""
    return _read(source, domain, rank)[0]


def read_ranges(sources: Iterable[Source], *, domain: Any = ANY_DOMAIN, rank: int | None = None) -> Ranges:
    """The ranges of every file in `sources`, read together (e.g. one report per rank or per collection).

    domain: keep only this NVTX domain's ranges (None: NVTX's default
    domain, whose records carry ``domain=None``; the default, `ANY_DOMAIN`:
    every domain). rank: keep only that rank's ranges where a capture names
    ranks (a process without ``RANK`` counts as rank 0); an nsys report
    holds one rank's ranges (``report.rank1.nsys-rep``) and is kept whole.

    Raises `CaptureFileError` for a file that cannot be read.
    """
    if isinstance(sources, (str, os.PathLike, Mapping)):
        raise TypeError("read_ranges takes a list of files; for one file, use read_file")
    files, domains = [], set()
    for source in sources:
        file, seen = _read(source, domain, rank)
        files.append(file)
        domains |= seen
    return Ranges(tuple(files), frozenset(domains))


def _read(source: Source, domain: Any, rank: int | None) -> tuple[RangeFile, set[str | None]]:
    if not isinstance(source, (str, os.PathLike)):
        return _kept(RangeFile("<trace>", False, tuple(load_chrome_trace(source))), domain, rank)
    path = os.fspath(source)
    if path.endswith(REPORT_SUFFIXES):
        report = read_report(path)
        return _kept(RangeFile(path, True, report.ranges, report.gpu_ns, report.kernels), domain, None)
    if path.endswith(TORCH_SUFFIX):
        records, gpu_ns, kernels = read_torch_trace(path)
        return _kept(RangeFile(path, False, tuple(records), gpu_ns, kernels, torch=True), domain, rank)
    if path.endswith(CAPTURE_SUFFIX):
        return _kept(RangeFile(path, False, tuple(load_chrome_trace(path))), domain, rank)
    if not os.path.lexists(path):  # a name mistyped, more likely than a report of another kind
        raise CaptureFileError(f"{path}: no such file or folder; give reports ({', '.join(SUFFIXES)}) or profile output folders")
    raise CaptureFileError(
        f"{path}: not a report this reads: pass an Nsight Systems report "
        f"({', '.join(REPORT_SUFFIXES)}), a capture from 'nvtx-regions capture -o FILE.json', "
        f"or a torch.profiler trace (*{TORCH_SUFFIX})"
    )


def _kept(file: RangeFile, domain: Any, rank: int | None) -> tuple[RangeFile, set[str | None]]:
    """`file` with only the ranges of `domain` and `rank` (None: every rank), and the domains it held."""
    gpu = file.gpu_ns if file.gpu_ns is not None else (None,) * len(file.records)
    kept = [
        (record, ns)
        for record, ns in zip(file.records, gpu)
        if in_domain(record.domain, domain) and (rank is None or (record.rank or 0) == rank)
    ]
    records = tuple(record for record, _ in kept)
    gpu_ns = tuple(ns for _, ns in kept) if file.gpu_ns is not None else None
    found = RangeFile(file.source, file.nsys, records, gpu_ns, file.kernels, file.torch)
    return found, {record.domain for record in file.records}
