"""Issue 21: what users met as tracebacks ends in ONE line naming what was wrong, and a
non-zero exit status (or, where the fix is to carry on, the job goes on). Every case is
run as a user runs it: real `main.py` processes, the real Django state server, real
files and a real kernel error (ENOSPC from /dev/full); and in each, the output of
every process of the job (scheduler, server, workers, state server) is searched for a
traceback, not only the one that failed."""
from __future__ import annotations

import glob
import os
import re
import shutil
import signal
import socket
import subprocess
import sys

import pytest

from esync.launch.supervisor import free_port
from tests.cluster import Cluster
from tests.helpers import REPO, assert_no_traceback, run_main, wait_until
from tests.stateserver import StateServer

FAST = ["-n", "lenet", "--num-threads", "1", "-e", "0"]
STATESERVER = os.path.join(REPO, "stateserver")


def assert_one_line(output: str, line: str) -> None:
    """`line` is in `output`, whole, on one line, and nothing in it is a traceback."""
    assert "Traceback" not in output, output[-3000:]
    assert any(line in text for text in output.splitlines()), (line, output[-3000:])


def outputs_of(job: Cluster, state: StateServer = None) -> dict:
    found = job.outputs()
    if state is not None and state.proc is not None:
        found["stateserver"] = state.output()
    return found


def esync_workers(job: Cluster, port: int, args, names=("w0", "w1")) -> None:
    job.start("scheduler", "scheduler")
    job.start("server0", "server")
    for w, name in enumerate(names):
        job.start(f"worker{w}", "worker",
                  ["-m", "esync", "-port", str(port), "--device-name", name,
                   "-ld", job.log_dir, *FAST, *args])


