"""No hang and no silent failure (issue 21), each shown on real processes and within
30 s: a peer that never reads its answers, a node with another job key, a job aborted
during start-up, a node that never comes, nodes whose settings disagree, evaluators
that pile up. Every process of every job is checked for tracebacks."""
from __future__ import annotations

import os
import re
import time
from typing import Dict, Optional

import pytest
import zmq

from esync.transport.auth import new_key
from esync.transport.cluster import ClusterEnv
from esync.transport.node import Node
from esync.launch.supervisor import free_port
from tests.cluster import Cluster
from tests.helpers import assert_no_traceback
from tests.test_hostile import Attacker, answer, job_args, packed, scheduler_address, \
    server_address, shard_sizes

pytestmark = pytest.mark.slow  # whole clusters of real processes

HEARTBEAT_TIMEOUT = 3.0


def assert_all_end(job: Cluster, codes: Dict[str, Optional[int]], expected=None) -> None:
    """Every process ended (within the wait), with `expected` (a dict or one code)."""
    assert None not in codes.values(), {n: job.output(n)[-1500:] for n, c in codes.items()
                                        if c is None}
    if expected is not None:
        want = expected if isinstance(expected, dict) else {n: expected for n in codes}
        assert codes == want, {n: job.output(n)[-1500:] for n in codes}
    assert_no_traceback(job.outputs())


def assert_all_say(job: Cluster, pattern: str, timeout: float = 30) -> None:
    """Every process of the job ends with exit status 1, having said `pattern`."""
    assert_all_end(job, job.wait(timeout), 1)
    for name in job.procs:
        assert re.search(pattern, job.output(name)), (name, job.output(name))


def worker_args(name: str, job: Cluster, *more: str, stop=("--max-rounds", "150")) -> list:
    return ["-m", "sync", "-n", "lenet", "--num-threads", "1", "-e", "50", *stop,
            "--device-name", name, "-ld", job.log_dir, *more]


def flood_until(sock: zmq.Socket, frames: list, job: Cluster, name: str, text: str,
                timeout: float = 20) -> int:
    """Send `frames` over and over, never reading, until `name` logs `text`."""
    deadline, sent = time.monotonic() + timeout, 0
    while text not in job.output(name):
        for _ in range(200):
            sock.send_multipart(frames)
        sent += 200
        assert time.monotonic() < deadline, (sent, job.output(name)[-2000:])
    return sent


# --- 1. a peer that never reads ------------------------------------------------------
@pytest.mark.parametrize("keyed", [False, True], ids=["no key", "job key"])
def test_a_peer_that_never_reads_its_acks_leaves_the_job_running(tmp_path, keyed):
    """The issue's attack: heartbeats from a socket that never reads the acks filled the
    scheduler's queue for it, and its blocking send stalled the scheduler for good. With
    a job key, the peer holds it (an insider that stalls) but never registered."""
    key = new_key() if keyed else None
    with Cluster(tmp_path, 1, 2, HEARTBEAT_TIMEOUT,
                 env={"ESYNC_JOB_KEY": key} if key else None) as job, \
            Attacker(key) as attacker:
        job.start("scheduler", "scheduler")
        job.start("server0", "server")
        for w in range(2):  # long enough to lose the scheduler twice over, were it stuck
            job.start(f"worker{w}", "worker",
                      worker_args(f"w{w}", job, stop=("--time-limit", "8")))
        job.wait_for_output("scheduler", "ranks assigned")
        sock = attacker.dealer(scheduler_address(job))
        sock.setsockopt(zmq.SNDHWM, 0)  # never refuses to send; never reads
        flood_until(sock, [packed({"type": "heartbeat", "sender": "stalled"})], job,
                    "scheduler", "does not read its answers")
        assert all(p.poll() is None for p in job.procs.values())  # while the job runs
        sock.close(linger=0)
        assert_all_end(job, job.wait(60), 0)
        assert "reached the time limit of 8 s" in job.output("worker0")


