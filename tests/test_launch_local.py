"""esync/launch/local.py starts a whole job as child processes, stops it cleanly on Ctrl-C
(a worker that dies is left to the scheduler), and leaves no process behind, even when
it is killed itself. Bad
flags, the launcher's own and the workers' (main.py's parser), start nothing."""
import glob
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from esync.launch import local
from tests.helpers import REPO, alive

LAUNCH = os.path.join(REPO, "src", "esync", "launch", "local.py")


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


def wait_gone(pids, timeout=15):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def wait_for_rounds(folder, count=2, timeout=120):
    """Until the workers have logged `count` rounds (the evaluator's records do not
    count: it may log twice before a worker's first round ends, and the launcher
    counts a job as training from the first round a worker logs)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        logged = glob.glob(os.path.join(folder, "*", "*", "iter-*.json"))
        if sum(os.path.basename(os.path.dirname(f)) != "evaluator" for f in logged) >= count:
            return
        time.sleep(0.2)
    raise AssertionError(f"no training logs under {folder}")


@pytest.mark.slow
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
    assert sorted(p.name for p in host.iterdir() if p.is_dir()) == ["evaluator", "w0",
                                                                     "w1-x2"]
    assert (host / "evaluator" / "iter-1.json").exists()  # the job's evaluator
    for device in ("w0", "w1-x2"):
        assert (host / device / "iter-1.json").exists()
        assert "--device-name" in (host / device / "worker.log").read_text()
    assert "all 2 workers finished" in (host / "scheduler.log").read_text()
    assert (host / "server0.log").exists()
    assert not children_of(proc.pid)


@pytest.mark.slow
def test_an_esync_job_with_a_relative_out_folder(tmp_path):
    """--out relative to where the launcher runs: the state server (run from its own
    folder) must find its database there too (the README's quick start does this)."""
    proc = subprocess.Popen([sys.executable, LAUNCH, "-m", "esync", "--workers", "2",
                             "--out", "runs", "--max-rounds", "3", "--no-progress"],
                            cwd=tmp_path, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    (host,) = (tmp_path / "runs" / "lenet" / "esync").iterdir()
    assert (host / "stateserver.sqlite3").exists() and (host / "w1" / "iter-3.json").exists()
    assert not children_of(proc.pid)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ctrl-c", "worker dies", "launcher killed"])
def test_the_job_stops_and_no_process_is_left(tmp_path, how):
    proc = launch(["-m", "esync", "--workers", "2", "--out", str(tmp_path),
                   "--time-limit", "300", "--no-progress"])
    try:
        wait_for_rounds(tmp_path / "lenet" / "esync")
        kids = children_of(proc.pid)
        assert len(kids) == 6  # state server, scheduler, evaluator, server, two workers
        start = time.monotonic()
        if how == "ctrl-c":
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate(timeout=30)
            assert proc.returncode == 130 and "interrupted; stopping the job" in out
        elif how == "worker dies":
            # its own device name, not a "w1" anywhere (pytest-xdist's tmp paths have one)
            worker = next(p for p in kids if b"\0--device-name\0w1\0"
                          in open(f"/proc/{p}/cmdline", "rb").read())
            lines = []
            reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
            reader.start()
            os.kill(worker, signal.SIGKILL)
            # the scheduler decides (it goes on without it): the launcher keeps the job
            note = "launch: worker1 died (signal 9); the job goes on without it\n"
            deadline = time.monotonic() + 30
            while note not in lines and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert note in lines and proc.poll() is None, "".join(lines)
            assert all(alive(p) for p in kids if p != worker)
            start = time.monotonic()
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=30)
            reader.join(timeout=10)
            assert proc.returncode == 130, "".join(lines)
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
    # the workers' flags, checked by main.py's own parser before anything starts
    (["-m", "sync", "-c", "maybe"],
     "esync-launch: error: argument -c/--cpu: expected 1/0, true/false or yes/no, "
     "got 'maybe'"),
    (["-m", "async", "-dcasgd", "perhaps"], "argument -dcasgd/--use-dcasgd: expected 1/0"),
    (["-m", "sync", "-b", "-3"], "argument -b/--batch-size: expected a positive integer"),
    (["-m", "sync", "--bogus"], "unrecognized arguments: --bogus"),
    (["-m", "sync", "--device-name", "mine"], "--device-name is set by the launcher"),
    (["-m", "sync", "--log-dir=elsewhere"], "-ld/--log-dir is set by the launcher"),
])
def test_bad_input_is_one_line_and_starts_nothing(tmp_path, args, message):
    proc = launch([*args, "--out", str(tmp_path)])
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and message in out, out
    assert not os.listdir(tmp_path)
    if "-c" in args or "--bogus" in args:  # one line, no usage
        assert len(out.splitlines()) == 1, out


