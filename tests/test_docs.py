"""The docs cannot rot: README's and docs/'s commands and examples run, the outputs they show are
real, the language reference covers the grammar (and only the grammar), and the CLI reference is
what the parsers print.

A fenced block runs when an HTML comment before it says how:

- ``<!-- test: run -->`` (python): the examples of one page run in order, in one namespace, as a
  reader following the page would run them. Every page runs in one child process (thunder is
  imported once), each page in a fresh namespace; a page fails on an exception or on an
  `NvtxRegionsWarning` it does not catch itself.
- ``<!-- test: torchrun -->`` (python): the block is a script, run under torchrun on 2 CPU ranks.
- ``<!-- test: command -->`` (bash): each ``.venv/bin/...`` part of the command line runs.
- ``<!-- test: specs -->`` (text): each line is a spec; on the model of README's first example
  (the quickstart's), run once, every rule of it must select something (`explain`).
- ``<!-- test: file PATH -->`` (text): the lines of PATH, its comments and blank lines left out.
- ``<!-- test: quickstart output -->``, ``print_ranges excerpt``, ``trace excerpt``: output
  shown on a page, compared with a real run.

``python tests/test_docs.py --write`` regenerates docs/reference/cli.md and the table of
docs/reference/backends.md (from `selection.support`), and refreshes the trace excerpt in
docs/reference/api.md from a real run.
"""

from __future__ import annotations

import ast
import functools
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import lark
import pytest

from support.environment import THUNDER_INSTALLED
from nvtx_regions import parse, render
from nvtx_regions.language import tree as T
from nvtx_regions.language.grammar import grammar_text, syntax

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
LANGUAGE = DOCS / "reference" / "language.md"
API = DOCS / "reference" / "api.md"
CLI = DOCS / "reference" / "cli.md"
BACKENDS_PAGE = DOCS / "reference" / "backends.md"
# Pages whose examples the tests of their own features run (tests/test_profile*.py, the Inductor tests).
OTHERS_RUN = {DOCS / "profile.md", DOCS / "inductor.md"}
MARKED = re.compile(r"<!-- test: (?P<marker>[^>]*?) -->\n```(?P<lang>\w*)\n(?P<body>.*?)```", re.S)
# Code that needs lightning-thunder (an optional dependency), and the example scripts that import it.
NEEDS_THUNDER = re.compile(r"^\s*(import thunder|from thunder\b)|\bNvtxProfileTransform\b", re.M)
THUNDER_EXAMPLES = {"quickstart.py", "print_ranges.py", "compare_eager_thunder.py"}


def pages() -> list[Path]:
    """README and every page of docs/ whose examples this file runs."""
    return [README, *sorted(p for p in DOCS.rglob("*.md") if p not in OTHERS_RUN)]


def name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


@functools.lru_cache(maxsize=None)
def text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def blocks(marker: str, page: Path | None = None) -> list[tuple[Path, int, str]]:
    """(page, line of the block's first line, body) of each block marked ``<!-- test: marker -->``."""
    found = []
    for p in [page] if page else pages():
        for m in MARKED.finditer(text(p)):
            if m["marker"] == marker:
                found.append((p, text(p).count("\n", 0, m.start("body")) + 1, m["body"]))
    return found


def needs_thunder(code: str) -> bool:
    return bool(NEEDS_THUNDER.search(code))


def thunder_if(needed: bool, value):
    """`value` as a test parameter, marked `thunder` when it needs thunder."""
    return pytest.param(value, marks=pytest.mark.thunder) if needed else value


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600, **kwargs)


# ------------------------------------------------------------------ the quickstart and the commands


