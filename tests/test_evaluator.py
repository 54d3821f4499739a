"""The evaluator (DMLC_ROLE=evaluator, esync/runtime/evaluator.py): a process apart from training
that pulls the global model every --eval-interval seconds, read-only, and logs its test
accuracy on the training clock. Real jobs of real processes on loopback; and -m local,
which has no evaluator, evaluating in-process by the clock."""
import glob
import io
import json
import os
import re
import signal
import socket
import time
from types import SimpleNamespace

import numpy as np
import pytest

from esync import registry
from esync.cli import main
from esync.comm.kvstore import KVStore
from esync.transport.cluster import ClusterEnv
from esync.transport.node import JobAborted, Node
from esync.launch import local
from tests.cluster import Cluster
from tests.helpers import CLUSTER_VARIABLES

EVALUATOR = registry.EVALUATOR
CHANCE = 0.1  # ten classes
TRAIN = ["-m", "sync", "-n", "lenet"]


def records(folder):
    """The iteration records of one device folder, in round order (all must be there)."""
    count = len(glob.glob(os.path.join(folder, "iter-*.json")))
    return [json.load(open(os.path.join(folder, f"iter-{n}.json")))
            for n in range(1, count + 1)]


def evaluator_records(log_dir):
    return records(os.path.join(log_dir, socket.gethostname(), EVALUATOR))


def wait_for(condition, what, timeout=60, procs=()):
    """Poll `condition` until it holds; fail after `timeout` s or if one of `procs`
    ended meanwhile."""
    deadline = time.monotonic() + timeout
    while not condition():
        ended = {p.pid: p.returncode for p in procs if p.poll() is not None}
        assert not ended, f"processes ended while waiting for {what}: {ended}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.05)


def check_evaluator_log(log):
    """What every evaluator log holds: the workers' format, one line per evaluation,
    on the training clock."""
    assert len(log) >= 3, log
    times = [r["total_time"] for r in log]
    assert times == sorted(times) and len(set(times)) == len(times), times  # increasing
    rounds = [r["round"] for r in log]
    assert rounds == sorted(rounds), rounds  # the model only moves forward
    for n, r in enumerate(log, 1):
        assert r["num_iters"] == n and r["num_samples"] == 0 and r["loss"] is None
        assert 0.0 <= r["accuracy"] <= 1.0
        assert set(r["time"]["0"]) == {"pull", "evaluate"}
        assert r["bytes_sent"] > 0 and r["bytes_received"] > 4 * 62158  # the whole model
    assert max(r["accuracy"] for r in log) > CHANCE + 0.5  # it learns, and it is seen


@pytest.mark.slow  # a whole job of real processes
def test_evaluator_started_before_the_servers_logs_the_global_model(tmp_path):
    """Scheduler and evaluator first; the server and the workers only once the evaluator
    has registered. The evaluator waits for them, evaluates the model on the training
    clock, and sees exactly what worker 0 sees (which evaluates every round here)."""
    with Cluster(tmp_path, num_servers=1, num_workers=2) as job:
        job.start("scheduler", "scheduler")
        job.start(EVALUATOR, EVALUATOR, [*TRAIN, "--eval-interval", "0.2", "-ld", job.log_dir])
        job.wait_for_output("scheduler", "evaluator registered")
        assert not os.path.exists(os.path.join(job.log_dir, socket.gethostname(), EVALUATOR,
                                               "iter-1.json"))  # nothing to evaluate yet
        job.start("server0", "server", ["-c", "1"])
        for w in range(2):
            job.start(f"worker{w}", "worker", [*TRAIN, "--max-rounds", "40", "-e", "1",
                                               "--device-name", f"w{w}", "-ld", job.log_dir])
        # it computes at a lower priority (niceness) than the workers, started as it was
        job.wait_for_output(EVALUATOR, "[evaluator] evaluating")
        niceness = {name: os.getpriority(os.PRIO_PROCESS, job.procs[name].pid)
                    for name in (EVALUATOR, "worker0")}
        assert niceness[EVALUATOR] == min(19, niceness["worker0"] + 10), niceness
        assert f"at niceness {niceness[EVALUATOR]};" in job.output(EVALUATOR)
        codes = job.wait()
        assert codes == {name: 0 for name in job.procs}, \
            {n: job.output(n)[-800:] for n, c in codes.items() if c != 0}

        log = evaluator_records(job.log_dir)
        check_evaluator_log(log)
        # (its first pull waited until worker 0 gave the server the initial model: it
        # may see round 0 before or after training started, whoever was quicker)
        assert all(r["total_time"] > 0 for r in log[1:])
        assert log[-1]["round"] <= 40
        out = job.output(EVALUATOR)
        assert f"[evaluator] the job ended; {len(log)} evaluations" in out
        assert len(re.findall(r"test accuracy", out)) == len(log)

        # the model of round r is the same for the evaluator and for worker 0
        workers = {w: records(os.path.join(job.log_dir, socket.gethostname(), f"w{w}"))
                   for w in range(2)}
        # (--max-rounds: every worker stops after round 40, none told)
        assert [len(rounds) for rounds in workers.values()] == [40, 40]
        rank0 = [w for w in workers if "accuracy" in workers[w][-1]]
        assert len(rank0) == 1  # worker 0 alone evaluates
        by_round = {r["num_iters"]: r["accuracy"] for r in workers[rank0[0]]}
        assert sorted(by_round) == list(range(1, 41))
        seen = [(r["round"], r["accuracy"], by_round[r["round"]]) for r in log
                if r["round"] >= 1]
        assert seen
        # a pull that comes mid-round waits for its end: never the round's weights with
        # the previous round's BatchNorm statistics (a mix that, in one CI run under load,
        # differed from worker 0's accuracy by more than 0.03)
        assert all(mine == worker0 for _, mine, worker0 in seen), seen
        # the clock: training lasted as long as the workers say, the evaluator's times
        # lie within it
        end = max(rounds[-1]["total_time"] for rounds in workers.values())
        assert log[-1]["total_time"] <= end + 1.0
        assert "evaluator registered" in job.output("scheduler")
        assert "all 4 nodes are done" in job.output("scheduler")  # it confirmed the end


