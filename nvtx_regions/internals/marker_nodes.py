"""The user's marker nodes in a Dynamo graph (`compiled_markers` puts them there): taken out before
Inductor compiles it, and carried on the other nodes' metadata to the kernels.

Checked on torch 2.11 and 2.14 (CPU).

Carry (`take_markers`): the backend reads the marker nodes of the Dynamo graph in order, keeps one
stack per NVTX domain and one for record_function, adds the markers open around each compute node
to its ``nn_module_stack`` as entries of their own (key ``nvtx_regions.marker.<n>``), and removes
the marker nodes, so Inductor compiles the graph a plain ``torch.compile`` would. AOTAutograd
copies ``nn_module_stack`` to the forward graph's nodes and, as ``fwd_nn_module_stack``, to the
backward's (``inductor_origins``, which splits these entries back out: `split_markers`); the
module digest that keys Inductor's caches covers them too.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ..core.markers import RECORD_FUNCTION, Marker
from .compiled_markers import color_value, marker_op

__all__ = ["Problem", "Taken", "take_markers", "describe", "split_markers", "is_marker_entry", "MARKER_KEY"]

MARKER_KEY = "nvtx_regions.marker."  # the prefix of a marker's entries in nn_module_stack
MARKER_CLASS = "nvtx_regions.Marker"


@dataclass(frozen=True)
class Problem:
    """A marker that cannot be carried through the compiler: where, and why."""

    where: str
    why: str


def _is_marker_node(node: Any) -> str | None:
    """"push"/"pop" for a marker node of a Dynamo graph, else None."""
    import torch

    if node.op != "call_function":
        return None
    if node.target is marker_op():
        return str(node.args[0])
    if node.target is torch.ops.profiler._record_function_enter_new.default or node.target is torch.ops.profiler._record_function_enter_new:
        return "push"
    exit_op = getattr(torch.ops.profiler._record_function_exit, "_RecordFunction", None)
    if exit_op is not None and node.target is exit_op:
        return "pop"
    return None


def _where(node: Any) -> tuple[str, int] | None:
    """The user's file and line of a marker node, from Dynamo's ``stack_trace``: its innermost frame
    outside torch, nvtx and nvtx_regions."""
    trace = node.meta.get("stack_trace") or ""
    found = None
    for match in re.finditer(r'File "([^"]+)", line (\d+)', trace):
        filename = match.group(1)
        if any(part in filename for part in ("/torch/", "/nvtx/", "/nvtx_regions/", "contextlib")):
            continue
        found = (filename, int(match.group(2)))
    return found


def _place(where: tuple[str, int] | None) -> str:
    return f"{where[0]}:{where[1]}" if where else "<unknown line>"


@dataclass(frozen=True)
class Taken:
    """What `take_markers` took out of a graph: the markers it carries, and those it cannot."""

    markers: tuple[Marker, ...]
    problems: tuple[Problem, ...]


def take_markers(gm: Any) -> Taken:
    """Take the marker nodes out of Dynamo's graph `gm`, recording on each other node the markers
    open around it (see the module doc). A marker that cannot be carried (a push with no pop in
    the graph, a pop with nothing open, a message not known when compiling) is left out: its
    nodes go, and a `Problem` names it. Nothing is changed when the graph holds no marker."""
    nodes = [(node, _is_marker_node(node)) for node in gm.graph.nodes]
    if not any(action for _, action in nodes):
        return Taken((), ())
    problems: list[Problem] = []
    stacks: dict[tuple[str, str | None], list[Marker]] = {}
    by_enter: dict[Any, Marker] = {}  # record_function's enter node -> its marker
    count = 0
    opened: list[Marker] = []  # every marker pushed, in order
    closed: set[Marker] = set()
    for node, action in nodes:
        if action is None:
            if node.op in ("placeholder", "output", "get_attr"):
                continue
            open_now = sorted((m for stack in stacks.values() for m in stack), key=lambda m: m.occurrence)
            if open_now:
                _attach(node, open_now)
            continue
        where = _where(node)
        if node.target is marker_op():
            _, form, message, domain, color = node.args
            key = ("nvtx", domain)
            if action == "push":
                if message is not None and not isinstance(message, str):
                    problems.append(Problem(_place(where), f"its message is not a str known when compiling ({message!r})"))
                    continue
                marker = Marker(domain, message, _color(color), form, count, where)
                count += 1
                stacks.setdefault(key, []).append(marker)
                opened.append(marker)
            else:
                stack = stacks.get(key)
                if not stack:
                    problems.append(Problem(
                        _place(where), f"a pop of {'the default NVTX domain' if domain is None else repr(domain)} with no "
                        "push before it in this graph (the push ran outside it, before a graph break)",
                    ))  # fmt: skip
                    continue
                closed.add(stack.pop())
        elif action == "push":
            name = node.args[0] if node.args else None
            if not isinstance(name, str):
                problems.append(Problem(_place(where), f"record_function's name is not a str known when compiling ({name!r})"))
                continue
            marker = Marker(None, name, None, RECORD_FUNCTION, count, where)
            count += 1
            by_enter[node] = marker
            stacks.setdefault(marker.stack_key, []).append(marker)
            opened.append(marker)
        else:
            marker = by_enter.get(node.args[0]) if node.args else None
            stack = stacks.get(("record_function", None), [])
            if marker is not None and marker in stack:
                stack.remove(marker)
                closed.add(marker)
    unclosed = [m for m in opened if m not in closed]
    for marker in unclosed:
        problems.append(Problem(
            marker.place, f"{describe(marker)} is pushed in this graph and not popped in it (the pop runs "
            "after a graph break, or never)",
        ))  # fmt: skip
    if unclosed:
        for node, _ in nodes:
            stack = node.meta.get("nn_module_stack")
            if stack:
                for marker in unclosed:
                    stack.pop(f"{MARKER_KEY}{marker.occurrence}", None)
    # Last first: a record_function exit node uses its enter node.
    for node, action in reversed(nodes):
        if action is not None:
            gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
    return Taken(tuple(m for m in opened if m in closed), tuple(problems))


def describe(marker: Marker) -> str:
    """`marker` as the user wrote it, for messages."""
    if marker.form == RECORD_FUNCTION:
        return f"record_function({marker.message!r})"
    api = "torch.cuda.nvtx.range_push" if marker.form == "torch.cuda.nvtx" else "nvtx.push_range/annotate"
    domain = "" if marker.domain is None else f" in domain {marker.domain!r}"
    return f"{api}({marker.message!r}){domain}"


def _color(text: str | None) -> int | None:
    """An nvtx colour (a name, or an int) as ARGB, as nvtx pushes it."""
    if text is None:
        return None
    value = color_value(text)
    try:
        from nvtx._lib.lib import color_to_hex

        return int(color_to_hex(value))
    except Exception:  # noqa: BLE001 - a colour nvtx cannot read: the range goes without one
        return value if isinstance(value, int) else None


def _attach(node: Any, markers: list[Marker]) -> None:
    stack = dict(node.meta.get("nn_module_stack") or {})
    for marker in markers:
        stack[f"{MARKER_KEY}{marker.occurrence}"] = (_encode(marker), MARKER_CLASS)
    node.meta["nn_module_stack"] = stack


def _encode(marker: Marker) -> str:
    where = list(marker.where) if marker.where else None
    return json.dumps([marker.form, marker.domain, marker.message, marker.color, marker.occurrence, where])


def is_marker_entry(key: Any) -> bool:
    return str(key).startswith(MARKER_KEY)


def split_markers(stack: dict[Any, Any]) -> tuple[dict[Any, Any], tuple[Marker, ...]]:
    """An ``nn_module_stack`` as (its module entries, the markers `take_markers` put in it, in push order)."""
    modules = {}
    markers = []
    for key, value in stack.items():
        if is_marker_entry(key):
            form, domain, message, color, occurrence, where = json.loads(value[0])
            markers.append(Marker(domain, message, color, form, occurrence, None if where is None else tuple(where)))
        else:
            modules[key] = value
    return modules, tuple(sorted(markers, key=lambda m: m.occurrence))
