"""The ``--domain`` option of every command: one spelling of NVTX's default domain, parsed here.

On the command line the default domain is ``default``, the word Nsight Systems
uses for it (``nsys profile --nvtx-domain-include=default``), so one word
works in nvtx-regions and in the nsys command it prints. Parsed, it is None,
the value of ``domain=`` everywhere in the library (and of a default-domain
record's ``domain``). Any other word is a domain's name. As in nsys, a
domain literally named ``default`` cannot be chosen on the command line.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["DEFAULT_DOMAIN_WORD", "add_domain_option", "domain_word", "parse_domain"]

DEFAULT_DOMAIN_WORD = "default"


def parse_domain(text: str) -> str | None:
    """The domain a ``--domain`` word names: None for ``default``; argparse's error for an empty word."""
    if not text:
        raise argparse.ArgumentTypeError(f"give a domain's name, or {DEFAULT_DOMAIN_WORD!r} for NVTX's default domain")
    return None if text == DEFAULT_DOMAIN_WORD else text


def domain_word(domain: str | None) -> str:
    """How a domain is written on the command line (`parse_domain`'s inverse)."""
    return DEFAULT_DOMAIN_WORD if domain is None else domain


def add_domain_option(parser: argparse.ArgumentParser, what: str, *, default: Any) -> None:
    """Add ``--domain NAME`` to `parser`: `what` it does, its `default` (kept as given when the option is absent)."""
    parser.add_argument(
        "--domain", type=parse_domain, default=default, metavar="NAME",
        help=f"{what} ({DEFAULT_DOMAIN_WORD!r}: NVTX's default domain, as nsys spells it)",
    )  # fmt: skip
