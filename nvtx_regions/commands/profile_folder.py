"""The output folder of ``nvtx-regions profile``, read back: what ran (``profile.json``), every rank's
reports, and several folders (one per node) merged into one run.

    write_manifest(folder, Manifest(spec=..., backends=("eager", "inductor"), ...))
    runs = read_folders([Path("node0"), Path("node1")], rows=RowKinds.of(compiled))  # one BackendRanks per backend

``profile.json`` says what the folder holds: the spec (its canonical text),
the backends in column order and the baseline, the tool, the domain, the
warm-up, and, under torchrun, the world size and the ranks this node ran
(from torchrun's ``--nproc_per_node``, ``--nnodes`` and ``--node_rank``).

A backend's reports, by rank, are found by their names: nsys's
``report.rank<R>[.N].nsys-rep`` (``report[.N].nsys-rep`` without torchrun:
rank 0), torch.profiler's ``rank<R>[-PID].pt.trace.json``, and our capture's
one ``timeline.json``, whose ranges carry their rank. Each rank is read and
summarized (`report.summary`) before the next is read, so memory holds one
rank's events and every rank's summary.

``profile.json`` also says which job the folder came from (`Job`): torchrun's run id
(``--rdzv-id``, torchrun's ``TORCHELASTIC_RUN_ID``; ``none`` by default) and
rendezvous endpoint (``--rdzv-endpoint``, else ``--master_addr:--master_port``),
as the command's options say them, and when ``profile`` started its first run
and ended its last (UTC). The nodes of one job share the run id and endpoint
and run at the same time, since each run waits in the rendezvous for every
node; a rerun of the same command, same run id and endpoint, starts after the
first run ended. So two folders are of one job when their run ids and
endpoints agree and their times overlap (a folder whose ``profile`` was
stopped before the end records no end, and overlaps every later start). The
nodes' clocks must agree to within the length of a run, as NTP keeps them.

Folders merged must be of one job and hold the same spec, backends, tool,
domain and warm-up; a rank may appear in one folder only. Every refusal is a
`UsageError` that names the folders and the fix. A rank missing from 0..N-1
(N: the world size, else the largest rank + 1) is no refusal: the table names
it (`BackendRanks.missing`).
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from ..core.errors import CaptureFileError
from ..core.naming import ANY_DOMAIN
from ..report.ranks_table import BackendRanks, ranks_text
from ..report.reader import read_ranges
from ..report.summary import RankSummary, RowKinds, summarize_ranks
from .status import UsageError

__all__ = ["MANIFEST", "Job", "Manifest", "write_manifest", "read_manifest", "torchrun_ranks", "torchrun_job", "rank_files",
           "read_backend", "report_domain", "read_folders", "different_jobs", "now"]  # fmt: skip

MANIFEST = "profile.json"
_FORMAT = "nvtx_regions profile 1"
_NSYS = re.compile(r"report(?:\.rank(\d+))?(?:\.\d+)?\.nsys-rep")
_TORCH = re.compile(r"rank(\d+)(?:-\d+)?\.pt\.trace\.json")
CAPTURE_FILE = "timeline.json"


def now() -> str:
    """The time now, as `Job` records it: UTC, ISO 8601, to the millisecond."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class Job:
    """Which job a profile folder came from (see the module doc).

    run_id: torchrun's ``--rdzv-id`` (``"none"``, torchrun's default, unless given); None without
    torchrun, or with ``--standalone`` (torchrun makes up one per run). endpoint: its rendezvous
    endpoint (``--rdzv-endpoint``, else ``MASTER_ADDR:MASTER_PORT``); None without torchrun.
    started, ended: when ``profile`` started its first run and ended its last (`now`); ended is
    None until then.
    """

    run_id: str | None
    endpoint: str | None
    started: str
    ended: str | None = None

    def words(self) -> str:
        """The job in words, for a message."""
        run_id = repr(self.run_id) if self.run_id is not None else "none known (no torchrun, or --standalone)"
        return f"run id {run_id}, endpoint {self.endpoint or '-'}, started {self.started}, ended {self.ended or 'never (stopped)'}"


def _overlap(a: Job, b: Job) -> bool:
    """Whether the times of `a` and `b` overlap (an unknown end: still running)."""
    def at(text: str | None) -> datetime:
        return datetime.fromisoformat(text) if text is not None else datetime.max.replace(tzinfo=timezone.utc)

    return at(a.started) < at(b.ended) and at(b.started) < at(a.ended)


def different_jobs(a: Job | None, b: Job | None) -> str | None:
    """Why folders of jobs `a` and `b` are not of one job, in words; None when they are (or when neither
    records its job)."""
    if a is None and b is None:
        return None
    if a is None or b is None:
        return f"{'the first' if a is None else 'the second'} records no job (written by hand, or by an older nvtx-regions)"
    if a.run_id != b.run_id:
        return "different torchrun run ids"
    if a.endpoint != b.endpoint:
        return "different rendezvous endpoints"
    if not _overlap(a, b):
        return "the same run id and endpoint, but one ran after the other had ended: two runs of the same command"
    return None