def test_quickstart_is_two_commands_and_ci_runs_them_verbatim():
    quickstart = text(README).split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)```", quickstart, flags=re.S)
    assert len(commands) == 2
    install, test = (c.strip() for c in commands)
    assert "pip install" in install and install.endswith("examples/quickstart.py")
    assert test == ".venv/bin/python -m pytest"
    ci = (ROOT / ".ci/run").read_text()
    assert install in ci.splitlines() and test in ci.splitlines()
    assert "set -euo pipefail" in ci


def command_argvs(command: str) -> list[list[str]]:
    """The ``.venv/bin/python`` and ``.venv/bin/nvtx-regions`` parts of a shell command line (not the
    set-up before them), as argvs for this interpreter."""
    from readme_before_gpu import argv_of

    parts = [p.strip() for p in command.replace("\\\n", " ").strip().split("&&")]
    return [argv_of(p, "timeline.json") for p in parts if p.split()[0] in (".venv/bin/python", ".venv/bin/nvtx-regions")]


@functools.lru_cache(maxsize=None)
def command_result(argv: tuple[str, ...]) -> subprocess.CompletedProcess:
    """One run of each distinct command, however many pages show it."""
    return run(list(argv))


def all_command_argvs() -> list[tuple[str, ...]]:
    """Each distinct command of the `command` blocks, except those tests/test_readme_before_gpu.py runs."""
    from readme_before_gpu import COMMANDS

    seen: dict[tuple[str, ...], None] = {}
    for _, _, body in blocks("command"):
        if body.strip() in COMMANDS.values():
            continue
        for argv in command_argvs(body):
            seen[tuple(argv)] = None
    return list(seen)


def command_needs_thunder(argv: tuple[str, ...]) -> bool:
    return any(Path(word).name in THUNDER_EXAMPLES for word in argv)


def test_the_examples_that_need_thunder_are_known():
    found = {path.name for path in (ROOT / "examples").glob("*.py") if needs_thunder(path.read_text(encoding="utf-8"))}
    # print_ranges.py needs it through quickstart.py, which it runs.
    assert found | {"print_ranges.py"} == THUNDER_EXAMPLES


@pytest.mark.parametrize(
    "argv", [thunder_if(command_needs_thunder(a), a) for a in all_command_argvs()],
    ids=lambda argv: " ".join(Path(a).name for a in argv[1:4]),
)
def test_commands_run(argv):
    result = command_result(argv)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.thunder
def test_quickstart_output_is_real():
    ((_, _, expected),) = blocks("quickstart output")
    (argv,) = [a for a in all_command_argvs() if a[-1].endswith("quickstart.py")]
    out = command_result(argv).stdout
    assert out[out.index("===== ranges per rule") :].strip() == expected.strip()


@pytest.mark.thunder
def test_print_ranges_excerpt_is_the_real_output():
    ((_, _, block),) = blocks("print_ranges excerpt")
    shown = block.splitlines()
    assert shown[-1] == "..."  # marked as the first lines only
    (argv,) = [a for a in all_command_argvs() if a[-1].endswith("print_ranges.py")]
    real = command_result(argv).stdout.splitlines()[: len(shown) - 1]

    def masked(lines: list[str]) -> list[str]:
        return [re.sub(r"^pid \d+, thread \d+,", "pid <pid>, thread <pid>,", line) for line in lines]

    assert masked(shown[:-1]) == masked(real)


def test_spec_excerpts_are_the_files():
    shown = [(page, m["marker"][len("file ") :], m["body"]) for page in pages() for m in MARKED.finditer(text(page)) if m["marker"].startswith("file ")]
    assert shown
    for page, path, body in shown:
        lines = [line.rstrip() for line in (ROOT / path).read_text(encoding="utf-8").splitlines()]
        assert body.splitlines() == [line for line in lines if line and not line.lstrip().startswith("#")], (name(page), path)


# ------------------------------------------------------------------ the Python examples, one child process

RUNNER = r"""
import contextlib, io, json, sys, traceback, warnings

from nvtx_regions.testing import attach
attach()  # before any NVTX call, so that pages can capture

todo = json.load(open(sys.argv[1]))
checks = {}
if todo["thunder"]:
    import thunder
    checks["thunder.dynamo after import thunder"] = "thunder.dynamo" in sys.modules or hasattr(thunder, "dynamo")

results, namespaces = {}, {}
for page, page_blocks in todo["pages"].items():
    out, error, namespace = io.StringIO(), None, {"__name__": "__main__"}
    namespaces[page] = namespace
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with contextlib.redirect_stdout(out):
            try:
                for line, code in page_blocks:
                    exec(compile("\n" * (line - 1) + code, page, "exec"), namespace)
            except BaseException:
                error = traceback.format_exc()
    ours = [f"{w.filename}:{w.lineno}: {w.message}" for w in caught if w.category.__name__ == "NvtxRegionsWarning"]
    results[page] = {"stdout": out.getvalue(), "error": error, "warnings": ours}

specs = {}
if todo["specs"]:
    from nvtx_regions import explain

    jitted = namespaces["README.md"]["jitted"]  # README's first example: the quickstart's model, run once
    for spec in todo["specs"]:
        try:
            found = explain(jitted, spec)
            specs[spec] = {"unselected": {str(k): v for k, v in found.reasons.items()}, "error": None}
        except Exception:
            specs[spec] = {"unselected": {}, "error": traceback.format_exc()}
json.dump({"pages": results, "specs": specs, "checks": checks}, open(sys.argv[2], "w"))
"""


def spec_lines() -> list[str]:
    return [line for _, _, body in blocks("specs") for line in body.splitlines() if line.strip()]


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


@pytest.fixture(scope="module")
def torchrun_examples(tmp_path_factory) -> Iterator[list[tuple[subprocess.Popen, Path]]]:
    """Each `torchrun` block started on 2 CPU ranks, with each rank's stdout in a file of its own
    (on one stream they interleave); started before `session` so that the two overlap. Without
    thunder, the blocks that need it are not started (their tests are deselected)."""
    started = []
    for index, (_, _, body) in enumerate(blocks("torchrun")):
        if needs_thunder(body) and not THUNDER_INSTALLED:
            started.append((None, None))
            continue
        tmp = tmp_path_factory.mktemp(f"torchrun{index}")
        (tmp / "example.py").write_text(body, encoding="utf-8")
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "--log-dir", str(tmp / "logs"), "--redirects", "1", str(tmp / "example.py")]
        with open(tmp / "stderr", "w") as stderr:  # a file, not a pipe: nobody reads it while the session runs
            started.append((subprocess.Popen(argv, cwd=ROOT, env=child_env(), stdout=subprocess.DEVNULL, stderr=stderr), tmp))
    yield started
    for process, _ in started:
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def session(tmp_path_factory, torchrun_examples) -> dict:
    """Every page's `run` examples and every `specs` line, run in one child process; without thunder,
    the pages whose examples need none (the others' tests are deselected). Minutes on a CPU: the
    tests that read it are in the slow tier."""
    tmp = tmp_path_factory.mktemp("docs")
    todo = {"pages": {}, "specs": spec_lines() if THUNDER_INSTALLED else [], "thunder": THUNDER_INSTALLED}
    # api.md first: the printed trace it shows names its ranges by how many transforms the process made.
    for page, line, body in sorted(blocks("run"), key=lambda b: b[0] != API):
        if THUNDER_INSTALLED or not page_needs_thunder(name(page)):
            todo["pages"].setdefault(name(page), []).append((line, body))
    (tmp / "todo.json").write_text(json.dumps(todo), encoding="utf-8")
    result = run([sys.executable, "-c", RUNNER, str(tmp / "todo.json"), str(tmp / "done.json")], env=child_env())
    assert result.returncode == 0, result.stderr[-5000:]
    return json.loads((tmp / "done.json").read_text(encoding="utf-8"))


def pages_with_examples() -> list[str]:
    return sorted({name(page) for page, _, _ in blocks("run")})


def page_needs_thunder(page: str) -> bool:
    return any(needs_thunder(body) for p, _, body in blocks("run") if name(p) == page)


@pytest.mark.slow
@pytest.mark.parametrize("page", [thunder_if(page_needs_thunder(p), p) for p in pages_with_examples()])
def test_page_examples_run(session, page):
    result = session["pages"][page]
    assert result["error"] is None, result["error"]
    assert result["warnings"] == [], "an example gives a warning it does not expect"


@pytest.mark.slow
@pytest.mark.thunder
def test_specs_select_something_on_the_quickstart_model(session, tmp_path):
    def failed(results: dict) -> dict:
        return {spec: r for spec, r in results.items() if r["error"] or r["unselected"]}

    assert len(spec_lines()) >= 5
    # The child reported on every spec line of the docs: none left out, no empty report.
    assert sorted(session["specs"]) == sorted(set(spec_lines()))
    assert failed(session["specs"]) == {}
    # The positive control: the same runner on README's model (its block that makes `jitted`),
    # given a spec of the docs, one that selects nothing and one that does not parse: the same
    # check flags the last two, and only them.
    (made,) = [(line, body) for _, line, body in blocks("run", README) if "jitted =" in body]
    good, nothing, broken = spec_lines()[0], "each module <transformer.h.9>", "each module <transformer.h.*"
    todo = {"pages": {"README.md": [made]}, "specs": [good, nothing, broken], "thunder": True}
    (tmp_path / "todo.json").write_text(json.dumps(todo), encoding="utf-8")
    result = run([sys.executable, "-c", RUNNER, str(tmp_path / "todo.json"), str(tmp_path / "done.json")], env=child_env())
    assert result.returncode == 0, result.stderr[-5000:]
    control = json.loads((tmp_path / "done.json").read_text(encoding="utf-8"))["specs"]
    assert sorted(failed(control)) == sorted([nothing, broken]), control
    assert "transformer.h.9" in str(control[nothing]["unselected"]) and control[broken]["error"], control


def test_readme_shows_five_specs():
    assert len([line for _, _, body in blocks("specs", README) for line in body.splitlines() if line.strip()]) == 5


@pytest.mark.slow
@pytest.mark.thunder
def test_thunderfx_page_imports_thunder_dynamo(session):
    # The page says a plain `import thunder` does not import thunder.dynamo: true of thunder 0.2.6.
    assert session["checks"]["thunder.dynamo after import thunder"] is False
    (code,) = [body for page, _, body in blocks("run") if page.name == "thunderfx-ddp-fsdp.md" and "ThunderCompiler" in body]
    imports = [a.name for node in ast.walk(ast.parse(code)) if isinstance(node, ast.Import) for a in node.names]
    assert "thunder.dynamo" in imports


@pytest.mark.slow
@pytest.mark.parametrize("index", [thunder_if(needs_thunder(body), i) for i, (_, _, body) in enumerate(blocks("torchrun"))])
def test_torchrun_examples_run(torchrun_examples, session, index):
    page, line, _ = blocks("torchrun")[index]
    process, tmp = torchrun_examples[index]
    process.wait(timeout=600)
    assert process.returncode == 0, f"{name(page)}:{line}\n{(tmp / 'stderr').read_text()[-3000:]}"
    outs = sorted(path.read_text() for path in (tmp / "logs").rglob("stdout.log"))
    # torch 2.8's gloo prints its own "[Gloo] Rank 0 is connected ..." lines to stdout.
    printed = [[line.split()[0] for line in out.splitlines() if not line.startswith("[Gloo]")] for out in outs]
    assert printed == [["0", "0"], ["1", "1"]], outs


# ------------------------------------------------------------------ the trace excerpt


def trace_excerpt(stdout: str) -> str:
    """The excerpt of the printed forward trace api.md shows: its code from the function's first line
    to the line after the first pop (thunder's blank lines and comments left out)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("def computation("))
    code = [line for line in lines[start + 1 :] if line.strip() and not line.lstrip().startswith("#")]
    first_pop = next(i for i, line in enumerate(code) if "pop" in line.split("#")[0])
    return "\n".join(code[: first_pop + 2])


@pytest.mark.slow
@pytest.mark.thunder
def test_trace_excerpt_is_the_real_trace(session):
    ((_, _, shown),) = blocks("trace excerpt", API)
    real = session["pages"][name(API)]["stdout"]
    assert shown.strip("\n") == trace_excerpt(real), "the trace changed: run `python tests/test_docs.py --write`"


# ------------------------------------------------------------------ the language reference


def reference_examples() -> list[str]:
    rows = [line for line in text(LANGUAGE).splitlines() if line.startswith("| `")]
    return [re.findall(r"`([^`]*)`", row.split("|")[2])[0] for row in rows]


