"""Every change nvtx_regions makes to thunder, made when first needed, as one change of
`installs` (its owner: the last handle's ``remove()`` puts it back).

`install(markers)` applies each patch of `PATCHES` once (the first `NvtxProfileTransform`
does it, through `attribution.recording.install_module_recorder`, and the first one after
everything was put back); importing nvtx_regions changes nothing. A patch that cannot be
applied, or that fails while thunder traces, gives one `NvtxRegionsWarning` saying what is
lost; thunder's own work goes on unchanged. `uninstall()` puts back exactly what was there.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable

from ..core.errors import NvtxRegionsWarning
from . import installs
from .frames import outside_package
from .installs import Undo
from .lookasides import MarkerRecorder, library_files, marker_lookasides
from .recorder import attributed
from .thunderfx import marker_break
from .versions import check_versions

__all__ = ["Patch", "PATCHES", "install", "uninstall", "installed"]

THUNDER = "thunder's patches"  # their name in `installs`


@dataclass(frozen=True)
class Patch:
    """One change to thunder: its name, what is lost without it, and how to apply it."""

    name: str
    lost: str
    apply: Callable[[Undo, MarkerRecorder], None]


def _source_location(undo: Undo, markers: MarkerRecorder) -> None:
    # thunder 0.2.6 (thunder/core/trace.py; its caller per torch op is
    # jit_ext.record_source_loc_in_symbol_header; Symbol.bind copies the
    # filename into BoundSymbol.source_filename). See `recorder`.
    from thunder.core.trace import TraceCtx

    original = TraceCtx.set_current_source_location

    def set_current_source_location(self, filename, positions):
        if filename is not None:
            try:
                filename = attributed(filename, self)
            except Exception as error:  # thunder's tracing goes on without the annotation
                _failed(PATCHES[0], error)
        return original(self, filename, positions)

    set_current_source_location.__wrapped__ = original  # type: ignore[attr-defined]
    undo.setattr(TraceCtx, "set_current_source_location", set_current_source_location)


def _marker_lookasides(undo: Undo, markers: MarkerRecorder) -> None:
    from thunder.core.jit_ext import _general_jit_lookaside_map  # see `lookasides.marker_lookasides`

    for api, lookaside in marker_lookasides(markers).items():
        undo.setitem(_general_jit_lookaside_map, api, lookaside)


def _thunderfx_compiler(undo: Undo, markers: MarkerRecorder) -> None:
    # thunder 0.2.6: ThunderFX's torch.compile backend is ThunderCompiler.__call__(gm, sample_args).
    try:
        from thunder.dynamo.compiler import ThunderCompiler
    except ImportError:  # a thunder without ThunderFX: nothing to patch, nothing lost
        return
    original = ThunderCompiler.__call__

    def __call__(self, gm, sample_args):
        found = None
        try:
            found = marker_break(gm, library_files())
        except Exception as error:  # compilation goes on without the hint
            _failed(PATCHES[2], error)
        if found is not None:
            markers.graph_break(*found)
        return original(self, gm, sample_args)

    __call__.__wrapped__ = original  # type: ignore[attr-defined]
    undo.setattr(ThunderCompiler, "__call__", __call__)


def _guarded_callables(undo: Undo, markers: MarkerRecorder) -> None:
    # thunder 0.2.6 builds what it runs from each final trace with TraceCtx.python_callable
    # (thunder/__init__.py: the computation and backward callables of a cache entry).
    from thunder.core.trace import TraceCtx

    from .thunder import call_guards

    original = TraceCtx.python_callable

    def python_callable(self, *args, **kwargs):
        function = original(self, *args, **kwargs)
        for guard in call_guards(self):
            function = guard.wrap(function)
        return function

    python_callable.__wrapped__ = original  # type: ignore[attr-defined]
    undo.setattr(TraceCtx, "python_callable", python_callable)


def _compile_data(undo: Undo, markers: MarkerRecorder) -> None:
    # thunder 0.2.6: thunder.jit makes one CompileData (thunder/common.py) per compilation, keeping
    # the keywords it does not know in compile_options. See `thunder.note_ignored_options`.
    from thunder.common import CompileData

    from .thunder import note_ignored_options

    original = CompileData.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        try:
            note_ignored_options(self)
        except Exception as error:  # thunder.jit goes on without the note
            _failed(PATCHES[4], error)

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    undo.setattr(CompileData, "__init__", __init__)


PATCHES = (
    Patch(
        "thunder.core.trace.TraceCtx.set_current_source_location",
        "no op records its module calls or the markers open around it: `module`, `class`, `each module` "
        "and `marker` rules select nothing",
        _source_location,
    ),
    Patch(
        "thunder's JIT lookaside map (thunder.core.jit_ext._general_jit_lookaside_map) for the NVTX marker APIs",
        "the model's own NVTX markers are not recorded (`marker` rules select nothing), run only once while "
        "thunder traces, and record_function makes thunder.jit fail",
        _marker_lookasides,
    ),
    Patch(
        "thunder.dynamo.compiler.ThunderCompiler.__call__",
        "no warning says when torch.compile breaks its graph at one of the model's NVTX markers",
        _thunderfx_compiler,
    ),
    Patch(
        "thunder.core.trace.TraceCtx.python_callable",
        "a call that raises leaves the ranges it opened open, and later ranges on its thread nest inside them",
        _guarded_callables,
    ),
    Patch(
        "thunder.common.CompileData.__init__",
        "the warning about a transform thunder never called does not name the thunder.jit keyword it was "
        "given to, which thunder ignores",
        _compile_data,
    ),
)

_applied: list[tuple[Patch, Undo]] = []
_reported: set[str] = set()
_PROCEED = (
    "nvtx_regions was checked on thunder 0.2.6 and torch 2.11; install those, or drop the rules that need it "
    "(ranges per op and `op`/`name` rules still work)"
)


def install(markers: MarkerRecorder) -> None:
    """Apply every patch of `PATCHES` (once; later calls do nothing until they are put back).

    `markers` records the model's NVTX markers while thunder traces. Checks
    the thunder and torch versions first (`versions.check_versions`).
    """
    installs.make(THUNDER, lambda undo: _apply(undo, markers))


def _apply(undo: Undo, markers: MarkerRecorder) -> None:
    check_versions()
    for patch in PATCHES:
        own = Undo()
        try:
            patch.apply(own, markers)
        except Exception as error:
            own.restore()
            warnings.warn(
                f"nvtx_regions cannot patch {patch.name} ({type(error).__name__}: {error}), so {patch.lost}. "
                f"{_PROCEED}",
                NvtxRegionsWarning,
                stacklevel=outside_package(),
            )
        else:
            _applied.append((patch, own))
            undo.then(own.restore)
    undo.then(_applied.clear)


def uninstall() -> None:
    """Undo every patch `install` applied, restoring exactly what was there; `install` may run again."""
    installs.put_back(THUNDER)


def installed() -> tuple[str, ...]:
    """The names of the patches in place now."""
    return tuple(patch.name for patch, _ in _applied)


def _failed(patch: Patch, error: Exception) -> None:
    """Report, once per patch per process, that `patch` failed while thunder worked."""
    if patch.name in _reported:
        return
    _reported.add(patch.name)
    warnings.warn(
        f"nvtx_regions: {patch.name} failed ({type(error).__name__}: {error}); for what thunder compiles "
        f"while this happens, {patch.lost}. {_PROCEED}",
        NvtxRegionsWarning,
        stacklevel=outside_package(),
    )
