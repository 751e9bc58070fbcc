"""How a backend's run of ``nvtx-regions profile`` ended, rank by rank, in the words the summary says it.

    end = RunEnd.of(returncode, folder / "stderr.txt", torchrun=True)
    note, failure = end.judge(program, "eager", folder, tool, domain, ranks)  # one of them is None

A run failed when its command's exit status is not 0. Under torchrun, its report of
failed workers gives each failed rank's exit status and the rank that failed first
(`internals.torchrun.failed_workers`), unless another failed rank printed its uncaught exception
first (`first_raised`: torchrun's root cause is the lowest of the ranks that failed within
the same second, often one whose error is its peer's closed connection); the summary shows that rank's own last lines
(its uncaught exception, which torch.distributed prints with a ``[rankR]: `` prefix)
and names ``stderr.txt``, which holds the rest. Without torchrun, it shows the last
traceback of the one process (else its last lines).

One failure is none of the job's: a rank that aborted at exit after its report was
complete (under torchrun). On torch 2.11 a gloo process group outlives ``dist.destroy_process_group()``
once ``torch.distributed.nn`` is first imported after ``init_process_group``:
``torch.distributed.nn.functional`` keeps the group in its functions' defaults, and
``torch.optim``'s first optimizer imports it (through Dynamo). The group's worker
threads then run on while Python exits; one that drops a tensor a Python object holds
takes the GIL, Python ends that thread (``pthread_exit``), the unwinding meets a
``noexcept`` destructor, and libstdc++ aborts the whole process: "terminate called
without an active exception", SIGABRT (torchrun's exit status -6; 134 through nsys).
It strikes after the script's end, rarely, more often on a busy machine. `RunEnd.judge`
tells it apart by all of: each failed rank aborted (SIGABRT) or was stopped by torchrun
(SIGTERM, SIGKILL) after one did; stderr holds that line once per aborted rank; every
rank's report is complete (`complete_ranks`: it holds the last step any rank ran, and no
range left open); and no failed rank printed an uncaught exception. (A rank that raises
can abort the same way as Python exits, and the exception, unwinding, closes its ranges:
its report looks complete.) The run is then whole: a note says which rank, why, and what to do.
"""

from __future__ import annotations

import signal
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import CaptureFileError
from ..core.profiling import step_number
from ..internals.torchrun import failed_workers, first_raised, rank_lines
from ..report.ranks_table import ranks_text
from ..report.reader import read_ranges
from .child import ended
from .profile_folder import rank_files, report_domain

__all__ = ["TERMINATE", "RunEnd", "complete_ranks"]

TERMINATE = "terminate called without an active exception"
_ABORTED = (-signal.SIGABRT, 128 + signal.SIGABRT)  # a Python worker's exit status; nsys's for its program's
_STOPPED = tuple(code for s in (signal.SIGTERM, signal.SIGKILL) for code in (-s, 128 + s))  # torchrun stops the others
_LINES = 10  # of a failed rank's own lines, the last ones shown
_TRACEBACK = "Traceback (most recent call last):"
_AVOID = "to avoid it, `import torch.distributed.nn` before `dist.init_process_group(...)`"


def _last_error(lines: list[str]) -> list[str]:
    """The last traceback in `lines` (else the lines), its last `_LINES` non-empty lines."""
    starts = [i for i, line in enumerate(lines) if line.startswith(_TRACEBACK)]
    tail = [line for line in lines[starts[-1] if starts else 0 :] if line.strip()]
    return tail[-_LINES:]


def complete_ranks(folder: Path, tool: str, domain: str | None) -> dict[int, bool]:
    """Each rank that has a report in backend folder `folder`, and whether it is complete: it holds the
    last step any rank's report holds (its step ranges' numbers), and no range left open. Raises
    `CaptureFileError` for a report that cannot be read."""
    last: dict[int, int] = {}
    left_open: set[int] = set()
    for number, paths in rank_files(folder, tool).items():
        for record in read_ranges([str(p) for p in paths], domain=report_domain(tool, domain)).records:
            rank = number if number is not None else record.rank or 0
            step = step_number(record.message)
            last[rank] = max(last.get(rank, -1), -1 if step is None else step)
            if record.unclosed:
                left_open.add(rank)
    end = max(last.values(), default=-1)
    return {rank: step == end and rank not in left_open for rank, step in last.items()}