def test_an_evaluator_that_never_reads_is_dropped_and_the_job_goes_on(tmp_path):
    """A member that stops reading (a hung process whose heartbeats still flow): it is
    lost by the failure policy; an evaluator's loss ends nothing."""
    with Cluster(tmp_path, 1, 2, HEARTBEAT_TIMEOUT) as job, Attacker() as insider:
        job.start("scheduler", "scheduler")
        job.start("server0", "server")
        for w in range(2):
            job.start(f"worker{w}", "worker", worker_args(f"w{w}", job))
        job.wait_for_output("scheduler", "ranks assigned")
        address = scheduler_address(job)
        control = insider.dealer(address, b"hung-evaluator/ctl")
        control.send_multipart([packed({"type": "register", "sender": "hung-evaluator",
                                        "role": "evaluator", "pid": 1})])
        assignment = answer(control, 10000)
        assert assignment is not None and assignment.type == "assign", assignment
        heartbeats = insider.dealer(address, b"hung-evaluator/hb")
        heartbeats.setsockopt(zmq.SNDHWM, 0)
        flood_until(heartbeats, [packed({"type": "heartbeat", "sender": "hung-evaluator"})],
                    job, "scheduler", "does not read the scheduler's messages")
        assert_all_end(job, job.wait(60), 0)
        assert re.search(r"evaluator 0 \(pid 1 on \?\) does not read the scheduler's "
                         r"messages; the job goes on without it", job.output("scheduler"))


def test_a_worker_that_never_reads_a_server_is_left_behind(tmp_path):
    """A registered worker (this process) that pulls and never reads: the server drops
    it and tells the scheduler, which leaves it behind; the other worker finishes."""
    with Cluster(tmp_path, 1, 2, HEARTBEAT_TIMEOUT) as job:
        job.start("scheduler", "scheduler", ["--on-worker-failure", "continue"])
        job.start("server0", "server")
        job.start("worker0", "worker", worker_args("w0", job))
        address = server_address(job)
        job.wait_for_output("scheduler", "worker registered")
        env = {k: v for k, v in job.env.items() if k.startswith(("DMLC_", "PS_"))}
        node = Node(ClusterEnv.from_environ({**env, "DMLC_ROLE": "worker"}), "worker")
        try:
            assert node.register(device="w1")["rank"] == 1
            node.barrier("workers")  # worker 0 initialised the shard: training starts
            shard_sizes(job)
            stalled = node.context.socket(zmq.DEALER)
            stalled.setsockopt(zmq.IDENTITY, f"{node.uid}/kv".encode())
            stalled.setsockopt(zmq.SNDHWM, 0)
            stalled.setsockopt(zmq.LINGER, 0)
            stalled.connect(address)
            flood_until(stalled, [packed({"type": "pull", "sender": 1, "shard": 0})], job,
                        "server0", "worker 1 does not read its answers")
            stalled.close(linger=0)
            job.wait_for_output("scheduler", "stopped reading server 0's answers")
        finally:
            node.close()
        assert_all_end(job, job.wait(60), 0)
        assert "the job goes on with 1 worker(s)" in job.output("scheduler")
        assert "finished 150 rounds" in job.output("worker0")


# --- 2. another job key ----------------------------------------------------------------
def test_workers_with_another_key_or_none_say_so_and_the_job_ends_by_its_timeout(tmp_path):
    with Cluster(tmp_path, 1, 3, HEARTBEAT_TIMEOUT, env={"ESYNC_JOB_KEY": new_key()}) as job:
        job.start("scheduler", "scheduler", ["--start-timeout", "12"])
        job.start("server0", "server")
        job.start("worker0", "worker", worker_args("w0", job))
        right = job.env["ESYNC_JOB_KEY"]
        job.env["ESYNC_JOB_KEY"] = new_key()
        job.start("worker1", "worker", worker_args("w1", job))
        del job.env["ESYNC_JOB_KEY"]
        job.start("worker2", "worker", worker_args("w2", job))
        job.env["ESYNC_JOB_KEY"] = right
        started = time.monotonic()
        assert job.procs["worker1"].wait(20) == 1
        assert job.procs["worker2"].wait(20) == 1
        assert time.monotonic() - started < 20
        assert "esync: error: worker w1: the scheduler refused our job key: the job's key " \
               "differs from ours" in job.output("worker1")
        # (the mismatch of mechanisms, or, when the scheduler hangs up before saying so,
        # the guess from that)
        assert re.search(r"esync: error: worker w2: the scheduler (requires a job key|hangs "
                         r"up during the handshake: it may require a job key), and this "
                         r"node has none", job.output("worker2")), job.output("worker2")
        job.wait_for_output("scheduler", "a node could not join: its job key differs from "
                                         "the job's", timeout=5)
        codes = job.wait(30)  # the others: by --start-timeout
        assert_all_end(job, codes, 1)
        for name in ("scheduler", "server0", "worker0"):
            assert "the job did not start within --start-timeout 12 s: 1 of 1 server and 1 " \
                   "of 3 workers registered, waiting for 2 more workers" in job.output(name)
        assert "failed to authenticate" in job.output("scheduler")


