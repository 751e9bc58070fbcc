"""When the thunder transform says that a rule selected nothing: once per
compilation, or under ThunderFX when asked (and at exit).

A compilation is a forward trace and, when one follows, its backward; the
check waits for the backward. ThunderFX compiles many subgraphs with one
transform and gives no moment when all of them are done, so there the check
waits for `NothingSelectedCheck.check` (the transform's ``check()``) and runs
at exit for traces seen since (`at_exit`, from the transform's report at exit).
"""

from __future__ import annotations

import sys
from typing import Any

from ..internals.frames import backward_follows
from ..internals.thunderfx import is_thunderfx_subgraph
from ..attribution.traceview import TraceView
from ..core.errors import SelectorError
from ..selection.plan import Plan
from ..selection.unselected import RuleTally

__all__ = ["NothingSelectedCheck", "VIEWS_KEPT"]

# Memory stays bounded however often thunder recompiles: the tally keeps the
# views of the latest traces for the hints of check(); its counts of ranges
# cover every trace.
VIEWS_KEPT = 32


class NothingSelectedCheck:
    """When one transform (`handle`) says which rules selected nothing; its tally (the handle's,
    `SpecHandle.tally`) counts the ranges per rule of every trace seen."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.traces_seen = 0
        self._compilation: RuleTally | None = None  # a forward waiting for its backward
        self._subgraphs_seen = False
        self._checked_at = 0  # how many traces `check()` last covered

    def add(self, view: TraceView, plan: Plan, *, augmented_forward: bool) -> None:
        """Count one trace's plan; report the rules of a finished compilation that selected nothing.

        `augmented_forward`: the trace is a forward that thunder tagged as
        saving values for a backward.
        """
        self.traces_seen += 1
        tally, strict = self.handle.tally, self.handle.strict
        tally.add(plan, view)
        # Views only feed the nearest-name hints; the latest ones are enough.
        del tally.views[:-VIEWS_KEPT]
        if is_thunderfx_subgraph():
            self._subgraphs_seen = True
            return
        if view.phase == "backward":
            compilation = self._compilation or RuleTally(tally.spec)
            self._compilation = None
            compilation.add(plan, view)
            compilation.report(strict=strict, where="the forward and backward traces of this compilation")
            return
        if self._compilation is not None:
            # The previous forward's backward never came.
            pending, self._compilation = self._compilation, None
            pending.report(strict=strict, where="the forward trace of the previous compilation")
        compilation = RuleTally(tally.spec)
        compilation.add(plan, view)
        if augmented_forward and backward_follows():
            self._compilation = compilation
        else:
            compilation.report(strict=strict, where="the forward trace of this compilation")

    def at_exit(self) -> None:
        """At exit, under ThunderFX (which gives no "all subgraphs compiled" moment): `check()` the
        traces seen since it last ran, rather than never; an error of ``strict`` is printed, as nothing
        can catch it then."""
        if not self._subgraphs_seen or self.traces_seen <= self._checked_at:
            return
        try:
            self.check()
        except SelectorError as error:
            print(f"nvtx_regions: {error}", file=sys.stderr)

    def check(self) -> None:
        """Report rules that selected nothing in any trace seen (see `NvtxProfileTransform.check`)."""
        if not self.traces_seen:
            raise SelectorError("check(): this transform has not seen a trace yet; call the compiled function first")
        self._checked_at = self.traces_seen
        self.handle.say_unselected(f"any of the {self.traces_seen} traces seen", once=False, stacklevel=3)