WEIGHTS = np.linspace(-1, 1, 1000).astype(np.float32)
BUFFERS = np.arange(6, dtype=np.float32)
RULE = {"name": "sync", "num_workers": 1, "lr": 0.5}


@pytest.mark.slow  # a scheduler and a server as real processes
def test_the_server_refuses_an_evaluator_s_push_and_init_and_serves_on(tmp_path):
    with Cluster(tmp_path, num_servers=1, num_workers=1) as job:
        job.start("scheduler", "scheduler")
        job.start("server0", "server")
        env = {k: v for k, v in job.env.items() if k.startswith(("DMLC_", "PS_"))}
        worker = Node(ClusterEnv.from_environ({**env, "DMLC_ROLE": "worker"}), "worker")
        evaluator = Node(ClusterEnv.from_environ({**env, "DMLC_ROLE": EVALUATOR}), EVALUATOR)
        stores = []

        def store(node, rank):
            kv = KVStore(node, servers, rank, len(WEIGHTS), len(BUFFERS))
            stores.append(kv)
            return kv

        try:
            servers = worker.register()["servers"]
            # an evaluator joins at any time, and is told where the servers are
            assert evaluator.register()["servers"] == servers
            kv = store(worker, 0)
            kv.init(RULE, WEIGHTS, BUFFERS)
            params, buffers = np.zeros_like(WEIGHTS), np.zeros_like(BUFFERS)

            with pytest.raises(JobAborted, match="server 0 refused a request: the evaluator "
                                                 "may only pull, not init"):
                store(evaluator, EVALUATOR).init(RULE, WEIGHTS * 0, BUFFERS * 0)
            with pytest.raises(JobAborted, match="server 0 refused a request: the evaluator "
                                                 "may only pull, not push"):
                store(evaluator, EVALUATOR).push_pull(1, np.ones_like(WEIGHTS), BUFFERS * 9,
                                                      params, buffers)
            reader = store(evaluator, EVALUATOR)
            reader.pull(params, buffers)
            np.testing.assert_array_equal(params, WEIGHTS)  # nothing of it was applied
            np.testing.assert_array_equal(buffers, BUFFERS)
            assert reader.model_round == 0 and reader.bytes_received > WEIGHTS.nbytes

            # the worker's round 1 is still round 1 (the evaluator's push took no part)
            kv.push_pull(1, np.ones_like(WEIGHTS), BUFFERS * 2, params, buffers)
            np.testing.assert_allclose(params, WEIGHTS - 0.5)
            reader.pull(params, buffers)
            np.testing.assert_allclose(params, WEIGHTS - 0.5)
            np.testing.assert_array_equal(buffers, BUFFERS * 2)
            assert reader.model_round == 1
            worker.finish()
            # the scheduler shuts the evaluator down with the servers
            wait_for(lambda: evaluator.shutdown_requested, "shutdown of the evaluator",
                     timeout=20)
        finally:
            for kv in stores:
                kv.close()
            worker.close()
            evaluator.close()
        codes = job.wait(30)
        assert codes == {"scheduler": 0, "server0": 0}, job.output("scheduler")
        server = job.output("server0")
        assert "the evaluator may only pull, not init" in server
        assert "the evaluator may only pull, not push" in server
        assert "all 3 nodes are done" in job.output("scheduler")