# --- 3. a job aborted during start-up ----------------------------------------------------
START_UP_ABORTS = {
    "a worker's bad flag": ("worker", ["-b", "-3"], "argument -b/--batch-size: expected a "
                                                    "positive integer, got '-3'"),
    "--checkpoint-every 0": ("server", ["--checkpoint-every", "0"],
                             "argument --checkpoint-every: expected N rounds"),
    "--keep-checkpoints 0": ("server", ["--keep-checkpoints", "0"],
                             "argument --keep-checkpoints: expected a positive integer"),
    "--resume without --checkpoint-dir": ("scheduler", ["--resume", "1"],
                                          "--resume needs --checkpoint-dir"),
    "--resume with an empty --checkpoint-dir": (
        "scheduler", ["--resume", "1", "--checkpoint-dir", "{tmp}/empty"],
        "--resume: cannot read the job id from"),
}


@pytest.mark.parametrize("case", list(START_UP_ABORTS))
def test_a_start_up_abort_ends_the_nodes_started_before_and_after_it(tmp_path, case):
    role, bad, reason = START_UP_ABORTS[case]
    bad = [a.replace("{tmp}", str(tmp_path)) for a in bad]
    os.makedirs(tmp_path / "empty")
    with Cluster(tmp_path, 1, 2, HEARTBEAT_TIMEOUT) as job:
        started = time.monotonic()
        job.start("scheduler", "scheduler", bad if role == "scheduler" else [])
        if role == "scheduler":  # it fails at once; every node comes after it
            job.wait_for_output("scheduler", "staying up")
            before = []
        else:  # one node starts before the bad one, the others after it
            before = ["worker0"]
            job.start("worker0", "worker", worker_args("w0", job))
            job.start("bad", role, bad if role == "server" else worker_args("w1", job, *bad))
            job.wait_for_output("scheduler", "aborting the job")
        for name, node_role in (("server0", "server"), ("worker0", "worker"),
                                ("worker1", "worker")):
            if name in before or (name, node_role) == ("server0", role) or \
                    (name == "worker1" and role == "worker"):
                continue
            job.start(name, node_role, [] if node_role == "server" else
                      worker_args(name.replace("worker", "w"), job))
        codes = job.wait(30)
        assert time.monotonic() - started < 30
        assert_all_end(job, codes)
        for name, code in codes.items():
            assert code != 0, (name, job.output(name))
            assert reason in job.output(name), (name, job.output(name))
        assert codes.get("bad", codes["scheduler"]) == 2  # the one with bad input
        for name in codes:
            if name not in ("bad", "scheduler"):
                assert "esync: error: job aborted: " in job.output(name), job.output(name)


