"""`NvtxInductor` (issue 22): a spec's ranges in Inductor's generated wrapper, under torch.compile.

Every range test captures the NVTX calls that really happen, and compares them
with what `nvtx_regions.eager.annotate` emits for the same spec on the same
model. Compiles cost tens of seconds on these CPUs, so each compiled model is
shared by the tests of a module-scoped fixture, and Inductor's cache is this
module's own directory. No thunder here: the GPT is examples/gpt.py's, and
Hugging Face models are in tests/test_huggingface.py.
"""

from __future__ import annotations

import collections
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from support.inductor import own_inductor_cache
from support.models import gpt_inputs, loss_of
from support.nsys import require_nsys
import nvtx_regions
from nvtx_regions import NvtxRegionsWarning, SelectorError
from nvtx_regions.eager import annotate
from nvtx_regions.capture import is_attached
from nvtx_regions.testing import capture, capture_subprocess, check_balanced, continues, start_end_ranges

ROOT = Path(__file__).resolve().parents[1]
WORKERS = ROOT / "tests" / "workers"
for folder in (WORKERS, ROOT / "examples"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from gpt import small_gpt  # noqa: E402
from inductor_steps import blocks_input, make_blocks  # noqa: E402
from regions_kit import open_llama, open_llama_inputs, overlapping_pushes  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning")

BLOCKS_SPEC = "each module <transformer.h.*>"
GPT_STEP = ["transformer.h.0", "transformer.h.1", "transformer.h.1 (backward)", "transformer.h.0 (backward)"]
TINY_SPEC = "each module <blocks.*>"
TINY_STEP = ["blocks.0", "blocks.1", "blocks.1 (backward)", "blocks.0 (backward)"]


@pytest.fixture(scope="module", autouse=True)
def inductor_cache(tmp_path_factory):
    """This module's own Inductor cache, and one compile thread."""
    with own_inductor_cache(tmp_path_factory.mktemp("inductor_cache")) as directory:
        yield directory


def _needs_capture() -> None:
    if not is_attached():
        pytest.skip("the NVTX capture tool is not attached in this process")


def _ranges(events) -> list[str]:
    """The messages of the module calls' ranges in our domain in the order they open (push/pop and
    start/end ranges alike), after checking that every range closes. A call's later parts
    (`continues`: Inductor ran other modules' work between its own) are left out: names and counts
    are eager's."""
    check_balanced(events)
    ours = [e for e in events if e.domain == "nvtx_regions"]
    assert all(r.end_ns is not None for r in start_end_ranges(ours))
    return [e.message for e in sorted(ours, key=lambda e: e.ts_ns) if e.kind in ("push", "start") and not continues(e.message)]


def _pushes(events) -> collections.Counter:
    return collections.Counter(
        (e.domain, e.message, e.color, e.category) for e in events if e.kind in ("push", "start") and not continues(e.message or "")
    )


def _without_our_lines(code: str) -> str:
    """Generated code with the range lines (and the graph's ids, which count compiles) left out:
    the header's ranges, the lines that push and pop, and the try/except around the body, whose
    lines go back to the body's indentation."""
    kept, in_header, in_try, skip = [], False, None, 0
    for line in code.splitlines():
        if line.startswith("nvtx_regions_ranges = graph_ranges("):
            in_header = True
        if in_header:
            in_header = line != ")"
            continue
        if skip:
            skip -= 1
            continue
        if in_try is None and re.fullmatch(r"\s+try:", line):
            in_try = line[: -len("try:")]
            continue
        if in_try is not None and line == f"{in_try}except BaseException as nvtx_regions_error:":
            in_try, skip = None, 2  # its close_after and raise
            continue
        if in_try is not None and line.startswith(in_try + "    "):
            line = in_try + line[len(in_try) + 4 :]
        if "nvtx_regions" not in line and not line.startswith("# AOT ID"):
            kept.append(line)
    return "\n".join(kept)


@dataclass
class Compiled:
    """One model compiled and run: the first step's loss, gradients and generated code; the next steps' NVTX events."""

    loss: torch.Tensor
    grads: dict[str, torch.Tensor]
    code: list[str]
    events: list
    graph_breaks: int
    backend: object


def _compile_and_run(model, inputs, backend, *, steps: int = 2) -> Compiled:
    """Compile and run step 0 of a `nvtx_regions.steps` loop (its steps in a domain of their own),
    then capture steps 1..`steps`."""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code  # torch's own test helper: the sources Inductor wrote

    _needs_capture()
    counters.clear()
    compiled = torch.compile(model, backend=backend)

    def step():
        loss = loss_of(compiled(*inputs()))
        loss.backward()
        return loss.detach()

    loop = nvtx_regions.steps(range(1 + steps), domain="inductor_tests_steps")
    next(loop)
    loss, code = run_and_get_code(step)
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    with capture() as events:
        for _ in loop:
            step()
    ours = [e for e in events if e.domain != "inductor_tests_steps"]  # the step ranges cross the capture's ends
    return Compiled(loss, grads, code, ours, sum(counters["graph_break"].values()), backend)


def _eager_events(model, inputs, spec: str, steps: int = 2) -> list:
    _needs_capture()
    with annotate(model, spec):
        with capture() as events:
            for _ in range(steps):
                loss_of(model(*inputs())).backward()
    return list(events)


# -- nanoGPT: ranges, kernels, numerics -----------------------------------------------


@pytest.fixture(scope="module")
def gpt():
    from nvtx_regions.inductor import NvtxInductor

    annotated = _compile_and_run(small_gpt(), gpt_inputs, NvtxInductor(BLOCKS_SPEC))
    plain = _compile_and_run(small_gpt(), gpt_inputs, "inductor")
    return annotated, plain, _eager_events(small_gpt(), gpt_inputs, BLOCKS_SPEC)


@pytest.mark.slow
def test_gpt_block_ranges_are_eagers_in_order_and_balanced(gpt):
    annotated, _, eager = gpt
    assert _ranges(annotated.events) == _ranges(eager) == GPT_STEP * 2
    # Same domain, message, colour and NVTX category, range for range.
    assert _pushes(annotated.events) == _pushes(eager)


@pytest.mark.slow
def test_gpt_compiles_as_plain_torch_compile(gpt):
    annotated, plain, _ = gpt
    assert annotated.graph_breaks == plain.graph_breaks == 0
    assert len(annotated.code) == len(plain.code) == 2  # one forward, one backward graph
    for ours, theirs in zip(annotated.code, plain.code):
        ours, theirs = _without_our_lines(ours), _without_our_lines(theirs)
        assert ours == theirs, "\n".join(difflib.unified_diff(theirs.splitlines(), ours.splitlines(), lineterm="", n=1))
    assert all("nvtx_regions" not in code for code in plain.code)
    assert _ranges(plain.events) == []
    assert torch.equal(annotated.loss, plain.loss)
    assert annotated.grads.keys() == plain.grads.keys() and len(plain.grads) > 10
    for name, grad in plain.grads.items():
        assert torch.equal(annotated.grads[name], grad), name


def _range_bodies(code: str) -> dict[str, str]:
    """Range message -> the generated lines between its push and its pop (pops pair with pushes as they nest)."""
    bodies, open_at = {}, []
    lines = code.splitlines()
    for number, line in enumerate(lines):
        push = re.search(r"nvtx_regions_push\(nvtx_regions_attr_\d+, nvtx_regions_domain\)  # (.*)$", line)
        if push:
            open_at.append((push.group(1), number))
        elif re.search(r"nvtx_regions_pop\(\)$", line):
            message, start = open_at.pop()
            bodies[message] = "\n".join(lines[start + 1 : number])
    return bodies


@pytest.mark.slow
def test_gpt_each_block_range_holds_its_own_kernels(gpt):
    # Each block has 4 Linear, one attention and one GELU: the forward range holds
    # 4 addmm, one attention and one GELU kernel; the backward range 8 mm (input and
    # weight gradients), one attention backward and one GELU backward kernel.
    # (CPU kernel groups are written at their flush, after the next node began:
    # counted under that node, a block's last kernels would land in the next block.)
    annotated, _, _ = gpt
    forward, backward = (_range_bodies(code) for code in annotated.code)

    def first_call(body: str) -> str:
        return re.search(r"\b(cpp_fused\w*|extern_kernels\.\w+)\(", body).group(1)

    # A block's forward starts at its first linear: the kernel before it fuses the previous
    # module's last ops (the embeddings, the residual add) with this block's layer norm, so it
    # belongs to their common parent. Its backward starts at the gradient of its last linear,
    # not with the final layer norm's backward kernel.
    assert first_call(forward["transformer.h.0"]) == first_call(forward["transformer.h.1"]) == "extern_kernels.addmm"
    assert first_call(backward["transformer.h.1 (backward)"]) == "extern_kernels.mm"
    for block in ("transformer.h.0", "transformer.h.1"):
        body = forward[block]
        assert len(re.findall(r"extern_kernels\.addmm\(", body)) == 4, block
        assert len(re.findall(r"_scaled_dot_product_flash_attention_for_cpu\.default\(", body)) == 1, block
        assert len(re.findall(r"cpp_fused_gelu\w*\(", body)) == 1, block
        body = backward[f"{block} (backward)"]
        assert len(re.findall(r"extern_kernels\.mm\(", body)) == 8, block
        assert len(re.findall(r"_scaled_dot_product_flash_attention_for_cpu_backward\.default\(", body)) == 1, block
        assert len(re.findall(r"cpp_fused_gelu_gelu_backward\w*\(", body)) == 1, block


@pytest.mark.slow
def test_explain_says_what_each_rule_selected(gpt):
    annotated, _, _ = gpt
    text = str(annotated.backend.explain())
    assert "graph 0 (forward)" in text and "graph 0 (backward)" in text
    assert "rule 'each module <transformer.h.*>' (<select>:1): one range per module call\n  forward 'graph 0 (forward)': 2 ranges" in text
    assert "    transformer.h.1 (backward): kernels #" in text
    # An extern kernel is its own FX node's: c_attn's addmm, though ln_1's output is inlined into it.
    assert re.search(r"extern_kernels\.addmm\s+transformer\.h\.0\.attn\.c_attn$", text, flags=re.M)
    assert re.search(r"extern_kernels\.addmm\s+transformer\.h\.1\.mlp\.c_proj$", text, flags=re.M)


# -- litgpt's llama-like model (thunder's test copy of it) -------------------------------


@pytest.mark.slow
@pytest.mark.thunder
def test_llama_block_ranges_are_eagers_with_no_graph_break():
    from nvtx_regions.inductor import NvtxInductor

    annotated = _compile_and_run(open_llama(), open_llama_inputs, NvtxInductor(BLOCKS_SPEC))
    eager = _eager_events(open_llama(), open_llama_inputs, BLOCKS_SPEC)
    assert annotated.graph_breaks == 0
    assert _ranges(annotated.events) == _ranges(eager) == GPT_STEP * 2
    assert _pushes(annotated.events) == _pushes(eager)


# -- a small model: cache, graph breaks, gates, op rules --------------------------------


def _tiny_inputs():
    return (blocks_input(),)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The two-block model compiled in this process into a fresh Inductor cache (the first of
    the processes that share it), and its eager ranges."""
    from nvtx_regions.inductor import NvtxInductor

    directory = tmp_path_factory.mktemp("shared_cache")
    os.environ["TORCHINDUCTOR_CACHE_DIR"], before = str(directory), os.environ["TORCHINDUCTOR_CACHE_DIR"]
    try:
        annotated = _compile_and_run(make_blocks(), _tiny_inputs, NvtxInductor(TINY_SPEC))
    finally:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = before
    return directory, annotated, _eager_events(make_blocks(), _tiny_inputs, TINY_SPEC)


def _worker(directory: Path, spec: str, steps: int = 2, *, build: Path = ROOT):
    """Run tests/workers/inductor_steps.py under the capture tool, with the nvtx_regions of `build`."""
    env = {"TORCHINDUCTOR_CACHE_DIR": str(directory), "TORCHINDUCTOR_COMPILE_THREADS": "1", "PYTHONPATH": str(build)}
    result = capture_subprocess(
        [sys.executable, str(WORKERS / "inductor_steps.py"), spec, str(steps)], env=env, timeout=400, cwd=ROOT
    ).check()
    return result, json.loads(result.stdout.strip().splitlines()[-1])


def test_tiny_ranges_are_eagers(tiny):
    _, annotated, eager = tiny
    assert _ranges(annotated.events) == _ranges(eager) == TINY_STEP * 2
    assert _pushes(annotated.events) == _pushes(eager)


@pytest.mark.slow
def test_a_second_process_hits_the_cache_and_still_emits_the_ranges(tiny):
    directory, _, _ = tiny
    result, counts = _worker(directory, TINY_SPEC)
    assert counts["fx_misses"] == 0 and (counts["fx_hits"] > 0 or counts["aot_hits"] > 0), counts
    assert _ranges(result.events) == TINY_STEP * 2


@pytest.mark.slow
def test_a_wrapper_cached_by_another_build_of_nvtx_regions_is_a_miss(tiny, tmp_path):
    # Any file of the package may change what a wrapper gets (which kernel belongs to which
    # module, what a rule selects), not only the code that writes the lines: a build that
    # differs by one comment in selection/ must not be served this build's wrappers.
    directory, _, _ = tiny
    same, other = tmp_path / "same", tmp_path / "other"
    for build in (same, other):
        shutil.copytree(ROOT / "nvtx_regions", build / "nvtx_regions", ignore=shutil.ignore_patterns("__pycache__"))
    with open(other / "nvtx_regions" / "selection" / "plan.py", "a", encoding="utf-8") as stream:
        stream.write("# another build\n")
    # The same build elsewhere hits: the key is the package's contents, not where it lies.
    result, counts = _worker(directory, TINY_SPEC, build=same)
    assert counts["package"] == str(same / "nvtx_regions"), counts
    assert counts["fx_misses"] == 0 and (counts["fx_hits"] > 0 or counts["aot_hits"] > 0), counts
    result, counts = _worker(directory, TINY_SPEC, build=other)
    assert counts["package"] == str(other / "nvtx_regions"), counts
    assert counts["fx_misses"] > 0 and counts["fx_hits"] == counts["aot_hits"] == 0, counts
    assert _ranges(result.events) == TINY_STEP * 2


@pytest.mark.slow
def test_a_plain_compile_after_an_annotated_one_emits_no_range(tiny):
    directory, _, _ = tiny
    result, counts = _worker(directory, "-")
    assert counts["fx_misses"] > 0, counts  # the annotated graphs are other cache entries
    assert _ranges(result.events) == []


def test_the_same_graph_under_other_modules_is_another_cache_entry(tmp_path):
    # Inductor's cache keys cover the graph, not the module paths its nodes came from:
    # ours must, or the second model would replay the first's messages.
    from nvtx_regions.inductor import NvtxInductor

    os.environ["TORCHINDUCTOR_CACHE_DIR"], before = str(tmp_path), os.environ["TORCHINDUCTOR_CACHE_DIR"]
    try:
        first = _compile_and_run(make_blocks(), _tiny_inputs, NvtxInductor("each class <Block>"), steps=1)
        second = _compile_and_run(make_blocks(container="layers"), _tiny_inputs, NvtxInductor("each class <Block>"), steps=1)
    finally:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = before
    assert _ranges(first.events) == TINY_STEP
    assert _ranges(second.events) == [message.replace("blocks", "layers") for message in TINY_STEP]


def test_a_graph_break_gives_two_graphs_to_one_backend():
    from nvtx_regions.inductor import NvtxInductor

    backend = NvtxInductor(TINY_SPEC)
    annotated = _compile_and_run(make_blocks(graph_break=True), _tiny_inputs, backend)
    eager = _eager_events(make_blocks(graph_break=True), _tiny_inputs, TINY_SPEC)
    assert annotated.graph_breaks == 1
    assert sorted((g.number, g.view.phase) for g in backend.graphs) == [
        (0, "backward"), (0, "forward"), (1, "backward"), (1, "forward"),
    ]  # fmt: skip
    assert _ranges(annotated.events) == _ranges(eager) == TINY_STEP * 2


def test_gates_and_op_rules_on_kernels():
    from nvtx_regions.inductor import NvtxInductor

    spec = (
        "each module <blocks.*> and steps 1..1\n"
        "linears: op in <addmm> and forward\n"
        "op in <mm> and backward and rank in <5>"
    )
    annotated = _compile_and_run(make_blocks(), _tiny_inputs, NvtxInductor(spec), steps=3)
    # The step clock: the loop's iterations; the first (compiling) was step 0.
    addmm = ["extern_kernels.addmm"]
    step_1 = ["blocks.0", *addmm, "blocks.1", *addmm, *addmm, "blocks.1 (backward)", "blocks.0 (backward)"]
    assert _ranges(annotated.events) == [*step_1, *addmm * 3, *addmm * 3]
    categories = {e.message: e.category for e in annotated.events if e.kind == "push"}
    assert None not in categories.values()
    assert categories["extern_kernels.addmm"] != categories["blocks.0"] == categories["blocks.1 (backward)"]


def test_two_threads_one_gated_wrapper_each_call_gated_as_a_whole():
    """Gates are decided per call of a wrapper, into its locals: a step gate that opens or closes
    while the other thread's call is in flight (both wait for each other inside blocks.0's range)
    leaves that call's ranges whole. A swap of the wrapper's globals at each call's start would
    cut them short in the call in flight, or leave them open."""
    import threading

    from nvtx_regions.inductor import NvtxInductor

    _needs_capture()
    barrier, threaded = threading.Barrier(2, timeout=120), threading.Event()

    @torch.library.custom_op("nvtx_regions_tests::rendezvous", mutates_args=())
    def rendezvous(x: torch.Tensor) -> torch.Tensor:
        if threaded.is_set():  # the compiling call meets no one
            barrier.wait()
        return x.clone()

    @rendezvous.register_fake
    def _(x):
        return torch.empty_like(x)

    class Block(torch.nn.Module):
        def __init__(self, meet: bool) -> None:
            super().__init__()
            self.fc, self.meet = torch.nn.Linear(16, 16), meet

        def forward(self, x):
            x = torch.relu(self.fc(x))
            return rendezvous(x) if self.meet else x

    class Blocks(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList([Block(True), Block(False)])

        def forward(self, x):
            return self.blocks[1](self.blocks[0](x))

    torch._dynamo.reset()
    # The compiling call is at step 0. Thread a's calls are the steps of a `steps` loop, which moves
    # the clock while thread b's calls, paired with a's, are in flight.
    compiled = torch.compile(Blocks(), backend=NvtxInductor("each module <blocks.*> and steps 2..5"))
    x = blocks_input()
    with torch.no_grad():
        compiled(x)
    threaded.set()
    calls, tids, errors = 8, {}, []

    def worker(name: str) -> None:
        tids[name] = threading.get_native_id()
        try:
            with torch.no_grad():
                for _ in nvtx_regions.steps(range(calls), domain="inductor_tests_steps") if name == "a" else range(calls):
                    compiled(x)
        except BaseException as error:  # reported below, with the thread's name
            errors.append((name, error))
            barrier.abort()

    with capture() as events:
        threads = [threading.Thread(target=worker, args=(name,)) for name in "ab"]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert not errors, errors
    check_balanced(events)
    ours = [e for e in events if e.domain == "nvtx_regions"]
    step = ["blocks.0", "blocks.1"]
    on_calls = {}
    for name in "ab":
        pushed = [e.message for e in sorted(ours, key=lambda e: e.ts_ns) if e.tid == tids[name] and e.kind == "push"]
        # Each call emits both ranges or none.
        assert pushed == step * (len(pushed) // 2), (name, pushed)
        on_calls[name] = len(pushed) // 2
    assert on_calls["a"] == 4  # steps 2, 3, 4 and 5
    # The calls overlapped: one thread pushed while the other had a range open.
    assert overlapping_pushes(ours, tids.values()) > 0, "the threads' calls never overlapped; the test proves nothing"


@pytest.mark.parametrize(
    "text, why",
    [
        ("between t3..t9", "'t3' is a thunder proxy name"),
        ("reads <t0>", "names thunder proxies"),
        ("source <model.py:1..9>", "no source line survives"),
        ("backward of (op in <mm>)", "not tied one by one"),
    ],
)
def test_rules_with_no_meaning_under_inductor_are_refused(text, why):
    from nvtx_regions.inductor import NvtxInductor

    with pytest.raises(SelectorError) as error:
        NvtxInductor(f"each module <blocks.*>\n{text}", strict=True)
    message = str(error.value)
    assert message.startswith(f"rule {text!r} (<select>:2): not supported under Inductor: "), message
    assert why in message
    # Without strict=True: left out, named in one warning, and the rest of the spec runs.
    with pytest.warns(NvtxRegionsWarning, match="^1 rule of the spec is left out under Inductor") as seen:
        backend = NvtxInductor(f"each module <blocks.*>\n{text}")
    assert [str(w.message).splitlines()[1:] for w in seen] == [[f"  {message}"]]
    assert [rule.applies for rule in backend.compiled.rules] == [True, False]


def test_this_torch_has_every_part_of_inductor_we_reach_into():
    from nvtx_regions.internals import inductor_reaches as reaches

    assert reaches.missing_reaches() == []


def _without_enter_context(monkeypatch):
    from torch._inductor.scheduler import Scheduler

    monkeypatch.delattr(Scheduler, "enter_context")


def _without_kernel_call_line(monkeypatch):
    from torch._inductor.codegen import wrapper

    monkeypatch.delattr(wrapper, "KernelCallLine")


def _compile_fx_without_inner_compile(monkeypatch):
    import torch._inductor.compile_fx as compile_fx

    monkeypatch.setattr(compile_fx, "compile_fx", lambda model, example_inputs, config_patches=None: None)


def _without_cpp_flush(monkeypatch):
    from torch._inductor.codegen.cpp import CppScheduling

    monkeypatch.delattr(CppScheduling, "flush")


@pytest.mark.parametrize(
    "remove, named",
    [
        (_without_enter_context, "torch._inductor.scheduler.Scheduler.enter_context(node)"),
        (_without_kernel_call_line, "torch._inductor.codegen.wrapper.KernelCallLine.kernel_name"),
        (_compile_fx_without_inner_compile, "torch._inductor.compile_fx.compile_fx(inner_compile=, config_patches=)"),
        (_without_cpp_flush, "torch._inductor.codegen.cpp.CppScheduling.flush()"),
    ],
)
def test_a_torch_without_a_part_we_reach_into_gets_our_error_naming_it(monkeypatch, remove, named):
    # No version gate: what is checked is the parts themselves, when a backend is made.
    from nvtx_regions.inductor import NvtxInductor, UnsupportedTorchError
    from nvtx_regions.internals import inductor_reaches as reaches

    NvtxInductor(TINY_SPEC)
    remove(monkeypatch)
    monkeypatch.setattr(reaches, "_reaches_present", False)
    with pytest.raises(UnsupportedTorchError) as error:
        NvtxInductor(TINY_SPEC)
    message = str(error.value)
    assert f"that torch {torch.__version__} lacks: {named} (without it: " in message, message
    assert message.count("(without it: ") == 1, message
    assert "checked on torch 2.11 and 2.14: install one of those, or annotate eagerly with nvtx_regions.eager.annotate" in message
    assert isinstance(error.value, RuntimeError)


# -- the real consumers: Nsight Systems, and compare ----------------------------------------


@pytest.mark.slow
def test_nsys_sees_the_inductor_ranges(tiny, tmp_path):
    from support.nsys import export, nsys_ranges, run_nsys as run

    nsys = require_nsys()
    directory, _, _ = tiny
    report = tmp_path / "inductor"
    os.environ["TORCHINDUCTOR_CACHE_DIR"], before = str(directory), os.environ["TORCHINDUCTOR_CACHE_DIR"]
    try:
        done = run(
            [nsys, "profile", "--trace=nvtx", "--sample=none", "--cpuctxsw=none", f"--output={report}",
             sys.executable, str(WORKERS / "inductor_steps.py"), TINY_SPEC, "2"]
        )  # fmt: skip
    finally:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = before
    assert done.returncode == 0, done.output[-3000:]
    seen = [r for r in nsys_ranges(export(report.with_suffix(".nsys-rep"))) if r.domain == "nvtx_regions"]
    assert [r.message for r in seen] == TINY_STEP * 2
    assert {r.category for r in seen} == {"each module <blocks.*>"}


def test_compare_lines_inductor_up_with_eager_module_by_module(tiny, tmp_path):
    from nvtx_regions.capture import write_chrome_trace

    _, annotated, eager = tiny
    paths = []
    for name, events in (("inductor", annotated.events), ("eager", eager)):
        path = tmp_path / f"{name}.json"
        with open(path, "w", encoding="utf-8") as stream:
            write_chrome_trace(events, stream)
        paths.append(str(path))
    printed = subprocess.run(
        [sys.executable, "-m", "nvtx_regions", "compare", *paths], cwd=ROOT, capture_output=True, text=True,
        timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert printed.returncode == 0, printed.stderr
    # One row per module range, with its count in each capture (2 steps each): "blocks.0 (backward)  2  2  ...".
    counts = {}
    for line in printed.stdout.splitlines()[1:]:
        found = re.match(r"^(\S+(?: \(backward\))?)\s+(\d+)\s+(\d+)\s", line)
        assert found, line
        counts[found.group(1)] = (int(found.group(2)), int(found.group(3)))
    assert counts == {message: (2, 2) for message in TINY_STEP}


@pytest.mark.slow
def test_the_docs_example_runs_and_emits_the_block_ranges(tmp_path):
    text = (ROOT / "docs" / "inductor.md").read_text(encoding="utf-8")
    (example,) = re.findall(r"<!-- test: inductor-example -->\s*```python\n(.*?)```", text, flags=re.S)
    # A cache of its own: explain() lists the graphs compiled in this process, not those the cache served.
    env = {"TORCHINDUCTOR_COMPILE_THREADS": "1", "PYTHONPATH": str(ROOT), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}
    result = capture_subprocess(example, env=env, timeout=400, cwd=ROOT).check()
    assert _ranges(result.events) == TINY_STEP * 2
    assert "graph 0 (forward)" in result.stdout and "    blocks.1 (backward): kernels #" in result.stdout


def test_a_rule_that_selects_nothing_warns_once_naming_the_nearest_module():
    from nvtx_regions.inductor import NvtxInductor

    torch._dynamo.reset()
    compiled = torch.compile(make_blocks(), backend=NvtxInductor("each module <block.*>"))
    with pytest.warns(NvtxRegionsWarning) as seen:
        with torch.no_grad():
            compiled(blocks_input())
            compiled(blocks_input())
    (warning,) = [w for w in seen if issubclass(w.category, NvtxRegionsWarning)]
    assert "rule 'each module <block.*>' (<select>:1) selected nothing in the graphs compiled so far" in str(warning.message)
    assert "nearest: blocks" in str(warning.message)


def test_a_part_compiled_without_model_is_told_to_give_the_model():
    """A block compiled on its own by a backend given no model= names its modules from the block
    (``fc``, not ``blocks.0.fc``): the rule selects nothing, and the warning names model= as the way out."""
    from nvtx_regions.inductor import NvtxInductor

    torch._dynamo.reset()
    model = make_blocks()
    block = torch.compile(model.blocks[0], backend=NvtxInductor("each module <blocks.*.fc>"))
    with pytest.warns(NvtxRegionsWarning) as seen:
        with torch.no_grad():
            block(blocks_input())
            block(blocks_input())
    (warning,) = [w for w in seen if issubclass(w.category, NvtxRegionsWarning)]
    assert "selected nothing in the graphs compiled so far (this NvtxInductor was given no model=" in str(warning.message)
    assert "NvtxInductor(spec, model=model) names them from the whole model" in str(warning.message)
    torch._dynamo.reset()
