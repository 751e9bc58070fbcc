"""README cannot rot: its commands and examples run, its quickstart output is
real, and its language reference covers the grammar (and only the grammar)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import lark
import pytest

from nvtx_regions import parse, render
from nvtx_regions.language import tree as T
from nvtx_regions.language.grammar import grammar_text, syntax

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def blocks_after(marker: str) -> list[str]:
    """The fenced code blocks that follow an HTML comment `<!-- test: marker -->`."""
    pattern = rf"<!-- test: {re.escape(marker)} -->\s*```\w*\n(.*?)```"
    return re.findall(pattern, README, flags=re.S)


def python_segments(command: str) -> list[list[str]]:
    """The `.venv/bin/python ...` parts of a shell command line, run with this interpreter."""
    parts = [p.strip() for p in command.strip().split("&&")]
    return [[sys.executable, *p.split()[1:]] for p in parts if p.startswith(".venv/bin/python")]


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600, **kwargs)


def test_quickstart_is_two_commands_and_ci_runs_them_verbatim():
    quickstart = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)```", quickstart, flags=re.S)
    assert len(commands) == 2
    install, test = (c.strip() for c in commands)
    assert "pip install" in install and install.endswith("examples/quickstart.py")
    assert test == ".venv/bin/python -m pytest"
    ci = (ROOT / ".ci/run").read_text()
    assert install in ci.splitlines() and test in ci.splitlines()
    assert "set -euo pipefail" in ci


def test_readme_commands_run_and_quickstart_output_is_real():
    (expected_output,) = blocks_after("quickstart output")
    for command in blocks_after("command"):
        for argv in python_segments(command):
            result = run(argv)
            assert result.returncode == 0, result.stderr[-3000:]
            if argv[-1].endswith("quickstart.py"):
                table = result.stdout[result.stdout.index("===== ranges per rule") :]
                assert table.strip() == expected_output.strip()


@pytest.mark.parametrize("index", range(len(blocks_after("run"))))
def test_readme_python_examples_run(index):
    result = run([sys.executable, "-c", blocks_after("run")[index]])
    assert result.returncode == 0, result.stderr[-3000:]


def reference_examples() -> list[str]:
    section = README.split("## Language reference", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
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
    assert constructs == set(ALIAS_NODES), "grammar changed: update ALIAS_NODES and README's language reference"
    found = set()
    for example in reference_examples():
        spec = parse(example)  # every example in the table parses
        assert parse(render(spec)) == spec
        found |= nodes(spec)
    missing = [alias for alias, node in ALIAS_NODES.items() if node not in found]
    assert not missing, f"README's language reference has no example of {missing}"
    section = README.split("## Language reference", 1)[1]
    assert {k for k in syntax().keywords if f"`{k}" not in section and f" {k} " not in section} == set()


def test_cli_check_reports_errors_with_location(tmp_path):
    bad = tmp_path / "bad.nvtx"
    bad.write_text("ok: all\nop in <linear\n", encoding="utf-8")
    result = run([sys.executable, "-m", "nvtx_regions", "check", str(bad)])
    assert result.returncode == 2  # a spec error (commands.status)
    assert result.stderr.startswith(f'{bad}:2:14: expected "," or ">" to close the "<" list, got end of input')
    good = run([sys.executable, "-m", "nvtx_regions", "check", "examples/regions.nvtx"])
    assert good.returncode == 0 and "examples/regions.nvtx:7: embed: op in <embedding>" in good.stdout