# Grammar alternatives (their lark aliases) and the tree node that proves an example uses them.
ALIAS_NODES = {
    "op_in": T.OpIn, "reads": T.Reads, "between": T.Between, "forward": T.Forward, "backward": T.Backward,
    "backward_of": T.BackwardOf, "all": T.All, "rank_in": T.RankIn, "steps": T.Steps, "proxy": T.Proxy,
    "first": T.First, "last": T.Last, "not_expr": T.Not, "or_expr": T.Or, "and_expr": T.And, "label": "label",
    "module_in": T.ModuleIn, "class_in": T.ClassIn, "each_module": T.EachModule, "each_class": T.EachClass,
    "source": T.Source, "marker_in": T.MarkerIn, "each_marker": T.EachMarker,
}  # fmt: skip


def nodes(spec: T.Spec) -> set:
    found = set()
    for rule in spec.rules:
        if rule.label is not None:
            found.add("label")
        for node in T.walk(rule.expr):
            found.add(type(node))
            if isinstance(node, T.Between):
                found.update(type(p) for p in (node.start, node.end))
    return found


def test_language_reference_covers_every_grammar_construct():
    grammar = lark.Lark(grammar_text(), parser="lalr")
    aliases = {str(rule.alias or rule.origin.name) for rule in grammar.rules}
    constructs = {a for a in aliases if not a.startswith(("_", "__")) and a not in {"start", "rule", "expr", "atom", "filter", "endpoint", "pattern"}}
    assert constructs == set(ALIAS_NODES), "grammar changed: update ALIAS_NODES and docs/reference/language.md"
    found = set()
    for example in reference_examples():
        spec = parse(example)  # every example in the table parses
        assert parse(render(spec)) == spec
        found |= nodes(spec)
    missing = [alias for alias, node in ALIAS_NODES.items() if node not in found]
    assert not missing, f"docs/reference/language.md has no example of {missing}"
    assert {k for k in syntax().keywords if f"`{k}" not in text(LANGUAGE) and f" {k} " not in text(LANGUAGE)} == set()


