"""Where ranges go: the sinks a spec's ranges are emitted to, chosen once for every backend.

- ``"nvtx"``: NVTX ranges (`runtime.domain`), for Nsight Systems and any NVTX tool;
- ``"record_function"``: torch.profiler ranges, the kind ``torch.profiler.record_function``
  makes (``user_annotation`` events in the exported trace; on CUDA each also gets a
  ``gpu_user_annotation``, the GPU time of the range).

Each sink is an object (`Sink`): what a range's push takes (`attributes`) and the functions that
push, pop, start and end its ranges in a domain (`calls`: an `NvtxCalls`; no tool, no gate: `SKIPPED`), so
the same generated lines and hooks drive any sink, or several at once (`domain.calls_of`). A third
sink would be one more class in `SINK_OBJECTS`. Everywhere else a choice of sinks is the tuple of
their names (``emit=``, pickled transforms, generated code): `chosen_sinks(emit)` reads ``emit=``
or ``$NVTX_REGIONS_EMIT``, once per backend, and `sinks_named` gives their objects.

The record_function sink costs ~0.1 µs a range while no profiler runs (it asks torch whether
one does, and records nothing), and otherwise what ``record_function`` itself costs, less its
Python context manager: it calls the same C++ ``RecordFunction`` with the user scope.
"""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable

from ..core.markers import RECORD_FUNCTION
from ..core.profiling import ENV_EMIT, STEP_CATEGORY, emit_sinks, profiler_step_message, step_message
from ..internals.nvtx_calls import c_push_pop, c_start_end
from ..internals.profiler import user_scope_functions

__all__ = ["chosen_sinks", "record_function_calls", "sinks_named", "marker_sink", "Sink", "NVTX_ONLY", "NvtxCalls", "nvtx_calls", "SKIPPED"]

NVTX_ONLY = ("nvtx",)


# C callables standing in for push(attributes, domain) and pop() when a gate is closed or
# no tool is attached: no Python frame, no effect, no allocation (an empty dict's `get`
# returns its default; an empty list's `clear` clears nothing). Measured: ~90 ns a
# push+pop pair, where `slice` (which allocates) took ~180 ns.
SKIP_PUSH = {}.get
SKIP_POP = [].clear


def SKIP_START(attributes: Any, domain: Any) -> tuple[int, None]:
    """Start/end stand-in: nvtx's `start_range` gives ``(range id, domain)``, which the end line unpacks."""
    return (0, None)


SKIP_END = {}.get  # takes the (0, None) that SKIP_START gave


@dataclass(frozen=True)
class NvtxCalls:
    """The functions that push, pop, start and end one domain's ranges, and the domain argument
    push and start take (its C handle; None where they ignore it)."""

    push: Callable[[Any, Any], Any]
    pop: Callable[[], Any]
    start: Callable[[Any, Any], Any]
    end: Callable[..., Any]
    domain_argument: Any


SKIPPED = NvtxCalls(SKIP_PUSH, SKIP_POP, SKIP_START, SKIP_END, None)


def nvtx_calls(domain: Any) -> NvtxCalls:
    """The functions of `domain`'s NVTX ranges: nvtx's C functions when a tool records the domain, else `SKIPPED`.

    The pop has the handle bound (`functools.partial`, C too): its line loads one
    global less, which matters more in a large trace than the partial's few ns.
    """
    if not domain.enabled:  # nvtx's DummyDomain: no tool attached, nothing to emit
        return SKIPPED
    handle = domain.handle
    push_pop, start_end = c_push_pop(), c_start_end()
    if push_pop is None or start_end is None:  # another nvtx layout: slower, still correct
        return NvtxCalls(
            lambda attributes, _: handle.push_range(attributes),
            handle.pop_range,
            lambda attributes, _: (handle.start_range(attributes), None),
            lambda range_id, _: handle.end_range(range_id),
            None,
        )
    push, pop = push_pop
    start, end = start_end  # start_range gives (range id, domain handle): end_range's arguments
    return NvtxCalls(push, functools.partial(pop, handle.handle), start, end, handle.handle)


class Sink:
    """Where ranges go: its `name` (as ``emit=`` says it), and for a domain (`domain.Domain`) what a
    range's push takes and the functions that emit its ranges. `has_domains`: its ranges live in
    the spec's domain (else in none); `stack(domain)`: the stack a range of the domain named so
    lives on, on which two ranges must nest."""

    name = ""
    has_domains = False

    def stack(self, domain: str | None) -> Any:
        return self.name

    def attributes(self, domain: Any, message: str, color: int | None, category: str | None) -> Any:
        """What a push of this sink takes, for the range `message` of `domain`."""
        raise NotImplementedError

    def step_attributes(self, domain: Any, number: int) -> Any:
        """What a push of this sink takes for training step `number`'s range (`nvtx_regions.steps`):
        ``step N`` in the category ``nvtx_regions.steps``, as our reports and nsys read it."""
        return self.attributes(domain, step_message(number), None, STEP_CATEGORY)

    def calls(self, domain: Any) -> Any:
        """The push, pop, start and end of `domain`'s ranges in this sink (an `NvtxCalls`)."""
        raise NotImplementedError