# --- 4. a node that never comes ------------------------------------------------------------
def test_the_scheduler_names_who_is_missing_and_gives_up_after_start_timeout(tmp_path):
    with Cluster(tmp_path, 1, 3, HEARTBEAT_TIMEOUT) as job:
        job.start("scheduler", "scheduler", ["--start-timeout", "15"])
        job.start("server0", "server")
        for w in range(2):
            job.start(f"worker{w}", "worker", worker_args(f"w{w}", job))
        # said every 5 s: within 5 s of the last registration (torch's import, under load)
        job.wait_for_output("scheduler", "2 of 3 workers registered, waiting for 1 more "
                                         "worker (DMLC_NUM_WORKER=3); registered: ",
                            timeout=14)
        codes = job.wait(30)
        assert_all_end(job, codes, 1)
        assert re.search(r"waiting since \d\d:\d\d:\d\d: 1 of 1 server and 2 of 3 workers "
                         r"registered, waiting for 1 more worker \(DMLC_NUM_WORKER=3\); "
                         r"registered: .*worker w0", job.output("scheduler"))
        for name in job.procs:
            assert "the job did not start within --start-timeout 15 s: 1 of 1 server and 2 " \
                   "of 3 workers registered, waiting for 1 more worker" in job.output(name)
        # the server, which starts first, waited long enough to say so
        assert "waiting for the job's other nodes to register" in job.output("server0")


def test_a_registered_node_that_gives_up_ends_the_job_for_the_others(tmp_path):
    """A node's --start-timeout shorter than the scheduler's: once it gives up, the
    others would wait for it; it tells the scheduler, which ends the job."""
    with Cluster(tmp_path, 1, 2, HEARTBEAT_TIMEOUT) as job:
        job.start("scheduler", "scheduler")
        job.start("server0", "server")
        job.start("worker0", "worker", worker_args("w0", job, "--start-timeout", "8"))
        assert job.procs["worker0"].wait(20) == 1
        job.start("worker1", "worker", worker_args("w1", job))  # late: it is told why
        assert_all_say(job, r"worker w0(:| failed:) gave up after --start-timeout 8 s "
                            r"waiting for the job's other nodes to register")
        assert "aborting the job" in job.output("scheduler")


def test_a_node_without_its_scheduler_says_so_and_gives_up(tmp_path):
    """A wrong scheduler address: nothing listens there."""
    with Cluster(tmp_path, 1, 2, HEARTBEAT_TIMEOUT) as job:
        job.env["DMLC_PS_ROOT_PORT"] = str(free_port())  # nobody there
        job.start("worker0", "worker", worker_args("w0", job, "--start-timeout", "7"))
        job.start("server0", "server", ["--start-timeout", "7"])
        codes = job.wait(30)
        assert_all_end(job, codes, 1)
        for name, label in (("worker0", "worker w0"), ("server0", "server (pid")):
            out = job.output(name)
            assert f"[{label}" in out and "waiting for the scheduler at tcp://127.0.0.1:" \
                   f"{job.env['DMLC_PS_ROOT_PORT']}: nothing listens there" in out, out
            assert "gave up after --start-timeout 7 s waiting for the scheduler" in out, out


def test_a_worker_too_many_waits_for_a_place_and_hears_when_the_job_ends(tmp_path):
    """One worker more than DMLC_NUM_WORKER while the job runs: it waits for a dead
    worker's place (none comes), and is told when the job ends instead of losing the
    scheduler."""
    with Cluster(tmp_path, 1, 1, HEARTBEAT_TIMEOUT) as job:
        job.start("scheduler", "scheduler")
        job.start("server0", "server")
        job.start("worker0", "worker", worker_args("w0", job, stop=("--max-rounds", "400")))
        job.wait_for_output("scheduler", "ranks assigned")
        job.start("extra", "worker", worker_args("w1", job))
        job.wait_for_output("scheduler", "waits for a dead worker's place")
        codes = job.wait(60)
        assert_all_end(job, codes, {"scheduler": 0, "server0": 0, "worker0": 0, "extra": 1})
        assert re.search(r"esync: error: job aborted: the job ended before a dead worker's "
                         r"place came free for worker w1 \(pid \d+", job.output("extra"))
        assert "lost the scheduler" not in job.output("extra")


# --- 5. settings that disagree --------------------------------------------------------
def test_a_worker_with_another_dmlc_num_worker_is_refused_and_the_job_ends(tmp_path):
    with Cluster(tmp_path, 1, 2, HEARTBEAT_TIMEOUT) as job:
        job.start("scheduler", "scheduler")
        job.start("server0", "server")
        job.start("worker0", "worker", worker_args("w0", job))
        job.wait_for_output("scheduler", "worker registered")
        job.env["DMLC_NUM_WORKER"] = "3"
        job.start("worker1", "worker", worker_args("w1", job))
        assert_all_say(job, r"DMLC_NUM_WORKER is 3 for worker w1 \(pid \d+ on .*\) but 2 "
                            r"for the scheduler")
        assert "esync: error: the scheduler refused this worker: DMLC_NUM_WORKER is 3" \
            in job.output("worker1")