def test_language_reference_starts_with_the_rules():
    headings = re.findall(r"^## (.*)$", text(LANGUAGE), flags=re.M)
    assert headings[0] == "Rules" and headings[-1] == "Input"
    before_input = text(LANGUAGE).split("\n## Input", 1)[0]
    assert "NUL" not in before_input and "surrogate" not in before_input and "byte order mark" not in before_input


def test_cli_check_reports_errors_with_location(tmp_path):
    bad = tmp_path / "bad.nvtx"
    bad.write_text("ok: all\nop in <linear\n", encoding="utf-8")
    result = run([sys.executable, "-m", "nvtx_regions", "check", str(bad)])
    assert result.returncode == 2  # a spec error (commands.status)
    assert result.stderr.startswith(f'{bad}:2:14: expected "," or ">" to close the "<" list, got end of input')
    good = run([sys.executable, "-m", "nvtx_regions", "check", "examples/regions.nvtx"])
    assert good.returncode == 0 and "examples/regions.nvtx:7: embed: op in <embedding>" in good.stdout


# ------------------------------------------------------------------ the CLI reference, generated

HELP_COLUMNS = "80"  # argparse wraps help at $COLUMNS


def render_cli_reference(helps: dict[str, str]) -> str:
    """docs/reference/cli.md from each command's ``--help`` text (``nvtx-regions`` first)."""
    out = [
        "# Command-line reference",
        "",
        "`nvtx-regions` (also `python -m nvtx_regions`) and each of its commands, as their `--help`",
        "prints them. NVTX's default domain is written `default` wherever a command takes a domain.",
        "The exit codes are listed in [errors](errors.md#command-exit-codes); what `capture`, `explain`",
        "and `nsys` do with the command after `--` is in [how the commands run your script](commands.md).",
        "",
        "<!-- Generated by `python tests/test_docs.py --write` from the argparse parsers; do not edit. -->",
    ]
    for command, help_text in helps.items():
        out += ["", f"## `{command}`", "", "```text", help_text.rstrip(), "```"]
    return "\n".join(out) + "\n"


