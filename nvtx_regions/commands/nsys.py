"""``nvtx-regions nsys``: the ``nsys profile`` command line that fits a spec.

    nvtx-regions nsys examples/regions.nvtx -- python train.py
    nvtx-regions nsys steps.nvtx --domain my_model -- torchrun --nproc_per_node=2 train.py
    nvtx-regions nsys steps.nvtx --domain default -- python train.py     # a transform with domain=None
    nvtx-regions nsys blocks.nvtx --run -- python train.py               # run it here too, and check the report

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
  one, as under ``nvtx-regions profile``.

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
import os
import re
import shlex
import shutil
from collections.abc import Sequence
from dataclasses import dataclass

from pathlib import Path
from typing import Any

from ..core.naming import ANY_DOMAIN, DEFAULT_DOMAIN
from ..core.profiling import ENV_SPEC, step_number
from ..language.tree import Spec, render
from ..selection.compile import CompiledRule, EachMarkerRule, RegionRule, compile_spec
from .domain import DEFAULT_DOMAIN_WORD, add_domain_option, domain_word
from .status import OK, PROBLEM_FOUND, UsageError, child_status

__all__ = [
    "HELP", "DESCRIPTION", "USAGE", "EXAMPLE", "Flag", "NsysCommand", "add_arguments", "nsys_command", "report_files",
    "run", "run_nsys", "split_torchrun",
]  # fmt: skip

HELP = "print the nsys profile command line that fits a spec"
DESCRIPTION = "Print the nsys profile command line that records what SPEC selects."
USAGE = "nvtx-regions nsys SPEC [--domain NAME] [-o REPORT] [--run] -- COMMAND..."
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

    def shell(self) -> str:
        """The command on one line, quoted for a POSIX shell."""
        return shlex.join(self.argv)

    def __str__(self) -> str:
        out = [f"# {f.text}: {f.why} [{f.source}]" for f in self.flags]
        out += [f"# note: {n}" for n in self.notes]
        flags = {f.text for f in self.flags}
        if self.argv[0] == "env":
            out.append(f"# {self.argv[1]}: {ENV_NOTE}")
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


ENV_NOTE = (
    "nvtx_regions.compile(model) without a spec takes this file, as under nvtx-regions profile "
    "(a relative path is read from the folder the script runs in)"
)

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


def _torchrun_start(command: list[str]) -> int | None:
    """Where torchrun's own arguments start in `command`, or None when it is not a torchrun command."""
    if os.path.basename(command[0]) == "torchrun":
        return 1
    for i in range(1, len(command) - 1):
        if command[i : i + 2] == ["-m", "torch.distributed.run"]:
            return i + 2
        if not command[i].startswith("-"):  # the interpreter's options end here
            return None
    return None


# pip writes `#!/bin/sh` and this second line when the interpreter's path is too long for `#!`.
_SH_EXEC = re.compile(r"""^'''exec' "?(?P<python>[^"]+?)"? "\$0" "\$@"$""")


def _script_interpreter(script: str) -> str | None:
    """The interpreter a console script such as ``torchrun`` runs under, from its first lines."""
    try:
        with open(script, "rb") as f:
            head = f.read(1024).decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    if not head or not head[0].startswith("#!"):
        return None
    words = head[0][2:].split()
    if not words:
        return None
    if os.path.basename(words[0]) == "env" and len(words) > 1:
        return words[1]  # `#!/usr/bin/env python3`: the same name, found on PATH as the script's is
    if os.path.basename(words[0]) == "sh":
        match = next(filter(None, (_SH_EXEC.match(line) for line in head[1:3])), None)
        return match["python"] if match else None
    return words[0]


def _worker_python(command: list[str], start: int) -> str:
    """The interpreter torchrun runs each worker with: ``$PYTHON_EXEC``, else its own ``sys.executable``."""
    if os.environ.get("PYTHON_EXEC"):
        return os.environ["PYTHON_EXEC"]
    if start > 1:  # `PYTHON [options] -m torch.distributed.run`: that interpreter
        return command[0]
    script = command[0] if os.sep in command[0] else shutil.which(command[0])
    interpreter = _script_interpreter(script) if script else None
    if interpreter is None:
        raise UsageError(
            f"cannot tell which Python {command[0]!r} runs its workers with (not found, or no #! line); "
            "give its path (e.g. .venv/bin/torchrun), or use PYTHON -m torch.distributed.run"
        )
    return interpreter


