"""The package's shape: sub-packages by layer, imports that run one way, no cycle.

Reads every import statement of ``nvtx_regions`` (module level and inside
functions, not those under ``if TYPE_CHECKING:``), so a lazy import that runs
the wrong way fails here as surely as a top-level one.
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
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
    # The engine every backend's view shares: nothing of thunder's (`attribution`) or anyone's internals.
    "selection": {"core", "language"},
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
    "get_compile_data", "_execution_engine", "_current_graph_task_id",
    "_lineno_map", "compile_subgraph_reason",
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


# -- every reach into torch's and thunder's private internals, listed --------

# Each private reach, as the code writes it (an import's dotted path, or an attribute chain from
# the name `torch` or `thunder`), and the module of nvtx_regions/internals/ where it lives: the
# versions it was checked on, from that module's docstrings. A path is private where a part after
# the first starts with `_`, or where it lies in one of thunder's internal modules.
TORCH_214 = "torch 2.11 and 2.14"
THUNDER = "thunder 0.2.6"
PRIVATE_ALLOWED: dict[tuple[str, str], str] = {
    ("torch._C._current_graph_task_id", "autograd"): TORCH_214,
    ("torch.autograd.Variable._execution_engine.queue_callback", "autograd"): TORCH_214,
    ("torch._C._current_autograd_node", "autograd"): "torch 2.8, 2.11 and 2.14.1",
    ("torch._guards.TracingContext", "compiled_markers"): TORCH_214,
    ("torch._dynamo.config", "compiled_markers"): TORCH_214,
    ("torch._C._dynamo.eval_frame._FrameAction", "dynamo"): "torch 2.8, 2.11 and 2.14.1",
    ("torch._C._dynamo.eval_frame._FrameExecStrategy", "dynamo"): "torch 2.8, 2.11 and 2.14.1",
    ("torch._C._dynamo.eval_frame.set_code_exec_strategy", "dynamo"): "torch 2.8, 2.11 and 2.14.1",
    ("torch._dynamo.symbolic_convert", "dynamo"): "torch 2.8, 2.11 and 2.14.1",
    ("torch._dynamo.symbolic_convert.InstructionTranslatorBase", "dynamo"): "torch 2.8, 2.11 and 2.14.1",
    ("torch._dynamo.assume_constant_result", "dynamo"): "torch 2.8, 2.11 and 2.14.1",
    ("torch._dynamo.callback.callback_handler", "dynamo"): "torch 2.8, 2.11 and 2.14.1",
    ("torch._dynamo.eval_frame.innermost_fn", "dynamo"): "torch 2.8, 2.11 and 2.14.1",
    ("torch._dynamo.convert_frame", "dynamo"): "torch 2.8, 2.11 and 2.14.1",
    ("torch._dynamo.config", "dynamo"): "torch 2.8, 2.11 and 2.14.1",
    ("torch._dynamo.variables.builder.SourcelessBuilder", "dynamo"): "torch 2.8, 2.11 and 2.14.1",
    ("torch._dynamo.eval_frame.OptimizedModule", "inductor_origins"): "torch 2.8, 2.11 and 2.14.1",
    ("torch.distributed.algorithms._checkpoint.checkpoint_wrapper.ActivationWrapper", "inductor_origins"): "torch 2.8, 2.11 and 2.14.1",
    ("torch._inductor.compile_fx.compile_fx", "inductor"): TORCH_214,
    ("torch._inductor.compile_fx.compile_fx_inner", "inductor"): TORCH_214,
    ("torch._inductor.config", "inductor"): TORCH_214,
    ("torch._inductor.list_mode_options", "inductor"): TORCH_214,
    ("torch._inductor.codegen.cpp.CppScheduling", "inductor"): TORCH_214,
    ("torch._inductor.codegen.wrapper", "inductor"): TORCH_214,
    ("torch._inductor.codegen.wrapper.PythonWrapperCodegen", "inductor"): TORCH_214,
    ("torch._inductor.codegen.wrapper.WrapperLine", "inductor"): TORCH_214,
    ("torch._inductor.custom_graph_pass.CustomGraphPass", "inductor"): TORCH_214,
    ("torch._inductor.scheduler.Scheduler", "inductor"): TORCH_214,
    ("torch._inductor.virtualized.V", "inductor"): TORCH_214,
    ("torch._C._nvtx.rangePushA", "lookasides"): "torch 2.11",
    ("torch._C._nvtx.rangePop", "lookasides"): "torch 2.11",
    ("thunder.core.interpreter.interpreter_needs_wrap", "lookasides"): THUNDER,
    ("thunder.core.interpreter.get_interpreterruntimectx", "lookasides"): THUNDER,
    ("thunder.core.jit_ext.get_jit_ctx", "lookasides"): THUNDER,
    ("torch.ops.profiler._record_function_enter_new", "marker_nodes"): TORCH_214,
    ("torch.ops.profiler._record_function_enter_new.default", "marker_nodes"): TORCH_214,
    ("torch.ops.profiler._record_function_exit", "marker_nodes"): TORCH_214,
    ("thunder.common.CompileData", "patches"): THUNDER,
    ("thunder.core.jit_ext._general_jit_lookaside_map", "patches"): THUNDER,
    ("torch.autograd._record_function_with_args_enter", "profiler"): "torch 2.8, 2.11 and 2.14.1",
    ("torch.autograd._record_function_with_args_exit", "profiler"): "torch 2.8, 2.11 and 2.14.1",
    ("torch._C._autograd._profiler_enabled", "profiler"): "torch 2.8, 2.11 and 2.14.1",
    ("thunder.core.interpreter.get_interpreterruntimectx", "recorder"): THUNDER,
    ("thunder.core.compile_data.get_compile_data", "thunderfx"): THUNDER,
}  # fmt: skip
# thunder's modules that are its machinery, not its Transform API: every path into them is private.
THUNDER_INTERNAL = ("thunder.core.jit_ext", "thunder.core.interpreter", "thunder.core.compile_data", "thunder.common")


def private_path(path: str) -> bool:
    parts = path.split(".")
    if parts[0] not in ("torch", "thunder"):
        return False
    if any(part.startswith("_") and not (part.startswith("__") and part.endswith("__")) for part in parts[1:]):
        return True
    return any(path == m or path.startswith(m + ".") for m in THUNDER_INTERNAL)


def _chain(node: ast.AST) -> str | None:
    """``a.b.c`` for an attribute chain on a plain name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def torch_thunder_reaches(path: Path) -> list[tuple[int, str]]:
    """(line, dotted path) of each private reach into torch or thunder in a module's source: an
    import of a private path, or the longest attribute chain from `torch`/`thunder` that is one."""
    tree = ast.parse(path.read_text(), filename=str(path))
    inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            chain = _chain(node)
            if chain is not None and private_path(chain):
                found.append((node.lineno, chain))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if private_path(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names if private_path(f"{node.module}.{a.name}")]
    return sorted(found)


