"""--remote-prep on a real Ray head (started for this file, as tests/test_ray.py starts
its own): a worker over shards whose transform is slow (a stand-in for heavy
augmentation) stalls on preprocessing, so its batches go to Ray tasks once its rounds
have stalled for a second; its records count them (`remote_batches`), every sample is
trained once an epoch, and a worker killed while in remote mode and started again
continues at its exact next sample. Bad settings are one line naming the flag."""
from __future__ import annotations

import collections
import contextlib
import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from esync.data.leases import Lease
from tests.cluster import Cluster
from tests.helpers import REPO, wait_until
from tests.test_ray import Launch, ray_head
from tests.test_shard_data import write_shards

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")

#: the head's logical CPUs: a job of state server, scheduler, server and one worker
#: leaves one free
CPUS = 5
#: ms of sleep per sample in the transform: a batch of 16 takes about 0.16 s to make
DELAY_MS = "10"


@pytest.fixture(scope="module")
def head():
    with ray_head(CPUS) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("shards"))


@pytest.fixture(scope="module")
def script():
    """The user's script: SHARDS DELAY_MS WORKERS [esync flags] (a transform that sleeps;
    its function is __main__'s, so Ray sends it to the tasks by value)."""
    return os.path.join(REPO, "tests", "stall_script.py")


def _records(folder):
    """{round: record} of a device's folder."""
    return {int(os.path.basename(p)[5:-5]): json.load(open(p))
            for p in glob.glob(os.path.join(folder, "iter-*.json"))}


def _ids(record):
    return [(int(epoch), i) for epoch, ids in record.get("sample_ids", {}).items() for i in ids]


@pytest.mark.slow  # a Ray head and a whole job
def test_a_prep_stalled_worker_on_ray_sends_its_batches_to_ray_tasks(head, shards, script,
                                                                     tmp_path):
    """esync-run --ray: the worker starts with its own DataLoader worker, goes remote after
    its rounds stalled (the batches its DataLoader held first), trains every sample once an
    epoch, and leaves no process behind (its tasks' Ray workers included)."""
    out = str(tmp_path / "out")
    before = set(head.cluster_pids())  # Ray's own daemons
    with Launch(head, ["-m", "sync", "--workers", "1", "--num-threads", "1",
                       "--remote-prep", "0.3", "--log-samples", "1", "--epochs", "2",
                       "--block-size", "16"], out,
                program=os.path.join(REPO, "src", "esync", "launch", "run.py"),
                script=[script, shards, DELAY_MS, "1"]) as job:
        namespace = job.namespace()
        assert job.wait(timeout=150) == 0, job.output[-3000:]
    (folder,) = glob.glob(os.path.join(out, "stall_script", "sync", "*", "w0"))
    records = _records(folder)
    rounds = sorted(records)
    remote = [records[r]["remote_batches"] for r in rounds]
    assert remote[0] == 0 and sum(remote) > len(rounds) // 2, remote
    assert all(records[r]["prep_seconds"] > 0 for r in rounds)
    assert {r["data"]["split"] for r in records.values()} == {"leased"}
    assert all("sampler" in r["data"] for r in records.values())
    visits = collections.Counter(pair for r in rounds for pair in _ids(records[r]))
    assert max(visits.values()) == 1
    for epoch in (0, 1):  # --epochs 2: both whole
        assert sorted(i for e, i in visits if e == epoch) == list(range(300))
    log = open(os.path.join(folder, "worker.log")).read()
    assert "batches go to Ray tasks" in log and "Traceback" not in log
    assert head.ray("gone:15", namespace) == []
    # no actor, no process of the job, no Ray worker of its tasks
    wait_until(lambda: set(head.cluster_pids()) <= before, "no process of the job", 20,
               poll=0.2)


# --- a worker killed in remote mode and started again ---------------------------------

def _stopped(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")


@contextlib.contextmanager
def _frozen(proc):
    """`proc` stopped (SIGSTOP: it writes nothing meanwhile), then continued if alive."""
    proc.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: proc.poll() is not None or _stopped(proc.pid),
                   f"pid {proc.pid} to stop", timeout=10, poll=0.001)
        yield
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)


def _in_remote_mid_lease(record):
    """Whether `record`'s round had batches from Ray tasks and left its worker inside a
    lease (a sample of it trained, one to come)."""
    state = (record or {}).get("data", {}).get("sampler") or {}
    if not record.get("remote_batches") or not state.get("lease") or state.get("pending"):
        return False
    return 0 < state["pos"] < Lease.from_dict(state["lease"]).size


def _kill_in_remote_mode(job, folder, proc):
    """SIGKILL `proc` right after a round of it that went remote and ended mid-lease
    (checked with it stopped, so that the record checked is its last); that record."""
    deadline = time.monotonic() + 90
    while True:
        ended = {n: p.returncode for n, p in job.procs.items() if p.poll() is not None}
        assert not ended, f"processes ended before the kill: {ended}"
        assert time.monotonic() < deadline, "the worker never went remote mid-lease"
        records = _records(folder)
        last = records[max(records)] if records else None
        if last is not None and _in_remote_mid_lease(last):
            with _frozen(proc):
                records = _records(folder)
                if records[max(records)] == last:
                    proc.kill()
                    proc.wait(10)
                    return last
        time.sleep(0.005)


