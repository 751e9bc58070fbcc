"""``nvtx-regions grammar``: print the grammar file, the one definition of the syntax."""

from __future__ import annotations

import argparse

from ..language.parse import grammar_resource, grammar_text
from .status import OK

__all__ = ["HELP", "DESCRIPTION", "add_arguments", "run"]

HELP = "print the grammar (the one definition of the syntax)"
DESCRIPTION = "Print the lark grammar of the spec language, as shipped in the package."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """No arguments."""


def run(args: argparse.Namespace) -> int:
    print(f"# {grammar_resource()}")
    print(grammar_text(), end="")
    return OK
