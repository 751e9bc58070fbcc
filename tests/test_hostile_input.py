"""The commands under the inputs people really give them (issue 17): a capture is
never lost, a file is never destroyed, and every bad input ends in our own
one-line error with a non-zero status, never a traceback.

Each test here failed before the fix it names. The capture tests run the real
command in a subprocess; the compare and check tests call ``main`` in-process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nvtx_regions.__main__ import main
from nvtx_regions.commands.nsys import nsys_command, split_torchrun
from nvtx_regions.testing import unavailable_reason
from nvtx_regions import parse

ROOT = Path(__file__).resolve().parents[1]
needs_tool = pytest.mark.skipif(bool(unavailable_reason()), reason=f"capture tool unavailable: {unavailable_reason()}")
FIX = "pass a file written by 'nvtx-regions capture -o FILE.json'"


def plain_env(**extra: str) -> dict[str, str]:
    drop = ("NVTX_INJECTION64_PATH", "NVTX_REGIONS_CAPTURE_DIR", "NVTX_REGIONS_CAPTURE_MODE")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


def cli(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nvtx_regions", *args], cwd=cwd, env=env or plain_env(),
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def one_line_error(result: subprocess.CompletedProcess, prefix: str) -> str:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix), result.stderr
    return lines[0]


def marker_script(tmp_path: Path) -> tuple[str, Path]:
    """A child script that leaves a file behind when it runs: a refused output must not run it."""
    ran = tmp_path / "ran"
    child = tmp_path / "child.py"
    child.write_text(f"import nvtx\nnvtx.mark('m')\nopen({str(ran)!r}, 'w').close()\n")
    return str(child), ran


# ------------------------------------------------------------------ capture: output paths, checked first


@pytest.mark.parametrize(
    "output, message",
    [
        ("{tmp}", "is a directory; give a file name, e.g. -o {tmp}/timeline.json"),
        ("/proc/out.json", "cannot write in /proc/"),
        ("{tmp}/afile/out.json", "cannot write in {tmp}/afile/"),  # a file where a folder should be
        ("-", "the trace cannot go to standard output, which is the command's own"),
    ],
)
def test_capture_refuses_an_output_it_cannot_write_before_running(tmp_path, output, message):
    (tmp_path / "afile").write_text("")
    child, ran = marker_script(tmp_path)
    output = output.format(tmp=tmp_path)
    result = cli("capture", "-o", output, "--", sys.executable, child)
    line = one_line_error(result, f"nvtx-regions capture: -o {output}: ")
    assert message.format(tmp=tmp_path) in line
    assert result.returncode == 2 and not ran.exists()
    assert not Path("-").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders; /proc stands in above")
def test_capture_refuses_a_read_only_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    child, ran = marker_script(tmp_path)
    result = cli("capture", "-o", str(folder / "t.json"), "--", sys.executable, child)
    assert "cannot write in" in one_line_error(result, "nvtx-regions capture: -o ")
    assert not ran.exists()


def test_capture_never_replaces_the_script_or_an_existing_file(tmp_path):
    child, ran = marker_script(tmp_path)
    before = Path(child).read_text()
    for force in ([], ["--force-overwrite"]):
        result = cli("capture", "-o", child, *force, "--", sys.executable, child)
        line = one_line_error(result, f"nvtx-regions capture: -o {child}: ")
        assert f"is {child!r}, a file the command uses" in line
    assert Path(child).read_text() == before and not ran.exists()

    existing = tmp_path / "existing.json"
    existing.write_text("keep me")
    result = cli("capture", "-o", str(existing), "--", sys.executable, child)
    assert one_line_error(result, "nvtx-regions capture: ").endswith(
        "the file exists; add --force-overwrite to replace it, or give another name"
    )
    assert existing.read_text() == "keep me" and not ran.exists()


@needs_tool
def test_force_overwrite_replaces_an_existing_trace(tmp_path):
    child, ran = marker_script(tmp_path)
    existing = tmp_path / "existing.json"
    existing.write_text("old")
    result = cli("capture", "-o", str(existing), "--force-overwrite", "--", sys.executable, child)
    assert result.returncode == 0, result.stderr
    assert ran.exists() and json.loads(existing.read_text())["traceEvents"]


@pytest.mark.parametrize("raw, message", [("{tmp}/afile", "is a file, not a folder"), ("/proc/raw", "cannot write in /proc/raw/")])
def test_capture_refuses_a_raw_dir_it_cannot_write(tmp_path, raw, message):
    (tmp_path / "afile").write_text("")
    child, ran = marker_script(tmp_path)
    raw = raw.format(tmp=tmp_path)
    result = cli("capture", "-o", str(tmp_path / "t.json"), "--raw-dir", raw, "--", sys.executable, child)
    assert message in one_line_error(result, f"nvtx-regions capture: --raw-dir {raw}: ")
    assert not ran.exists()


def test_help_after_an_option_shows_help(tmp_path):
    for command in ("capture", "explain", "nsys"):
        args = [command, *(["examples/regions.nvtx"] if command != "capture" else []), "-o", "x", "--help"]
        result = cli(*args)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"usage: nvtx-regions {command}") and "--" in result.stdout
        assert result.stderr == ""


# ------------------------------------------------------------------ capture: a trace that cannot be written at the end


@needs_tool
def test_a_trace_that_cannot_be_written_at_the_end_is_kept_and_named(tmp_path):
    out_dir = tmp_path / "out"
    child = tmp_path / "child.py"
    # The command replaces the output's folder with a file: writing there fails only at the end.
    child.write_text(
        textwrap.dedent(
            f"""
            import shutil, nvtx
            with nvtx.annotate("kept"):
                pass
            shutil.rmtree({str(out_dir)!r})
            open({str(out_dir)!r}, "w").close()
            """
        )
    )
    result = cli("capture", "-o", str(out_dir / "t.json"), "--", sys.executable, str(child), env=plain_env(TMPDIR=str(tmp_path)))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    (line,) = [l for l in result.stdout.splitlines() if "could not write" in l]
    kept = Path(line.split("so the trace is kept at ", 1)[1].split(",", 1)[0])
    assert line.startswith(f"nvtx-regions capture: could not write {out_dir / 't.json'} (Not a directory)")
    assert kept.name == "t.json" and kept.parent.name.startswith("nvtx_capture-")
    names = [e["name"] for e in json.loads(kept.read_text())["traceEvents"] if e["ph"] == "X"]
    assert names == ["kept"]
    assert list(kept.parent.glob("nvtx-*.jsonl"))  # the raw event files are kept beside it


# ------------------------------------------------------------------ capture: SIGKILL of the capture process


def _dead(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"  # a zombie waiting for init is dead too


@needs_tool
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's prctl")
def test_sigkill_of_capture_takes_the_child_down_and_the_next_run_cleans_up(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    pid_file = tmp_path / "child.pid"
    child = tmp_path / "child.py"
    child.write_text(f"import os, time, nvtx\nnvtx.mark('m')\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(120)\n")
    env = plain_env(TMPDIR=str(tmp))
    capture = subprocess.Popen(
        [sys.executable, "-m", "nvtx_regions", "capture", "-o", str(tmp_path / "t.json"), "--", sys.executable, str(child)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child_pid = int(pid_file.read_text())
    (left,) = tmp.glob("nvtx_capture-*")
    assert left.name.startswith(f"nvtx_capture-{capture.pid}-")
    capture.kill()
    capture.wait(timeout=30)
    deadline = time.monotonic() + 30
    while not _dead(child_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _dead(child_pid), "the command outlived the killed capture process"
    assert left.exists()  # SIGKILL runs no cleanup: the next run does it

    again = cli("capture", "-o", str(tmp_path / "t2.json"), "--", sys.executable, "-c", "pass", env=env)
    assert again.returncode == 0, again.stderr
    assert not left.exists() and list(tmp.glob("nvtx_capture-*")) == []


# ------------------------------------------------------------------ compare: bad capture files


BAD_TRACES = [
    # (file content, the end of the message after "<file>: ")
    ('[{"name": "a", "ph": "X", "ts": 0, "dur": "abc"}]',
     f"""event 0: complete event 'a' has 'dur' "abc", not a duration in microseconds (a number >= 0); {FIX}"""),
    ('[{"name": "a", "ph": "X", "ts": 0, "dur": null}]', f"event 0: complete event 'a' has no 'dur' (its duration in microseconds); {FIX}"),
    ('[{"name": "a", "ph": "X", "ts": 0}]', f"event 0: complete event 'a' has no 'dur' (its duration in microseconds); {FIX}"),
    ('[{"name": "a", "ph": "M"}, {"name": "a", "ph": "X", "ts": 0, "dur": 1, "args": 5}]',
     f"event 1: complete event 'a' has 'args' 5, not a JSON object; {FIX}"),
    ('[{"name": "a", "ph": "X", "ts": 0, "dur": 1, "args": ["domain"]}]',
     f"event 0: complete event 'a' has 'args' a list, not a JSON object; {FIX}"),
    ('[1, 2, 3]', f"event 0: 1 is not a JSON object; {FIX}"),
    ('{"traceEvents": [{"name": "a", "ph": "X", "ts": 0, "dur": NaN}]}',
     f"event 0: complete event 'a' has 'dur' NaN, not a duration in microseconds (a number >= 0); {FIX}"),
    ('[{"name": "a", "ph": "X", "ts": 0, "dur": -5}]',
     f"event 0: complete event 'a' has 'dur' -5, not a duration in microseconds (a number >= 0); {FIX}"),
    ('[{"name": "a", "ph": "X", "ts": 0, "dur": 1e999}]',
     f"event 0: complete event 'a' has 'dur' Infinity, not a duration in microseconds (a number >= 0); {FIX}"),
    ('[{"name": "a", "ph": "X", "ts": 0, "dur": 1' + "0" * 400 + '}]',
     f"event 0: complete event 'a' has 'dur' 1{'0' * 36}..., not a duration in microseconds (a number >= 0); {FIX}"),
    ('[{"name": 7, "ph": "X", "ts": 0, "dur": 1}]', f"event 0: a complete event ('ph': 'X') needs a string 'name', not 7; {FIX}"),
    ('[{"name": "a", "ph": "X", "ts": 0, "dur": 1, "args": {"domain": 3}}]',
     f"event 0: complete event 'a' has 'args.domain' 3, not a string or null; {FIX}"),
    ('[{"name": "a", "ph": "X", "ts": "x", "dur": 1}]', f"""event 0: complete event 'a' has 'ts' "x", not a time in microseconds; {FIX}"""),
    ("[" * 100_000 + "]" * 100_000, f"JSON nested too deeply to be a Chrome trace; {FIX}"),
    ('"just a string"', f"not a Chrome trace (expected a 'traceEvents' list or a list of events); {FIX}"),
    (b"\xff\xfe garbage", None),  # not UTF-8: "not JSON (...)"
]  # fmt: skip


@pytest.mark.parametrize("content, message", BAD_TRACES, ids=range(len(BAD_TRACES)))
def test_compare_names_the_file_and_the_event_of_a_bad_capture(tmp_path, capsys, content, message):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text('[{"name": "a", "ph": "X", "ts": 0, "dur": 1}]')
    bad.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert main(["compare", str(good), str(bad)]) == 1
    captured = capsys.readouterr()
    err = captured.err
    assert captured.out == "" and err.count("\n") == 1
    if message is None:
        assert err.startswith(f"nvtx-regions compare: {bad}: not JSON (")
    else:
        assert err == f"nvtx-regions compare: {bad}: {message}\n"


def test_events_that_are_not_ranges_are_passed_over(tmp_path, capsys):
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps([
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "p"}},
        {"name": "i", "ph": "i", "ts": 1, "s": "t"}, {"ph": "B", "ts": 1}, {"ph": "E", "ts": 2},
        {"name": "r", "ph": "X", "ts": 0, "dur": 2.5},
    ]))  # fmt: skip
    assert main(["compare", str(trace), str(trace)]) == 0
    assert capsys.readouterr().out.splitlines()[1].split() == ["r", "1", "1", "2.5", "us", "2.5", "us", "1.00"]


def test_compare_reads_pytorch_profiler_traces_whose_pid_is_text(tmp_path, capsys):
    trace = tmp_path / "kineto.json"
    trace.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "Trace", "ts": 1.5, "dur": 10, "pid": "Spans", "tid": "PyTorch Profiler", "name": "PyTorch Profiler (0)"},
        {"ph": "X", "cat": "cpu_op", "ts": 2, "dur": 3, "pid": 7, "tid": 7, "name": "aten::mm", "args": {"External id": 1}},
    ]}))  # fmt: skip
    assert main(["compare", str(trace), str(trace), "--domain", "cpu_op"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[:3] == ["aten::mm", "1", "1"]


def test_compare_domain_that_is_not_there_names_those_that_are(tmp_path, capsys):
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps([
        {"name": "a", "ph": "X", "ts": 0, "dur": 1, "cat": "nvtx_regions"},
        {"name": "b", "ph": "X", "ts": 0, "dur": 1, "cat": "NVTX"},
    ]))  # fmt: skip
    assert main(["compare", str(trace), str(trace), "--domain", "foo"]) == 1
    assert capsys.readouterr().err == (
        "nvtx-regions compare: no ranges of domain 'foo' in either file; "
        "the domains there are: default, nvtx_regions (pass one to --domain)\n"
    )


def test_compare_arguments_have_help_and_there_is_a_version(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["compare", "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert "the first capture: a Chrome trace JSON file" in text and "the second capture" in text
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("nvtx-regions ") and len(out.splitlines()) == 1


# ------------------------------------------------------------------ check: standard input


def test_check_dash_with_standard_input_closed_is_our_error():
    result = subprocess.run(
        ["sh", "-c", f'exec "{sys.executable}" -m nvtx_regions check - 0<&-'],
        cwd=ROOT, env=plain_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    line = one_line_error(result, "nvtx-regions check: -: standard input is closed")
    assert "nvtx-regions check - < spec.nvtx" in line and result.returncode == 2


@pytest.mark.parametrize(
    "data, status, expected",
    [
        (b"op in <caf\xe9>\n" + b"\xff" * 4096, 2,
         "<stdin>: not UTF-8 text (byte 10 is 0xE9, on line 1: invalid continuation byte); save it as UTF-8"),
        (bytes(range(256)) * 16, 2, "<stdin>: binary data, not spec text (a NUL byte at offset 0); a spec is UTF-8 text"),
        (b"\xef\xbb\xbfop in <linear>\n", 0, ""),
    ],
    ids=["latin-1", "binary", "byte-order-mark"],
)  # fmt: skip
def test_check_dash_decodes_standard_input_as_files_are(data, status, expected):
    # Standard input goes through the language layer's one decoder (parse_bytes), as files do.
    result = subprocess.run(
        [sys.executable, "-m", "nvtx_regions", "check", "-"], input=data,
        cwd=ROOT, env=plain_env(), capture_output=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == status
    assert result.stderr.decode().strip() == expected


# ------------------------------------------------------------------ explain: how the command ended


def test_explain_of_a_sigkilled_script_says_killed_by_sigkill(tmp_path):
    child = tmp_path / "die.py"
    child.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    result = cli("explain", "examples/regions.nvtx", "--", sys.executable, str(child))
    assert result.returncode == 128 + signal.SIGKILL
    assert result.stderr.strip() == f"nvtx-regions explain: {sys.executable} was killed by SIGKILL"


@pytest.mark.thunder
def test_explain_of_a_script_that_ends_with_os_exit_says_so(tmp_path):
    child = tmp_path / "quits.py"
    child.write_text(
        textwrap.dedent(
            """
            import os, torch, thunder
            def double(x):
                return torch.nn.functional.linear(x, torch.ones(2, 2))
            jitted = thunder.jit(double)
            jitted(torch.ones(2, 2))
            os._exit(0)
            """
        )
    )
    result = cli("explain", "examples/regions.nvtx", "--", sys.executable, str(child))
    assert result.returncode == 1
    (line,) = [l for l in result.stderr.splitlines() if l.startswith("nvtx-regions")]  # the rest is the script's warnings
    assert line.startswith("nvtx-regions explain: process ") and "compiled or called double (thunder) and then ended without running its exit handlers (os._exit)" in line
    assert "nothing to explain" not in result.stderr


# ------------------------------------------------------------------ nsys: torchrun and labels


def test_nsys_under_torchrun_runs_workers_with_torchruns_python(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTHON_EXEC", raising=False)
    venv_torchrun = Path(sys.executable).with_name("torchrun")
    if not venv_torchrun.exists():
        pytest.skip("no torchrun next to this interpreter")
    shebang = venv_torchrun.read_text().splitlines()[0][2:].strip()
    launcher, worker = split_torchrun([str(venv_torchrun), "--nproc_per_node=2", "x.py", "--steps", "3"])
    assert worker == [shebang, "-u", "x.py", "--steps", "3"]  # the interpreter torchrun runs, with its -u
    assert shebang != "python"
    # pip's `#!/bin/sh` form for long interpreter paths
    long_form = tmp_path / "torchrun"
    long_form.write_text("#!/bin/sh\n'''exec' \"/opt/a long path/bin/python3\" \"$0\" \"$@\"\n' '''\nimport sys\n")
    assert split_torchrun([str(long_form), "x.py"])[1] == ["/opt/a long path/bin/python3", "-u", "x.py"]
    # `PYTHON -u -m torch.distributed.run`: that interpreter, whatever its own options
    assert split_torchrun(["/usr/bin/python3.11", "-u", "-m", "torch.distributed.run", "-m", "pkg.train"]) == (
        ["/usr/bin/python3.11", "-u", "-m", "torch.distributed.run"], ["/usr/bin/python3.11", "-u", "-m", "pkg.train"])  # fmt: skip
    monkeypatch.setenv("PYTHON_EXEC", "/opt/py")  # torchrun's own override
    assert split_torchrun([str(venv_torchrun), "x.py"])[1] == ["/opt/py", "-u", "x.py"]


def test_torchruns_argument_errors_are_torchruns():
    result = cli("nsys", "examples/regions.nvtx", "--", "torchrun", "--nproc_per_node", timeout=120)
    assert result.returncode == 2
    assert "usage: torchrun" in result.stderr and "usage: nvtx-regions" not in result.stderr
    assert result.stderr.rstrip().endswith(
        "nvtx-regions nsys: torchrun cannot parse its arguments (its message is above); fix them, then run this again"
    )
    assert "Traceback" not in result.stderr


def test_a_label_with_at_is_refused_for_the_nvtx_capture():
    spec = parse('"a@b": between first(op in <linear>)..last(op in <linear>) and forward and steps 1..2')
    with pytest.raises(Exception) as raised:
        nsys_command(spec, ["python", "t.py"])
    assert str(raised.value) == (
        "the label 'a@b' (line 1) holds '@', and nsys reads --nvtx-capture as RANGE@DOMAIN; "
        "rename it without '@' to start collecting at its range"
    )


# ------------------------------------------------------------------ one convention for every command


def test_every_command_is_a_module_with_arguments_and_run():
    import importlib

    from nvtx_regions.commands.main import COMMANDS, build_parser, command_parsers

    parsers = command_parsers()
    assert list(parsers) == list(COMMANDS) == ["check", "grammar", "capture", "nsys", "explain", "profile", "report", "compare"]
    for name, parser in parsers.items():
        module = importlib.import_module(f"nvtx_regions.commands.{name}")
        assert callable(module.add_arguments) and callable(module.run) and module.HELP and module.DESCRIPTION
        assert parser.prog == f"nvtx-regions {name}" and parser.format_help().startswith("usage: nvtx-regions ")
    text = " ".join(build_parser().format_help().split())
    assert "exit status: 0 ok; 1 a problem found" in text and "2 a usage or spec error" in text


def test_one_spelling_of_the_default_domain_on_every_command():
    from nvtx_regions.commands.main import command_parsers
    from nvtx_regions.core.naming import ANY_DOMAIN

    parsers = command_parsers()
    argv = {"compare": ["a.json", "b.json"], "report": ["r.sqlite"], "nsys": ["s.nvtx"]}
    for name, positional in argv.items():
        assert parsers[name].parse_args([*positional, "--domain", "default"]).domain is None
        assert parsers[name].parse_args([*positional, "--domain", "mine"]).domain == "mine"
    assert parsers["compare"].parse_args(argv["compare"]).domain is ANY_DOMAIN
    assert parsers["report"].parse_args(argv["report"]).domain is ANY_DOMAIN
    assert parsers["nsys"].parse_args(argv["nsys"]).domain == "nvtx_regions"
    with pytest.raises(SystemExit) as exited:
        parsers["nsys"].parse_args(["s.nvtx", "--default-domain"])  # the old second spelling is gone
    assert exited.value.code == 2


def test_a_spec_error_exits_2_on_every_command(tmp_path, capsys):
    bad = tmp_path / "bad.nvtx"
    bad.write_text("op in <linear\n", encoding="utf-8")
    ran = tmp_path / "ran"
    child = [sys.executable, "-c", f"open({str(ran)!r}, 'w').close()"]
    for argv in (["check", str(bad)], ["nsys", str(bad), "--", *child], ["explain", str(bad), "--", *child]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert f"{bad}:1:14: " in err and err.count("\n") == 3, err  # the message, the line and its caret
    assert not ran.exists()
