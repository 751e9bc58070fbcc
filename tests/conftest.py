"""Shared fixtures: real thunder CPU traces of an MLP and a small GPT, forward
and backward, with the default executors and with torch.compile fusions.

The capture plugin attaches the NVTX capture tool before the first NVTX call,
so in this test session NVTX domains are real and every range call is seen.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest

# The two test workers share the machine's cores: one intra-op thread per process (its idle
# threads would spin on the core the other worker needs), and Inductor compiling in the process
# rather than in a pool of processes that each import torch. Child processes inherit both.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

pytest_plugins = ["nvtx_regions.testing.pytest_plugin"]


NSYS_LOCK = Path(tempfile.gettempdir()) / f"nvtx_regions_tests_nsys_{os.getuid()}" / "lock"


def _one_nsys_session_at_a_time() -> None:
    """Every nsys this test run starts (tests, our commands, their children) goes through a
    wrapper first on PATH that holds one lock, shared by the test workers, for the whole command.

    Nsight Systems 2022.4.2 sessions started at once by the two workers can fail at start
    ("sem_open: No such file or directory" in its ProcessWaiter; once in a CI run). A command
    that nsys itself runs calls the real nsys directly, so nothing waits for its own lock.
    Only flock holds the lock (``-o``): nsys's agent and its target run in sessions of their
    own and can outlive it (a run killed at its timeout leaves both), and had they inherited
    the lock, every later nsys of the test run would wait for it until its own timeout.
    """
    real = shutil.which("nsys")
    folder = NSYS_LOCK.parent
    if real is None or Path(real).parent == folder:
        return
    folder.mkdir(exist_ok=True)
    script = (
        "#!/bin/sh\n"
        f'if [ -n "$NVTX_REGIONS_TESTS_NSYS_LOCKED" ]; then exec "{real}" "$@"; fi\n'
        "export NVTX_REGIONS_TESTS_NSYS_LOCKED=1\n"
        f'exec flock -o "{NSYS_LOCK}" "{real}" "$@"\n'
    )
    wrapper = folder / "nsys"
    if not wrapper.is_file() or wrapper.read_text() != script:
        staged = folder / f"nsys.{os.getpid()}"
        staged.write_text(script)
        staged.chmod(0o755)
        os.replace(staged, wrapper)  # the other worker may be writing the same text
    os.environ["PATH"] = f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"


_one_nsys_session_at_a_time()


# Nsight Systems 2022.4.2 failing by itself rather than the command it profiles; each seen under
# load in a CI run of this project. A test that meets one runs its nsys command once more.
NSYS_OWN_FAILURES = (
    "sem_open: No such file or directory",  # two sessions starting at once (its ProcessWaiter)
    "Local Endpoint is not available",  # a process it injected (gcc under Inductor) lost its agent
)


def nsys_failed_by_itself(returncode: int, output: str) -> bool:
    """Whether an nsys run that ended with `returncode` and printed `output` failed by nsys's own fault."""
    return returncode != 0 and any(failure in output for failure in NSYS_OWN_FAILURES)


def finish_or_fail(process: subprocess.Popen, timeout: float) -> tuple[str, str | None]:
    """`process.communicate()` (its stdout and stderr) within `timeout` seconds; past it, SIGINT to its
    process group first, nsys's own way to end a session: it stops its target and its agent, which
    run in sessions of their own and would outlive a kill of the group. SIGKILL follows 60 s later,
    then the test fails with the tail of what the process printed."""
    try:
        return process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGINT)
        try:
            stdout, stderr = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
        pytest.fail(f"did not finish in {timeout} s: {shlex.join(process.args)}\n{(stdout or '')[-3000:]}{(stderr or '')[-3000:]}")


def require_nsys() -> str:
    """The nsys on PATH; without one the calling test skips, except under ``CI=true``, where it fails."""
    nsys = shutil.which("nsys")
    if nsys is None:
        message = "Nsight Systems (nsys) is not installed; .ci/install-nsys installs it (root, Debian bookworm)"
        if os.environ.get("CI") == "true":
            pytest.fail(message + ". Under CI=true the nsys tests run; they do not skip")
        pytest.skip(message)
    return nsys


# lightning-thunder is an optional dependency. Test files that need it all through say so with
# `pytestmark = pytest.mark.thunder` on one line (they import it at the top); other tests that need
# it are marked one by one. Without thunder, run `pytest -m "not thunder"`: the marked files are
# not collected, the marked tests are deselected, and the summary says how many of each.
THUNDER_INSTALLED = importlib.util.find_spec("thunder") is not None
_THUNDER_FILE = re.compile(r"^pytestmark = .*\bpytest\.mark\.thunder\b", re.M)
TESTS = Path(__file__).resolve().parent


def needs_thunder(path: Path) -> bool:
    """Whether a test file needs thunder throughout (`pytestmark = pytest.mark.thunder`)."""
    return path.name.startswith("test_") and bool(_THUNDER_FILE.search(path.read_text(encoding="utf-8")))


