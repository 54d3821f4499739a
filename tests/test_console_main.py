"""esync.errors.command_main, every console command's frame: a bad input is one line
`PROG: error: ...` and exit status 2, PROG the name the command was started by (the
installed script's, or a link's), Ctrl-C is `PROG: interrupted` and 130; the log tools
(compare, drawer, summary) no longer print a constant name."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from esync.errors import OneLineParser, UserError, command_main, program_name
from esync.logs_tools import compare

BIN = os.path.dirname(sys.executable)


def _script(name):
    return shutil.which(name) or os.path.join(BIN, name)


@pytest.mark.parametrize("command", ["esync-compare", "esync-draw", "esync-summary"])
def test_log_tools_name_themselves_by_how_they_were_started(command, tmp_path):
    """Each of the three, started as its console script and as a link of another name,
    says its bad input in one line under that name, with exit status 2."""
    missing = tmp_path / "nowhere"
    flags = {"esync-compare": ["--out", missing, "-n", "lenet"],
             "esync-draw": ["-b", missing, "-n", "lenet"],
             "esync-summary": ["-b", missing, "-n", "lenet", "-m", "esync"]}[command]
    link = tmp_path / "my-tool"
    os.symlink(_script(command), link)
    for path, name in ((_script(command), command), (str(link), "my-tool")):
        done = subprocess.run([path, *map(str, flags)], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"{name}: error: "), lines
        assert str(missing) in lines[0]


def test_a_given_argv_is_named_by_the_command_s_default(tmp_path, capsys):
    """Called in a process of another program (a test, a script), with its arguments
    given: the command's own name, or the one passed."""
    assert compare.main(["--out", str(tmp_path / "x"), "-n", "lenet"]) == 2
    assert capsys.readouterr().err == f"compare.py: error: no such folder: {tmp_path / 'x'}\n"
    assert compare.main(["--targets", "2", "--out", str(tmp_path), "-n", "lenet"],
                        prog="esync-compare") == 2
    assert capsys.readouterr().err == "esync-compare: error: target 2 is not in (0, 1]\n"


def test_the_frame_user_error_interrupt_and_exit_status(capsys):
    seen = []

    def body(argv, prog):
        seen.append((argv, prog))
        if argv == ["bad"]:
            raise UserError("--flag 3: expected a number below 2")
        if argv == ["stop"]:
            raise KeyboardInterrupt
        if argv == ["parse"]:
            OneLineParser(prog=prog).parse_args(["--nope"])
        return 7

    assert command_main(body, ["ok"], None, "tool") == 7 and seen == [(["ok"], "tool")]
    assert command_main(body, ["bad"], "mine", "tool") == 2
    assert capsys.readouterr().err == "mine: error: --flag 3: expected a number below 2\n"
    assert command_main(body, ["stop"], None, "tool") == 130
    assert capsys.readouterr().err == "tool: interrupted\n"
    assert command_main(body, ["parse"], None, "tool") == 2
    assert capsys.readouterr().err == "tool: error: unrecognized arguments: --nope\n"
    with pytest.raises(ZeroDivisionError):  # a bug is not bad input: its traceback shows
        command_main(lambda argv, prog: 1 // 0, [], None, "tool")


@pytest.mark.parametrize("argv0, name", [
    ("/venv/bin/esync-summary", "esync-summary"), ("/x/my-tool", "my-tool"),
    ("/src/esync/logs_tools/summary.py", "summary.py (default)"),
    ("-c", "summary.py (default)"), ("", "summary.py (default)")])
def test_program_name(argv0, name, monkeypatch):
    monkeypatch.setattr(sys, "argv", [argv0, "--flag"])
    assert program_name("summary.py (default)") == name
