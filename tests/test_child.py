"""`commands.child.run_child`, the one runner of the commands that run the user's command:
its environment goes through ``env=``, and its stderr, copied to a file, is read from its pipe."""

from __future__ import annotations

import os
import sys

from nvtx_regions.commands.child import run_child

GRANDCHILD = "import subprocess, sys; sys.stderr.write('child\\n'); sys.stderr.flush(); " \
             "subprocess.run([sys.executable, '-c', 'import os, sys; sys.stderr.write(os.environ[\"ONLY_THERE\"] + \"\\\\n\")'])"  # fmt: skip


def test_stderr_is_shown_and_copied_with_the_environment_given(tmp_path, capfd):
    before = (dict(os.environ), os.fstat(2).st_ino)
    copy = tmp_path / "stderr.txt"
    returncode = run_child([sys.executable, "-c", GRANDCHILD], {**os.environ, "ONLY_THERE": "grandchild"}, stderr_copy=copy)
    assert returncode == 0
    assert copy.read_text() == "child\ngrandchild\n"  # the grandchild's too: it holds the same pipe
    assert capfd.readouterr().err == "child\ngrandchild\n"  # shown as well
    assert (dict(os.environ), os.fstat(2).st_ino) == before  # this process's environment and stderr untouched


def test_without_a_copy_stderr_is_the_commands_own(tmp_path, capfd):
    assert run_child([sys.executable, "-c", "import sys; sys.stderr.write('direct'); sys.exit(4)"], dict(os.environ)) == 4
    assert capfd.readouterr().err == "direct"
