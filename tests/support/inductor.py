"""An Inductor cache of a test module's own, and one compile thread, for the modules that compile."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def own_inductor_cache(directory: Path) -> Iterator[Path]:
    """Inductor's caches in `directory`, compiling in this process, until the block ends; then no
    Inductor worker left running into later test files (thunder's interpreter once saw a dict change
    size under it while tracing, torch 2.11)."""
    import torch._inductor.config as config

    before = {name: os.environ.get(name) for name in ("TORCHINDUCTOR_CACHE_DIR", "TORCHINDUCTOR_COMPILE_THREADS")}
    os.environ["TORCHINDUCTOR_CACHE_DIR"], os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = str(directory), "1"
    # Set and restored by hand: pytest's MonkeyPatch.undo deletes a config entry it did not find in
    # the module's __dict__, which breaks every later compile in this process.
    threads, config.compile_threads = config.compile_threads, 1
    try:
        yield directory
    finally:
        config.compile_threads = threads
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        from torch._inductor.async_compile import shutdown_compile_workers

        shutdown_compile_workers()