@dataclass(frozen=True)
class RunEnd:
    """A run whose command ended with `returncode` (not 0), its stderr kept in `stderr`. failed: each failed
    rank's exit status, by rank, as torchrun reports them (without torchrun, the one process's as rank
    0's); first: the rank that failed first (torchrun's root cause); None where unknown."""

    returncode: int
    stderr: Path
    torchrun: bool
    failed: Mapping[int, int] = field(default_factory=dict)
    first: int | None = None
    text: str = ""

    @classmethod
    def of(cls, returncode: int, stderr: Path, *, torchrun: bool) -> RunEnd:
        """The end of a run whose command ended with `returncode`, from its stderr file `stderr`."""
        try:
            text = stderr.read_text(encoding="utf-8", errors="replace")
        except OSError:
            text = ""
        if not torchrun:
            return cls(returncode, stderr, False, {0: returncode}, 0, text)
        failed, first = failed_workers(text)
        raised = first_raised(text)
        return cls(returncode, stderr, True, failed, raised if raised in failed else first, text)

    def aborted_at_exit(self, complete: Collection[int], ranks: Collection[int]) -> tuple[int, ...]:
        """The ranks that aborted at exit after their reports were complete, when that is all that went
        wrong in this run (see the module doc); () otherwise. complete: the ranks whose reports are complete
        (`complete_ranks`); ranks: every rank the run should have."""
        aborted = tuple(sorted(rank for rank, code in self.failed.items() if code in _ABORTED))
        if not aborted or any(code not in (*_ABORTED, *_STOPPED) for code in self.failed.values()):
            return ()
        if self.text.count(TERMINATE) < len(aborted) or not set(ranks) <= set(complete):
            return ()
        if any(_TRACEBACK in rank_lines(self.text, rank) for rank in self.failed):
            return ()  # a rank raised: its ranges closed as the exception unwound, and it aborted as Python exited
        return aborted

    def note(self, backend: str, aborted: tuple[int, ...]) -> str:
        """The note for a run whose ranks `aborted` only aborted at exit."""
        many = len(aborted) > 1
        stopped = sorted(rank for rank, code in self.failed.items() if code in _STOPPED)
        after = (
            f"; torchrun then stopped rank{'s' * (len(stopped) > 1)} {ranks_text(stopped)}, "
            f"{'their reports' if len(stopped) > 1 else 'its report'} complete too" if stopped else ""
        )
        return (
            f"note: {backend}: rank{'s' * many} {ranks_text(aborted)} aborted at exit (SIGABRT, \"{TERMINATE}\", "
            f"in {self.stderr}) after {'their reports were' if many else 'its report was'} complete{after}: the table "
            "holds every step of every rank, and the run counts as whole. The abort is torch's, not the script's: Python "
            "ended a torch.distributed thread still running as it exited (on torch 2.11, gloo's: its process group outlives "
            "dist.destroy_process_group() when torch.distributed.nn is first imported after init_process_group, as "
            f"torch.optim does); {_AVOID}"
        )

    def words(self, program: str) -> str:
        """Why the run failed: how its command ended, the first failed rank's own last lines, and the file
        that holds the rest."""
        said = ended(program, self.returncode)
        if not self.torchrun or self.first is None:
            lines = _last_error(self.text.splitlines())
            shown = "\n".join(f"    {line}" for line in lines) if lines else "    (its stderr was empty)"
            unsaid = ", with no report of a failed rank" if self.torchrun else ""
            return f"{said}{unsaid}; its stderr ended with:\n{shown}\n    (all of it: {self.stderr})"
        rank = self.first
        how = f"rank {rank} failed first ({ended('it', self.failed[rank])})"
        own = _last_error(rank_lines(self.text, rank))
        if not own:
            return f"{said}: {how} and printed no Python error (no line [rank{rank}]: ... in {self.stderr}, every rank's stderr)"
        shown = "\n".join(f"    {line}" for line in own)
        return f"{said}: {how}; its last lines:\n{shown}\n    (the rest, and every rank's stderr: {self.stderr})"

    def judge(self, program: str, backend: str, folder: Path, tool: str, domain: str | None,
              ranks: Collection[int] | None) -> tuple[str | None, str | None]:  # fmt: skip
        """(a note, None) for a run whose ranks only aborted at exit after their reports were complete; else
        (None, why it failed). program: the command's; folder: the backend's folder of reports, written by
        `tool` in `domain`; ranks: every rank the run should have (None: the ranks that have a report)."""
        if self.torchrun and any(code in _ABORTED for code in self.failed.values()) and TERMINATE in self.text:
            try:
                reports = complete_ranks(folder, tool, domain)
            except CaptureFileError:  # a report that cannot be read is no complete one
                reports = {}
            complete = {rank for rank, whole in reports.items() if whole}
            aborted = self.aborted_at_exit(complete, ranks if ranks is not None else set(reports))
            if aborted:
                return self.note(backend, aborted), None
        return None, self.words(program)
