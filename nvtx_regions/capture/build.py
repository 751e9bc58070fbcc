"""Find NVTX headers and a C compiler, and build the capture tool once per cache key.

`build_tool()` compiles ``nvtx_capture.c`` (shipped next to this module) into a
shared library and returns its path. The result is cached under
``$NVTX_REGIONS_CACHE`` (default ``~/.cache/nvtx_regions``), keyed by a hash of
the C source, the NVTX headers used and the compiler; a build writes a
temporary file and renames it into place, so concurrent processes are safe.
Nothing is ever downloaded: when no compiler or no headers are found,
`CaptureUnavailable` says what is missing and how to fix it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

__all__ = [
    "CaptureUnavailable",
    "build_tool",
    "find_compiler",
    "find_nvtx_include",
    "unavailable_reason",
]

ENV_CACHE = "NVTX_REGIONS_CACHE"
ENV_INCLUDE = "NVTX_REGIONS_NVTX_INCLUDE"
SOURCE = Path(__file__).with_name("nvtx_capture.c")

_CFLAGS = (
    "-shared",
    "-fPIC",
    "-O2",
    "-std=gnu11",
    "-pthread",
    "-fvisibility=hidden",
    # Never unload: the library registers atexit/atfork handlers.
    "-Wl,-z,nodelete",
)
_BUILD_LOCK = threading.Lock()


class CaptureUnavailable(RuntimeError):
    """The capture tool cannot be built here (no C compiler or no NVTX headers)."""


def _has_nvtx3(include_dir: Path) -> bool:
    return (include_dir / "nvtx3" / "nvToolsExt.h").is_file()


def find_nvtx_include() -> Path:
    """Return the directory that contains ``nvtx3/nvToolsExt.h``.

    Looks, in order, at ``$NVTX_REGIONS_NVTX_INCLUDE`` (that directory or its
    ``nvtx3`` parent), the ``nvidia-nvtx`` wheels (``nvidia/*/include``),
    ``$CUDA_HOME``/``$CUDA_PATH``, ``/usr/local/cuda`` and ``/usr``.
    Raises `CaptureUnavailable` when none has the headers.
    """
    explicit = os.environ.get(ENV_INCLUDE)
    if explicit:
        path = Path(explicit).expanduser()
        for candidate in (path, path.parent):
            if _has_nvtx3(candidate):
                return candidate.resolve()
        raise CaptureUnavailable(
            f"${ENV_INCLUDE}={explicit} has no nvtx3/nvToolsExt.h; point it at the directory "
            "that contains the nvtx3/ header folder, or unset it to search the usual places"
        )
    for candidate in _candidate_include_dirs():
        if _has_nvtx3(candidate):
            return candidate.resolve()
    raise CaptureUnavailable(
        "NVTX v3 headers (nvtx3/nvToolsExt.h) not found in the nvidia-nvtx wheel, $CUDA_HOME, "
        f"/usr/local/cuda or /usr/include; install them (pip install nvidia-nvtx) or set ${ENV_INCLUDE} "
        "to the directory that contains nvtx3/"
    )


def _candidate_include_dirs() -> list[Path]:
    dirs: list[Path] = []
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    for location in (spec.submodule_search_locations or []) if spec else []:
        dirs += sorted(p.parent.parent for p in Path(location).glob("*/include/nvtx3/nvToolsExt.h"))
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            dirs.append(Path(os.environ[var]) / "include")
    dirs += [Path("/usr/local/cuda/include"), Path("/usr/include")]
    return dirs


def find_compiler() -> list[str]:
    """Return the C compiler command: ``$CC`` (may carry flags) or the first of cc, gcc, clang.

    Raises `CaptureUnavailable` when it is not found.
    """
    cc = os.environ.get("CC")
    if cc:
        argv = shlex.split(cc)
        resolved = shutil.which(argv[0]) if argv else None
        if not resolved:
            raise CaptureUnavailable(
                f"C compiler $CC={cc!r} not found; install a C compiler (e.g. apt-get install gcc) "
                "or point $CC at one"
            )
        return [resolved, *argv[1:]]
    for name in ("cc", "gcc", "clang"):
        resolved = shutil.which(name)
        if resolved:
            return [resolved]
    raise CaptureUnavailable(
        "no C compiler found (tried cc, gcc, clang on PATH); install one (e.g. apt-get install gcc) "
        "or set $CC"
    )


def _cache_dir() -> Path:
    base = os.environ.get(ENV_CACHE)
    return Path(base).expanduser() if base else Path.home() / ".cache" / "nvtx_regions"


def _cache_key(source: bytes, include_dir: Path, compiler: list[str]) -> str:
    h = hashlib.sha256()
    h.update(source)
    h.update(str(include_dir).encode())
    # The headers themselves, so an upgraded wheel in the same place rebuilds.
    for header in ("nvToolsExt.h", "nvtxDetail/nvtxTypes.h"):
        h.update((include_dir / "nvtx3" / header).read_bytes())
    h.update("\0".join(compiler).encode())
    h.update(os.path.realpath(compiler[0]).encode())
    h.update("\0".join(_CFLAGS).encode())
    return h.hexdigest()[:20]


def build_tool(*, rebuild: bool = False) -> Path:
    """Return the path of the compiled capture library, building it if needed.

    Reads ``$CC``, ``$NVTX_REGIONS_NVTX_INCLUDE`` and ``$NVTX_REGIONS_CACHE`` at each call.
    Raises `CaptureUnavailable` when it cannot be built, with the compiler's output
    when compilation itself fails.
    """
    compiler = find_compiler()
    include_dir = find_nvtx_include()
    source = SOURCE.read_bytes()
    key = _cache_key(source, include_dir, compiler)
    cache = _cache_dir()
    target = cache / f"nvtx_capture-{key}.so"
    with _BUILD_LOCK:
        if not rebuild and target.is_file():
            return target
        try:
            cache.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CaptureUnavailable(
                f"cannot create the cache directory {cache}: {e}; set ${ENV_CACHE} to a writable directory"
            ) from e
        fd, tmp = tempfile.mkstemp(prefix=".nvtx_capture-", suffix=".so.tmp", dir=cache)
        os.close(fd)
        try:
            cmd = [*compiler, *_CFLAGS, f"-I{include_dir}", str(SOURCE), "-o", tmp]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise CaptureUnavailable(
                    f"building the NVTX capture tool failed ({shlex.join(cmd)}):\n"
                    f"{proc.stdout}{proc.stderr}".rstrip()
                )
            os.chmod(tmp, 0o755)
            os.replace(tmp, target)  # atomic: a concurrent builder's rename is equivalent
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return target


def unavailable_reason() -> str | None:
    """Return why the tool cannot be built here, or None when it can (builds it)."""
    try:
        build_tool()
    except CaptureUnavailable as e:
        return str(e)
    return None
