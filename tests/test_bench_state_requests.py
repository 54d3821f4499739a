"""bench/state_requests.py: the state server's CPU per budget and per live report, run
as a user runs it, small (a real runserver, real clients)."""
import os
import re
import subprocess
import sys

from tests.helpers import REPO


def test_it_prints_each_kinds_cpu_against_the_refused_baseline():
    done = subprocess.run([sys.executable, os.path.join(REPO, "bench", "state_requests.py"),
                           "--workers", "4", "--rounds", "20", "--repeats", "1"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {m.group(1): (float(m.group(2)), float(m.group(3)))
            for m in re.finditer(r"^\| ([a-z ()]+) \| ([0-9.]+) \[[^]]*\] \| ([0-9.]+) ",
                                 done.stdout, re.M)}
    assert set(rows) == {"refused (baseline)", "budget", "report"}, done.stdout
    assert all(cpu > 0 for cpu, _ in rows.values()), done.stdout
    assert rows["refused (baseline)"][1] == 1.0