def split_torchrun(command: Sequence[str]) -> tuple[list[str], list[str]] | None:
    """For a torchrun command: (launcher part, the program each worker runs); else None.

    Uses torchrun's own argument parser, so every torchrun option form works,
    and its errors come out as torchrun's (then `UsageError`). The worker
    program is what torchrun would run: ``PYTHON -u SCRIPT ARGS``,
    ``PYTHON -u -m MODULE ARGS``, or the program itself under ``--no-python``,
    where PYTHON is ``$PYTHON_EXEC`` or torchrun's own interpreter (the one
    in its ``#!`` line, or the one before ``-m torch.distributed.run``).
    """
    command = list(command)
    start = _torchrun_start(command) if command else None
    if start is None:
        return None
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    parser.prog = os.path.basename(command[0]) if start == 1 else shlex.join(command[:start])
    try:
        args = parser.parse_args(command[start:])
    except SystemExit:
        raise UsageError(
            f"{parser.prog} cannot parse its arguments (its message is above); fix them, then run this again"
        ) from None
    tail = 1 + len(args.training_script_args)
    options = command[start : len(command) - tail]  # torchrun's own, less those that choose the worker program
    if args.no_python:
        worker = [args.training_script, *args.training_script_args]
    elif args.module:
        worker = [_worker_python(command, start), "-u", "-m", args.training_script, *args.training_script_args]
    else:
        worker = [_worker_python(command, start), "-u", args.training_script, *args.training_script_args]
    chooser = {"--no-python", "--no_python", "-m", "--module", "--run-path", "--run_path"}
    return [*command[:start], *(w for w in options if w not in chooser)], worker


def _domain_value(domain: str | None) -> str:
    # The guide: `default` names the default domain (our --domain word too); commas in a name are escaped.
    return DEFAULT_DOMAIN_WORD if domain is None else domain.replace(",", "\\,")