@pytest.mark.slow  # a whole job of real processes, trained to an accuracy
def test_the_evaluator_ends_the_job_once_the_target_has_held(tmp_path):
    out = io.StringIO()
    code = local.run([*TRAIN, "--workers", "2", "--out", str(tmp_path), "--eval-interval",
                      "0.2", "--target-accuracy", "0.9", "--target-hold", "0.5",
                      "--time-limit", "60"], progress=False, out=out)
    host = tmp_path / "lenet" / "sync" / socket.gethostname()
    assert code == 0, out.getvalue() + (host / "evaluator.log").read_text()
    said = (host / "evaluator.log").read_text()
    decided = re.search(r"reached target accuracy 0\.9 \(held 0\.5 s\) at ([0-9.]+)s: "
                        r"ending the job", said)
    assert decided, said
    at = float(decided.group(1))

    log = evaluator_records(str(host.parent))
    check_evaluator_log(log)
    # every evaluation of the last 0.5 s before the decision was at the target
    before = [r for r in log if r["total_time"] < at + 0.005]  # (it says at to 0.01 s)
    assert before[-1]["total_time"] == pytest.approx(at, abs=0.005)
    streak = []
    for r in reversed(before):
        if r["accuracy"] < 0.9:
            break
        streak.append(r["total_time"])
    assert streak and at - min(streak) >= 0.5, before
    assert len(streak) < len(before)  # it was below the target once (it did start low)

    for device in ("w0", "w1"):
        worker_said = (host / device / "worker.log").read_text()
        assert "the evaluator reached target accuracy 0.9 (held 0.5 s)" in worker_said, \
            worker_said
        rounds = records(str(host / device))
        # ended by the evaluator, long before the time limit, soon after the decision
        assert at <= rounds[-1]["total_time"] < 30
    assert "the evaluator ends the job" in (host / "server0.log").read_text()


@pytest.mark.slow  # a whole job of real processes
def test_a_dying_evaluator_does_not_end_the_job(tmp_path):
    # a heartbeat timeout of 3 s, as the other fault tests': at 1.5 s, a worker importing
    # torch._dynamo (its first optimizer) on a loaded 2-core machine missed it, and the
    # scheduler aborted the job before the evaluator was killed
    with Cluster(tmp_path, num_servers=1, num_workers=2, heartbeat_timeout=3.0) as job:
        job.start("scheduler", "scheduler")
        job.start("server0", "server", ["-c", "1"])
        for w in range(2):
            job.start(f"worker{w}", "worker", [*TRAIN, "--time-limit", "6", "-e", "0",
                                               "--device-name", f"w{w}", "-ld", job.log_dir])
        victim = job.start(EVALUATOR, EVALUATOR, [*TRAIN, "--eval-interval", "0.2",
                                                  "-ld", job.log_dir])
        folder = os.path.join(job.log_dir, socket.gethostname(), EVALUATOR)
        # mid-run: once it has evaluated the model of a round that trained
        wait_for(lambda: os.path.exists(os.path.join(folder, "iter-2.json")),
                 "evaluation of a trained model", procs=job.procs.values())
        victim.send_signal(signal.SIGKILL)
        codes = job.wait()
        assert codes == {"scheduler": 0, "server0": 0, "worker0": 0, "worker1": 0,
                         EVALUATOR: -signal.SIGKILL}, \
            {n: job.output(n)[-800:] for n in job.procs}
        for w in range(2):
            assert "reached the time limit of 6 s" in job.output(f"worker{w}")
        scheduler = job.output("scheduler")
        named = f"evaluator 0 (pid {victim.pid} on {socket.gethostname()})"
        # the scheduler noticed (while training went on: "the job goes on without it";
        # or, had the workers finished first, when it did not confirm the shutdown)
        assert f"{named} sent no heartbeat for 3 s; the job goes on without it" \
            in scheduler or f"{named} did not confirm the shutdown" in scheduler, scheduler
        assert "aborting" not in scheduler
        assert "all 2 workers finished" in scheduler


def test_local_mode_evaluates_by_the_clock(tmp_path, capsys, monkeypatch):
    """-m local has no evaluator: with -e 0 it evaluates itself, after the first round
    that ends --eval-interval seconds of training after the last evaluation."""
    for var in CLUSTER_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    capsys.readouterr()
    code = main(["-m", "local", "-n", "lenet", "-e", "0", "--eval-interval", "0.3",
                 "--time-limit", "3", "-ld", str(tmp_path)], prog="main.py")
    out = SimpleNamespace(**dict(zip(("out", "err"), capsys.readouterr())))
    assert code == 0, out.err
    log = records(os.path.join(str(tmp_path), socket.gethostname(), "cpu"))
    assert "reached the time limit of 3 s" in out.out
    evaluated = [r for r in log if "accuracy" in r]
    assert 6 <= len(evaluated) <= 10, [r["total_time"] for r in evaluated]
    assert len(log) >= 3 * len(evaluated)  # a round is one iteration: not every round
    last = 0.0
    for r in evaluated:
        n = r["num_iters"]
        assert r["total_time"] - last >= 0.3 - 0.01, (n, r["total_time"], last)
        if n > 1:  # ... and the round before it had not reached the interval yet
            assert log[n - 2]["total_time"] - last < 0.3 + 0.01
        assert 0.0 <= r["accuracy"] <= 1.0
        last = r["total_time"]
    assert evaluated[-1]["accuracy"] > CHANCE + 0.5
    assert log[-1]["total_time"] == pytest.approx(3.0, abs=0.5)  # the pauses left out