def cli_helps() -> dict[str, str]:
    """``format_help()`` of the main parser and of each command's parser, at a fixed width."""
    from nvtx_regions.commands.main import build_parser, command_parsers

    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        helps = {"nvtx-regions": build_parser().format_help()}
        helps.update({f"nvtx-regions {command}": parser.format_help() for command, parser in command_parsers().items()})
    finally:
        if saved is None:
            os.environ.pop("COLUMNS")
        else:
            os.environ["COLUMNS"] = saved
    return helps


def test_cli_reference_is_generated_from_the_parsers():
    assert text(CLI) == render_cli_reference(cli_helps()), "run `python tests/test_docs.py --write`"


# ------------------------------------------------------------------ what each backend supports, generated

SUPPORT_BEGIN = "<!-- Generated by `python tests/test_docs.py --write` from nvtx_regions/selection/support.py; do not edit. -->\n"
SUPPORT_END = "<!-- End of the generated table. -->\n"


def render_support_table() -> str:
    """The table of `selection.support.SUPPORT`: a row per construct, a column per backend."""
    from nvtx_regions.core.profiling import BACKENDS
    from nvtx_regions.selection.support import BACKEND_NAMES, SUPPORT

    def cell(construct, backend: str) -> str:
        if backend in construct.why_not:
            return f"no: {construct.why_not[backend]}"
        return f"yes: {construct.notes[backend]}" if backend in construct.notes else "yes"

    lines = [f"| Construct | {' | '.join(BACKEND_NAMES[b] for b in BACKENDS)} |", "| --- |" + " --- |" * len(BACKENDS)]
    lines += [f"| {c.text} | {' | '.join(cell(c, b) for b in BACKENDS)} |" for c in SUPPORT.values()]
    return "\n".join(lines) + "\n"