def _where(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent))


def test_no_private_torch_or_thunder_reach_outside_internals():
    found = [
        f"{_where(path)}:{line}: {reach}"
        for name, path in modules().items()
        if layer(name) != "internals"
        for line, reach in torch_thunder_reaches(path)
    ]
    assert found == [], "private torch/thunder reaches outside nvtx_regions/internals/ (move each there, with the version checked)"


def test_every_private_reach_in_internals_is_allowed_and_every_allowed_one_is_used():
    used, unlisted = set(), []
    for name, path in modules().items():
        if layer(name) != "internals":
            continue
        short = name.rpartition(".")[2]
        for line, reach in torch_thunder_reaches(path):
            if (reach, short) in PRIVATE_ALLOWED:
                used.add((reach, short))
            else:
                unlisted.append(f"{_where(path)}:{line}: {reach}")
    assert unlisted == [], "private reaches missing from PRIVATE_ALLOWED (add each, with the version checked)"
    assert sorted(set(PRIVATE_ALLOWED) - used) == [], "PRIVATE_ALLOWED entries no longer used (remove them)"


def test_every_allowed_entry_names_a_module_and_versions():
    internals = {name.rpartition(".")[2] for name in modules() if layer(name) == "internals"}
    assert {module for _, module in PRIVATE_ALLOWED} <= internals
    assert all(versions.startswith(("torch 2.", "thunder 0.")) for versions in PRIVATE_ALLOWED.values())


def _resolve(path: str) -> object:
    """The object at dotted `path`, importing the longest module prefix."""
    import importlib

    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            found = getattr(found, part)
        return found
    raise ImportError(path)


def _missing_of(allowed, library: str) -> tuple[int, list[str]]:
    """How many reaches of `allowed` into `library` were checked, and those missing, with why."""
    checked, missing = 0, []
    for reach, _ in allowed:
        if reach.startswith(f"{library}."):
            checked += 1
            try:
                _resolve(reach)
            except (ImportError, AttributeError) as error:
                missing.append(f"{reach}: {error}")
    return checked, missing


def test_every_allowed_torch_reach_exists_in_the_installed_torch():
    missing_of = functools.partial(_missing_of, library="torch")
    checked, missing = missing_of(PRIVATE_ALLOWED)
    assert missing == []
    assert checked >= 25, f"only {checked} torch reaches checked"  # 31 when written
    # The positive control: the same check reports a reach the installed torch lacks, whether its
    # module or its attribute is missing.
    assert missing_of([("torch._C._no_such_reach", "x"), ("torch._no_such_module.f", "x"), ("torch._C._nn", "x")]) == (
        3, ["torch._C._no_such_reach: module 'torch._C' has no attribute '_no_such_reach'",
            "torch._no_such_module.f: module 'torch' has no attribute '_no_such_module'"],
    )  # fmt: skip


