"""Which module call each op of a trace belongs to: module paths, module globs,
and the attribution rules for forward and backward traces.

Promises:
- Forward: an op belongs to the innermost module whose ``forward`` was running
  when thunder recorded it (recorded by `internals.recorder`); a fusion belongs
  to the deepest module call that contains all its parts.
- Backward: every op gets a set of *forward origins* (positions of forward
  ops), by this data-flow rule, and belongs to the deepest module call that
  contains all its origins:
  1. an op that produces a gradient the backward returns for a forward
     argument (a parameter) has as origins the forward ops that read that
     argument; so a parameter's gradient belongs to the parameter's module;
  2. otherwise, an op that reads tensors saved from the forward has as origins
     the forward ops that read those tensors (or, for a tensor no forward op
     reads, the op that produced it);
  3. otherwise (pure gradient arithmetic: reshapes, sums of cotangents), it
     lies between two ops with origins by rules 1-2 (the previous and the
     next in the trace) and joins the module call of one of them. Between
     two ops of the same call, that call. Between two calls, the ops of the
     gap are split at one point, the earlier ones joining the earlier call:
     the point where most ops join the call that the data flow prefers for
     them (the nearer, in data-flow steps, of the nearest op with origins it
     depends on and the nearest one that depends on it; producers win ties).
     An op takes the origins of its data-flow preference when that is in
     the call it joins, else those of the neighbour it joins. So gradient
     arithmetic never cuts a module call's backward range in two.
- Communication that thunder's ddp/fsdp insert (all-reduce, reduce-scatter,
  all-gather, wait, ops whose outputs only collectives read, such as the
  gradient's division by the world size, and ddp's copies of the parameters)
  belongs to no module: thunder schedules it apart from the module's compute.
  Rule 1 looks through it, to the op that produced the gradient being
  communicated and to the ops that read the copied parameter.
- Module paths are those of the jitted model's ``named_modules()``; the root
  module's path is ``""``.

Hoisted ops (`parameter_only`, `core.bits.anchored_span`): thunder may move ops that
need only the model's weights away from the rest of their module's ops (under
ThunderFX the causal mask's ``arange`` and the layer norms' weight reshapes go
to the top of the forward; under FSDP the ops on the all-gathered weights
follow the all-gathers). Such an op keeps its module (``module <...>`` still
selects it), but it does not stretch a module call's ``each`` range:
- a value is *static* if it is an argument that thunder tags as a parameter or
  buffer (``ProxyTag.STATIC_MEMORY_LOCATION``), the output of an op that reads
  no proxy (``arange``, ``full``: constants), or the output of an op (a
  collective too, so FSDP's all-gather of a parameter shard and its wait)
  that reads only static values; in a backward trace, every value saved from
  the forward (all it reads without computing it, but the cotangents) is
  static too, so ops that recompute forward values from saved ones, which
  thunder may put first, do not depend on the gradient flowing in;
- an op is *parameter-only* if every proxy it reads is static;
- a module call's range runs from its first to its last op that is not
  parameter-only (its *anchored* ops); parameter-only ops of the call outside
  that range are *hoisted* and left out of it. A call whose ops are all
  parameter-only (an embedding of ``arange`` positions) keeps all its ops.
Whether an op is parameter-only does not depend on the call, so an inner
call's anchored ops are among its outer call's, and ``each`` ranges nest as
the module tree does.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Callable, Sequence

from ..core.bits import bit_positions
from ..core.calls import Chain, common_chain

if TYPE_CHECKING:
    from .traceview import TraceView

__all__ = [
    "forward_chains", "backward_origins", "communication", "argument_copies", "parameter_only",
]


def _origins_from_neighbours(
    view: TraceView, origins: list[int | None], chain_of: Callable[[int], Chain | None]
) -> list[int | None]:
    """Rule 3: give ops without origins those of their producers or consumers (see module doc)."""
    ops = view.ops
    producer: dict[str, int] = {}
    consumers: dict[str, list[int]] = {}
    for position, op in enumerate(ops):
        for name in op.reads:
            consumers.setdefault(name, []).append(position)
        for name in op.writes:
            producer.setdefault(name, position)
    # Nearest evidence (an op with origins by rule 1 or 2) through producers
    # and through consumers, in data-flow steps: (steps, origins).
    up: list[tuple[int, int] | None] = [None] * len(ops)
    for position, op in enumerate(ops):
        if origins[position] is not None:
            continue
        candidates = []
        for name in op.reads:
            q = producer.get(name)
            if q is None or q >= position:
                continue
            if origins[q] is not None:
                candidates.append((1, -q, origins[q]))
            elif up[q] is not None:
                candidates.append((up[q][0] + 1, -q, up[q][1]))
        if candidates:
            steps, _, mask = min(candidates)
            up[position] = (steps, mask)
    down: list[tuple[int, int] | None] = [None] * len(ops)
    for position in range(len(ops) - 1, -1, -1):
        if origins[position] is not None:
            continue
        candidates = []
        for name in ops[position].writes:
            for r in consumers.get(name, ()):
                if r <= position:
                    continue
                if origins[r] is not None:
                    candidates.append((1, r, origins[r]))
                elif down[r] is not None:
                    candidates.append((down[r][0] + 1, r, down[r][1]))
        if candidates:
            steps, _, mask = min(candidates)
            down[position] = (steps, mask)
    chains: dict[int, tuple[int, ...] | None] = {}

    def calls(mask: int | None) -> tuple[int, ...] | None:
        """The call numbers of the deepest module call containing `mask`'s ops (a hashable chain)."""
        if mask is None:
            return None
        if mask not in chains:
            found = _chain_of_mask(mask, chain_of)
            chains[mask] = None if found is None else tuple(call.call for call in found)
        return chains[mask]

    # What the data flow prefers: the nearer side in steps (a tie goes to the producers).
    preferred: list[int | None] = [None] * len(ops)
    for position in range(len(ops)):
        sides = [side for side in (up[position], down[position]) if side is not None]
        if origins[position] is None and sides:
            preferred[position] = min(sides, key=lambda side: side[0])[1]

    # Between two ops with evidence, the ops without go to the module of one or
    # the other, split at one point (so no module call's range is cut), chosen
    # to agree with as many data-flow preferences as possible.
    final = list(origins)
    evidence = [p for p, mask in enumerate(origins) if mask is not None]
    if not evidence:
        return preferred
    bounds = [(None, evidence[0])] + list(zip(evidence, evidence[1:])) + [(evidence[-1], None)]
    for before, after in bounds:
        start = 0 if before is None else before + 1
        stop = len(ops) if after is None else after
        if start >= stop:
            continue
        sides = [origins[q] for q in (before, after) if q is not None]
        if len(sides) == 1 or calls(sides[0]) == calls(sides[1]):
            split = stop if before is not None else start
        else:
            a, b = calls(sides[0]), calls(sides[1])
            votes = [calls(preferred[p]) for p in range(start, stop)]
            best, split = -1, start
            for cut in range(start, stop + 1):
                agree = sum(v == a for v in votes[: cut - start]) + sum(v == b for v in votes[cut - start :])
                if agree >= best:
                    best, split = agree, cut
        for position in range(start, stop):
            side = origins[before] if position < split and before is not None else origins[after] if after is not None else origins[before]
            mine = preferred[position]
            final[position] = mine if mine is not None and calls(mine) == calls(side) else side
    return final


