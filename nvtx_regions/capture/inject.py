"""Run code with the capture tool injected into NVTX, and collect what it emitted.

NVTX picks its tool once per process, at the first NVTX call, from
``NVTX_INJECTION64_PATH``. Hence two ways in:

* `capture_subprocess` runs a fresh process (or a launcher such as torchrun and
  its workers) with the tool set, and returns every process's events.
* `attach` sets the variable in this process, which only works before the
  process's first NVTX call (top of a script, a conftest, the pytest plugin);
  then ``with capture() as events:`` collects the events of the block.

Environment variables: ``NVTX_INJECTION64_PATH`` (NVTX's own),
``NVTX_REGIONS_CAPTURE_DIR`` (where each process writes ``nvtx-<pid>.jsonl``;
set by `capture_subprocess`), ``NVTX_REGIONS_CAPTURE_MODE`` (``events``, the
default, or ``count``: handlers only count calls per kind, for benchmarks).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .events import NvtxEvent, int_or_none, parse_records
from .build import build_tool

__all__ = [
    "CaptureNotAttached",
    "CaptureResult",
    "CapturedEvents",
    "CapturedProcessFailed",
    "ProcessCapture",
    "attach",
    "capture",
    "capture_subprocess",
    "is_attached",
]

ENV_INJECTION = "NVTX_INJECTION64_PATH"
ENV_DIR = "NVTX_REGIONS_CAPTURE_DIR"
ENV_MODE = "NVTX_REGIONS_CAPTURE_MODE"
MODES = ("events", "count")
PROBE_MESSAGE = "nvtx_regions.testing:probe"  # same string as in nvtx_capture.c; never recorded
_ABI_VERSION = 1


class CaptureNotAttached(RuntimeError):
    """In-process capture cannot see this process's NVTX calls (tool not attached, or attached too late)."""


class CapturedProcessFailed(subprocess.CalledProcessError):
    """Raised by `CaptureResult.check`; unlike its base class, its message ends with the child's stderr."""

    def __str__(self) -> str:
        tail = (self.stderr or "")[-3000:]
        return f"{super().__str__()}\n--- stderr (tail) ---\n{tail}" if tail else super().__str__()


# ---------------------------------------------------------------- subprocess


@dataclass(frozen=True)
class ProcessCapture:
    """What one process emitted. rank/local_rank/world_size come from its RANK,
    LOCAL_RANK and WORLD_SIZE environment (None when unset). complete is False
    when the process did not exit normally (killed, ``os._exit``): events are
    still all there, but counts then are tallied from the events (``events``
    mode) or empty (``count`` mode)."""

    pid: int
    ppid: int
    rank: int | None
    local_rank: int | None
    world_size: int | None
    mode: str
    events: tuple[NvtxEvent, ...]
    counts: Mapping[str, int]
    complete: bool

    @classmethod
    def from_file(cls, path: Path) -> ProcessCapture:
        header: dict = {}
        end: dict = {}
        records = list(parse_records(path.read_bytes().split(b"\n")))
        for r in records:
            if r.get("type") == "process":
                header = r
            elif r.get("type") == "end":
                end = r
        pid = int(header.get("pid") or path.stem.rpartition("-")[2])
        events = tuple(NvtxEvent.from_record(r, pid=pid) for r in records if r.get("type") == "event")
        counts = dict(end["counts"]) if end else dict(Counter(e.kind for e in events))
        return cls(
            pid=pid,
            ppid=int(header.get("ppid") or 0),
            rank=int_or_none(header.get("rank")),
            local_rank=int_or_none(header.get("local_rank")),
            world_size=int_or_none(header.get("world_size")),
            mode=header.get("mode", "events"),
            events=events,
            counts=counts,
            complete=bool(end),
        )


@dataclass(frozen=True)
class CaptureResult:
    """The outcome of `capture_subprocess`: one `ProcessCapture` per process
    that made an NVTX call, keyed by pid."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    processes: Mapping[int, ProcessCapture]

    @property
    def events(self) -> list[NvtxEvent]:
        """All processes' events, in time order (one process: its events as emitted)."""
        return sorted((e for p in self.processes.values() for e in p.events), key=lambda e: e.ts_ns)

    @property
    def counts(self) -> dict[str, int]:
        """Calls per kind, summed over processes."""
        total: Counter[str] = Counter()
        for p in self.processes.values():
            total.update(p.counts)
        return dict(total)

    def by_rank(self) -> dict[int, ProcessCapture]:
        """The processes that had RANK set (e.g. torchrun workers), keyed by rank."""
        return {p.rank: p for p in self.processes.values() if p.rank is not None}

    def check(self) -> CaptureResult:
        """Return self, or raise `CapturedProcessFailed` (a `subprocess.CalledProcessError`
        whose message shows the stderr tail) on a non-zero exit."""
        if self.returncode != 0:
            raise CapturedProcessFailed(self.returncode, list(self.argv), self.stdout, self.stderr)
        return self