def full_file(folder: str, name: str) -> str:
    """`folder/name` as a link to /dev/full: every write to it fails with ENOSPC."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this machine")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    os.symlink("/dev/full", path)
    return path


# --- 1. a full disk while a worker writes its logs -------------------------------------
def test_a_full_disk_while_logging_a_round_is_one_line(tmp_path):
    folder = os.path.join(str(tmp_path), socket.gethostname(), "cpu")
    full_file(folder, "iter-3.json.partial")  # what write_round opens for round 3
    result = run_main(["-m", "local", *FAST, "--max-rounds", "5", "-ld", str(tmp_path)],
                      timeout=120)
    assert result.returncode == 2, result.stderr
    assert_one_line(result.stdout + result.stderr,
                    f"main.py: error: -ld/--log-dir: cannot write "
                    f"{os.path.join(folder, 'iter-3.json')}: No space left on device")
    assert sorted(os.listdir(folder)) == [".lock", "iter-1.json", "iter-2.json"]


@pytest.mark.slow  # a whole cluster
def test_a_worker_whose_disk_is_full_ends_the_job_with_one_line(tmp_path):
    with Cluster(tmp_path, 1, 2) as job:
        folder = os.path.join(job.log_dir, socket.gethostname(), "w1")
        full_file(folder, "iter-2.json.partial")
        job.start_all(["-m", "sync", *FAST, "--max-rounds", "5"])
        codes = job.wait(120)
        assert codes["worker1"] == 2 and all(c not in (0, None) for c in codes.values()), codes
        assert_one_line(job.output("worker1"),
                        f"main.py: error: -ld/--log-dir: cannot write "
                        f"{os.path.join(folder, 'iter-2.json')}: No space left on device")
        assert "aborting the job" in job.output("scheduler")
        assert_no_traceback(outputs_of(job))


# --- 2. the state server's settings and database ----------------------------------------
def runserver(env: dict, timeout: float = 60) -> subprocess.CompletedProcess:
    """`python manage.py runserver` (as the README and the launchers start it) with
    `env` added to the environment; it is expected to stop by itself."""
    return subprocess.run([sys.executable, "manage.py", "runserver", "--noreload",
                           f"127.0.0.1:{free_port()}"], cwd=STATESERVER, capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ, **env))


@pytest.mark.parametrize("env, line", [
    ({"ESYNC_SMOOTHING": "2"}, "ESYNC_SMOOTHING must be a number in (0, 1], got '2'"),
    ({"ESYNC_SMOOTHING": "often"}, "ESYNC_SMOOTHING must be a number in (0, 1], got 'often'"),
    ({"ESYNC_STATE_TOKEN": "a b"},
     "ESYNC_STATE_TOKEN must be printable ASCII without spaces (it travels in an HTTP "
     "header)"),
    ({"ESYNC_DATABASE": "{"}, "ESYNC_DATABASE is not JSON"),
])
def test_a_bad_state_server_setting_is_one_line(tmp_path, env, line):
    result = runserver(dict(env, ESYNC_STATE_DB=str(tmp_path / "db.sqlite3")))
    assert result.returncode == 2
    assert_one_line(result.stdout + result.stderr, f"manage.py: error: {line}")
    assert not os.path.exists(tmp_path / "db.sqlite3")


def test_a_database_path_under_a_file_is_one_line(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    db = str(tmp_path / "file" / "db.sqlite3")
    result = runserver({"ESYNC_STATE_DB": db})
    assert result.returncode == 2
    assert_one_line(result.stderr, f"manage.py: error: ESYNC_STATE_DB={db}: cannot use this "
                                   f"database file: {tmp_path / 'file'} is not a folder")


def test_a_database_path_that_is_a_folder_is_one_line(tmp_path):
    result = runserver({"ESYNC_STATE_DB": str(tmp_path)})
    assert result.returncode == 2
    assert_one_line(result.stderr, f"manage.py: error: ESYNC_STATE_DB={tmp_path}: cannot use "
                                   f"this database file: it is a folder, not a file")


def test_a_read_only_database_is_one_line_at_start(tmp_path):
    """A database that can be read but not written: before, the server started and
    answered every write 500; now it stops at start-up naming the file. (Read-only by
    the immutable attribute, which holds for root too.)"""
    db = str(tmp_path / "db.sqlite3")
    migrate = subprocess.run([sys.executable, "manage.py", "migrate"], cwd=STATESERVER,
                             capture_output=True, text=True, timeout=60,
                             env=dict(os.environ, ESYNC_STATE_DB=db))
    assert migrate.returncode == 0, migrate.stderr
    if not shutil.which("chattr") or subprocess.run(["chattr", "+i", db],
                                                    capture_output=True).returncode != 0:
        if os.geteuid() == 0:
            pytest.skip("cannot make a file read-only for root here (chattr +i)")
        os.chmod(db, 0o444)
    try:
        result = runserver({"ESYNC_STATE_DB": db})
    finally:
        subprocess.run(["chattr", "-i", db], capture_output=True)
    assert result.returncode == 2
    assert_one_line(result.stderr, f"manage.py: error: ESYNC_STATE_DB={db}: cannot use this "
                                   f"database file: attempt to write a readonly database")


@pytest.mark.slow  # the launcher starts a job's processes
def test_a_bad_state_server_setting_shows_through_the_launcher(tmp_path):
    result = subprocess.run([sys.executable, os.path.join(REPO, "src", "esync", "launch", "local.py"),
                             "-m", "esync", "--workers", "1", "--out", str(tmp_path), *FAST,
                             "--max-rounds", "3"], cwd=REPO, capture_output=True, text=True,
                            timeout=180, env=dict(os.environ, ESYNC_SMOOTHING="2"))
    assert result.returncode != 0
    assert_one_line(result.stdout + result.stderr,
                    "stateserver exited with status 2: manage.py: error: ESYNC_SMOOTHING "
                    "must be a number in (0, 1], got '2'")
    logs = glob.glob(os.path.join(str(tmp_path), "**", "*.log"), recursive=True)
    assert logs
    for path in logs:
        with open(path) as f:
            assert "Traceback" not in f.read(), path


# --- 3. a worker and the state server's token, or no state server ------------------------
@pytest.mark.slow  # a whole cluster
@pytest.mark.parametrize("worker_token, line", [
    ("another", "(this worker's ESYNC_STATE_TOKEN is not the state server's token)"),
    (None, "(this worker has no ESYNC_STATE_TOKEN: set it to the state server's token)"),
])
def test_a_wrong_state_token_ends_the_job_with_one_line(tmp_path, monkeypatch,
                                                        worker_token, line):
    monkeypatch.setenv("ESYNC_STATE_TOKEN", "the-state-servers-token")
    state = StateServer(tmp_path).start()
    try:
        if worker_token is None:
            monkeypatch.delenv("ESYNC_STATE_TOKEN")
        else:
            monkeypatch.setenv("ESYNC_STATE_TOKEN", worker_token)
        with Cluster(tmp_path, 1, 2) as job:
            esync_workers(job, state.port, ["--max-rounds", "3"])
            codes = job.wait(120)
            assert all(code not in (0, None) for code in codes.values()), codes
            failed = [n for n in ("worker0", "worker1") if codes[n] == 2]
            assert len(failed) == 1, codes  # worker 0, which creates the job
            assert_one_line(job.output(failed[0]), line)
            assert re.search(r"main\.py: error: state server http://127\.0\.0\.1:\d+ refused "
                             r"POST /jobs/", job.output(failed[0]))
            assert "aborting the job" in job.output("scheduler")
            assert_no_traceback(outputs_of(job, state))
    finally:
        state.stop()


@pytest.mark.slow  # a whole cluster
def test_an_unreachable_state_server_is_one_line_in_every_process(tmp_path):
    port = free_port()  # nothing listens there
    with Cluster(tmp_path, 1, 2, env={"ESYNC_STATE_SERVER_PATIENCE": "1"}) as job:
        esync_workers(job, port, ["--max-rounds", "3"])
        codes = job.wait(120)
        assert all(code not in (0, None) for code in codes.values()), codes
        failed = [n for n in ("worker0", "worker1") if codes[n] == 2]
        assert len(failed) == 1, codes
        assert_one_line(job.output(failed[0]),
                        f"main.py: error: state server http://127.0.0.1:{port} unreachable "
                        f"for 1 s")
        assert "aborting the job" in job.output("scheduler")
        assert_no_traceback(outputs_of(job))


@pytest.mark.slow  # a whole cluster
def test_a_state_server_gone_mid_job_is_one_line_in_every_process(tmp_path):
    state = StateServer(tmp_path).start()
    try:
        with Cluster(tmp_path, 1, 2, env={"ESYNC_STATE_SERVER_PATIENCE": "1"}) as job:
            esync_workers(job, state.port, ["--max-rounds", "100000"])
            wait_until(lambda: state.get("/status/")["jobs"]
                       and state.get("/status/")["jobs"][0]["round"] >= 3, "round 3", 120)
            state.stop(signal.SIGKILL)  # and it does not come back
            codes = job.wait(120)
            assert all(code not in (0, None) for code in codes.values()), codes
            assert any(code == 2 for code in codes.values()), codes
            lines = [line for n in ("worker0", "worker1") for line in
                     job.output(n).splitlines() if line.startswith("main.py: error: ")]
            assert lines and all(f"state server http://127.0.0.1:{state.port} unreachable "
                                 f"for 1 s" in line for line in lines), lines
            assert "aborting the job" in job.output("scheduler")
            assert_no_traceback(outputs_of(job))
    finally:
        state.stop(signal.SIGKILL)


# --- 4. two workers of one job with the same --device-name ------------------------------
@pytest.mark.slow  # a whole cluster
def test_a_duplicate_device_name_is_one_line_in_every_process(tmp_path):
    with StateServer(tmp_path) as state, Cluster(tmp_path, 1, 2) as job:
        esync_workers(job, state.port, ["--max-rounds", "3"], names=("same", "same"))
        codes = job.wait(120)
        assert all(code not in (0, None) for code in codes.values()), codes
        failed = [n for n in ("worker0", "worker1") if codes[n] == 2]
        assert len(failed) == 1, codes
        assert_one_line(job.output(failed[0]), "is in use by another running process")
        assert "--device-name" in job.output(failed[0])
        assert_no_traceback(outputs_of(job, state))


# --- 5. values from the state server ------------------------------------------------------
def rank_of(job: Cluster, name: str) -> int:
    return int(re.search(r"rank (\d+) of", job.output(name)).group(1))


@pytest.mark.slow  # a whole cluster
def test_a_strangers_round_is_refused_and_the_worker_carries_on(tmp_path, monkeypatch):
    """Without ESYNC_STATE_TOKEN anyone may write. A report of round 2**31-1 for rank 0
    made worker 0's next request 'in the past' and ended it with a traceback: the state
    server now refuses it (400, naming the field and the range); a round within range
    but ahead of worker 0 is refused to worker 0 for some rounds, which it runs with 1
    local iteration, saying so once, and the job ends normally."""
    monkeypatch.delenv("ESYNC_STATE_TOKEN", raising=False)
    with StateServer(tmp_path) as state, Cluster(tmp_path, 1, 2) as job:
        esync_workers(job, state.port, ["--max-rounds", "200"])
        wait_until(lambda: state.get("/status/")["jobs"]
                   and state.get("/status/")["jobs"][0]["round"] >= 3, "round 3", 120)
        name = state.get("/status/")["jobs"][0]["job"]
        status, answer = state.request("POST", f"/jobs/{name}/budget/", {
            "rank": 0, "round": 2**31 - 1, "time_per_iteration": None})
        assert status == 400
        assert re.fullmatch(r"field 'round' must be an integer in 1\.\.\d+ \(at most 8 beyond "
                            r"round \d+, .*\), got 2147483647", answer["error"]), answer
        ahead = state.get(f"/jobs/{name}/")["round"] + 8
        status, answer = state.request("POST", f"/jobs/{name}/budget/", {
            "rank": 0, "round": ahead, "time_per_iteration": None})
        assert status == 200, answer
        codes = job.wait(120)
        assert codes == {n: 0 for n in job.procs}, codes
        first = next(n for n in ("worker0", "worker1") if rank_of(job, n) == 0)
        out = job.output(first)
        assert_one_line(out, "is in the past: rank 0 already asked for round "
                             f"{ahead}")
        assert out.count("runs 1 local iteration a round until the state server answers") == 1
        assert "has budgets from the state server again" in out
        assert_no_traceback(outputs_of(job, state))
        assert state.get(f"/jobs/{name}/")["round"] >= 200