def nsys_command(
    spec: Spec,
    command: Sequence[str],
    *,
    domain: str | None = DEFAULT_DOMAIN,
    output: str = "nvtx_regions_report",
    spec_path: str | os.PathLike[str] | None = None,
) -> NsysCommand:
    """The ``nsys profile`` command that records what `spec` selects when `command` runs.

    domain: the NVTX domain of the spec's `NvtxProfileTransform` (None: the
    default domain). output: the report name (under torchrun, ``.rank<RANK>``
    is appended through nsys's ``%q{RANK}``). spec_path: the spec's file; the
    command then starts with ``env NVTX_REGIONS_SPEC=spec_path``, so that a
    script calling ``nvtx_regions.compile(model)`` without a spec runs this one.
    Raises `SelectorError` for a spec that does not compile.
    """
    compiled = compile_spec(spec)
    flags = [
        Flag(
            "--trace=cuda,nvtx",
            "record NVTX ranges and the CUDA API calls and kernels under them "
            f"({CHECKED}; on a machine without CUDA it records the NVTX ranges alone, without error)",
            f"{GUIDE}: --trace",
        ),
    ]
    notes: list[str] = []
    markers = [rule for rule in compiled.rules if isinstance(rule, EachMarkerRule)]
    if markers:
        # The user's markers are re-emitted in the user's own domains, which the spec does not name.
        notes.append(
            f"no --nvtx-domain-include: rule {render(markers[0].rule)!r} re-emits your markers in their own NVTX domains"
        )
    else:
        flags.append(
            Flag(
                f"--nvtx-domain-include={_domain_value(domain)}",
                f"keep only NVTX events of the spec's domain ({'the default domain' if domain is None else repr(domain)}; {CHECKED})",
                f"{GUIDE}: --nvtx-domain-include",
            )
        )
    flags.extend(SAMPLING_OFF)
    rule = _capture_rule(compiled.rules)
    torchrun = split_torchrun(command)
    if rule is not None:
        gate, region = rule.gate, rule.region  # set: _capture_rule checked them
        label = rule.rule.label
        for name, what in ((label, f"label {label!r} (line {rule.rule.line})"), (domain, f"domain {domain!r}")):
            if name is not None and "@" in name:
                raise UsageError(
                    f"the {what} holds '@', and nsys reads --nvtx-capture as RANGE@DOMAIN; "
                    "rename it without '@' to start collecting at its range"
                )
        target = label if domain is None else f"{label}@{domain}"
        flags.append(Flag("--capture-range=nvtx", f"collect only inside an NVTX range ({CHECKED})", f"{GUIDE}: --capture-range"))
        flags.append(
            Flag(
                f"--nvtx-capture={target}",
                f"the range of region {label!r} (line {rule.rule.line}), pushed only in {gate.text()} "
                f"(a registered string, which nsys matches by default; {CHECKED})",
                f"{GUIDE}: --nvtx-capture",
            )
        )
        if gate.last_step is None:
            end, times = "repeat", f"every range {label!r} from step {gate.first_step} on"
            after = ""
        else:
            steps = gate.last_step - gate.first_step + 1
            per_step = 1 if region.phase is not None else 2
            count = steps * per_step
            times = f"{steps} step{'s' * (steps != 1)}"
            times += "" if per_step == 1 else " x 2 (a region without `and forward`/`and backward` may be in both traces)"
            if torchrun:
                end = f"repeat:{count}"
                after = (", then each rank runs to its end uncollected (ending a rank early would make torchrun "
                         "fail the job and stop the other ranks' nsys)")  # fmt: skip
            else:
                end = f"repeat-shutdown:{count}"
                after = ", then nsys ends the session and the script (SIGTERM: exit status 143)"
        flags.append(
            Flag(
                f"--capture-range-end={end}",
                f"one collection per range, {times}{after} ({CHECKED})",
                f"{GUIDE}: --capture-range-end",
            )
        )
        if gate.ranks is not None:
            notes.append(f"only ranks {sorted(gate.ranks)} push {label!r}; other ranks never start collecting")
        others = [r for r in compiled.rules if r is not rule and r.gate is not None and r.gate.first_step is not None]
        for other in others:
            notes.append(f"{other.describe()} is gated too; its ranges are recorded only inside the ranges of {label!r}")
    else:
        for gated in compiled.rules:
            if gated.gate is not None and gated.gate.first_step is not None:
                why = "has no label" if not gated.rule.label else "is not a bare region (its ranges carry op lines)"
                notes.append(
                    f"{gated.describe()} has a steps gate but {why}, so there is no capture range: "
                    "the whole run is recorded (its ranges still appear only in those steps)"
                )
    report = f"{output}.rank%q{{RANK}}" if torchrun else output
    numbered = "; one per collection, numbered .1, .2, ... before .nsys-rep" if rule is not None else ""
    flags.append(
        Flag(
            f"--output={report}",
            (f"one report per rank: nsys substitutes each worker's RANK{numbered} ({CHECKED})" if torchrun
             else f"the report file name{numbered} ({CHECKED})"),
            f"{GUIDE}: --output",
        )
    )  # fmt: skip
    nsys = ["nsys", "profile", *(f.text for f in flags)]
    if torchrun:
        launcher, worker = torchrun
        argv = [*launcher, "--no-python", *nsys, *worker]
        notes.append("torchrun --no-python runs nsys as each worker's program, so every rank has its own nsys")
    else:
        argv = [*nsys, *command]
    if spec_path is not None:
        # `env NAME=VALUE command` rather than the shell's `NAME=VALUE command` (sh-only: fish and csh
        # reject it) or nsys's --env-var (which splits its value at commas): a user copies the command
        # to the GPU machine's shell, whichever it is. torchrun hands its environment to its workers.
        # The path stays as given, as the command's own paths do, so the command runs from that folder on any machine.
        argv = ["env", f"{ENV_SPEC}={os.fspath(spec_path)}", *argv]
    kept = ANY_DOMAIN if markers else domain
    return NsysCommand(tuple(argv), tuple(flags), tuple(notes), output, kept, torchrun is not None)


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
    import sys

    from ..report.reader import read_ranges
    from .child import ended, run_child

    returncode = command.status(run_child(list(command.argv), dict(os.environ)))
    if returncode != 0:
        program = command.argv[2] if command.argv[0] == "env" else command.argv[0]
        print(f"nvtx-regions nsys: {ended(program, returncode)}", file=sys.stderr)
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
    parser.add_argument(
        "--run", action="store_true", dest="run_here",
        help="also run the command here; exit 1 when its reports hold no range of the spec (nsys exits 0 then)",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """``nvtx-regions nsys``: `args.command` is the command after ``--``."""
    from ..language.parse import load

    command = nsys_command(load(args.spec), args.command, domain=args.domain, output=args.output, spec_path=args.spec)
    print(command, flush=True)
    return run_nsys(command) if args.run_here else OK