def capture_subprocess(
    command: str | Sequence[str],
    *,
    env: Mapping[str, str | None] | None = None,
    mode: str = "events",
    timeout: float = 120.0,
    cwd: str | os.PathLike[str] | None = None,
) -> CaptureResult:
    """Run ``command`` with the capture tool injected and return what every process emitted.

    command: Python source (a str, dedented, run as ``sys.executable -c``) or an argv
    (e.g. ``["torchrun", "--nproc_per_node=2", "train.py"]``; every process
    that inherits the environment is captured, each into its own file).
    env: changes to this process's environment (a None value removes a variable).
    A non-zero exit does not raise; call `CaptureResult.check`. On timeout the
    whole process group is killed and `subprocess.TimeoutExpired` is raised.
    Raises `CaptureUnavailable` when the tool cannot be built.
    """
    _check_mode(mode)
    tool = build_tool()
    if isinstance(command, str):
        argv: tuple[str, ...] = (sys.executable, "-c", textwrap.dedent(command))
    else:
        argv = tuple(map(str, command))
    child_env = dict(os.environ)
    for key, value in (env or {}).items():
        if value is None:
            child_env.pop(key, None)
        else:
            child_env[key] = value
    with tempfile.TemporaryDirectory(prefix="nvtx_capture-") as out_dir:
        child_env.update({ENV_INJECTION: str(tool), ENV_DIR: out_dir, ENV_MODE: mode})
        proc = subprocess.Popen(
            argv,
            env=child_env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            encoding="utf-8",
            errors="replace",
            start_new_session=True,  # so a timeout can kill launcher and workers together
        )
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            raise subprocess.TimeoutExpired(list(argv), timeout, stdout, stderr) from None
        processes = {}
        for path in sorted(Path(out_dir).glob("nvtx-*.jsonl")):
            p = ProcessCapture.from_file(path)
            processes[p.pid] = p
    return CaptureResult(argv, proc.returncode, stdout, stderr, processes)


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")


# ---------------------------------------------------------------- in-process


class CapturedEvents(list):
    """The events of one `capture` block, filled when the block exits.

    counts: calls per kind made during the block (the only data in ``count`` mode).
    """

    counts: dict[str, int]
    mode: str

    def __init__(self, mode: str):
        super().__init__()
        self.counts = {}
        self.mode = mode


class _Library:
    """ctypes view of the loaded tool (the very instance NVTX loaded: same path)."""

    def __init__(self, path: str):
        lib = ctypes.CDLL(path)
        if not hasattr(lib, "nvtx_capture_abi_version") or lib.nvtx_capture_abi_version() != _ABI_VERSION:
            raise CaptureNotAttached(
                f"{ENV_INJECTION}={path} is not this version's capture tool; unset it and call attach()"
            )
        lib.nvtx_capture_clients.restype = ctypes.c_int
        lib.nvtx_capture_count_mode.restype = ctypes.c_int
        lib.nvtx_capture_num_kinds.restype = ctypes.c_int
        lib.nvtx_capture_kind_name.restype = ctypes.c_char_p
        lib.nvtx_capture_kind_name.argtypes = [ctypes.c_int]
        lib.nvtx_capture_counts.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_int]
        lib.nvtx_capture_probes.restype = ctypes.c_uint64
        lib.nvtx_capture_set_recording.argtypes = [ctypes.c_int]
        lib.nvtx_capture_drain.restype = ctypes.c_size_t
        lib.nvtx_capture_drain.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        lib.nvtx_capture_free.argtypes = [ctypes.c_void_p]
        self.lib = lib
        self.path = path
        self.kinds = [lib.nvtx_capture_kind_name(k).decode() for k in range(lib.nvtx_capture_num_kinds())]
        self.verified: set[str] = set()

    @property
    def mode(self) -> str:
        return "count" if self.lib.nvtx_capture_count_mode() else "events"

    def counts(self) -> dict[str, int]:
        out = (ctypes.c_uint64 * len(self.kinds))()
        self.lib.nvtx_capture_counts(out, len(self.kinds))
        return dict(zip(self.kinds, out))

    def probes(self) -> int:
        return self.lib.nvtx_capture_probes()

    def drain(self) -> list[NvtxEvent]:
        ptr = ctypes.c_void_p()
        size = self.lib.nvtx_capture_drain(ctypes.byref(ptr))
        try:
            data = ctypes.string_at(ptr.value, size) if ptr.value and size else b""
        finally:
            if ptr.value:
                self.lib.nvtx_capture_free(ptr)
        pid = os.getpid()
        return [NvtxEvent.from_record(r, pid=pid) for r in parse_records(data.split(b"\n")) if r.get("type") == "event"]


_lock = threading.RLock()
_libraries: dict[str, _Library] = {}
_active: list[CapturedEvents] = []


def _is_tool_path(path: str) -> bool:
    return Path(path).name.startswith("nvtx_capture-") and Path(path).is_file()


def is_attached() -> bool:
    """True when this process's ``NVTX_INJECTION64_PATH`` names the capture tool.

    It does not tell whether NVTX was already initialized before that; `capture`
    checks that for the NVTX users it can probe.
    """
    return _is_tool_path(os.environ.get(ENV_INJECTION, ""))


