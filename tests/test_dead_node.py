"""A node killed with SIGKILL ends the job with a message naming it, instead of a hang:
a server without checkpoints, the scheduler, and a worker under `--on-worker-failure
abort` (ps-lite's behaviour; by default the job goes on without it: test_failures.py)."""
import glob
import os
import signal
import time

import pytest

from tests.cluster import Cluster

pytestmark = pytest.mark.slow  # whole clusters of real processes

TIMEOUT = 3.0  # PS_HEARTBEAT_TIMEOUT of these jobs


def _start_training(tmp_path):
    job = Cluster(tmp_path, num_servers=1, num_workers=2, heartbeat_timeout=TIMEOUT)
    job.start_all(["-m", "sync", "-n", "lenet", "--time-limit", "120", "-e", "20"],
                  server_args=("-c", "1", "--on-worker-failure", "abort"))
    deadline = time.monotonic() + 60
    while len(glob.glob(os.path.join(job.log_dir, "*", "w*", "iter-*.json"))) < 10:
        assert time.monotonic() < deadline, "training did not start"
        assert all(p.poll() is None for p in job.procs.values()), "a process ended early"
        time.sleep(0.2)
    return job


def _wait_for_the_rest(job, victim):
    killed_at = time.monotonic()
    job.procs[victim].send_signal(signal.SIGKILL)
    codes = job.wait(TIMEOUT + 15)
    took = time.monotonic() - killed_at
    return codes, took


@pytest.mark.parametrize("victim", ["worker1", "server0"])
def test_killed_node_is_named_and_everyone_exits(tmp_path, victim):
    with _start_training(tmp_path) as job:
        pid = job.procs[victim].pid
        codes, took = _wait_for_the_rest(job, victim)
        survivors = [n for n in job.procs if n != victim]
        assert all(codes[n] == 1 for n in survivors), codes
        assert took < TIMEOUT + 10
        named = f"{victim.rstrip('0123456789')} "  # "worker 1 (pid ...)" / "server 0 (...)"
        assert f"(pid {pid} on " in job.output("scheduler")
        assert "sent no heartbeat for 3 s" in job.output("scheduler")
        for name in survivors:
            if name != "scheduler":
                out = job.output(name)
                assert "esync: error: job aborted:" in out and f"(pid {pid} on " in out, out
                assert named in out


def test_killed_scheduler_ends_servers_and_workers(tmp_path):
    with _start_training(tmp_path) as job:
        codes, took = _wait_for_the_rest(job, "scheduler")
        assert all(codes[n] == 1 for n in job.procs if n != "scheduler"), codes
        for name in ("server0", "worker0", "worker1"):
            assert "job aborted: lost the scheduler" in job.output(name)


def test_worker_with_a_bad_flag_ends_the_job(tmp_path):
    """A worker that cannot even start tells the scheduler, instead of being waited for."""
    with Cluster(tmp_path, num_servers=1, num_workers=2, heartbeat_timeout=TIMEOUT) as job:
        job.start("scheduler", "scheduler")
        job.start("server0", "server")
        job.start("worker0", "worker", ["-m", "sync", "--device-name", "w0", "-ld", job.log_dir])
        # the bad one starts once the others have registered
        job.wait_for_output("scheduler", "server registered", "worker registered")
        job.start("worker1", "worker", ["-m", "sync", "-n", "vgg99"])
        codes = job.wait(30)
        assert codes == {"scheduler": 1, "server0": 1, "worker0": 1, "worker1": 2}, codes
        for name in ("server0", "worker0"):
            assert "could not start: argument -n/--network: expected one of alexnet, " \
                in job.output(name) and "module:function, got 'vgg99'" in job.output(name)


def test_worker_failing_after_joining_ends_the_job(tmp_path):
    """Two workers given the same log folder: the second fails, and says so to all."""
    with Cluster(tmp_path, num_servers=1, num_workers=2, heartbeat_timeout=TIMEOUT) as job:
        job.start("scheduler", "scheduler")
        job.start("server0", "server")
        for w in range(2):
            job.start(f"worker{w}", "worker", ["-m", "async", "--max-rounds", "100000",
                                               "--device-name", "same", "-ld", job.log_dir])
        codes = job.wait(60)
        assert sorted(codes.values()) == [1, 1, 1, 2], codes
        loser = next(n for n, c in codes.items() if c == 2)
        assert "is in use by another running process" in job.output(loser)
        assert "failed: log folder" in job.output("scheduler")