@dataclass(frozen=True)
class Manifest:
    """What one ``nvtx-regions profile`` run put in its folder (see the module doc)."""

    spec: str
    backends: tuple[str, ...]
    baseline: str
    tool: str
    domain: str | None
    warmup: int
    world_size: int | None = None  # under torchrun, where its options say it
    ranks: tuple[int, ...] | None = None  # the ranks this node ran, where torchrun's options say them
    job: Job | None = None  # which job; None in a folder written by hand


def write_manifest(folder: Path, manifest: Manifest) -> None:
    (folder / MANIFEST).write_text(json.dumps({"format": _FORMAT, **asdict(manifest)}, indent=1) + "\n", encoding="utf-8")


def read_manifest(folder: Path) -> Manifest:
    """The manifest of a profile folder; `UsageError` naming the folder when it is none."""
    path = folder / MANIFEST
    not_one = f"{folder}: not an output folder of 'nvtx-regions profile'"
    if not folder.is_dir():
        raise UsageError(f"{not_one} (no such folder); give the -o folder of each node's run")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{not_one} (no {MANIFEST}); give the -o folder of each node's run") from None
    except (OSError, ValueError) as error:
        raise UsageError(f"{path}: cannot be read ({error}); run 'nvtx-regions profile' again for this node") from None
    if not isinstance(data, dict) or data.get("format") != _FORMAT:
        raise UsageError(f"{path}: not a {MANIFEST} this version writes; run 'nvtx-regions profile' again for this node")
    try:
        ranks, job = data.get("ranks"), data.get("job")
        return Manifest(
            str(data["spec"]), tuple(data["backends"]), str(data["baseline"]), str(data["tool"]), data["domain"],
            int(data["warmup"]), data.get("world_size"), tuple(ranks) if ranks is not None else None,
            _job(job),
        )  # fmt: skip
    except (KeyError, TypeError, ValueError) as error:
        raise UsageError(f"{path}: a field is missing or wrong ({error}); run 'nvtx-regions profile' again for this node") from None


def _job(data: object) -> Job | None:
    """The `Job` of a manifest's ``job`` field; TypeError or ValueError for one that is wrong."""
    if data is None:
        return None
    job = Job(**data)  # type: ignore[arg-type]
    for time in (job.started, job.ended):
        if time is not None:
            datetime.fromisoformat(time)
    return job


def _torchrun_options(command: Sequence[str]) -> argparse.Namespace | None:
    """torchrun's options in `command`, parsed by torch's own parser; None for a command that is no torchrun.
    Raises ValueError for options it cannot parse."""
    from ..internals.torchrun import torchrun_start

    start = torchrun_start(command)
    if start is None:
        return None
    from torch.distributed.run import get_args_parser

    try:
        return get_args_parser().parse_known_args(list(command[start:]))[0]
    except SystemExit:
        raise ValueError("torchrun's options do not parse") from None


def torchrun_job(command: Sequence[str]) -> Job:
    """The `Job` of `command`, started now: torchrun's run id and rendezvous endpoint as its options
    say them (as torchrun's own ``config_from_args`` reads them)."""
    try:
        options = _torchrun_options(command)
    except ValueError:
        options = None
    if options is None:
        return Job(None, None, now())
    if options.standalone:  # torchrun makes up a run id per run, and listens on localhost:0
        return Job(None, "localhost:0", now())
    endpoint = options.rdzv_endpoint
    if options.rdzv_backend == "static" and not endpoint:
        # torch 2.14's parser leaves the port None when not given: torchrun's default, 29500, then.
        endpoint = f"{options.master_addr}:{29500 if options.master_port is None else options.master_port}"
    return Job(str(options.rdzv_id), endpoint or None, now())


def torchrun_ranks(command: Sequence[str]) -> tuple[int | None, tuple[int, ...] | None]:
    """(world size, the ranks this node runs) of a torchrun command, as its options say them; (None, None)
    where they do not (``--nproc_per_node=gpu``, an elastic ``--nnodes=1:4``); (1, (0,)) for a command
    that is no torchrun."""
    try:
        options = _torchrun_options(command)
        if options is None:
            return 1, (0,)
        per_node = int(options.nproc_per_node)
        low, _, high = str(options.nnodes).partition(":")
        nodes = int(low)
        if high and int(high) != nodes:
            return None, None
        node = int(options.node_rank)
    except (ValueError, TypeError):
        return None, None
    return per_node * nodes, tuple(range(node * per_node, (node + 1) * per_node))


def rank_files(folder: Path, tool: str) -> dict[int | None, list[Path]]:
    """A backend folder's reports by rank (see the module doc); a capture's one file under None (its
    ranges carry their ranks)."""
    if tool == "capture":
        path = folder / CAPTURE_FILE
        return {None: [path]} if path.is_file() else {}
    pattern = _NSYS if tool == "nsys" else _TORCH
    found: dict[int | None, list[Path]] = {}
    for path in sorted(folder.iterdir()) if folder.is_dir() else ():
        match = pattern.fullmatch(path.name)
        if match:
            found.setdefault(int(match[1] or 0), []).append(path)
    return found


