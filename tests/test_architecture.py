"""The package's shape: sub-packages by layer, imports that run one way, no cycle.

Reads every import statement of ``nvtx_regions`` (module level and inside
functions, not those under ``if TYPE_CHECKING:``), so a lazy import that runs
the wrong way fails here as surely as a top-level one.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from support.environment import THUNDER_INSTALLED

PACKAGE = Path(__file__).resolve().parents[1] / "nvtx_regions"

# What each sub-package may import from the others. `core` is the leaf;
# `capture` is independent of thunder and the language; `commands` is the top.
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "internals": {"core"},
    "language": {"core"},
    "attribution": {"core", "internals"},
    "selection": {"core", "language", "attribution", "internals"},
    "runtime": {"core", "internals", "selection"},
    "emission": {"core", "language", "attribution", "selection", "internals", "runtime"},
    "capture": {"core"},
    "inductor": {"core", "internals", "language", "attribution", "selection", "emission", "runtime"},
    "report": {"core", "language", "attribution", "selection", "emission", "capture", "internals", "inductor", "runtime"},
    "commands": {"core", "language", "attribution", "selection", "emission", "capture", "report", "internals", "inductor", "runtime"},
    "testing": {"core", "capture"},
}
# The public entry points at the top of the package may import anything.
FACADES = {"nvtx_regions", "nvtx_regions.__main__", "nvtx_regions.eager", "nvtx_regions.compare", "nvtx_regions.backends"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {
        module_name(path): path
        for path in sorted(PACKAGE.rglob("*.py"))
        if "_explain_site" not in path.parts and "__pycache__" not in path.parts
    }


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The nvtx_regions modules that `name` imports at run time."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def resolve(target: str) -> str | None:
        while target and target not in known:
            target = target.rpartition(".")[0]
        return target or None

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("nvtx_regions"):
                    found.add(resolve(alias.name))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("nvtx_regions"):
                for alias in node.names:
                    full = f"{target}.{alias.name}"
                    found.add(full if full in known else resolve(target))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(None)
    found.discard(name)
    return found


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports_of(name, path, set(found)) for name, path in found.items()}


def layer(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ALLOWED else None


def test_every_module_sits_in_a_layer_or_is_a_public_entry_point():
    stray = [name for name in modules() if layer(name) is None and name not in FACADES]
    assert stray == [], f"modules outside the layered sub-packages: {stray}"


def test_imports_run_down_the_layers():
    wrong = []
    for name, targets in graph().items():
        mine = layer(name)
        if mine is None:
            continue
        for target in targets:
            theirs = layer(target)
            if theirs is None:
                wrong.append(f"{name} imports the facade {target}")
            elif theirs != mine and theirs not in ALLOWED[mine]:
                wrong.append(f"{name} ({mine}) imports {target} ({theirs})")
    assert wrong == []


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_import_cycle_between_modules():
    # A package's __init__ importing its own modules is not a cycle of concerns.
    edges = {name: {t for t in targets if not name.startswith(t + ".")} for name, targets in graph().items()}
    assert _cycle(edges) is None


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_import_reader_sees_lazy_imports_and_skips_type_checking(tmp_path):
    source = tmp_path / "nvtx_regions" / "core" / "x.py"
    source.parent.mkdir(parents=True)
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ..emission import transform\n"
        "def f():\n    from ..selection.plan import make_plan\n"
    )
    known = {"nvtx_regions.core.x", "nvtx_regions.selection.plan", "nvtx_regions.emission.transform", "nvtx_regions.selection"}
    assert imports_of("nvtx_regions.core.x", source, known) == {"nvtx_regions.selection.plan"}


# The only modules that import thunder when they are loaded: the thunder backend's transform and
# its trace rewrite. Everything else imports without thunder, an optional dependency.
THUNDER_MODULES = {"nvtx_regions.emission.transform", "nvtx_regions.emission.rewrite"}


def imports_thunder_when_loaded(path: Path) -> bool:
    """Whether a module's top level (not its functions) imports thunder or calls `require_thunder`."""
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "thunder" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "thunder":
            return True
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) == "require_thunder":
            return True
    return False


def loadable_here(name: str) -> bool:
    return THUNDER_INSTALLED or name not in THUNDER_MODULES


