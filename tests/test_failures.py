"""Jobs that survive what a real cluster does, on real processes: a worker SIGKILLed
mid-run (the job goes on; the worker started again rejoins and its logs continue), a
server SIGKILLed and started again (it restores its shard from the latest checkpoint),
and a whole job killed and started again with --resume."""
import contextlib
import glob
import json
import os
import re
import signal
import socket
import time

import pytest

from tests.cluster import Cluster
from tests.stateserver import StateServer

pytestmark = pytest.mark.slow  # whole clusters of real processes

TIMEOUT = 3.0  # PS_HEARTBEAT_TIMEOUT of these jobs
COMMON = ["-n", "lenet", "--num-threads", "1"]


def _logs(job, device):
    """{round: record} of a device's log folder."""
    folder = os.path.join(job.log_dir, socket.gethostname(), device)
    out = {}
    for path in glob.glob(os.path.join(folder, "iter-*.json")):
        with open(path) as f:
            out[int(os.path.basename(path)[5:-5])] = json.load(f)
    return out


def _wait(job, what, condition, timeout=60, dead=()):
    """Until `condition()`; fails if a process other than `dead` ended meanwhile."""
    deadline = time.monotonic() + timeout
    while not condition():
        ended = {n: p.returncode for n, p in job.procs.items()
                 if p.poll() is not None and n not in dead}
        assert not ended, f"processes ended while waiting for {what}: {ended}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _worker(job, name, k, args):
    return job.start(name, "worker", [*args, "--device-name", f"w{k}", "-ld", job.log_dir])


def _final_accuracy(job, devices):
    """The accuracy of the last evaluation any of `devices` logged (by training time)."""
    evaluated = [r for d in devices for r in _logs(job, d).values() if "accuracy" in r]
    assert evaluated, "nothing was evaluated"
    return max(evaluated, key=lambda r: r["total_time"])["accuracy"]


@pytest.mark.parametrize("mode", ["sync", "esync", "async"])
def test_a_killed_worker_is_left_behind_and_rejoins(tmp_path, mode):
    state = StateServer(tmp_path) if mode == "esync" else contextlib.nullcontext()
    with state as state_server, Cluster(tmp_path, 1, 2, heartbeat_timeout=TIMEOUT) as job:
        extra = ["-ip", "127.0.0.1", "-port", str(state_server.port)] if mode == "esync" else []
        args = ["-m", mode, *COMMON, "--time-limit", "15", "-e", "5", *extra]
        job.start("scheduler", "scheduler", ["-m", mode])
        job.start("server0", "server", ["-m", mode, "-c", "1"])
        for k in range(2):
            _worker(job, f"worker{k}", k, args)
        _wait(job, "10 rounds of w1", lambda: len(_logs(job, "w1")) >= 10)
        job.procs["worker1"].send_signal(signal.SIGKILL)
        _wait(job, "the scheduler to leave w1 behind",
              lambda: "the job goes on with 1 worker" in job.output("scheduler"),
              dead={"worker1"})
        before = max(_logs(job, "w1"))
        goes_on = max(_logs(job, "w0"))
        _wait(job, "w0 to train on alone", lambda: max(_logs(job, "w0")) >= goes_on + 5,
              dead={"worker1"})

        _worker(job, "worker1-again", 1, args)
        _wait(job, "w1 to rejoin", lambda: "rejoins as worker" in job.output("scheduler"),
              dead={"worker1"})
        _wait(job, "w1 to train again", lambda: max(_logs(job, "w1")) >= before + 5,
              dead={"worker1"})
        codes = job.wait(60)

        assert codes.pop("worker1") == -signal.SIGKILL
        assert codes == {"scheduler": 0, "server0": 0, "worker0": 0, "worker1-again": 0}, codes
        assert "continuing the job from round" in job.output("worker1-again")
        logs = _logs(job, "w1")
        rounds = sorted(logs)
        assert rounds[0] == 1 and rounds[-1] > before  # the old logs are kept, new ones go on
        # it trains its own partition on from where its data order was (no repartition)
        after = min(r for r in rounds if r > before)
        assert logs[after]["epoch"] > logs[before]["epoch"] > 0
        if mode != "async":  # synchronous: it rejoined at a round ahead of its last
            first_again = int(re.search(r"continuing the job from round (\d+)",
                                        job.output("worker1-again")).group(1))
            assert first_again > before
            assert f"worker 1 takes part again from round {first_again}" \
                in job.output("server0")
        assert _final_accuracy(job, ["w0", "w1"]) >= 0.90