def test_servers_with_different_modes_are_refused_and_the_job_ends(tmp_path):
    with Cluster(tmp_path, 2, 2, HEARTBEAT_TIMEOUT) as job:
        job.start("scheduler", "scheduler")
        job.start("server0", "server", ["-m", "sync"])
        job.wait_for_output("scheduler", "server registered")
        job.start("server1", "server", ["-m", "async"])
        for w in range(2):
            job.start(f"worker{w}", "worker", worker_args(f"w{w}", job))
        assert_all_say(job, r"-m is async for server \(pid \d+ on .*\) but sync for server "
                            r"\(pid \d+ on .*\)")


def test_a_worker_with_another_network_than_the_scheduler_is_refused(tmp_path):
    with Cluster(tmp_path, 1, 1, HEARTBEAT_TIMEOUT) as job:
        job.start("scheduler", "scheduler", ["-n", "lenet"])
        job.start("server0", "server")
        job.start("worker0", "worker", worker_args("w0", job, "-n", "alexnet"))
        codes = job.wait(30)
        assert_all_end(job, codes, 1)
        assert "-n is alexnet for worker w0" in job.output("worker0")
        assert "but lenet for the scheduler" in job.output("server0")


# --- 6. evaluators are bounded, and dropped when they go quiet ---------------------------
def test_evaluators_are_bounded_and_dropped_when_their_heartbeats_stop(tmp_path):
    from esync.transport.scheduler import MAX_EVALUATORS

    # heartbeats time out after 6 s: the first evaluator is still there when the last
    # of MAX_EVALUATORS + 1 registers (each waits 0.2 s for a refusal)
    with Cluster(tmp_path, 1, 1, 6.0) as job, Attacker() as attacker:
        job.start("scheduler", "scheduler")
        job.wait_for_output("scheduler", "listening")
        address = scheduler_address(job)

        def register(name: str) -> Optional[str]:
            """An evaluator that never sends a heartbeat; the scheduler's refusal, if any."""
            sock = attacker.dealer(address, f"{name}/ctl".encode())
            sock.send_multipart([packed({"type": "register", "sender": name,
                                         "role": "evaluator", "pid": 1})])
            reply = answer(sock, 200)
            return None if reply is None else reply.header.get("error")

        # the job is not complete: admitted evaluators wait, unanswered
        assert [register(f"quiet-{n}") for n in range(MAX_EVALUATORS)] == \
            [None] * MAX_EVALUATORS
        assert "the most it admits" in register("one-too-many")
        job.wait_for_output("scheduler", *[f"evaluator {n} (pid 1 on ?) sent no heartbeat"
                                           for n in range(MAX_EVALUATORS)], timeout=15)
        assert register("after-them") is None  # their places are free again
        assert job.procs["scheduler"].poll() is None
        assert_no_traceback(job.outputs())


def test_the_scheduler_survives_messages_about_settings_and_stalls_from_strangers(tmp_path):
    with Cluster(tmp_path, 1, 1, HEARTBEAT_TIMEOUT) as job, Attacker() as attacker:
        job.start("scheduler", "scheduler")
        job.wait_for_output("scheduler", "listening")
        sock = attacker.dealer(scheduler_address(job))
        for header in ({"type": "stalled", "sender": "x", "uid": "y"},
                       {"type": "stalled", "sender": "x", "uid": ["y"]},
                       {"type": "register", "sender": "z", "role": "worker",
                        "settings": {"-m": ["sync"]}}):
            sock.send_multipart([packed(header)])
            reply = answer(sock, 5000)
            assert reply is not None and reply.type == "error", (header, reply)
        assert job.procs["scheduler"].poll() is None
        assert_no_traceback(job.outputs())

