"""`esync-run --help`: the usage, where the logs go, and every flag of both parsers it
takes before the script (the launcher's, esync.launch.local; the job's, esync.options),
with the job's flags that only main.py's built-in loop reads marked; the manual's page
(docs/gen_reference.py) lists the same flags, marked the same way."""
import dataclasses
import os
import re
import subprocess
import sys

import pytest

from esync.launch import local
from esync.launch import run as esync_run
from esync.options import Options
from esync.options import build_parser as job_parser
from tests.helpers import CLUSTER_VARIABLES, REPO

OPTION = re.compile(r"(?<![\w-])(-{1,2}[A-Za-z][\w-]*)")


def _env():
    env = {k: v for k, v in os.environ.items() if k not in CLUSTER_VARIABLES}
    return dict(env, COLUMNS="100")


def _console_script():
    return os.path.join(os.path.dirname(sys.executable), "esync-run")


def _help(command):
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=_env(),
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return done.stdout


def _entries(text):
    """Each flag of a --help: (its option strings, its whole entry's text); a section's
    description (from its title, `name:`, to a blank line) is not one."""
    out, current, described = [], None, False
    for line in text.splitlines():
        if re.match(r"^\S.*:$", line):
            described, current = True, None
        elif described:
            described = bool(line.strip())
        elif re.match(r"^  -", line):
            invocation = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
            current = [tuple(OPTION.findall(invocation)), line]
            out.append(current)
        elif current is not None and line.startswith(" " * 4):
            current[1] += " " + line.strip()
        else:
            current = None
    return [(strings, " ".join(entry.split())) for strings, entry in out]


def _all_option_strings():
    return {s for parser in (local.build_parser(), job_parser())
            for a in parser._actions for s in a.option_strings}


def _built_in_strings():
    return {tuple(a.option_strings) for a in job_parser()._actions
            if a.dest in esync_run.BUILT_IN_LOOP_ONLY}


def test_the_built_in_loop_flags_are_options_fields_read_by_no_script():
    fields = {f.name for f in dataclasses.fields(Options)}
    assert esync_run.BUILT_IN_LOOP_ONLY <= fields
    assert set(esync_run.LAUNCHER_SETS) <= fields
    # -b too: a script's DataLoader gives the batch (speed-balanced DDP's included)
    assert esync_run.BUILT_IN_LOOP_ONLY == {"local_lr", "momentum", "weight_decay",
                                             "batch_size", "loader_workers"}


@pytest.mark.parametrize("command", [[_console_script(), "--help"],
                                     [sys.executable, "-m", "esync.launch.run", "--help"],
                                     [_console_script(), "--workers", "2", "-h"]],
                         ids=["console-script", "python-m", "after-flags"])
def test_help_lists_every_flag_of_both_parsers_marked(command):
    text = _help(command)
    assert text.startswith("usage: esync-run [launcher flags] [job flags] SCRIPT.py "
                           "[script args]\n")
    assert "OUT/<script name>/<mode folder>/<host>/<device>/worker.log" in text
    assert "OUT/<script name>/<mode folder>/<host>/<device>/iter-<n>.json" in text
    assert "launcher flags" in text and "job flags" in text
    shown = {s for strings, _ in _entries(text) for s in strings}
    assert shown == _all_option_strings()
    marked = {strings for strings, entry in _entries(text)
              if esync_run.BUILT_IN_MARK in entry}
    assert marked == {tuple(s) for s in _built_in_strings()}
    assert len(_entries(text)) == len({strings for strings, _ in _entries(text)})
    launcher_set = {strings for strings, entry in _entries(text)
                    if esync_run.LAUNCHER_MARK in entry}
    assert ("-ld", "--log-dir") in launcher_set and ("--device-name",) in launcher_set
    # the launcher's flags come first, then the job's
    assert text.index("--no-auth") < text.index("--learning-rate")


def test_the_manual_page_lists_the_same_flags_marked_the_same_way():
    done = subprocess.run([sys.executable, os.path.join("docs", "gen_reference.py"),
                           "esync-run"], capture_output=True, text=True, cwd=REPO,
                          env=_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| `")]
    flags = {tuple(re.findall(r"`(-[^`]+)`", row.split(" | ")[0])): row for row in rows}
    entries = dict(_entries(esync_run.format_help()))
    assert set(flags) == set(entries)
    marked = {strings for strings, row in flags.items()
              if "\\[built-in loop only\\]" in row}
    assert marked == {tuple(s) for s in _built_in_strings()}
    assert "OUT/&lt;script name&gt;" in done.stdout or "OUT/<script name>" in done.stdout


def test_the_script_and_its_own_help_are_its_own(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import sys\nprint('script help')\n")
    # after the script, -h is the script's: the launcher parses what comes before
    assert esync_run.split(["--workers", "2", str(script), "-h"]) == (
        ["--workers", "2"], [str(script), "-h"])
    assert not esync_run.asks_help(["--workers", "2", str(script), "--help"])
    assert esync_run.asks_help(["-m", "sync", "--help"])
    done = subprocess.run([_console_script(), "--workers", "2"], capture_output=True,
                          text=True, cwd=REPO, env=_env(), timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("esync-run: error: no training "
                                                           "script")