def _chain_of_mask(mask: int, chain_of: Callable[[int], Chain | None]) -> Chain | None:
    return common_chain(chain_of(p) for p in bit_positions(mask))


_COLLECTIVES = re.compile(r".*(all_reduce|reduce_scatter|all_gather|broadcast|wait|synchronize)", re.IGNORECASE)


def argument_copies(view: TraceView) -> dict[int, str]:
    """Positions of ``shallow_copy`` ops of the traced function's arguments (ddp's copies of
    the parameters), with the argument each copies."""
    return {
        p: op.reads[0]
        for p, op in enumerate(view.ops)
        if op.name == "shallow_copy" and len(op.reads) == 1 and op.reads[0] in view.args
    }


def communication(view: TraceView) -> set[int]:
    """Positions of collectives, of the ops whose outputs only collectives read
    (one step: the gradient's division by the world size, not what computed it),
    and of copies of arguments."""
    collectives = {p for p, op in enumerate(view.ops) if _COLLECTIVES.match(op.name)}
    if not collectives:
        return set(argument_copies(view))
    readers: dict[str, list[int]] = {}
    for position, op in enumerate(view.ops):
        for name in op.reads:
            readers.setdefault(name, []).append(position)
    found = set(collectives)
    for position, op in enumerate(view.ops):
        consumers = [r for name in op.writes for r in readers.get(name, ())]
        if consumers and all(r in collectives for r in consumers) and len(op.reads) == 1:
            found.add(position)
    return found | set(argument_copies(view))


