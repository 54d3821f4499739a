"""Jobs that survive their workers' deaths, on real processes: a worker SIGKILLed mid-run
in sync, esync and async (the job goes on; the worker started again rejoins and its logs
continue). Servers and whole jobs: test_failures_servers.py."""
import contextlib
import glob
import json
import os
import re
import signal
import socket
import time

import pytest

from esync.registry import EVALUATOR
from tests.cluster import Cluster
from tests.stateserver import StateServer

pytestmark = pytest.mark.slow  # whole clusters of real processes

TIMEOUT = 3.0  # PS_HEARTBEAT_TIMEOUT of these jobs
COMMON = ["-n", "lenet", "--num-threads", "1"]
#: the workers' limit: a backstop only. The job ends once an evaluator, started after the
#: rejoin, has seen the model hold 0.9 for 1 s of training: the events decide its end,
#: not a clock that a loaded machine's slow process starts race (a 15 s limit once ended
#: sync's job before w1 had trained 5 rounds again, and async's while the model dipped
#: as w1's partition came back)
BACKSTOP = ["--time-limit", "120"]
TARGET = ["--eval-interval", "0.2", "--target-accuracy", "0.9", "--target-hold", "1"]


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
        args = ["-m", mode, *COMMON, *BACKSTOP, "-e", "5", *extra]
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
        job.start(EVALUATOR, EVALUATOR, ["-m", mode, *COMMON, *TARGET, "-ld", job.log_dir])
        codes = job.wait(120)

        assert codes.pop("worker1") == -signal.SIGKILL
        assert codes == {"scheduler": 0, "server0": 0, "worker0": 0, "worker1-again": 0,
                         EVALUATOR: 0}, codes
        # the model, w1 back, is good: the evaluator saw 0.9 held and ended the job
        assert "the evaluator reached target accuracy 0.9" in job.output("worker0")
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
            rank = re.search(r"rejoins as worker (\d+)", job.output("scheduler")).group(1)
            assert f"worker {rank} takes part again from round {first_again}" \
                in job.output("server0")  # (ranks go by registration: w1 may be 0)
        # it came back with the job's model, not a fresh one: its first loss is a trained
        # model's (in every mode; a worker that pushed from its initial weights would not)
        assert logs[after]["loss"] < 0.25 * logs[1]["loss"], (logs[1], logs[after])
