"""``nvtx-regions nsys``: the ``nsys profile`` command line that fits a spec.

    nvtx-regions nsys examples/regions.nvtx -- python train.py
    nvtx-regions nsys steps.nvtx --domain my_model -- torchrun --nproc_per_node=2 train.py

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
- under torchrun, runs nsys inside each worker (``torchrun --no-python nsys
  profile ...``) with the rank in the report name: one report per rank.

Every flag name and value comes from the Nsight Systems User Guide, section
"CLI Profile Command Switch Options" (docs.nvidia.com/nsight-systems/UserGuide),
cited per flag below. Not run against a real nsys here (no Nsight on these
machines); tests/test_nsys.py checks the command lines against a table of specs.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from ..selection.compile import CompiledRule, RegionRule, compile_spec
from ..emission.runtime import DEFAULT_DOMAIN
from ..language.tree import Spec

__all__ = ["Flag", "NsysCommand", "nsys_command", "split_torchrun"]

GUIDE = "Nsight Systems User Guide, CLI Profile Command Switch Options"


@dataclass(frozen=True)
class Flag:
    """One nsys flag, why it is there, and the guide entry it comes from."""

    text: str
    why: str
    source: str


@dataclass(frozen=True)
class NsysCommand:
    """The command: `argv` to run; `str()` gives commented, copy-pasteable shell text."""

    argv: tuple[str, ...]
    flags: tuple[Flag, ...]
    notes: tuple[str, ...] = ()

    def shell(self) -> str:
        """The command on one line, quoted for a POSIX shell."""
        return shlex.join(self.argv)

    def __str__(self) -> str:
        out = [f"# {f.text}: {f.why} [{f.source}]" for f in self.flags]
        out += [f"# note: {n}" for n in self.notes]
        flags = {f.text for f in self.flags}
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


def _capture_rule(rules: Sequence[CompiledRule]) -> RegionRule | None:
    """The first labelled bare-region rule with a steps gate: its range can start the collection."""
    for rule in rules:
        gate = rule.gate
        if isinstance(rule, RegionRule) and not rule.region.never and rule.rule.label and gate and gate.first_step is not None:
            return rule
    return None


def split_torchrun(command: Sequence[str]) -> tuple[list[str], list[str]] | None:
    """For a torchrun command: (launcher part, the program each worker runs); else None.

    Uses torchrun's own argument parser, so every torchrun option form works.
    The worker program is what torchrun would run: ``python SCRIPT ARGS``,
    ``python -m MODULE ARGS``, or the program itself under ``--no-python``.
    """
    command = list(command)
    if not command:
        return None
    if os.path.basename(command[0]) == "torchrun":
        start = 1
    elif len(command) >= 3 and command[1:3] == ["-m", "torch.distributed.run"]:
        start = 3
    else:
        return None
    from torch.distributed.run import get_args_parser

    args = get_args_parser().parse_args(command[start:])
    tail = 1 + len(args.training_script_args)
    launcher = command[: len(command) - tail]
    if args.no_python:
        worker = [args.training_script, *args.training_script_args]
        launcher = [w for w in launcher if w not in ("--no-python", "--no_python")]
    elif args.module:
        worker = ["python", "-m", args.training_script, *args.training_script_args]
        launcher = [w for w in launcher if w not in ("-m", "--module")]
    else:
        worker = ["python", args.training_script, *args.training_script_args]
        launcher = [w for w in launcher if w not in ("--run-path", "--run_path")]
    return launcher, worker


def _domain_value(domain: str | None) -> str:
    # The guide: `default` names the default domain; commas in a name are escaped with a backslash.
    return "default" if domain is None else domain.replace(",", "\\,")


def nsys_command(
    spec: Spec,
    command: Sequence[str],
    *,
    domain: str | None = DEFAULT_DOMAIN,
    output: str = "nvtx_regions_report",
) -> NsysCommand:
    """The ``nsys profile`` command that records what `spec` selects when `command` runs.

    domain: the NVTX domain of the spec's `NvtxProfileTransform` (None: the
    default domain). output: the report name (under torchrun, ``.rank<RANK>``
    is appended through nsys's ``%q{RANK}``). Raises `SelectorError` for a spec
    that does not compile.
    """
    compiled = compile_spec(spec)
    flags = [
        Flag("--trace=cuda,nvtx", "record NVTX ranges and the CUDA API calls and kernels under them", f"{GUIDE}: --trace"),
        Flag(
            f"--nvtx-domain-include={_domain_value(domain)}",
            f"keep only NVTX events of the spec's domain ({'the default domain' if domain is None else repr(domain)})",
            f"{GUIDE}: --nvtx-domain-include",
        ),
    ]
    notes: list[str] = []
    rule = _capture_rule(compiled.rules)
    if rule is not None:
        gate, region = rule.gate, rule.region  # set: _capture_rule checked them
        label = rule.rule.label
        target = label if domain is None else f"{label}@{domain}"
        flags.append(Flag("--capture-range=nvtx", "collect only inside an NVTX range", f"{GUIDE}: --capture-range"))
        flags.append(
            Flag(
                f"--nvtx-capture={target}",
                f"the range of region {label!r} (line {rule.rule.line}), pushed only in {gate.text()}",
                f"{GUIDE}: --nvtx-capture",
            )
        )
        if gate.last_step is None:
            end, times = "repeat", f"every range {label!r} from step {gate.first_step} on"
        else:
            steps = gate.last_step - gate.first_step + 1
            per_step = 1 if region.phase is not None else 2
            end = f"repeat-shutdown:{steps * per_step}"
            times = f"{steps} step{'s' * (steps != 1)}"
            times += "" if per_step == 1 else " x 2 (a region without `and forward`/`and backward` may be in both traces)"
        flags.append(
            Flag(
                f"--capture-range-end={end}",
                f"one collection per range, {times}" + (", then end the session" if gate.last_step is not None else ""),
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
    torchrun = split_torchrun(command)
    report = f"{output}.rank%q{{RANK}}" if torchrun else output
    flags.append(
        Flag(
            f"--output={report}",
            "one report per rank: nsys substitutes each worker's RANK" if torchrun else "the report file name",
            f"{GUIDE}: --output",
        )
    )
    nsys = ["nsys", "profile", *(f.text for f in flags)]
    if torchrun:
        launcher, worker = torchrun
        argv = [*launcher, "--no-python", *nsys, *worker]
        notes.append("torchrun --no-python runs nsys as each worker's program, so every rank has its own nsys")
    else:
        argv = [*nsys, *command]
    return NsysCommand(tuple(argv), tuple(flags), tuple(notes))


def main(argv: list[str]) -> int:
    """Entry point of ``nvtx-regions nsys`` (argv after the subcommand name)."""
    import argparse

    from .child import split_command
    from ..language.parse import load

    parser = argparse.ArgumentParser(
        prog="nvtx-regions nsys",
        usage="nvtx-regions nsys SPEC [--domain NAME | --default-domain] [-o REPORT] -- COMMAND...",
        description="Print the nsys profile command line that records what SPEC selects.",
    )
    parser.add_argument("spec", help="a .nvtx spec file")
    parser.add_argument("--domain", default=DEFAULT_DOMAIN, help=f"the transform's NVTX domain (default {DEFAULT_DOMAIN})")
    parser.add_argument("--default-domain", action="store_true", help="the transform uses domain=None")
    parser.add_argument("-o", "--output", default="nvtx_regions_report", help="report name (default nvtx_regions_report)")
    if argv and argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    options, command = split_command(argv, "nvtx-regions nsys examples/regions.nvtx -- python train.py")
    args = parser.parse_args(options)
    spec = load(args.spec)
    print(nsys_command(spec, command, domain=None if args.default_domain else args.domain, output=args.output))
    return 0