def test_a_killed_server_restores_its_shard_from_the_latest_checkpoint(tmp_path):
    every = 10
    with Cluster(tmp_path, 1, 2, heartbeat_timeout=TIMEOUT) as job:
        checkpoints = os.path.join(job.dir, "checkpoints")
        keep = ["--checkpoint-dir", checkpoints, "--checkpoint-every", str(every)]
        args = ["-m", "sync", *COMMON, "--time-limit", "15", "-e", "5", *keep]
        job.start("scheduler", "scheduler", ["-m", "sync", *keep])
        job.start("server0", "server", ["-m", "sync", "-c", "1", *keep])
        for k in range(2):
            _worker(job, f"worker{k}", k, args)
        _wait(job, "a checkpoint and 35 rounds",
              lambda: len(_logs(job, "w0")) >= 35
              and glob.glob(os.path.join(checkpoints, "shard0", "round-*")))
        job.procs["server0"].send_signal(signal.SIGKILL)
        reached = max(max(_logs(job, "w0")), max(_logs(job, "w1")))
        job.start("server0-again", "server", ["-m", "sync", "-c", "1", *keep])
        _wait(job, "the restored server", lambda: "restored shard 0 from round"
              in job.output("server0-again"), dead={"server0"})
        codes = job.wait(60)

        assert codes.pop("server0") == -signal.SIGKILL
        assert codes == {"scheduler": 0, "server0-again": 0, "worker0": 0, "worker1": 0}, codes
        restored = int(re.search(r"restored shard 0 from round (\d+)",
                                 job.output("server0-again")).group(1))
        assert restored % every == 0 and reached - every - 1 <= restored <= reached
        assert "takes over shard 0" in job.output("scheduler")
        # the workers went on past the death, on the restored shard
        assert max(_logs(job, "w0")) > reached + 5
        assert _final_accuracy(job, ["w0", "w1"]) >= 0.90


@pytest.mark.parametrize("damaged", [False, True])
def test_a_killed_job_resumes_from_its_latest_checkpoint(tmp_path, damaged):
    """With `damaged`, the newest checkpoint's tensors are corrupt and a half-written one
    lies beside it: the job resumes from the one before, and says which file it skipped."""
    every = 10
    with Cluster(tmp_path, 1, 2, heartbeat_timeout=TIMEOUT) as job:
        checkpoints = os.path.join(job.dir, "checkpoints")
        keep = ["--checkpoint-dir", checkpoints, "--checkpoint-every", str(every)]
        args = ["-m", "sync", *COMMON, "--max-rounds", "400", "-e", "5", *keep]
        job.start("scheduler", "scheduler", ["-m", "sync", *keep])
        job.start("server0", "server", ["-m", "sync", "-c", "1", *keep])
        for k in range(2):
            _worker(job, f"worker{k}", k, args)
        _wait(job, "two checkpoints", lambda: len(glob.glob(
            os.path.join(checkpoints, "shard0", "round-*"))) >= 2)
        for proc in job.procs.values():  # the whole job dies at once
            proc.send_signal(signal.SIGKILL)
        job.wait(10)
        saved = sorted(int(p.rsplit("-", 1)[1]) for p in glob.glob(
            os.path.join(checkpoints, "shard0", "round-*")))
        job_id = json.load(open(os.path.join(checkpoints, "job.json")))["job"]
        if damaged:
            bad = os.path.join(checkpoints, "shard0", f"round-{saved[-1]}", "tensors.safetensors")
            data = bytearray(open(bad, "rb").read())
            data[-1] ^= 0xFF
            open(bad, "wb").write(bytes(data))
            os.makedirs(os.path.join(checkpoints, "shard0", f".partial-{saved[-1] + every}-0"))
            saved.pop()

        short = [a if a != "400" else str(saved[-1] + 30) for a in args]
        job.procs.clear()
        job.start("scheduler-again", "scheduler", ["-m", "sync", *keep, "--resume", "1"])
        job.start("server0-again", "server", ["-m", "sync", "-c", "1", *keep, "--resume", "1"])
        for k in range(2):
            _worker(job, f"worker{k}-again", k, [*short, "--resume", "1"])
        codes = job.wait(90)

        assert set(codes.values()) == {0}, codes
        assert f"resuming job {job_id}" in job.output("scheduler-again")
        assert f"restored shard 0 from round {saved[-1]}" in job.output("server0-again")
        if damaged:
            assert f"skipping a damaged checkpoint: {bad}" in job.output("server0-again")
        for k in range(2):
            assert f"continuing the job from round {saved[-1] + 1}" \
                in job.output(f"worker{k}-again")
            rounds = _logs(job, f"w{k}")
            # round 1's log is still there; the rounds after the checkpoint were trained
            # again; the job ended on its stop criterion, counted across the restart (in
            # SSGD the round that carries the stop to the others is one more)
            assert 1 in rounds and max(rounds) - (saved[-1] + 30) in (0, 1)
            # (the checkpoint's own round may have no log: a worker logs a round after
            # the server completed it, and may have been killed in between)
            assert set(range(saved[-1] + 1, max(rounds) + 1)) <= set(rounds)
            assert set(range(1, saved[-1])) <= set(rounds)
        assert _final_accuracy(job, ["w0", "w1"]) >= 0.90