class NvtxSink(Sink):
    """NVTX ranges: prebuilt event attributes (message as a registered string, colour, named
    category), pushed by nvtx's C functions."""

    name = "nvtx"
    has_domains = True

    def stack(self, domain: str | None) -> Any:
        return (self.name, domain)  # one stack per NVTX domain

    def attributes(self, domain: Any, message: str, color: int | None, category: str | None) -> Any:
        handle = domain.handle
        category_id = handle.get_category_id(category) if category else None
        return handle.get_event_attributes(message=message, color=color, category=category_id)

    def calls(self, domain: Any) -> Any:
        return nvtx_calls(domain)


class ProfilerSink(Sink):
    """torch.profiler ranges (`record_function_calls`): a range's attributes are its message."""

    name = "record_function"

    def attributes(self, domain: Any, message: str, color: int | None, category: str | None) -> Any:
        return message

    def step_attributes(self, domain: Any, number: int) -> Any:
        # torch.profiler's own name for a step (its `profile.step()` writes it): HTA and
        # TensorBoard's profiler plugin find iterations by it, and read no other.
        return profiler_step_message(number)

    def calls(self, domain: Any) -> Any:
        return NvtxCalls(*record_function_calls(), None)


SINK_OBJECTS: dict[str, Sink] = {sink.name: sink for sink in (NvtxSink(), ProfilerSink())}


def sinks_named(names: tuple[str, ...]) -> tuple[Sink, ...]:
    """The sink objects of `names` (from `chosen_sinks`, or a pickle or generated code), in that order."""
    return tuple(SINK_OBJECTS[name] for name in names)


def marker_sink(form: str) -> Sink:
    """The sink where a user's marker of `form` (`core.markers`) emits its own range: torch.profiler's
    for ``record_function``, NVTX's for the others."""
    return SINK_OBJECTS[RECORD_FUNCTION if form == RECORD_FUNCTION else "nvtx"]


def chosen_sinks(emit: Any, *, where: str) -> tuple[str, ...]:
    """The sinks of `emit` (``emit=`` of `where`, a function's name); None: ``$NVTX_REGIONS_EMIT``, else NVTX.

    A value given here that differs from ``$NVTX_REGIONS_EMIT`` is a ValueError: ``nvtx-regions
    profile --tool torch`` sets the variable, and a script that chose otherwise would give it
    nothing to read.
    """
    from_env = os.environ.get(ENV_EMIT) or None
    if emit is None:
        return NVTX_ONLY if from_env is None else emit_sinks(from_env, where=f"${ENV_EMIT}=")
    sinks = emit_sinks(emit, where=f"{where}(): emit=")
    if from_env is not None and emit_sinks(from_env, where=f"${ENV_EMIT}=") != sinks:
        raise ValueError(
            f"{where}(): emit={emit!r}, but ${ENV_EMIT} asks for {from_env!r} (nvtx-regions profile sets it "
            "for its tool); leave emit= unset so that the command chooses"
        )
    return sinks


@functools.cache
def record_function_calls() -> tuple[Callable[..., Any], Callable[[], Any], Callable[..., Any], Callable[..., Any]]:
    """(push, pop, start, end) of the record_function sink; each range's "attributes" is its message.

    One for the process (`functools.cache`): push(message, _) and pop() keep each thread's
    stack of entered ranges, one stack for every domain, as record_function has no domains.
    A range pushed while no profiler ran is a None on it, so a profiler started or stopped
    mid-range keeps pushes and pops paired. start(message, _) gives what end(*started) takes.
    """
    enter, leave, profiling = user_scope_functions()
    local = threading.local()

    def push(message: str, _domain: Any = None) -> None:
        stack = local.__dict__.get("stack")
        if stack is None:
            stack = local.stack = []
        stack.append(enter(message) if profiling() else None)

    def pop() -> None:
        stack = local.__dict__.get("stack")
        if stack:
            handle = stack.pop()
            if handle is not None:
                leave(handle)

    def start(message: str, _domain: Any = None) -> tuple[Any, None]:
        return (enter(message) if profiling() else None, None)

    def end(handle: Any, _unused: Any = None) -> None:
        if handle is not None:
            leave(handle)

    return push, pop, start, end
