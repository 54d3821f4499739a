"""A job that survives its servers' deaths, on real processes: a server SIGKILLed and
started again restores its shard from the latest checkpoint; a whole job killed and
started again with --resume continues from its checkpoints (also when the newest one is
damaged). Helpers: test_failures.py."""
import glob
import json
import os
import re
import signal

import pytest

from tests.cluster import Cluster
from tests.test_failures import COMMON, TIMEOUT, _final_accuracy, _logs, _wait, _worker

pytestmark = pytest.mark.slow  # whole clusters of real processes


def _start(job, keep, args, suffix="", extra=()):
    """The scheduler, server 0 and 2 SSGD workers (`args`), their names ending in
    `suffix`; `keep` (checkpoints) and `extra` go to every role."""
    job.start(f"scheduler{suffix}", "scheduler", ["-m", "sync", *keep, *extra])
    job.start(f"server0{suffix}", "server", ["-m", "sync", "-c", "1", *keep, *extra])
    for k in range(2):
        _worker(job, f"worker{k}{suffix}", k, [*args, *extra])


def test_a_killed_server_restores_its_shard_from_the_latest_checkpoint(tmp_path):
    every = 10
    with Cluster(tmp_path, 1, 2, heartbeat_timeout=TIMEOUT) as job:
        checkpoints = os.path.join(job.dir, "checkpoints")
        keep = ["--checkpoint-dir", checkpoints, "--checkpoint-every", str(every)]
        _start(job, keep, ["-m", "sync", *COMMON, "--time-limit", "15", "-e", "5", *keep])
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
        _start(job, keep, args)
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
        _start(job, keep, short, "-again", ["--resume", "1"])
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
