"""What the FX nodes Inductor compiles say about where they came from: the module calls Dynamo
recorded, in the user's module paths, the user's markers open around it (`compiled_markers`), and
whether a node computes anything from the graph's inputs.

Checked on torch 2.11 and 2.14 (`inductor_reaches.TESTED_TORCH`), with `inductor`'s docstring
on the metadata read here (``nn_module_stack``, ``fwd_nn_module_stack``).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

from ..core.markers import Marker
from ..core.naming import class_name
from .marker_nodes import is_marker_entry, split_markers

__all__ = ["Origin", "graph_module_stacks", "module_digest", "module_path", "module_paths", "called_module", "node_origin", "static_nodes"]


def module_digest(gm: Any) -> str:
    """A digest of the module stacks Dynamo recorded on `gm`'s nodes (paths and classes, in node order):
    what names the ranges, and what neither Inductor cache key covers."""
    import hashlib

    digest = hashlib.sha256()
    for node in gm.graph.nodes:
        stack = node.meta.get("nn_module_stack") or {}
        parts = [node.name]
        for value in stack.values():
            cls = value[1] if isinstance(value[1], str) else getattr(value[1], "__name__", str(value[1]))
            parts.append(f"{value[0]}:{cls}")
        digest.update("\0".join(parts).encode() + b"\n")
    return digest.hexdigest()[:24]


def graph_module_stacks(gm: Any) -> list[tuple[str, str]]:
    """(module call key, path relative to the compiled frame's root) of every module call Dynamo
    recorded on `gm`'s nodes (``nn_module_stack``, 2.11, 2.14), each once."""
    found: dict[tuple[str, str], None] = {}
    for node in gm.graph.nodes:
        for key, value in (node.meta.get("nn_module_stack") or {}).items():
            if not is_marker_entry(key) and not _is_wrapper(value[1]):
                found[(str(key), module_path(str(value[0])))] = None
    return list(found)


# The compiled frame's local or global that holds the root module, with the subscripts that pick it
# out of an argument (``L['args'][0]``: a ``forward`` that takes ``*args``, as transformers' decorated
# ones do; ``L['kwargs']['model']``).
_SOURCE_ROOT = re.compile(r"^[LG]\[['\"][^'\"]*['\"]\](?:\[[^\]]*\])*")
_ITEM = re.compile(r"\[['\"]?([^'\"\]]*)['\"]?\]")


def module_path(source: str) -> str:
    """A module's path as ``named_modules()`` gives it, from Dynamo's source name of it, whatever
    the compiled frame calls the root.

    ``L['self'].transformer.h.0`` -> ``transformer.h.0``; ``L['args'][0].model.layers.0`` ->
    ``model.layers.0``; ``L['self'].h[0]`` and ``L['self']._modules['h']['0']`` -> ``h.0``;
    ``L['self'].h.__dict__['_modules']['0']`` -> ``h.0`` (2.14, a module kept in a wrapper). A wrapper's
    attribute for what it wraps is left out (`_WRAPPED`). (2.11 and 2.14 write the first two forms.)
    """
    path = _SOURCE_ROOT.sub("", source)
    path = _ITEM.sub(lambda m: "." + m.group(1), path).replace("._modules.", ".")
    return _unwrapped(".".join(part for part in path.split(".") if part and part not in ("_modules", "__dict__")))


def module_paths(model: Any) -> dict[str, str]:
    """`model`'s module paths (`model_modules`, a shared module's first) by the module part of
    the key Dynamo records a module call under (`called_module`): the same path wherever Dynamo's
    compiled frame starts."""
    paths: dict[str, str] = {}
    for path, module in model_modules(model):
        paths.setdefault(str(id(module)), path)
    return paths


# Where a module that wraps another in place keeps it: torch.compile's OptimizedModule, and
# torch.distributed's activation checkpointing wrappers (`checkpoint_wrapper`,
# `apply_activation_checkpointing`, torchtitan's), ActivationWrapper (2.8, 2.11 and 2.14.1).
_WRAPPED = ("_orig_mod", "_checkpoint_wrapped_module")


def _unwrapped(path: str) -> str:
    return ".".join(part for part in path.split(".") if part not in _WRAPPED)


@functools.cache
def _wrappers() -> tuple[type, ...]:
    from torch._dynamo.eval_frame import OptimizedModule

    try:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import ActivationWrapper
    except ImportError:  # a torch built without torch.distributed
        return (OptimizedModule,)
    return (OptimizedModule, ActivationWrapper)


def _is_wrapper(cls: Any) -> bool:
    """Whether `cls`, a class Dynamo recorded a module call under (or its name), wraps a module in place
    (`_wrappers`): Dynamo records the wrapper's call and, inside it, the wrapped module's."""
    if isinstance(cls, str):
        names = {kind.__name__ for wrapper in _wrappers() for kind in (wrapper, *wrapper.__subclasses__())}
        return cls.rsplit(".", 1)[-1] in names
    return isinstance(cls, type) and issubclass(cls, _wrappers())


def model_modules(model: Any, *, every_path: bool = False) -> list[tuple[str, Any]]:
    """``model.named_modules()`` (`every_path`: a shared module under each of its paths, not only its
    first) as the model's author names them: a module that ``torch.compile`` or activation
    checkpointing wrapped in place (``layers[i] = torch.compile(layer)``, torchtitan's way;
    ``checkpoint_wrapper(layer)``) under its own path, not the wrapper's ``_orig_mod`` or
    ``_checkpoint_wrapped_module``, and the wrapper left out. Without it a module wrapped so would be
    named ``layers.0._orig_mod``, and its class would read ``OptimizedModule``; a model with
    activation checkpointing would not have the names of the same model without."""
    wrappers = _wrappers()
    named = model.named_modules(remove_duplicate=not every_path)
    return [(_unwrapped(path), module) for path, module in named if not isinstance(module, wrappers)]


def model_tensors(model: Any) -> list[tuple[str, Any]]:
    """``model``'s parameters and buffers by their names, as `model_modules` names their modules."""
    return [(_unwrapped(name), t) for name, t in (*model.named_parameters(), *model.named_buffers())]


def called_module(key: str) -> str:
    """The module part of a module call's key in ``nn_module_stack``: ``str(id(module))``, with
    ``@N`` after it for the module's N-th call in a frame (torch 2.8 to 2.14)."""
    return key.partition("@")[0]


@dataclass(frozen=True)
class Origin:
    """One FX node a kernel was generated from."""

    name: str  # the FX node's name
    op: str  # its aten op (``addmm``), or "" for a node that calls none
    # The module calls running when it was traced, outermost first: (call key, path, class name);
    # in a backward graph, those of the forward node it is the gradient of.
    modules: tuple[tuple[str, str, str], ...]
    # Computes nothing from what the graph is called with each step (`static_nodes`): a constant;
    # in a backward graph, anything that depends on no incoming gradient. Inductor may schedule
    # such a node anywhere (e.g. first), and dedupes constants across the graph.
    static: bool = False
    # The user's markers open around it when Dynamo traced it, in push order (`compiled_markers`);
    # in a backward graph, those of the forward node it is the gradient of.
    markers: tuple[Marker, ...] = ()


def static_nodes(graph: Any, phase: str) -> set[Any]:
    """The nodes of an FX graph that compute nothing from its inputs: in a forward, those that
    depend on no input (``full``, ``arange``, constants); in a backward, those that depend on
    no incoming gradient. AOTAutograd names a backward's gradient inputs ``tangents_<n>``
    (2.11, 2.14); the rest of its inputs are saved forward values."""
    static: set[Any] = set()
    for node in graph.nodes:
        if node.op == "placeholder":
            if phase == "backward" and not node.name.startswith("tangents"):
                static.add(node)
        elif all(arg in static for arg in node.all_input_nodes):
            static.add(node)
    return static


def node_origin(node: Any, phase: str, static: bool = False) -> Origin:
    meta = getattr(node, "meta", {}) or {}
    stack = None
    if phase == "backward":
        stack = meta.get("fwd_nn_module_stack")
    if not stack:
        # Forward; or a forward value recomputed in the backward (it keeps its own stack).
        stack = meta.get("nn_module_stack")
    modules = []
    stack, markers = split_markers(stack or {})
    for key, value in stack.items():
        source, cls = value[0], value[1]
        if _is_wrapper(cls):  # its module's call is the one recorded inside it
            continue
        modules.append((str(key), module_path(str(source)), class_name(cls).rsplit(".", 1)[-1]))
    target = getattr(node, "target", None)
    op = ""
    if getattr(node, "op", None) == "call_function":
        packet = getattr(target, "overloadpacket", None)
        op = getattr(packet, "__name__", None) or getattr(target, "__name__", "") or ""
    return Origin(str(getattr(node, "name", "")), op, tuple(modules), static, markers)
