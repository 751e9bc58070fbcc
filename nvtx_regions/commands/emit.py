"""The ``--emit`` option of the commands that run the user's command: where its ranges go, parsed here.

    nvtx-regions profile blocks.nvtx --emit nvtx,record_function -- python train.py

``nvtx``, ``record_function``, or both comma-separated, read by
`core.profiling.emit_sinks`, the parser of ``emit=`` and ``$NVTX_REGIONS_EMIT``;
a bad value is argparse's usage error (exit status 2), naming the accepted values.
The command hands the sinks to its child as ``$NVTX_REGIONS_EMIT`` (`emit_env`), which
``nvtx_regions.compile``, ``steps`` and every backend read when the script gives no
``emit=``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from ..core.profiling import ENV_EMIT, emit_sinks
from .status import UsageError

__all__ = ["add_emit_option", "emit_env", "parse_emit", "require_nvtx"]


def parse_emit(text: str) -> tuple[str, ...]:
    """The sinks an ``--emit`` value names; argparse's error naming the accepted values otherwise."""
    try:
        return emit_sinks(text, where="")
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_emit_option(parser: argparse.ArgumentParser, what: str) -> None:
    """Add ``--emit SINKS`` to `parser`, `what` saying its default; absent, ``args.emit`` is None."""
    parser.add_argument(
        "--emit", type=parse_emit, metavar="SINKS",
        help=f"where the script's ranges go: nvtx, record_function (torch.profiler), or nvtx,record_function ({what})",
    )  # fmt: skip


def require_nvtx(sinks: Sequence[str] | None, tool: str) -> None:
    """`UsageError` when `sinks` are chosen and leave out NVTX, the only ranges `tool` records."""
    if sinks is not None and "nvtx" not in sinks:
        raise UsageError(
            f"--emit {','.join(sinks)}: {tool} records NVTX ranges only; add nvtx (--emit nvtx,record_function)"
        )


def emit_env(sinks: Sequence[str] | None) -> dict[str, str]:
    """``{NVTX_REGIONS_EMIT: ...}`` for the child, or nothing when no sinks are chosen."""
    return {} if sinks is None else {ENV_EMIT: ",".join(sinks)}