def report_domain(tool: str, domain: str | None) -> object:
    """The domain a backend folder's reports are read in: `domain`, or any for torch.profiler's traces
    (record_function ranges have no domain)."""
    return ANY_DOMAIN if tool == "torch" else domain


def read_backend(folder: Path, tool: str, domain: str | None, *, rows: RowKinds, warmup: int,
                 rank: int | None = None) -> Iterator[RankSummary]:  # fmt: skip
    """Each rank's summary of one backend folder (only `rank`'s, given one), one rank read at a time.

    Raises `CaptureFileError` for a report that cannot be read."""
    domain = report_domain(tool, domain)
    for number, paths in rank_files(folder, tool).items():
        if rank is not None and number is not None and number != rank:
            continue
        ranges = read_ranges([str(p) for p in paths], domain=domain, rank=rank if number is None else None)
        for summary in summarize_ranks(ranges, rows=rows, warmup=warmup, rank=number).values():
            if rank is None or summary.rank == rank:
                yield summary


def read_folders(folders: Sequence[Path], *, rows: RowKinds | None = None) -> tuple[Manifest, list[BackendRanks]]:
    """Several profile folders (one per node) as one run: its manifest and, per backend, every rank's summary.

    Raises `UsageError` for a folder that is no profile output, folders of different runs (spec,
    backends, tool, domain, warm-up, world size) or of different jobs (`different_jobs`), a folder
    given twice, a rank found in two folders, and a report that cannot be read."""
    from ..language.parse import parse
    from ..selection.compile import compile_spec

    if len(set(map(Path.resolve, folders))) != len(folders):
        raise UsageError(f"{', '.join(map(str, folders))}: a folder is given twice; give each node's folder once")
    manifests = [read_manifest(folder) for folder in folders]
    first = manifests[0]
    for folder, manifest in zip(folders[1:], manifests[1:]):
        for what in ("spec", "backends", "tool", "domain", "warmup", "world_size"):
            mine, theirs = getattr(manifest, what), getattr(first, what)
            if mine != theirs:
                word = {"spec": "specs", "backends": "backends", "tool": "tools", "domain": "domains",
                        "warmup": "warm-ups", "world_size": "world sizes"}[what]  # fmt: skip
                shown = f":\n  {folders[0]}: {theirs!r}\n  {folder}: {mine!r}" if what != "spec" else ""
                raise UsageError(
                    f"{folders[0]} and {folder}: reports of different {word}{shown}\n"
                    f"merge only the folders of one run: every node runs the same spec, backends, tool and options"
                )
        why = different_jobs(first.job, manifest.job)
        if why is not None:
            shown = "".join(
                f"\n  {where / MANIFEST}: {found.job.words() if found.job else 'no job recorded'}"
                for where, found in ((folders[0], first), (folder, manifest))
            )
            raise UsageError(
                f"{folders[0]} and {folder}: reports of different jobs ({why}):{shown}\n"
                "merge only the folders that the nodes of one job wrote (run at the same time, with one run id and "
                "endpoint); give the other node's folder of the same run, or run 'nvtx-regions profile' on every node again"
            )
    if rows is None:
        rows = RowKinds.of(compile_spec(parse(first.spec)))
    runs = []
    for backend in first.backends:
        found: dict[int, RankSummary] = {}
        where: dict[int, Path] = {}
        for folder in folders:
            try:
                summaries = list(read_backend(folder / backend, first.tool, first.domain, rows=rows, warmup=first.warmup))
            except CaptureFileError as error:
                raise UsageError(f"{folder / backend}: {error}") from None
            for summary in summaries:
                if summary.rank in found:
                    raise UsageError(
                        f"rank {summary.rank} of {backend} appears twice: in {where[summary.rank] / backend} and "
                        f"{folder / backend}; give each node's folder once, and run each node with its own --node_rank"
                    )
                found[summary.rank] = summary
                where[summary.rank] = folder
        expected = first.world_size if first.world_size is not None else (max(found) + 1 if found else 0)
        missing = tuple(r for r in range(expected) if r not in found)
        if not found:
            runs.append(BackendRanks(backend, failure=f"no report of any rank in {', '.join(str(f / backend) for f in folders)}"))
        else:
            runs.append(BackendRanks(backend, found, missing=missing))
    return first, runs


def missing_words(runs: Sequence[BackendRanks], folders: Sequence[Path]) -> str | None:
    """What the merged folders lack, in words for the command's last line; None when every rank is there."""
    lacking = sorted({r for run in runs for r in run.missing})
    if not lacking:
        return None
    return (
        f"no report of rank{'s' * (len(lacking) > 1)} {ranks_text(lacking)} in {', '.join(map(str, folders))}: "
        "add the folder of the node that ran it, or run that node again"
    )