def forward_chains(view: TraceView, recorded: Sequence[Chain | None]) -> list[Chain | None]:
    """The module call of each op of a forward trace, from what was `recorded`
    per op; ops with no record take their neighbours' by rule 3 (communication: none)."""
    comm = communication(view)
    recorded = [None if p in comm else chain for p, chain in enumerate(recorded)]
    if all(chain is not None for chain in recorded) or not any(chain is not None for chain in recorded):
        return list(recorded)
    origins = [None if chain is None else 1 << p for p, chain in enumerate(recorded)]
    filled = _origins_from_neighbours(view, origins, lambda p: recorded[p])
    return [
        None if p in comm
        else recorded[p] if recorded[p] is not None
        else (None if mask is None else _chain_of_mask(mask, lambda q: recorded[q]))
        for p, mask in enumerate(filled)
    ]  # fmt: skip


def backward_origins(view: TraceView, forward: TraceView, returned: Sequence[str | None]) -> list[int | None]:
    """Per op of a backward trace: its forward origins (a bitset of forward
    positions), by rules 1-3. `returned` are the names the backward returns,
    aligned with `forward.arg_order`."""
    readers = dict(forward.by_read)
    passing = communication(forward)  # ddp's copies, fsdp's all-gathers and waits: read through them
    for argument in forward.args:
        mask, names, seen = 0, [argument], set()
        while names:
            name = names.pop()
            for q in bit_positions(forward.by_read.get(name, 0)):
                if q not in passing:
                    mask |= 1 << q
                elif q not in seen:
                    seen.add(q)
                    names.extend(forward.ops[q].writes)
        if mask:
            readers[argument] = mask
    producers: dict[str, int] = {}
    for position, op in enumerate(forward.ops):
        for name in op.writes:
            producers.setdefault(name, position)

    def saved(name: str) -> int:
        if name in readers:
            return readers[name]
        position = producers.get(name)
        return 0 if position is None else 1 << position

    comm = communication(view)
    made_by = {name: p for p, op in enumerate(view.ops) for name in op.writes}

    def computed_gradient(name: str) -> str:
        """Through the collectives that communicate it, to the gradient as computed."""
        seen = 0
        while made_by.get(name) in comm and seen < len(view.ops):
            inputs = [n for n in view.ops[made_by[name]].reads if n in made_by]
            if not inputs:
                break
            name, seen = inputs[0], seen + 1
        return name

    gradient_of: dict[str, int] = {}
    for argument, gradient in zip(forward.arg_order, returned):
        if gradient is not None and argument is not None and argument in readers:
            gradient = computed_gradient(gradient)
            gradient_of[gradient] = gradient_of.get(gradient, 0) | readers[argument]

    # Names the backward computes itself are not saved tensors, even if a
    # forward name were reused.
    computed = {name for op in view.ops for name in op.writes}
    origins: list[int | None] = []
    for position, op in enumerate(view.ops):
        if position in comm:
            origins.append(None)
            continue
        mask = 0
        for name in op.writes:
            mask |= gradient_of.get(name, 0)
        if not mask:
            for name in op.reads:
                if name not in computed:
                    mask |= saved(name)
        origins.append(mask or None)
    chains = forward.module_chains
    filled = _origins_from_neighbours(view, origins, lambda p: chains[p])
    return [None if p in comm else mask for p, mask in enumerate(filled)]


# -- hoisted ops (see the module docstring) ------------------------------------


def parameter_only(view: TraceView, static: frozenset[str]) -> int:
    """The parameter-only ops of `view` (a bitset over its positions), given
    the static names it starts from (parameters and buffers, or saved values)."""
    known = set(static)
    mask = 0
    for position, op in enumerate(view.ops):
        if all(name in known for name in op.reads):
            mask |= 1 << position
            known.update(op.writes)
    return mask
