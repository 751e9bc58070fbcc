"""ThunderFX (``thunder.dynamo.ThunderCompiler``): what torch.fx and dynamo
record that module attribution and the marker warning read.

Under ThunderFX, thunder interprets an FX ``GraphModule`` that dynamo built,
not the user's modules; the module calls come from the FX node being run.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

from ..core.calls import Chain, ModuleCall
from ..core.naming import class_name

__all__ = ["is_thunderfx_subgraph", "fx_node_calls", "marker_break"]


def is_thunderfx_subgraph() -> bool:
    """True while thunder compiles a subgraph that ThunderFX split out of a torch.compile graph.

    thunder 0.2.6: the compile data's ``fn`` is then a ``torch.fx.GraphModule``.
    Without it, the "selected nothing" check would run per subgraph.
    """
    from thunder.core.compile_data import get_compile_data

    cd = get_compile_data()
    fx = sys.modules.get("torch.fx")
    return cd is not None and fx is not None and isinstance(getattr(cd, "fn", None), fx.GraphModule)


def fx_node_calls(graph_module: Any, frame: Any) -> tuple[Chain, dict[str, str], frozenset[str]] | None:
    """Module calls of the FX node whose generated line is running, from ``meta["nn_module_stack"]``.

    torch 2.11: ``GraphModule._lineno_map`` maps a line of the generated
    ``forward``, counted from its ``def`` line, to the index of its node in
    ``graph.nodes`` (set by ``recompile()``), and dynamo stores ``nn_module_stack`` as an ordered dict
    of ``key -> (path, class)``, outermost first, where path is written like
    ``L['self'].transformer.h[0]`` or ``transformer.h.0``. thunder's
    ThunderFX splitter (0.2.6) copies node meta into the subgraphs it jits.
    Without it no op of a ThunderFX subgraph has a module.
    """
    positions = getattr(frame, "positions", None)
    lineno_map = getattr(graph_module, "_lineno_map", None)
    if positions is None or not lineno_map:
        return None
    index = lineno_map.get(positions.lineno - frame.code.co_firstlineno)
    if index is None:
        return None
    nodes = graph_module.__dict__.setdefault("_nvtx_regions_nodes", list(graph_module.graph.nodes))
    if index >= len(nodes):
        return None
    stack = nodes[index].meta.get("nn_module_stack") or {}
    classes = graph_module.__dict__.setdefault("_nvtx_regions_classes", {})
    chain = [ModuleCall("", type(graph_module).__name__, 0)]
    for key, value in stack.items():
        path, cls = value if isinstance(value, tuple) else (value, None)
        path = _fx_path(str(path))
        if not path:  # dynamo's entry for the root module itself
            continue
        name = class_name(cls) if getattr(cls, "__name__", None) else str(cls).rsplit(".", 1)[-1].strip("'>")
        classes[path] = name
        # FX keeps no call identity; one call number per (graph module, key) is the best there is.
        chain.append(ModuleCall(path, name, hash((id(graph_module), key)) & 0x7FFFFFFF))
    return tuple(chain), classes, _fx_static_inputs(graph_module, nodes)


def _fx_static_inputs(graph_module: Any, nodes: list) -> frozenset[str]:
    """The placeholders that dynamo marks as parameters or buffers of the compiled module.

    torch 2.11: dynamo (``inline_inbuilt_nn_modules``, the default) records a
    tensor's ``__dict__`` in the placeholder's ``meta["tensor_dict"]``, and
    marks every parameter and buffer there with ``_dynamo_static_input_type``;
    thunder's ThunderFX splitter (0.2.6) keeps the placeholder names as the
    trace's argument names. Without it, ThunderFX buffers (litgpt's rope
    ``cos``/``sin``) are not static and ops thunder hoists from them stretch
    ``each`` ranges.
    """
    found = graph_module.__dict__.get("_nvtx_regions_static")
    if found is None:
        found = graph_module.__dict__["_nvtx_regions_static"] = frozenset(
            node.name
            for node in nodes
            if node.op == "placeholder" and "_dynamo_static_input_type" in (node.meta.get("tensor_dict") or {})
        )
    return found


def _fx_path(path: str) -> str:
    """``L['self'].transformer.h[0].attn`` or ``L__self___transformer_h_0`` -> ``transformer.h.0.attn``."""
    path = re.sub(r"^L\['self'\]\.?", "", path)
    path = re.sub(r"^L\['[A-Za-z_0-9]+'\]\.?", "", path)
    path = re.sub(r"\[(\d+)\]", r".\1", path)
    path = re.sub(r"\['([^']*)'\]", r".\1", path)
    path = re.sub(r"_modules\.|\._modules", "", path)
    return path.strip(".")


# torch 2.11 dynamo's reason for a torch.cuda.nvtx call (it names the function, not its module).
_TORCH_NVTX_BREAK = re.compile(r"torch\.\* op returned non-Tensor[\s\S]*target: <function (range_push|range_pop|range|mark|range_start|range_end) at")


def marker_break(graph_module: Any, library_files: tuple[str, ...]) -> tuple[tuple[str, int], str] | None:
    """((filename, line), api) of the user's NVTX push at which torch.compile broke the graph
    it hands ThunderFX as `graph_module`; None if it broke elsewhere, or at a marker's pop.

    Checked on torch 2.11 and thunder 0.2.6. Dynamo cannot put a marker in
    its graph: ``range_push``/``range_pop`` return an int ("torch.* op
    returned non-Tensor"), and nvtx's ``push_range``/``pop_range`` are Cython
    functions it cannot trace. It breaks the graph there and runs the marker
    eagerly. Dynamo sets ``GraphModule.compile_subgraph_reason``
    (``graph_break``, ``reason``, ``user_stack``) on each graph it hands a
    backend. `library_files` are the directories of the marker APIs
    (`lookasides.library_files`). Without this, the only sign of such a
    break is a model that thunder compiles in pieces, or not at all.
    """
    reason = getattr(graph_module, "compile_subgraph_reason", None)
    if reason is None or not getattr(reason, "graph_break", False):
        return None
    stack = list(getattr(reason, "user_stack", None) or ())
    text = str(getattr(reason, "reason", ""))
    nvtx_dir = next((d for d in library_files if d.rstrip(os.sep).endswith(os.sep + "nvtx")), None)
    in_nvtx = nvtx_dir is not None and any(frame.filename.startswith(nvtx_dir) for frame in stack)
    in_torch_nvtx = bool(_TORCH_NVTX_BREAK.search(text)) or any(
        frame.filename.endswith(os.path.join("torch", "cuda", "nvtx.py")) for frame in stack
    )
    user = next((f for f in reversed(stack) if not f.filename.startswith(library_files)), None)
    if not (in_nvtx or in_torch_nvtx) or user is None:  # no user's line: the break inside nvtx's own wrapper
        return None
    # The pop's own break: the push's warning has said it all, once per marker.
    if "<function range_pop at" in text or any(f.name in ("pop_range", "__exit__") for f in stack if f is not user):
        return None
    return (user.filename, user.lineno), ("nvtx" if in_nvtx else "torch.cuda.nvtx")
