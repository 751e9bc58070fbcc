"""``nvtx-regions nsys``: the ``nsys profile`` command line that fits a spec.

    nvtx-regions nsys examples/regions.nvtx -- python train.py
    nvtx-regions nsys steps.nvtx --domain my_model -- torchrun --nproc_per_node=2 train.py
    nvtx-regions nsys steps.nvtx --domain default -- python train.py     # a transform with domain=None
    nvtx-regions nsys blocks.nvtx --run -- python train.py               # run it here too, and check the report
    nvtx-regions nsys blocks.nvtx --emit nvtx,record_function -- python train.py   # torch.profiler gets them too

`nsys_command` looks only at what a spec emits at run time: the NVTX
domain, each rule's label, whether a rule is a bare region (one range per
region, whose message is its label) and its run-time gates (`steps`,
`rank in`). It never looks at the kinds of filters, so new language forms
need no change here. The command:

- traces NVTX and CUDA, and only the spec's NVTX domain;
- when a labelled region rule has a ``steps`` gate, starts collecting at
  that region's NVTX range and collects one capture range per range it
  pushes, so only those steps are recorded (with ``rank in`` on the same
  rule, other ranks never push it and so never start collecting);
- turns CPU sampling and thread-switch tracing off (see `SAMPLING_OFF`);
- at the end of the last collection of a bounded ``steps`` gate, a single
  process is ended by nsys (SIGTERM, exit status 143); under torchrun every
  rank runs to its end instead (ending one rank would make torchrun fail the
  job and stop the other ranks' nsys mid-collection);
- under torchrun, runs nsys inside each worker (``torchrun --no-python nsys
  profile ...``) with the rank in the report name: one report per rank;
- starts with ``env NVTX_REGIONS_SPEC=SPEC`` where the spec is a file, so that
  a script calling ``nvtx_regions.compile(model)`` without a spec runs this
  one, as under ``nvtx-regions profile``; with ``--emit SINKS``, also
  ``NVTX_REGIONS_EMIT=SINKS`` (`commands.emit`; NVTX must be among them).

With ``--run`` the command also runs here (`run_nsys`), and a run whose
reports hold no range of the spec exits 1 and says so: nsys itself exits 0
when it collected nothing.

Every flag name and value comes from the Nsight Systems User Guide, section
"CLI Profile Command Switch Options" (docs.nvidia.com/nsight-systems/UserGuide),
cited per flag below, and says which nsys versions it was run on
(`CHECKED`): tests/test_nsys_real.py runs the commands for the documented specs
under the real nsys, tests/test_nsys.py checks the command lines for a table
of specs.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.naming import ANY_DOMAIN, DEFAULT_DOMAIN
from ..core.profiling import ENV_EMIT, ENV_SPEC, step_number
from ..language.tree import Spec, render
from ..internals import torchrun
from ..selection.compile import CompiledRule, CompiledSpec, EachMarkerRule, RegionRule, compile_spec
from .domain import DEFAULT_DOMAIN_WORD, add_domain_option, domain_word
from .emit import add_emit_option, emit_env, require_nvtx
from .status import OK, PROBLEM_FOUND, UsageError, child_status

__all__ = [
    "HELP", "DESCRIPTION", "USAGE", "EXAMPLE", "Flag", "NsysCommand", "add_arguments", "nsys_command", "report_files",
    "run", "run_nsys", "split_torchrun",
]  # fmt: skip

HELP = "print the nsys profile command line that fits a spec"
DESCRIPTION = "Print the nsys profile command line that records what SPEC selects."
USAGE = "nvtx-regions nsys SPEC [--domain NAME] [-o REPORT] [--emit SINKS] [--run] -- COMMAND..."
EXAMPLE = "nvtx-regions nsys examples/regions.nvtx -- python train.py"

GUIDE = "Nsight Systems User Guide, CLI Profile Command Switch Options"
# The nsys versions these commands were run on (tests/test_nsys_real.py, CPU only, no GPU).
CHECKED = "checked on nsys 2022.4.2"


@dataclass(frozen=True)
class Flag:
    """One nsys flag, why it is there, and the guide entry it comes from."""

    text: str
    why: str
    source: str


@dataclass(frozen=True)
class NsysCommand:
    """The command: `argv` to run; `str()` gives commented, copy-pasteable shell text.

    output: the report name given to ``--output`` (before nsys's ``%q{RANK}`` and numbering);
    domain: the NVTX domain the reports keep (`ANY_DOMAIN` where the spec re-emits your markers);
    torchrun: whether nsys runs inside each torchrun worker.
    """

    argv: tuple[str, ...]
    flags: tuple[Flag, ...]
    notes: tuple[str, ...] = ()
    output: str = "nvtx_regions_report"
    domain: Any = ANY_DOMAIN
    torchrun: bool = False

    def status(self, returncode: int) -> int:
        """The run's exit status as this command promises it: 0 for the SIGTERM (143) with which nsys
        ends the script after the last collection of ``--capture-range-end=repeat-shutdown:N``."""
        shutdown = any(f.text.startswith("--capture-range-end=repeat-shutdown") for f in self.flags)
        return 0 if returncode == 143 and shutdown else returncode

    def _env_words(self) -> tuple[str, ...]:
        """The ``NAME=VALUE`` words after a leading ``env``."""
        if self.argv[0] != "env":
            return ()
        return tuple(itertools.takewhile(lambda word: word.partition("=")[0] in ENV_NOTES, self.argv[1:]))

    @property
    def program(self) -> str:
        """The program the command runs: nsys, or torchrun (after ``env`` and its variables)."""
        words = self._env_words()
        return self.argv[len(words) + 1] if words else self.argv[0]

    def shell(self) -> str:
        """The command on one line, quoted for a POSIX shell."""
        return shlex.join(self.argv)

    def __str__(self) -> str:
        out = [f"# {f.text}: {f.why} [{f.source}]" for f in self.flags]
        out += [f"# note: {n}" for n in self.notes]
        flags = {f.text for f in self.flags}
        out += [f"# {word}: {ENV_NOTES[word.partition('=')[0]]}" for word in self._env_words()]
        last_flag = max(i for i, word in enumerate(self.argv) if word in flags)
        lines, current = [], []
        for i, word in enumerate(self.argv):
            if (word in flags or i == last_flag + 1) and current:
                lines.append(shlex.join(current))
                current = []
            current.append(word)
        lines.append(shlex.join(current))
        out.append(" \\\n    ".join(lines))
        return "\n".join(out)


ENV_NOTES = {
    ENV_SPEC: (
        "nvtx_regions.compile(model) without a spec takes this file, as under nvtx-regions profile "
        "(a relative path is read from the folder the script runs in)"
    ),
    ENV_EMIT: "where the ranges go, where the script gives no emit= (--emit)",
}

# CPU sampling and thread-switch tracing are off. With them on, nsys 2022.4.2
# (on Linux 6.18) hangs at the end of a collection: its agent's sampling thread
# spins on EPOLLHUP from its perf_event descriptors (seen with strace) once a
# traced thread is gone, and never finishes stopping. At the end of a capture
# range the script's NVTX pop waits for that stop, so the script hangs too
# (examples/train.py with examples/profile_steps.nvtx: 2 runs of 2 here, 2 of 3
# before); at the end of a whole run the script has exited and nsys hangs
# (the quickstart, 1 run of 3, under load). With both off, every run finished.
SAMPLING_OFF = (
    Flag("--sample=none", f"no CPU sampling: with it, nsys 2022.4.2 could hang at the end of a collection ({CHECKED})",
         f"{GUIDE}: --sample"),
    Flag("--cpuctxsw=none", f"no thread-switch tracing, for the same reason ({CHECKED})", f"{GUIDE}: --cpuctxsw"),
)  # fmt: skip


def _capture_rule(rules: Sequence[CompiledRule]) -> RegionRule | None:
    """The first labelled bare-region rule with a steps gate: its range can start the collection."""
    for rule in rules:
        gate = rule.gate
        if isinstance(rule, RegionRule) and not rule.region.never and rule.rule.label and gate and gate.first_step is not None:
            return rule
    return None


def split_torchrun(command: Sequence[str]) -> tuple[list[str], list[str]] | None:
    """`internals.torchrun.split_torchrun`: (launcher part, the program each worker runs) of a
    torchrun command, else None; a command it cannot split is a `UsageError`."""
    try:
        return torchrun.split_torchrun(command)
    except torchrun.TorchrunError as error:
        raise UsageError(str(error)) from None


def _domain_value(domain: str | None) -> str:
    # The guide: `default` names the default domain (our --domain word too); commas in a name are escaped.
    return DEFAULT_DOMAIN_WORD if domain is None else domain.replace(",", "\\,")


def _marker_rule(compiled: CompiledSpec) -> EachMarkerRule | None:
    """The first rule that re-emits the user's NVTX markers, in their own domains (the reports then keep every domain)."""
    return next((rule for rule in compiled.rules if isinstance(rule, EachMarkerRule)), None)


def _record_flags(compiled: CompiledSpec, domain: str | None) -> tuple[list[Flag], list[str]]:
    """(flags, notes) of what nsys records: NVTX and CUDA, only the spec's NVTX `domain` (every
    domain where the spec re-emits the user's markers, in their own domains), no sampling."""
    flags = [
        Flag(
            "--trace=cuda,nvtx",
            "record NVTX ranges and the CUDA API calls and kernels under them "
            f"({CHECKED}; on a machine without CUDA it records the NVTX ranges alone, without error)",
            f"{GUIDE}: --trace",
        ),
    ]
    notes = []
    marker = _marker_rule(compiled)
    if marker is not None:
        notes.append(
            f"no --nvtx-domain-include: rule {render(marker.rule)!r} re-emits your markers in their own NVTX domains"
        )
    else:
        flags.append(
            Flag(
                f"--nvtx-domain-include={_domain_value(domain)}",
                f"keep only NVTX events of the spec's domain ({'the default domain' if domain is None else repr(domain)}; {CHECKED})",
                f"{GUIDE}: --nvtx-domain-include",
            )
        )
    return [*flags, *SAMPLING_OFF], notes


def _capture_flags(compiled: CompiledSpec, domain: str | None, *, torchrun: bool) -> tuple[list[Flag], list[str]]:
    """(flags, notes) that collect only the steps of the first labelled region rule with a steps gate
    (`_capture_rule`): no flags when there is none, and a note for each gate that cannot start a collection.

    A bounded gate ends a single process with the last collection; under `torchrun` every rank runs to
    its end. Raises `UsageError` for a label or domain holding ``@``, which nsys reads as RANGE@DOMAIN.
    """
    rule = _capture_rule(compiled.rules)
    if rule is None:
        notes = []
        for gated in compiled.rules:
            if gated.gate is not None and gated.gate.first_step is not None:
                why = "has no label" if not gated.rule.label else "is not a bare region (its ranges carry op lines)"
                notes.append(
                    f"{gated.describe()} has a steps gate but {why}, so there is no capture range: "
                    "the whole run is recorded (its ranges still appear only in those steps)"
                )
        return [], notes
    gate, region = rule.gate, rule.region  # set: _capture_rule checked them
    label = rule.rule.label
    for name, what in ((label, f"label {label!r} (line {rule.rule.line})"), (domain, f"domain {domain!r}")):
        if name is not None and "@" in name:
            raise UsageError(
                f"the {what} holds '@', and nsys reads --nvtx-capture as RANGE@DOMAIN; "
                "rename it without '@' to start collecting at its range"
            )
    target = label if domain is None else f"{label}@{domain}"
    flags = [
        Flag("--capture-range=nvtx", f"collect only inside an NVTX range ({CHECKED})", f"{GUIDE}: --capture-range"),
        Flag(
            f"--nvtx-capture={target}",
            f"the range of region {label!r} (line {rule.rule.line}), pushed only in {gate.text()} "
            f"(a registered string, which nsys matches by default; {CHECKED})",
            f"{GUIDE}: --nvtx-capture",
        ),
    ]
    if gate.last_step is None:
        end, times, after = "repeat", f"every range {label!r} from step {gate.first_step} on", ""
    else:
        steps = gate.last_step - gate.first_step + 1
        per_step = 1 if region.phase is not None else 2
        times = f"{steps} step{'s' * (steps != 1)}"
        times += "" if per_step == 1 else " x 2 (a region without `and forward`/`and backward` may be in both traces)"
        if torchrun:
            end = f"repeat:{steps * per_step}"
            after = (", then each rank runs to its end uncollected (ending a rank early would make torchrun "
                     "fail the job and stop the other ranks' nsys)")  # fmt: skip
        else:
            end = f"repeat-shutdown:{steps * per_step}"
            after = ", then nsys ends the session and the script (SIGTERM: exit status 143)"
    flags.append(
        Flag(f"--capture-range-end={end}", f"one collection per range, {times}{after} ({CHECKED})", f"{GUIDE}: --capture-range-end")
    )
    notes = []
    if gate.ranks is not None:
        notes.append(f"only ranks {sorted(gate.ranks)} push {label!r}; other ranks never start collecting")
    for other in compiled.rules:
        if other is not rule and other.gate is not None and other.gate.first_step is not None:
            notes.append(f"{other.describe()} is gated too; its ranges are recorded only inside the ranges of {label!r}")
    return flags, notes


def _output_flag(output: str, *, torchrun: bool, collections: bool) -> Flag:
    """``--output``: `output`, with ``.rank%q{RANK}`` under `torchrun` (one report per rank); nsys numbers
    the reports of several `collections`."""
    numbered = "; one per collection, numbered .1, .2, ... before .nsys-rep" if collections else ""
    if torchrun:
        return Flag(
            f"--output={output}.rank%q{{RANK}}",
            f"one report per rank: nsys substitutes each worker's RANK{numbered} ({CHECKED})",
            f"{GUIDE}: --output",
        )
    return Flag(f"--output={output}", f"the report file name{numbered} ({CHECKED})", f"{GUIDE}: --output")


def _launch(nsys: list[str], command: Sequence[str], workers: tuple[list[str], list[str]] | None) -> tuple[list[str], list[str]]:
    """(argv, notes): `nsys` before `command`, or, for a torchrun command split into `workers`
    (launcher, worker program), torchrun running ``nsys ... WORKER`` as each worker's program."""
    if workers is None:
        return [*nsys, *command], []
    launcher, worker = workers
    note = "torchrun --no-python runs nsys as each worker's program, so every rank has its own nsys"
    return [*launcher, "--no-python", *nsys, *worker], [note]


def _with_env(argv: list[str], spec_path: str | os.PathLike[str] | None, emit: Sequence[str] | None) -> list[str]:
    """`argv` after ``env NVTX_REGIONS_SPEC=spec_path NVTX_REGIONS_EMIT=emit`` (each where given; nothing to add without either)."""
    words = [*([f"{ENV_SPEC}={os.fspath(spec_path)}"] if spec_path is not None else []), *(f"{k}={v}" for k, v in emit_env(emit).items())]
    if not words:
        return argv
    # `env NAME=VALUE command` rather than the shell's `NAME=VALUE command` (sh-only: fish and csh
    # reject it) or nsys's --env-var (which splits its value at commas): a user copies the command
    # to the GPU machine's shell, whichever it is. torchrun hands its environment to its workers.
    # The path stays as given, as the command's own paths do, so the command runs from that folder on any machine.
    return ["env", *words, *argv]


def nsys_command(
    spec: Spec,
    command: Sequence[str],
    *,
    domain: str | None = DEFAULT_DOMAIN,
    output: str = "nvtx_regions_report",
    spec_path: str | os.PathLike[str] | None = None,
    emit: Sequence[str] | None = None,
) -> NsysCommand:
    """The ``nsys profile`` command that records what `spec` selects when `command` runs.

    domain: the NVTX domain of the spec's `NvtxProfileTransform` (None: the
    default domain). output: the report name (under torchrun, ``.rank<RANK>``
    is appended through nsys's ``%q{RANK}``). spec_path: the spec's file; the
    command then starts with ``env NVTX_REGIONS_SPEC=spec_path``, so that a
    script calling ``nvtx_regions.compile(model)`` without a spec runs this one.
    emit: the sinks of the script's ranges (``--emit``), which then follow
    ``NVTX_REGIONS_EMIT=``. Raises `SelectorError` for a spec that does not
    compile, `UsageError` for a torchrun command that cannot be split, a
    capture range nsys cannot name, or sinks without NVTX.
    """
    require_nvtx(emit, "nsys")
    compiled = compile_spec(spec)
    workers = split_torchrun(command)
    torchrun = workers is not None
    recorded, notes = _record_flags(compiled, domain)
    captured, capture_notes = _capture_flags(compiled, domain, torchrun=torchrun)
    flags = [*recorded, *captured, _output_flag(output, torchrun=torchrun, collections=bool(captured))]
    argv, launch_notes = _launch(["nsys", "profile", *(f.text for f in flags)], command, workers)
    return NsysCommand(
        tuple(_with_env(argv, spec_path, emit)), tuple(flags), (*notes, *capture_notes, *launch_notes), output,
        domain if _marker_rule(compiled) is None else ANY_DOMAIN, torchrun,
    )  # fmt: skip


def report_files(output: str, *, torchrun: bool, rank: int | None = None) -> list[str]:
    """The reports an nsys command with ``--output=output`` wrote: ``output[.rankR][.N].nsys-rep``
    (N: one per collection; R: `rank`, or every rank when None)."""
    folder, name = Path(output).parent, Path(output).name
    ranks = "" if not torchrun else r"\.rank\d+" if rank is None else re.escape(f".rank{rank}")
    pattern = re.compile(rf"{re.escape(name)}{ranks}(\.\d+)?\.nsys-rep")
    return sorted(str(path) for path in folder.iterdir() if pattern.fullmatch(path.name)) if folder.is_dir() else []


def run_nsys(command: NsysCommand) -> int:
    """Run `command` here, then read its reports: its exit status (`NsysCommand.status`), or
    `PROBLEM_FOUND` with a message on stderr when it wrote no report or its reports hold no range
    of the spec (step ranges of `nvtx_regions.steps` do not count): nsys exits 0 either way."""
    from ..report.reader import read_ranges
    from .child import ended, run_child

    returncode = command.status(run_child(list(command.argv), dict(os.environ)))
    if returncode != 0:
        print(f"nvtx-regions nsys: {ended(command.program, returncode)}", file=sys.stderr)
        return child_status(returncode)
    paths = report_files(command.output, torchrun=command.torchrun)
    if not paths:
        print(f"nvtx-regions nsys: nsys wrote no report {command.output}*.nsys-rep", file=sys.stderr)
        return PROBLEM_FOUND
    ranges = read_ranges(paths, domain=command.domain)
    if not any(step_number(record.message) is None for record in ranges.records):
        where = "" if command.domain is ANY_DOMAIN else f" in domain {domain_word(command.domain)!r}"
        print(
            f"nvtx-regions nsys: {', '.join(paths)} hold no NVTX range of the spec{where}: the command emitted none. "
            f"Does the script call nvtx_regions.compile(model) (which takes the spec from ${ENV_SPEC}), "
            "or give its own annotate/transform/backend this spec and domain?",
            file=sys.stderr,
        )
        return PROBLEM_FOUND
    return OK


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="a .nvtx spec file")
    add_domain_option(parser, f"the transform's NVTX domain (default {DEFAULT_DOMAIN})", default=DEFAULT_DOMAIN)
    parser.add_argument("-o", "--output", default="nvtx_regions_report", help="report name (default nvtx_regions_report)")
    add_emit_option(parser, "default: the script's own, NVTX unless it says otherwise; nsys records nvtx")
    parser.add_argument(
        "--run", action="store_true", dest="run_here",
        help="also run the command here; exit 1 when its reports hold no range of the spec (nsys exits 0 then)",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """``nvtx-regions nsys``: `args.command` is the command after ``--``."""
    from ..language.parse import load

    command = nsys_command(
        load(args.spec), args.command, domain=args.domain, output=args.output, spec_path=args.spec, emit=args.emit
    )
    print(command, flush=True)
    return run_nsys(command) if args.run_here else OK