def support_page(table: str) -> str:
    """docs/reference/backends.md with `table` between its markers."""
    before, rest = text(BACKENDS_PAGE).split(SUPPORT_BEGIN, 1)
    return before + SUPPORT_BEGIN + table + SUPPORT_END + rest.split(SUPPORT_END, 1)[1]


def test_backends_reference_is_the_support_table():
    assert text(BACKENDS_PAGE) == support_page(render_support_table()), "run `python tests/test_docs.py --write`"


# ------------------------------------------------------------------ what every page holds

LINK = re.compile(r"\[[^\]]*\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_relative_links_lead_to_files():
    broken = []
    for page in [README, *DOCS.rglob("*.md")]:
        prose = re.sub(r"```.*?```", "", text(page), flags=re.S)  # code such as `self.blocks[0](x)` is no link
        for target in LINK.findall(prose):
            if not re.match(r"[a-z]+:", target) and not (page.parent / target).exists():
                broken.append(f"{name(page)}: {target}")
    assert not broken


def test_docs_speak_to_users():
    """Sections, not bold run-in labels; and no word about how this project is made."""
    for page in pages():
        prose = re.sub(r"```.*?```", "", text(page), flags=re.S)
        assert not re.search(r"^\s*(- )?\*\*", prose, flags=re.M), f"{name(page)}: a bold label as a heading"
        words = re.findall(r"\b(issues?|CI|sessions?|this project's|our (?:own )?machines?)\b", prose)
        assert not words, f"{name(page)}: {words}"


def test_api_reference_names_exist():
    section = text(API).split("## `nvtx_regions.testing`", 1)[1].split("\n## ", 1)[0]
    import nvtx_regions.testing as testing

    named = set(re.findall(r"`([a-z_]+)\(", section))
    assert named and not {n for n in named if not hasattr(testing, n)}
    import nvtx_regions

    for dotted in re.findall(r"^## `(nvtx_regions[\w.]*)`", text(API), flags=re.M):
        module, _, attr = dotted.rpartition(".")
        if module == "nvtx_regions" and attr in nvtx_regions.__all__:
            continue  # exported (the import test of __all__ checks each name); importing thunder here would cost seconds
        try:
            importlib.import_module(dotted)
        except ImportError:
            assert hasattr(importlib.import_module(module), attr), dotted


# ------------------------------------------------------------------ refreshing the generated parts


def refresh() -> list[str]:
    """Rewrite docs/reference/cli.md and api.md's trace excerpt from real runs; the files changed."""
    changed = []
    try:
        cli = render_cli_reference(cli_helps())
    except ImportError as error:  # a tree without the parsers' functions: keep the page as it is
        print(f"{name(CLI)} not regenerated: {error}", file=sys.stderr)
        cli = text(CLI)
    if text(CLI) != cli:
        CLI.write_text(cli, encoding="utf-8")
        changed.append(name(CLI))
    page = support_page(render_support_table())
    if text(BACKENDS_PAGE) != page:
        BACKENDS_PAGE.write_text(page, encoding="utf-8")
        changed.append(name(BACKENDS_PAGE))
    ((_, line, shown),) = blocks("trace excerpt", API)
    (example,) = [body for _, _, body in blocks("run", API) if "last_traces" in body]
    with tempfile.TemporaryDirectory() as tmp:
        result = subprocess.run([sys.executable, "-c", example], cwd=tmp, capture_output=True, text=True, timeout=600, check=True)
    excerpt = trace_excerpt(result.stdout)
    if excerpt != shown.strip("\n"):
        API.write_text(text(API).replace(shown, excerpt + "\n", 1), encoding="utf-8")
        changed.append(name(API))
    return changed


if __name__ == "__main__":
    if "--write" not in sys.argv:
        sys.exit(f"usage: {sys.argv[0]} --write   (regenerates the CLI reference, the backends table and the trace excerpt)")
    sys.path.insert(0, str(ROOT / "tests"))
    print("\n".join(f"updated {p}" for p in refresh()) or "already current")