def test_the_plan_comes_from_the_one_parser_and_the_registry(tmp_path):
    out = str(tmp_path)
    plan = local.plan(["-m", "async", "-dcasgd", "1", "-s", "yes", "--out", out, "-n", "lenet"])
    assert plan.algorithm.key == "dcasgd" and plan.folder == os.path.join(out, "lenet",
                                                                          "dcasgd-niid")
    assert plan.worker_args[-2:] == ["--num-threads", str(plan.threads)]
    assert plan.evaluator and "-e" in plan.worker_args  # accuracy by the evaluator
    plan = local.plan(["-m", "local", "--workers", "3", "--out", out, "--num-threads", "0",
                       "--max-rounds", "7"])
    assert plan.workers == 1 and not plan.algorithm.distributed and not plan.evaluator
    assert plan.folder == os.path.join(out, "lenet", "local")
    # the user's, and evaluations by the clock
    assert plan.worker_args == ["--num-threads", "0", "--max-rounds", "7", "-e", "0"]
    assert plan.stop_rounds == 7 and plan.stop_seconds is None
    plan = local.plan(["-m", "esync", "--out", out, "--time-limit", "9"])
    assert plan.algorithm.state_server and plan.stop_seconds == 9.0
    plan = local.plan(["-m", "sync", "--out", out, "-e", "5"])
    assert not plan.evaluator and "0" not in plan.worker_args  # worker 0 evaluates
    assert not os.listdir(tmp_path)


def test_devices_give_each_worker_its_device_flags_and_folder(tmp_path):
    out = str(tmp_path)
    plan = local.plan(["-m", "esync", "--workers", "4", "--devices", "gpu,cpu,gpu:5,gpu",
                       "--slowdown", "1,4,1,1", "--out", out])
    assert [plan.device_args(k) for k in range(4)] == [["-g", "0"], ["-c", "1"],
                                                       ["-g", "5"], ["-g", "1"]]
    assert [plan.label(k) for k in range(4)] == ["w0-gpu", "w1-x4", "w2-gpu", "w3-gpu"]
    # one for all; without --devices main.py's own -g/-c decide, as before
    assert local.plan(["-m", "sync", "--devices", "cpu", "--out", out]).device_args(1) == \
        ["-c", "1"]
    plan = local.plan(["-m", "sync", "-g", "0", "--out", out])
    assert plan.device_args(0) == [] and plan.label(0) == "w0" and "-g" in plan.worker_args
    # on Ray a GPU worker trains on the one GPU Ray made visible to it; threads: 1
    plan = local.plan(["-m", "sync", "--ray", "--devices", "gpu,cpu", "--out", out])
    assert plan.device_args(0) == ["-g", "0"] and plan.threads == 1
    assert plan.ray.address is None and plan.ray.servers_on == "head"
    assert local.plan(["-m", "sync", "--ray", "auto", "--out", out]).ray.address == "auto"
    assert not os.listdir(tmp_path)


COMMANDS = ["esync-launch", "esync-hosts", "esync-experiment", "esync-summary", "esync-draw"]


@pytest.mark.parametrize("command", COMMANDS)
def test_console_scripts_run(command, tmp_path):
    path = shutil.which(command) or os.path.join(os.path.dirname(sys.executable), command)
    result = subprocess.run([path, "--help"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: {command}")


@pytest.mark.parametrize("script", ["src/esync/launch/local.py", "src/esync/launch/hosts.py",
                                    "src/esync/launch/experiment.py", "src/esync/logs_tools/summary.py",
                                    "src/esync/logs_tools/drawer.py"])
def test_scripts_run_from_another_folder(script, tmp_path):
    result = subprocess.run([sys.executable, os.path.join(REPO, script), "--help"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: ")


def test_console_script_errors_name_the_command(tmp_path):
    path = shutil.which("esync-launch") or os.path.join(os.path.dirname(sys.executable),
                                                        "esync-launch")
    result = subprocess.run([path, "-m", "sync", "-c", "maybe", "--out", str(tmp_path)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith("esync-launch: error: argument -c/--cpu")
    assert not os.listdir(tmp_path)