def attach(*, mode: str | None = None) -> Path:
    """Make this process's NVTX calls go to the capture tool; return the tool's path.

    Must run before the process's first NVTX call (NVTX reads
    ``NVTX_INJECTION64_PATH`` then, once per library that embeds NVTX): at the
    top of a script, in a conftest, or through the pytest plugin. Subprocesses
    started afterwards inherit the variable (their events are counted, not recorded).
    mode: ``events`` or ``count``; default ``$NVTX_REGIONS_CAPTURE_MODE`` or ``events``.
    It is fixed at the first NVTX call too.
    Raises `CaptureUnavailable` when the tool cannot be built, and
    `CaptureNotAttached` when another tool is set, when the ``nvtx`` package or
    torch already initialized NVTX without it, or when a different mode is
    already in effect.
    """
    mode = mode or os.environ.get(ENV_MODE) or "events"
    _check_mode(mode)
    current = os.environ.get(ENV_INJECTION)
    if current and not _is_tool_path(current):
        raise CaptureNotAttached(
            f"{ENV_INJECTION} already names another NVTX tool ({current}), e.g. Nsight Systems; "
            "NVTX takes a single tool per process, so capture cannot run under it"
        )
    with _lock:
        path = Path(current) if current else build_tool()
        os.environ[ENV_INJECTION] = str(path)
        os.environ[ENV_MODE] = mode  # read by the tool when it initializes
        lib = _library(str(path))
        if lib.mode != mode:
            os.environ[ENV_MODE] = lib.mode
            raise CaptureNotAttached(
                f"the capture tool is already running in {lib.mode!r} mode in this process "
                f"(fixed at the first NVTX call or capture); cannot switch to {mode!r}"
            )
        _verify_probes(lib)
    return path


def _library(path: str) -> _Library:
    with _lock:
        if path not in _libraries:
            _libraries[path] = _Library(path)
        return _libraries[path]


def _attached_library() -> _Library:
    path = os.environ.get(ENV_INJECTION)
    if not path or not _is_tool_path(path):
        raise CaptureNotAttached(
            "the NVTX capture tool is not attached to this process "
            f"({ENV_INJECTION}={path!r}); call nvtx_regions.testing.attach() before the first NVTX call "
            "(top of the script, a conftest, or `-p nvtx_regions.testing.pytest_plugin`), "
            "or use capture_subprocess()"
        )
    return _library(path)


def _verify_probes(lib: _Library) -> None:
    """Check that the NVTX copies of the nvtx package and of torch, if loaded, reach the tool.

    An NVTX copy initialized before the tool was set stays a no-op forever; a
    probe call that the tool does not see reveals that.
    """
    probes = []
    nvtx_lib = sys.modules.get("nvtx._lib.lib")
    if nvtx_lib is not None and hasattr(nvtx_lib, "initialize"):
        probes.append(("the nvtx package", nvtx_lib.initialize))
    torch = sys.modules.get("torch")
    torch_nvtx = getattr(getattr(torch, "_C", None), "_nvtx", None)
    if torch_nvtx is not None and hasattr(torch_nvtx, "markA"):
        probes.append(("torch (torch.cuda.nvtx)", lambda: torch_nvtx.markA(PROBE_MESSAGE)))
    late = []
    for name, probe in probes:
        if name in lib.verified:
            continue
        before = lib.probes()
        probe()
        if lib.probes() > before:
            lib.verified.add(name)
        else:
            late.append(name)
    if late:
        raise CaptureNotAttached(
            f"NVTX in {' and '.join(late)} was initialized before the capture tool was attached, "
            "so its calls cannot be seen in this process; call nvtx_regions.testing.attach() "
            "before the first NVTX call (top of the script, a conftest, or `-p nvtx_regions.testing.pytest_plugin`), "
            "or use capture_subprocess()"
        )


def _distribute(lib: _Library) -> None:
    events = lib.drain()
    for captured in _active:
        captured.extend(events)


@contextlib.contextmanager
def capture() -> Iterator[CapturedEvents]:
    """Collect the NVTX events all threads of this process emit inside the block.

    The yielded list is filled when the block exits. Blocks may nest (and may
    run on several threads); each gets every event emitted while it was open.
    A range pushed before the block and popped inside shows up as an unmatched
    pop. In ``count`` mode the list stays empty and ``.counts`` holds the calls
    per kind. Raises `CaptureNotAttached` when the tool is not attached (see `attach`).
    """
    lib = _attached_library()
    with _lock:
        _verify_probes(lib)
        _distribute(lib)
        captured = CapturedEvents(lib.mode)
        counts_before = lib.counts()
        _active.append(captured)
        if len(_active) == 1:
            lib.lib.nvtx_capture_set_recording(1)
    try:
        yield captured
    finally:
        with _lock:
            if len(_active) == 1:
                lib.lib.nvtx_capture_set_recording(0)
            _distribute(lib)
            _active.remove(captured)
            after = lib.counts()
            captured.counts = {k: after[k] - counts_before[k] for k in after}