@pytest.mark.slow
def test_a_worker_killed_in_remote_mode_continues_at_its_exact_next_sample(head, shards,
                                                                           script, tmp_path):
    """SSGD of two workers on static shares, worker 0 with its own DataLoader worker only,
    worker 1 with --remote-prep; worker 1 is SIGKILLed after a round in remote mode and
    started again (waiting for its place already, as a supervisor would have it): it
    continues from the state kept before its last push (`sampler`), at its exact next
    sample, first with its own DataLoader worker; no sample twice in an epoch; no Ray
    worker of either is left."""
    env = {k: head.env[k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    env["ESYNC_RAY_ADDRESS"] = head.address
    env["ESYNC_RAY_TASKS"] = "esync.launch.rayprep:RayTasks"  # as esync/launch/onray.py names them
    before = set(head.cluster_pids())
    # leases of one block of 12 samples against batches of 16: rounds end inside leases
    args = ["-m", "sync", "--num-threads", "1", "--block-size", "12", "--data-split",
            "static", "--log-samples", "1", "--max-rounds", "40"]
    with Cluster(tmp_path, 1, 2, heartbeat_timeout=4.0, env=env) as job:
        folder = os.path.join(job.log_dir, socket.gethostname(), "w1")

        def worker(name, device, *extra):
            return job.start(name, "worker", [shards, DELAY_MS, "1", *args, *extra, "--device-name",
                                              device, "-ld", job.log_dir], program=[script])
        job.start("scheduler", "scheduler", ["-m", "sync"])
        job.start("server0", "server", ["-m", "sync", "-c", "1"])
        worker("worker0", "w0")
        worker("worker1", "w1", "--remote-prep", "0.3")
        wait_until(lambda: _records(folder), "worker 1's first record", 60, poll=0.05)
        worker("worker1-again", "w1", "--remote-prep", "0.3")
        killed = _kill_in_remote_mode(job, folder, job.procs["worker1"])
        codes = job.wait(120)
        assert codes.pop("worker1") == -signal.SIGKILL
        assert codes == {"scheduler": 0, "server0": 0, "worker0": 0, "worker1-again": 0}, \
            (codes, job.output("worker1-again")[-3000:])
        first = int(re.search(r"continuing the job from round (\d+)",
                              job.output("worker1-again")).group(1))
        records = _records(folder)
        saved = os.path.join(folder, f"data-{first - 1}.json")
        state = json.load(open(saved))["sampler"] if os.path.exists(saved) else \
            killed["data"]["sampler"]
        lease = Lease.from_dict(state["lease"])
        rest = lease.order()[state["pos"]:].tolist()
        after = [i for r in sorted(records) if r >= first for e, i in _ids(records[r])
                 if e == lease.epoch]
        assert after[:len(rest)] == rest[:len(after)] and after, (lease.id, rest, after)
        assert records[min(r for r in records if r >= first)]["remote_batches"] == 0
        visits = collections.Counter(pair for r in records.values() for pair in _ids(r))
        assert max(visits.values()) == 1
    # the killed worker's tasks and Ray workers went with it
    wait_until(lambda: set(head.cluster_pids()) <= before, "no Ray worker of the jobs", 20,
               poll=0.2)


# --- no cluster ---------------------------------------------------------------------------

NO_CLUSTER = ("--remote-prep needs a Ray cluster: start the job with esync-launch --ray "
              "(this worker has no ESYNC_RAY_ADDRESS or RAY_ADDRESS)")
#: nothing listens on port 1
NOWHERE = "127.0.0.1:1"


@pytest.mark.parametrize("variables, message", [
    ({}, NO_CLUSTER),
    ({"RAY_ADDRESS": NOWHERE},
     "--remote-prep needs ESYNC_RAY_TASKS, the module:function that sends batches to Ray "
     "tasks (esync-launch --ray sets it)"),
    ({"RAY_ADDRESS": NOWHERE, "ESYNC_RAY_TASKS": "esync.launch.rayprep:RayTasks"},
     f"--remote-prep: cannot reach the Ray cluster at {NOWHERE}: Connection refused"),
    ({"ESYNC_RAY_ADDRESS": NOWHERE, "ESYNC_RAY_TASKS": "esync.launch.rayprep:NoSuchTasks"},
     "ESYNC_RAY_TASKS esync.launch.rayprep:NoSuchTasks: esync.launch.rayprep has no 'NoSuchTasks'"),
], ids=["no-cluster", "no-tasks", "unreachable", "bad-tasks"])
def test_a_worker_without_a_cluster_to_reach_is_one_line_at_start(shards, tmp_path,
                                                                  variables, message):
    """A worker not started by esync-launch --ray: with no cluster's address, without the
    tasks that make its batches (RAY_ADDRESS set by hand), with a cluster that is not
    there, or with tasks that do not exist, it stops at start with one line naming what
    was wrong."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DMLC_", "RAY_", "ESYNC_RAY_"))}
    done = subprocess.run([sys.executable, "main.py", "-m", "local", "--dataset",
                           f"shards:{shards}", "--remote-prep", "0.5", "--max-rounds", "1",
                           "--log-dir", str(tmp_path / "logs")], cwd=REPO,
                          env=dict(env, **variables), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert errors == [f"main.py: error: {message}"], done.stderr
    assert "Traceback" not in done.stderr


def test_a_users_script_gets_the_same_one_line(shards, script, tmp_path):
    """esync.prepare_data_loader ends a script whose loader cannot be prepared as init
    ends one with bad settings: one line, exit status 2, no traceback."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DMLC_", "RAY_", "ESYNC_RAY_"))}
    done = subprocess.run([sys.executable, script, shards, "0", "1", "-m", "local",
                           "--remote-prep", "0.5", "--max-rounds", "1",
                           "-ld", str(tmp_path / "logs")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"{os.path.basename(script)}: error: {NO_CLUSTER}")
    assert "Traceback" not in done.stderr
