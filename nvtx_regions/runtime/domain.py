"""One NVTX domain and the sinks its ranges go to, their prebuilt attributes, and the functions
that push and pop them.

`Domain(name, sinks)` builds nvtx's domain on first use; `name=None` is NVTX's
default domain (where ``torch.cuda.nvtx`` writes). `sinks` (`runtime.sinks`):
``("nvtx",)``, the default, ``("record_function",)`` or both, by name; each sink
(`runtime.sinks.Sink`) builds its own part of a range's attributes and gives its
own functions. `calls_of(domain)` gives the four functions generated code and
hooks call, and the domain argument they take, whatever the sinks (one sink's
own, or each sink's in turn):

- ``push(attributes, domain_argument)`` and ``pop()``: the nvtx package's C
  functions (the pop with its domain bound), so a range pushes no Python frame;
- ``start(attributes, domain_argument) -> started`` and ``end(*started)``.

With no NVTX tool attached, nvtx hands out a dummy domain, and the four are
C callables that do nothing (`SKIP_PUSH`, ...). A closed gate uses the same
stand-ins. A range's attributes are nvtx's event attributes for the NVTX sink,
its message for record_function, and a tuple of each sink's, in order, for
several.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from ..internals.nvtx_calls import unasked_domain
from .sinks import NVTX_ONLY, SKIP_END, SKIP_POP, SKIP_PUSH, SKIP_START, SKIPPED, NvtxCalls, nvtx_calls, sinks_named

__all__ = ["Domain", "NvtxCalls", "calls_of", "nvtx_calls", "nvtx_domain", "SKIP_PUSH", "SKIP_POP", "SKIP_START", "SKIP_END", "SKIPPED"]


class Domain:
    """One NVTX domain and the event attributes built for it, created on first use.

    `name=None` is NVTX's default domain (where ``torch.cuda.nvtx`` writes); `sinks`: where its
    ranges go (`runtime.sinks`).
    """

    def __init__(self, name: str | None, sinks: tuple[str, ...] = NVTX_ONLY) -> None:
        self.name = name
        self.sinks = sinks
        self.sink_objects = sinks_named(sinks)
        self._handle: Any = None
        self._lock = threading.Lock()

    @property
    def handle(self) -> Any:
        """The `nvtx` package's domain object (a dummy one when no tool is attached)."""
        if self._handle is None:
            with self._lock:
                if self._handle is None:
                    self._handle = nvtx_domain(self.name)
        return self._handle

    @property
    def enabled(self) -> bool:
        """Whether a tool records this domain's ranges (else every call on it is a no-op)."""
        return hasattr(self.handle, "handle")

    def attributes(self, message: str, *, color: int | None = None, category: str | None = None) -> Any:
        """What a range's push takes: its sink's attributes (`runtime.sinks.Sink.attributes`; for NVTX,
        prebuilt event attributes), or a tuple of each sink's, in order, for several."""
        parts = tuple(sink.attributes(self, message, color, category) for sink in self.sink_objects)
        return parts[0] if len(parts) == 1 else parts

    def step_attributes(self, number: int) -> Any:
        """What the push of training step `number`'s range takes, each sink naming it as its readers
        find steps (`runtime.sinks.Sink.step_attributes`)."""
        parts = tuple(sink.step_attributes(self, number) for sink in self.sink_objects)
        return parts[0] if len(parts) == 1 else parts


def nvtx_domain(name: str | None) -> Any:
    """The `nvtx` package's domain object for `name`: a real one whenever an NVTX tool is attached.

    With no tool attached it is nvtx's dummy domain, whose ranges cost nothing.
    nvtx >= 0.2.12 decides "no tool" by asking ``nvtxDomainIsEnabled``, which
    comes from NVTX's payload extension: Nsight Systems 2022.4 (CUDA 11.8's)
    does not implement it and answers "disabled", so `nvtx.get_domain` hands
    out the dummy and every range is silently lost. A tool is attached when
    NVTX was told to load one (``NVTX_INJECTION64_PATH``, which nsys and our
    capture tool both set); then the domain is built from its C handle
    without that question.
    """
    import nvtx

    domain = nvtx.get_domain(name)
    if hasattr(domain, "handle") or not os.environ.get("NVTX_INJECTION64_PATH") or not nvtx.enabled():
        return domain
    return unasked_domain(name)


def calls_of(domain: Domain) -> NvtxCalls:
    """The functions of `domain`'s ranges, for its sinks (see the module doc): one sink's own; for
    several, each sink's in turn, pushing in order and popping in reverse, each with its part of the
    attributes."""
    calls = [sink.calls(domain) for sink in domain.sink_objects]
    if len(calls) == 1:
        return calls[0]
    pairs = [(c.push, c.domain_argument) for c in calls]
    pops = [c.pop for c in reversed(calls)]
    starts = [(c.start, c.domain_argument) for c in calls]
    ends = [c.end for c in calls]

    def push_each(parts: Any, _: Any) -> None:
        for (push, argument), part in zip(pairs, parts):
            push(part, argument)

    def pop_each() -> None:
        for pop in pops:
            pop()

    def start_each(parts: Any, _: Any) -> tuple[Any, ...]:
        return tuple(start(part, argument) for (start, argument), part in zip(starts, parts))

    def end_each(*started: Any) -> None:
        for end, each in reversed(list(zip(ends, started))):
            end(*each)

    return NvtxCalls(push_each, pop_each, start_each, end_each, calls[0].domain_argument)
