"""The names and colours that eager and thunder profiles share, written once.

``nvtx-regions compare`` lines an eager profile up with a thunder profile of
the same model range by range, so both must name a module call's ranges, their
NVTX category and colour, and their domain the same way. Every producer
(the thunder transform, `annotate()`, the plan of ``each`` rules) and every
reader (range art, reports) takes them from here.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

__all__ = [
    "ANY_DOMAIN", "DEFAULT_DOMAIN", "BACKWARD_SUFFIX", "CONTINUED", "Phase", "continues", "in_domain", "module_call_name",
    "range_message", "read_range_message", "rule_category", "rule_color",
]  # fmt: skip

# A pass of a training step, on every backend: a program (a trace, a graph, a module tree) is one's.
Phase = Literal["forward", "backward"]

# The NVTX domain of our ranges unless the user names another (None: NVTX's default domain).
DEFAULT_DOMAIN = "nvtx_regions"


class _AnyDomain:
    def __repr__(self) -> str:
        return "ANY_DOMAIN"


# The one "every domain" value of a `domain=` filter. Everywhere else a domain is
# its name, and None is NVTX's default domain (the NULL domain handle).
ANY_DOMAIN: Any = _AnyDomain()


def in_domain(domain: str | None, wanted: Any) -> bool:
    """Whether a range of `domain` passes the filter `wanted` (a name, None: the default domain, or `ANY_DOMAIN`)."""
    return wanted is ANY_DOMAIN or domain == wanted

# What a module call's backward range adds to its forward range's message.
BACKWARD_SUFFIX = " (backward)"


def class_name(cls: Any) -> str:
    """The name a module's class has in ranges and in ``class <...>``: the user's class. FSDP2's
    ``fully_shard`` gives each module it shards a class of its own, ``FSDP<Name>``, made from
    ``FSDPModule`` and the module's class (torch 2.8, 2.11 and 2.14.1): named after the latter, a model
    with FSDP has the names of the same model without it."""
    name = getattr(cls, "__name__", None) or str(cls)
    if name.startswith("FSDP"):
        for base in getattr(cls, "__bases__", ()):
            if name == "FSDP" + base.__name__:
                return base.__name__
    return name


def module_call_name(path: str, cls: str) -> str:
    """A module call's range message in the forward pass: its path, or its class name for the root module."""
    return path or cls


# What the range of a part of a module call after its first adds to the message, where a compiler ran
# other modules' work between parts of the call's own (Inductor runs a projection's weight gradient
# after its siblings' input gradients): ``o_proj (backward, continued)``.
CONTINUED = "continued"


def range_message(name: str, phase: Phase, *, continued: bool = False) -> str:
    """The message of a module call's range in `phase` ("forward" or "backward"); `continued`: of a
    part of the call after its first (see `CONTINUED`)."""
    if continued:
        return f"{name} (backward, {CONTINUED})" if phase == "backward" else f"{name} ({CONTINUED})"
    return name + BACKWARD_SUFFIX if phase == "backward" else name


def continues(message: str) -> bool:
    """Whether a range named `message` is a later part of a module call's range (`CONTINUED`): a count
    of calls, or a comparison of names across backends, leaves it out."""
    return read_range_message(message)[2]


def read_range_message(message: str) -> tuple[str, Phase, bool]:
    """(name, phase, continued) of a message `range_message` made; a message it did not make
    reads as a forward range named `message`."""
    for phase, continued, suffix in (
        ("backward", False, BACKWARD_SUFFIX), ("backward", True, f" (backward, {CONTINUED})"), ("forward", True, f" ({CONTINUED})"),
    ):  # fmt: skip
        if message.endswith(suffix):
            return message[: -len(suffix)], phase, continued
    return message, "forward", False


class _NamedRule(Protocol):
    label: str | None

    @property
    def written(self) -> str: ...


def rule_category(rule: _NamedRule) -> str:
    """The NVTX category of a rule's ranges: its label, else the rule as written."""
    return rule.label or rule.written


# Distinct, readable colours (ARGB), one per rule, cycling.
_PALETTE = (
    0xFF76B900, 0xFF1F77B4, 0xFFFF7F0E, 0xFFD62728, 0xFF9467BD,
    0xFF8C564B, 0xFFE377C2, 0xFF17BECF, 0xFFBCBD22, 0xFF7F7F7F,
)  # fmt: skip


def rule_color(number: int) -> int:
    """The colour of the ranges of the spec's rule number `number` (0-based)."""
    return _PALETTE[number % len(_PALETTE)]
