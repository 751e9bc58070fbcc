"""`NvtxInductor`: a ``torch.compile`` backend that compiles with Inductor and puts a spec's
NVTX ranges into the Python wrapper Inductor generates, after fusion.

    model = torch.compile(model, backend=NvtxInductor("each module <transformer.h.*>"))

Promises:
- The compile is Inductor's (``compile_fx``, with `options` as
  ``torch.compile(options=)`` takes them): same kernels, same graph breaks
  (none added), same numerics. The wrapper only gains the range lines.
- One backend object serves every graph ``torch.compile`` hands it (graph
  breaks, recompiles) and the forward and backward graph of each.
- Messages, domain, categories and colours are those of
  ``nvtx_regions.eager.annotate`` and ``NvtxProfileTransform`` for the same
  spec (``transformer.h.0``, ``transformer.h.0 (backward)``): an Inductor
  profile compares with an eager or a thunder one module by module.
- Inductor's caches (FX graph, AOTAutograd) key the graph by the spec, the
  domain, the graph's module stacks and this build of nvtx_regions too (a
  do-nothing post-grad pass whose ``uuid()`` names them), so a cache hit
  returns code with this spec's ranges for these modules, placed by this
  build, and a plain ``torch.compile`` never gets them.
- Where Inductor runs no Python wrapper per call (CUDA graphs,
  ``mode="reduce-overhead"``; ``cpp_wrapper``/AOTInductor) no range can be
  placed: one `NvtxRegionsWarning` says so, and the graph compiles without.
- Made on a torch that lacks a part of Inductor it reaches into, it raises
  `UnsupportedTorchError` naming what is missing (`internals.inductor_reaches`).
- Rules with no meaning under Inductor are left out, named once in one
  `NvtxRegionsWarning` (`inductor.check`, `selection.support`); rules that
  select nothing in any graph compiled so far warn once. ``strict=True``
  makes either a `SelectorError`.
- Without a spec, the spec is ``each module <**>``, as for `compile` and `annotate`.
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import NvtxRegionsWarning
from ..core.naming import DEFAULT_DOMAIN
from ..core.profiling import DEFAULT_SELECT
from ..internals import inductor as internals
from ..language.parse import parse, spec_from_arguments
from ..runtime.clock import watch_step_gates
from ..language.tree import render
from ..selection.plan import Plan, make_plan
from ..selection.unselected import RuleTally
from .check import check_spec
from .kernels import KernelView, kernel_view
from .placement import placement

if TYPE_CHECKING:
    from ..selection.explanation import Explanation

__all__ = ["NvtxInductor", "PlacedGraph", "build_digest"]


@functools.cache
def build_digest() -> str:
    """A digest of this build of nvtx_regions: the path and bytes of every ``.py`` file of the
    package and of its grammar, read once per process.

    Any of them may decide what a wrapper gets (attribution, selection, module paths, the lines,
    what they call), so it is part of the cache key: a wrapper cached by any other build is a miss
    (a key over the files that write the lines only once replayed a wrapper with no ranges).
    """
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted([*package.rglob("*.py"), *package.glob("grammar/*.lark")]):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class PlacedGraph:
    """One graph this backend placed ranges in (in this process): its kernels and its plan."""

    number: int  # the graph's number among those torch.compile gave this backend
    view: KernelView
    plan: Plan


class NvtxInductor:
    """A ``torch.compile`` backend: Inductor, with the ranges of `select` (spec text) and/or `spec`
    (a ``.nvtx`` file) in the generated wrapper (see the module doc); with neither, ``each module <**>``.

    `domain`: the NVTX domain (None: NVTX's default one). `options`: Inductor
    options, as ``torch.compile(options=)``. `model`: the model ``torch.compile``
    compiles (`nvtx_regions.compile` passes it): module paths are then its
    ``named_modules()`` paths even where Dynamo compiles a submodule's
    ``forward`` on its own after a graph break; without it, paths start at the
    compiled frame's module. `graphs` lists what was placed.
    """

    def __init__(
        self,
        select: str | None = None,
        *,
        spec: Any = None,
        domain: str | None = DEFAULT_DOMAIN,
        strict: bool = False,
        options: dict[str, Any] | None = None,
        model: Any = None,
    ) -> None:
        if model is not None and not callable(getattr(model, "named_modules", None)):
            raise TypeError(
                f"NvtxInductor(model=...) takes the torch.nn.Module that torch.compile compiles, for its module "
                f"paths; got {type(model).__name__}. Pass the module, or leave model out when compiling a function"
            )
        internals.check_reaches()
        parsed = spec_from_arguments(select, spec) or parse(DEFAULT_SELECT)
        self.compiled = check_spec(parsed, strict=strict, stacklevel=2)
        watch_step_gates(self.compiled.rules)
        self.spec = parsed
        self.domain = domain
        self.strict = strict
        self.options = dict(options or {})
        self._paths = None if model is None else internals.module_paths(model)
        self.graphs: list[PlacedGraph] = []
        self._tally = RuleTally(self.compiled)
        self._calls: dict[str, int] = {}  # Dynamo's module call keys -> call numbers
        self._graph_numbers = 0
        self._lock = threading.Lock()
        self._warned = False
        text = "\n".join(render(rule) for rule in parsed.rules)
        # The model's paths name the ranges too (they decide a message where the frame is a submodule's).
        tree = "" if self._paths is None else "\n".join(f"{p}:{type(m).__name__}" for p, m in model.named_modules())
        digest = hashlib.sha256(f"{build_digest()}\0{domain!r}\0{text}\0{tree}".encode()).hexdigest()[:24]
        self.cache_key = f"nvtx_regions:{digest}"

    def __repr__(self) -> str:
        return f"NvtxInductor({'; '.join(render(r) for r in self.spec.rules)!r}, domain={self.domain!r})"

    def __deepcopy__(self, memo: dict[int, Any]) -> NvtxInductor:
        # One backend serves every graph, and what it placed is its record: a copy (lightning
        # deep-copies torch.compile's arguments) is the same backend.
        return self

    def __call__(self, gm: Any, example_inputs: Any, *, mode: str | None = None, options: dict | None = None) -> Any:
        """Compile one Dynamo graph with Inductor, placing the ranges in its forward and backward wrappers.

        `mode` and `options` are what ``torch.compile(backend=..., mode=, options=)`` passes on;
        `options` adds to (and overrides) the constructor's.
        """
        internals.install()
        config = internals.inductor_config()
        patches = {**internals.mode_options(mode), **self.options, **(options or {})}
        theirs = patches.get("post_grad_custom_post_pass", config.post_grad_custom_post_pass)
        key = f"{self.cache_key}:{internals.module_digest(gm)}"
        patches["post_grad_custom_post_pass"] = internals.cache_key_pass(key, theirs)
        with self._lock:
            number = self._graph_numbers
            self._graph_numbers += 1

        def inner_compile(graph: Any, inputs: Any, **kwargs: Any) -> Any:
            phase = "backward" if kwargs.get("is_backward") else "forward"
            if self._cannot_place(kwargs, config):
                return internals.compile_fx_inner(graph, inputs, **kwargs)
            place = lambda kernels: self._place(number, phase, kernels, bool(kwargs.get("is_inference")))  # noqa: E731
            with internals.placing(phase, place):
                return internals.compile_fx_inner(graph, inputs, **kwargs)

        return internals.compile_fx(gm, example_inputs, inner_compile=inner_compile, config_patches=patches)

    def _cannot_place(self, kwargs: dict[str, Any], config: Any) -> bool:
        """Whether this graph gets no Python wrapper run per call (warning once if so)."""
        cudagraphs = kwargs.get("cudagraphs")
        cudagraphs = bool(getattr(cudagraphs, "value", cudagraphs)) or bool(config.triton.cudagraphs)
        cpp = bool(kwargs.get("cpp_wrapper")) or bool(config.cpp_wrapper) or bool(getattr(config, "fx_wrapper", False))
        if not (cudagraphs or cpp):
            return False
        if not self._warned:
            self._warned = True
            why = (
                "CUDA graphs (mode='reduce-overhead', triton.cudagraphs) replay the kernels without host calls"
                if cudagraphs
                else "cpp_wrapper/AOTInductor (or fx_wrapper) generates no Python wrapper to place them in"
            )
            warnings.warn(
                f"{self!r}: no NVTX range can be placed in this graph: {why}; it compiles without ranges. "
                "Compile without that option to get the ranges",
                NvtxRegionsWarning,
                stacklevel=2,
            )
        return True

    def _place(self, number: int, phase: str, kernels: list[Any], inference: bool) -> Any:
        name = f"graph {number} ({phase})"
        view = kernel_view(kernels, phase, name, self._calls, self._paths)  # type: ignore[arg-type]
        plan = make_plan(self.compiled, view, self.domain)
        with self._lock:
            self.graphs.append(PlacedGraph(number, view, plan))
            self._tally.add(plan, view)
        if phase == "backward" or inference:
            self._report()
        return placement(plan, view, self.compiled, self.domain)

    def _report(self) -> None:
        self._tally.report(strict=self.strict, where="the graphs compiled so far", once=True)

    def explain(
        self, select: str | None = None, *, spec: str | os.PathLike[str] | None = None, max_ops: int = 12
    ) -> Explanation:
        """What each rule of this backend's spec (or of `select`/`spec`) selected in each graph placed
        so far (`inductor.explain`); ``str()`` of it reads as a report."""
        from .explain import explain_graphs

        return explain_graphs(self, spec_from_arguments(select, spec), max_ops=max_ops)