def test_only_the_thunder_backend_imports_thunder_when_loaded():
    assert {name for name, path in modules().items() if imports_thunder_when_loaded(path)} == THUNDER_MODULES


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_sub_package_imports_on_its_own(package):
    # A fresh interpreter per sub-package: an import cycle shows up as an ImportError
    # only when the cycle is entered from the right module.
    names = sorted(name for name in modules() if layer(name) == package and loadable_here(name))
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
    result = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def test_light_layers_do_not_import_thunder_or_torch():
    code = (
        "import sys\n"
        "import nvtx_regions, nvtx_regions.language.parse, nvtx_regions.selection.compile, nvtx_regions.capture.chrome\n"
        "from nvtx_regions import compile, steps, NvtxInductor, annotate, explain, Explanation\n"
        "print(sorted(m for m in ('thunder', 'torch', 'matplotlib') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def _all_visitors() -> list[type]:
    import importlib

    from nvtx_regions.language.tree import Visitor

    for name in modules():
        if layer(name) not in (None, "commands", "testing") and loadable_here(name):
            importlib.import_module(name)
    found, todo = [], [Visitor]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__module__.startswith("nvtx_regions."):
                found.append(sub)
            todo.append(sub)
    return found


def test_every_pass_over_the_tree_handles_every_node_type():
    visitors = _all_visitors()
    assert len(visitors) >= 2  # at least render and the child walk
    gaps = {f"{v.__module__}.{v.__qualname__}": v.missing() for v in visitors if v.missing()}
    assert gaps == {}


def test_a_pass_missing_a_node_type_is_reported():
    from nvtx_regions.language.tree import EXPR_TYPES, Visitor

    class Partial(Visitor):
        handles = EXPR_TYPES

        def visit_OpIn(self, node):
            return "op"

    assert "Reads" in Partial.missing() and "OpIn" not in Partial.missing()
    with pytest.raises(TypeError, match="no visit_Reads"):
        from nvtx_regions.language.tree import Reads

        Partial().visit(Reads(("x",)))


# -- private reaches stay in nvtx_regions.internals ----------------------------

# What nvtx_regions.internals reaches for (attribute, keyword and imported names):
# frame walks, referrer searches, thunder's interpreter and JIT state, private
# torch and nvtx functions, torch.fx and dynamo records.
PRIVATE_NAMES = frozenset({
    "_getframe", "get_referrers", "f_back", "f_locals", "_lib", "jit_ext", "_call_ctx", "_C", "_nvtx",
    "_dynamo", "_inductor", "_functorch", "_general_jit_lookaside_map", "interpreter_needs_wrap",
    "get_interpreterruntimectx", "frame_stack", "localsplus", "get_jit_ctx", "_computation_trace",
    "get_compile_data", "_execution_engine", "_current_graph_task_id", "_current_autograd_node",
    "_is_full_backward_hook", "_lineno_map", "compile_subgraph_reason",
})  # fmt: skip
# Modules whose every use is a reach (besides any dotted path with a private part).
PRIVATE_MODULES = ("thunder.core.jit_ext", "thunder.core.interpreter", "thunder.core.compile_data")
FOREIGN = ("thunder", "torch", "nvtx")


def _private_module(name: str) -> bool:
    parts = name.split(".")
    if parts[0] not in FOREIGN:
        return False
    return any(part.startswith("_") or part in PRIVATE_NAMES for part in parts[1:]) or any(
        name == m or name.startswith(m + ".") for m in PRIVATE_MODULES
    )


def private_reaches(path: Path) -> list[str]:
    """``line: what`` for each private reach in a module's source (attribute, keyword and import names)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in PRIVATE_NAMES:
            found.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.keyword) and node.arg in PRIVATE_NAMES:
            found.append(f"{node.value.lineno}: {node.arg}=")
        elif isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if _private_module(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            foreign = node.module.split(".")[0] in FOREIGN
            for alias in node.names:
                if (
                    _private_module(node.module)
                    or alias.name in PRIVATE_NAMES
                    or (foreign and alias.name.startswith("_") and not alias.name.startswith("__"))
                    or _private_module(f"{node.module}.{alias.name}")
                ):
                    found.append(f"{node.lineno}: from {node.module} import {alias.name}")
    return found


def test_private_reaches_only_in_internals():
    reaches = {
        name: found
        for name, path in modules().items()
        if layer(name) != "internals" and (found := private_reaches(path))
    }
    assert reaches == {}, "private reaches outside nvtx_regions/internals/ (move them there, with the version checked)"


def test_the_private_reach_finder_finds_planted_reaches(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import sys, gc, torch\n"
        "import torch._dynamo\n"
        "from nvtx._lib.lib import push_range\n"
        "from torch.autograd.function import _SingleLevelFunction\n"
        "from thunder.core.jit_ext import get_jit_ctx\n"
        "from thunder.core import interpreter\n"
        "from sys import _getframe\n"
        "def f(symbol):\n"
        "    frame = sys._getframe(1)\n"
        "    gc.get_referrers(frame)\n"
        "    torch._C._current_graph_task_id()\n"
        "    return BoundSymbol(symbol, _call_ctx={})\n"
    )
    found = private_reaches(planted)
    assert sorted(int(line.split(":")[0]) for line in found) == [2, 3, 4, 5, 6, 7, 9, 10, 11, 11, 12], found
    clean = tmp_path / "clean.py"
    clean.write_text(
        "import sys, torch\nfrom thunder.core.trace import TraceCtx\nfrom ..internals.frames import caller_line\n"
        "def f(self):\n    return self._private, torch.nn.Module, sys.modules, TraceCtx.__dict__\n"
    )
    assert private_reaches(clean) == []


# -- size --------------------------------------------------------------------

MAX_LINES = 450


def test_no_module_is_over_450_lines():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"modules over {MAX_LINES} lines (split them by concern)"