def pytest_configure(config):
    warnings.filterwarnings("ignore", message="transformer_engine module not found")
    warnings.filterwarnings("ignore", message=".*is_autocast_cpu_enabled.*")
    if not THUNDER_INSTALLED and "not thunder" not in (config.option.markexpr or ""):
        raise pytest.UsageError(
            "lightning-thunder is not installed, and the tests marked `thunder` need it: run "
            "pytest -m \"not thunder\" (or pip install -e '.[test]' for every test)"
        )


def pytest_ignore_collect(collection_path, config):
    if not THUNDER_INSTALLED and collection_path.suffix == ".py" and needs_thunder(collection_path):
        return True
    return None


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not THUNDER_INSTALLED:
        files = sorted(p.name for p in TESTS.glob("test_*.py") if needs_thunder(p))
        terminalreporter.write_line(
            f"lightning-thunder is not installed: {len(files)} test files that need it were not collected "
            f"({', '.join(files)}); the tests marked `thunder` in other files were deselected"
        )


def require_transformers():
    """transformers, for the Hugging Face models; without it the calling test skips, except under
    ``CI=true``, where it fails (the test extras install it)."""
    try:
        import transformers
    except ImportError:
        message = "transformers is not installed (pip install -e '.[test-core]' installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(message + ". Under CI=true the Hugging Face tests run; they do not skip")
        pytest.skip(message)
    return transformers


@pytest.fixture(scope="module", autouse=True)
def dynamo_state_of_this_module_only():
    """Dynamo's caches reset after each test module that used torch.compile (dynamo, ThunderFX).

    Once dynamo has run, its patched ``nn.Module.__init__`` records every module made
    afterwards in a weak-key dictionary (torch 2.11: ``GenerationTracker``). When thunder's
    interpreter traces code that adds to it, it iterates that dictionary, and a weakref
    callback of a module collected meanwhile changes its size under the iteration:
    "dictionary changed size during iteration", seen once in a full run, in a later
    file's thunder.jit. The larger the dictionary, the longer that window.
    """
    yield
    if "torch._dynamo" in sys.modules:
        import torch

        torch.compiler.reset()


def make_mlp():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4)
    )


def mlp_inputs():
    import torch

    torch.manual_seed(1)
    return (torch.randn(5, 8),)


def plain_gpt(n_layer: int = 2):
    """`examples/gpt.py`'s small GPT: thunder's nanoGPT's modules, parameters and initial values,
    in plain PyTorch, for the tests that need no thunder."""
    if str(TESTS.parent / "examples") not in sys.path:
        sys.path.insert(0, str(TESTS.parent / "examples"))
    from gpt import small_gpt

    return small_gpt(n_layer)


def make_gpt(n_layer: int = 2):
    """thunder's nanoGPT (``thunder.tests.nanogpt_model``), for the thunder tests: their traces
    and source lines are that file's."""
    import torch
    from thunder.tests.nanogpt_model import GPT, GPTConfig

    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=n_layer, n_head=2, n_embd=32, dropout=0.0))


def gpt_inputs():
    import torch

    torch.manual_seed(1)
    return torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))


def loss_of(output):
    return output[1] if isinstance(output, tuple) else output.sum()


# (model name, executors): GPT with torch.compile fusions uses one layer, since
# each compile of it costs tens of seconds on these CPUs.
CONFIGS = {
    ("mlp", None): (make_mlp, mlp_inputs),
    ("mlp", "torchcompile"): (make_mlp, mlp_inputs),
    ("gpt", None): (make_gpt, gpt_inputs),
    ("gpt", "torchcompile"): (functools.partial(make_gpt, 1), gpt_inputs),
}


class Recorder:
    """A thunder transform that keeps the traces post-optimization transforms get."""

    def __new__(cls):
        from thunder.core.transform_common import Transform

        from nvtx_regions.attribution.recording import install_module_recorder

        install_module_recorder()  # as NvtxProfileTransform does: its traces carry module calls and markers

        class _Recorder(Transform):
            def __init__(self):
                self.traces = []

            def transform_trace_post_optimization(self, trace, **kwargs):
                self.traces.append(trace)
                return trace

        return _Recorder()


@functools.lru_cache(maxsize=None)
def compiled(model: str, executors: str | None, select: str | None = "<none>"):
    """Jit a fresh model (with an NvtxProfileTransform of `select`, or with a
    `Recorder` for "<none>"), run forward and backward once. Returns (jitted,
    transform, output, grads, forward trace, backward trace); for "<none>" the
    traces are those post-optimization transforms receive."""
    import thunder

    from nvtx_regions import NvtxProfileTransform

    make, inputs = CONFIGS[(model, executors)]
    net = make()
    transforms = [Recorder()] if select == "<none>" else [NvtxProfileTransform(select)]
    options = {"executors": [executors]} if executors else {}
    jitted = thunder.jit(net, transforms=transforms, **options)
    out = jitted(*inputs())
    loss_of(out).backward()
    grads = [p.grad.clone() for p in net.parameters()]
    if select == "<none>":
        forward, backward = transforms[0].traces
    else:
        forward, backward = thunder.last_traces(jitted)[-1], thunder.last_backward_traces(jitted)[-1]
    return jitted, transforms[0], out, grads, forward, backward


@pytest.fixture(params=list(CONFIGS), ids=lambda c: f"{c[0]}-{c[1] or 'default'}")
def config(request):
    return request.param
