"""launch/local.py starts a whole job as child processes, stops it cleanly on Ctrl-C or
when a child dies, and leaves no process behind, even when it is killed itself."""
import glob
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import REPO

LAUNCH = os.path.join(REPO, "launch", "local.py")


def launch(args, **kw):
    return subprocess.Popen([sys.executable, LAUNCH, *args], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kw)


def children_of(pid):
    """Pids whose parent is `pid` (from /proc)."""
    found = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.split("/")[2]))
    return found


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pids, timeout=15):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def wait_for_rounds(folder, count=2, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(glob.glob(os.path.join(folder, "*", "*", "iter-*.json"))) >= count:
            return
        time.sleep(0.2)
    raise AssertionError(f"no training logs under {folder}")


def test_a_small_cluster_runs_to_the_end_in_the_summary_layout(tmp_path):
    proc = launch(["-m", "async", "-dcasgd", "1", "--workers", "2", "--slowdown", "1,2",
                   "--out", str(tmp_path), "--max-rounds", "5", "-s", "1"])
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    folder = tmp_path / "lenet" / "dcasgd-niid"
    assert f"logs in {folder}" in out and "launch: done:" in out
    hosts = os.listdir(folder)
    assert len(hosts) == 1
    host = folder / hosts[0]
    assert sorted(p.name for p in host.iterdir() if p.is_dir()) == ["w0", "w1-x2"]
    for device in ("w0", "w1-x2"):
        assert (host / device / "iter-1.json").exists()
        assert "--device-name" in (host / device / "worker.log").read_text()
    assert "all 2 workers finished" in (host / "scheduler.log").read_text()
    assert (host / "server0.log").exists()
    assert not children_of(proc.pid)


@pytest.mark.parametrize("how", ["ctrl-c", "worker dies", "launcher killed"])
def test_the_job_stops_and_no_process_is_left(tmp_path, how):
    proc = launch(["-m", "esync", "--workers", "2", "--out", str(tmp_path),
                   "--time-limit", "300", "--no-progress"])
    try:
        wait_for_rounds(tmp_path / "lenet" / "esync")
        kids = children_of(proc.pid)
        assert len(kids) == 5  # state server, scheduler, server, two workers
        start = time.monotonic()
        if how == "ctrl-c":
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate(timeout=30)
            assert proc.returncode == 130 and "interrupted; stopping the job" in out
        elif how == "worker dies":
            worker = next(p for p in kids
                          if b"w1" in open(f"/proc/{p}/cmdline", "rb").read())
            os.kill(worker, signal.SIGKILL)
            out, _ = proc.communicate(timeout=30)
            assert proc.returncode == 1
            assert "launch: error: worker1 exited with status -9" in out
        else:
            proc.kill()
            proc.wait()
        assert wait_gone(kids), [p for p in kids if alive(p)]
        assert time.monotonic() - start < 20
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("args, message", [
    (["-m", "sync", "--workers", "3", "--slowdown", "1,4"], "expected 3 factor(s)"),
    (["-m", "sync", "--slowdown", "fast"], "--slowdown 'fast'"),
    (["-m", "sync", "-ld", "elsewhere"], "-ld/--log-dir is set by the launcher"),
    (["-m", "sync", "--workers", "0"], "--workers and --servers must be at least 1"),
    (["-m", "nosuch"], "invalid choice: 'nosuch'"),
])
def test_bad_input_is_one_line_and_starts_nothing(tmp_path, args, message):
    proc = launch([*args, "--out", str(tmp_path)])
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and message in out, out
    assert not os.listdir(tmp_path)