@pytest.mark.thunder
def test_every_allowed_thunder_reach_exists_in_the_installed_thunder():
    missing_of = functools.partial(_missing_of, library="thunder")
    checked, missing = missing_of(PRIVATE_ALLOWED)
    assert missing == []
    assert checked >= 5, f"only {checked} thunder reaches checked"  # 7 when written
    # The positive control: the same check reports a reach the installed thunder lacks.
    assert missing_of([("thunder.core.compile_data._no_such_reach", "x"), ("thunder.core.compile_data.get_compile_data", "x")]) == (
        2, ["thunder.core.compile_data._no_such_reach: module 'thunder.core.compile_data' has no attribute '_no_such_reach'"],
    )  # fmt: skip


def test_the_torch_thunder_reach_finder_finds_planted_reaches(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import torch, thunder\n"
        "import torch._dynamo\n"
        "from torch._inductor.codegen import wrapper\n"
        "from thunder.core.jit_ext import get_jit_ctx\n"
        "from thunder.core import interpreter\n"
        "from torch.autograd import _record_function_with_args_enter\n"
        "def f():\n"
        "    return torch._C._current_graph_task_id(), torch.ops.profiler._record_function_exit._RecordFunction\n"
        "x = thunder.core.compile_data.get_compile_data\n"
    )
    assert torch_thunder_reaches(planted) == [
        (2, "torch._dynamo"),
        (3, "torch._inductor.codegen.wrapper"),
        (4, "thunder.core.jit_ext.get_jit_ctx"),
        (5, "thunder.core.interpreter"),
        (6, "torch.autograd._record_function_with_args_enter"),
        (8, "torch._C._current_graph_task_id"),
        (8, "torch.ops.profiler._record_function_exit._RecordFunction"),
        (9, "thunder.core.compile_data.get_compile_data"),
    ]
    clean = tmp_path / "clean.py"
    clean.write_text(
        "import torch\nfrom thunder.core.trace import TraceCtx\nfrom torch.nn import Module\n"
        "def f(self):\n    return self._private, torch.nn.Module.__call__, TraceCtx.__dict__, torch.compiler.is_compiling\n"
    )
    assert torch_thunder_reaches(clean) == []


# -- size --------------------------------------------------------------------

MAX_LINES = 450


def test_no_module_is_over_450_lines():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"modules over {MAX_LINES} lines (split them by concern)"


def test_one_module_hook_front_end():
    """Module calls get their ranges from one front end (`runtime.module_ranges`, issue 43): only it
    registers the hooks that push and pop them (`register_hooks`), for eager and for Inductor's calls
    outside its graphs. Other registrations: eager's root pre-hook (recovery) and the watch on an
    Inductor model's first call, which push nothing."""
    calls: dict[str, int] = {}
    for name, path in modules().items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if called in ("register_hooks", "register_forward_pre_hook", "register_forward_hook"):
                    calls[f"{name}.{called}"] = calls.get(f"{name}.{called}", 0) + 1
    assert calls == {
        "nvtx_regions.runtime.module_ranges.register_hooks": 1,
        "nvtx_regions.internals.module_hooks.register_forward_pre_hook": 1,
        "nvtx_regions.internals.module_hooks.register_forward_hook": 1,
        "nvtx_regions.emission.eager.register_forward_pre_hook": 1,
        "nvtx_regions.inductor.outside.register_forward_hook": 1,
    }


# -- the Inductor wing's process-wide state lives in one module, each entry named in its doc ------

_STATE_VALUES = ("set(", "dict(", "{", "[", "weakref.", "threading.local(")


def module_state(folder: Path) -> set[str]:
    """``module.name`` for each module global of `folder`'s modules that holds mutable state: a name
    (not a dunder) bound at module level to a set, dict, list, weak container or thread-local."""
    found = set()
    for path in sorted(folder.glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            value = getattr(node, "value", None)
            if value is None or not ast.unparse(value).startswith(_STATE_VALUES):
                continue
            found |= {f"{path.stem}.{t.id}" for t in targets if isinstance(t, ast.Name) and not t.id.startswith("__")}
    return found


def test_the_inductor_wings_process_wide_state_is_all_in_its_state_module_and_named_in_its_doc():
    found = module_state(PACKAGE / "inductor")
    assert len(found) >= 9, found  # the finder sees the registries it must
    elsewhere = {name for name in found if not name.startswith("state.")}
    assert not elsewhere, f"process-wide state outside inductor/state.py: {sorted(elsewhere)}"
    doc = (PACKAGE / "inductor" / "state.py").read_text(encoding="utf-8")
    named = {f"state.{name}" for name in re.findall(r"^- `(\w+)`:", doc, re.MULTILINE)}
    assert found == named, f"named in inductor/state.py's doc but not found: {named - found}; found but not named: {found - named}"


def test_the_state_finder_finds_a_planted_registry(tmp_path):
    (tmp_path / "planted.py").write_text("_seen: set[str] = set()\n_cache = {}\n_MAX = 3\nPUBLIC = []\n__all__ = []\n", encoding="utf-8")
    assert module_state(tmp_path) == {"planted._seen", "planted._cache", "planted.PUBLIC"}
