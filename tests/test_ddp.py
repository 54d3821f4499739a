"""The DDP baseline (`-m ddp`, esync/algorithms/ddp/worker.py): PyTorch DistributedDataParallel
over gloo, as real processes on loopback, started by esync/launch/local.py (with its
evaluator) or by hand with torch.distributed's variables (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT)."""
import glob
import io
import json
import os
import socket
import statistics
import subprocess
import sys
import time

import pytest

from esync.comm.link import Link
from esync.infra.clock import Slowdown, lower_quartile
from esync.launch import local
from esync.launch.supervisor import free_port
from tests.helpers import CLUSTER_VARIABLES, MAIN, REPO, assert_breakdown

pytestmark = pytest.mark.slow  # whole jobs of real processes

LENET_WEIGHTS = 62158
STEP_BYTES = Link.ring_allreduce_bytes(4 * LENET_WEIGHTS, 2)  # per rank and step, each way
COMPUTE = ("forward and backward", "local update")  # what --slowdown scales


def records(folder):
    count = len(glob.glob(os.path.join(folder, "iter-*.json")))
    return [json.load(open(os.path.join(folder, f"iter-{n}.json")))
            for n in range(1, count + 1)]


class DDPJob:
    """Ranks of one DDP job started by hand, each with its own flags; none outlives it."""

    def __init__(self, folder, rank_args, common=(), timeout=180):
        self.dir = str(folder)
        self.log_dir = os.path.join(self.dir, "logs")
        env = {k: v for k, v in os.environ.items() if k not in CLUSTER_VARIABLES}
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONFAULTHANDLER="1",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                   WORLD_SIZE=str(len(rank_args)))
        self.procs = []
        try:
            for rank, extra in enumerate(rank_args):
                with open(self.out_path(rank), "w") as out:
                    self.procs.append(subprocess.Popen(
                        [sys.executable, MAIN, "-m", "ddp", "-n", "lenet", *common, *extra,
                         "--device-name", f"r{rank}", "-ld", self.log_dir],
                        cwd=REPO, env=dict(env, RANK=str(rank)), stdout=out,
                        stderr=subprocess.STDOUT))
            deadline = time.monotonic() + timeout
            self.codes = []
            for proc in self.procs:
                try:
                    self.codes.append(proc.wait(max(0.1, deadline - time.monotonic())))
                except subprocess.TimeoutExpired:
                    self.codes.append(None)
        finally:
            for proc in self.procs:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()

    def out_path(self, rank):
        return os.path.join(self.dir, f"rank{rank}.out")

    def output(self, rank):
        with open(self.out_path(rank)) as f:
            return f.read()

    def rounds(self, rank):
        return records(os.path.join(self.log_dir, socket.gethostname(), f"r{rank}"))

    def check_ok(self):
        assert self.codes == [0] * len(self.procs), \
            {r: self.output(r)[-1000:] for r in range(len(self.procs))}


def aggregate(rounds):
    """The median `global aggregate` of the rounds after the first (the first one also
    waits for the other rank to finish setting up)."""
    return statistics.median(r["time"]["0"]["global aggregate"] for r in rounds[1:])


@pytest.fixture(scope="module")
def unpaced(tmp_path_factory):
    """Two ranks by hand, 20 rounds, no emulated link."""
    return DDPJob(tmp_path_factory.mktemp("unpaced"), [[], []],
                  ["--max-rounds", "20", "-e", "0"])


def test_two_ranks_started_by_hand_train_the_same_rounds(unpaced):
    unpaced.check_ok()
    rank0, rank1 = unpaced.rounds(0), unpaced.rounds(1)
    assert [r["num_iters"] for r in rank0] == [r["num_iters"] for r in rank1] \
        == list(range(1, 21))
    assert "finished 20 rounds after 20 rounds" in unpaced.output(0)
    assert "rank 0 ended the job after 20 rounds" in unpaced.output(1)
    # each rank trains its own half of the data, one batch a round
    for r0, r1 in zip(rank0, rank1):
        assert r0["num_samples"] == r1["num_samples"] == 64
        assert r0["epoch"] == pytest.approx(r1["epoch"], rel=0.01)
    for rounds in (rank0, rank1):
        assert_breakdown(rounds)
        for r in rounds:
            assert r["time"]["0"]["global aggregate"] > 0
            assert r["bytes_sent"] == r["bytes_received"] == STEP_BYTES


def test_a_slow_link_on_one_rank_slows_every_rank_s_all_reduce(unpaced, tmp_path):
    """--bandwidth 10 --latency 5 on rank 1: its all-reduce of lenet's gradients is held
    for their ring bytes at 10 Mbit/s and 2 steps of 5 ms; rank 0 waits for it in the
    ring."""
    unpaced.check_ok()
    paced = DDPJob(tmp_path, [[], ["--bandwidth", "10", "--latency", "5"]],
                   ["--max-rounds", "10", "-e", "0"])
    paced.check_ok()
    hold = STEP_BYTES * 8 / 10e6 + 2 * 0.005  # 0.209 s
    for rank in (0, 1):
        before, after = aggregate(unpaced.rounds(rank)), aggregate(paced.rounds(rank))
        assert after - before > 0.7 * hold, (rank, before, after)
        assert after < before + 1.5 * hold + 0.1, (rank, before, after)
        assert len(paced.rounds(rank)) == 10
    # the hold is communication, not computing (counted there, computing would be more
    # than the hold itself)
    computing = [sum(r["time"]["0"][p] for p in COMPUTE) for r in paced.rounds(1)[1:]]
    assert statistics.median(computing) < hold


def test_slowdown_scales_computing_not_the_all_reduce(tmp_path):
    """--slowdown 10 on rank 0: each step's computing (forward and backward + local update:
    not the batch's loading, a slower accelerator's data loads as fast) is made to last
    10 times the lower quartile of the last 15 steps' computing CPU time (compute_cpu),
    never counting the time it spent waiting in the all-reduce: here that is long, as
    rank 1's link is slow. (10, not 3: a step computes on ~10 ms of CPU, and on a loaded
    2-core CI machine each of the 10 steps' wall computing once exceeded 3 times that, so
    none waited; CI on d84746c. The link at 5 Mbit/s, not 10: a step's CPU on a loaded
    CI machine was 25 ms, and 10 times that outlasted the all-reduce's 0.2 s; CI on
    1afd781.)"""
    job = DDPJob(tmp_path, [["--slowdown", "10"], ["--bandwidth", "5"]],  # 0.4 s a step
                 ["--max-rounds", "10", "-e", "0", "--num-threads", "1"])
    job.check_ok()
    rounds = job.rounds(0)
    assert len(rounds) == 10
    rule, waited = Slowdown(10, seed=0), []  # the rule, replayed on the logged steps
    for r in rounds:
        phases = r["time"]["0"]
        computed = sum(phases[p] for p in COMPUTE)
        (cpu,) = r["compute_cpu"]
        # (not bounded by `computed`: the thread's CPU during the all-reduce's window,
        # taken out of the wall time, stays in it: 10.3 ms against 8.9 in one run)
        assert cpu > 0
        # part of the wait came before the computing, as rank 0's draws make it
        assert r["slowdown_ahead"] == [pytest.approx(rule.ahead_of_computing(), abs=1e-5)]
        expected = rule.due(computed, cpu_seconds=cpu)
        assert phases["slowdown"] == pytest.approx(expected, abs=1e-4), (r["num_iters"], phases)
        waited.append(phases["slowdown"])
        # what counting the all-reduce would give: no wait at all (from the second
        # step: the first's window holds the warm-up alone)
        if len(rule.recent) > 1:
            assert computed + phases["global aggregate"] > 10 * lower_quartile(rule.recent)
    assert sum(waited) > 0
    assert aggregate(rounds) > 0.1  # rank 0 did wait for rank 1 in the all-reduce
    assert all("slowdown" not in r["time"]["0"] for r in job.rounds(1))
    assert all("compute_cpu" not in r for r in job.rounds(1))


def test_launched_ddp_reaches_90_percent_measured_by_the_evaluator(tmp_path):
    """The issue's check: 2 processes train lenet on digits to 0.90, as the evaluator
    measures it; it also ends the job there (--target-accuracy)."""
    out = io.StringIO()
    code = local.run(["-m", "ddp", "--workers", "2", "-n", "lenet", "--out", str(tmp_path),
                      "--target-accuracy", "0.9", "--time-limit", "60",
                      "--eval-interval", "0.2"], progress=False, out=out)
    host = tmp_path / "lenet" / "ddp" / socket.gethostname()
    logs = {str(p.relative_to(host)): p.read_text() for p in host.rglob("*.log")}
    assert code == 0, (out.getvalue(), logs)
    evaluator = records(str(host / "evaluator"))
    accuracies = [r["accuracy"] for r in evaluator]
    assert max(accuracies) >= 0.90, accuracies
    times = [r["total_time"] for r in evaluator]
    assert times == sorted(times) and times[-1] < 60
    assert [r["round"] for r in evaluator] == sorted(r["round"] for r in evaluator)
    assert all(r["num_samples"] == 0 for r in evaluator)
    assert "reached target accuracy 0.9" in logs["evaluator.log"]
    # rank 0 (w0, started first) heard it from the evaluator and told rank 1
    assert "the evaluator reached target accuracy 0.9 after" in logs["w0/worker.log"]
    assert "rank 0 ended the job after" in logs["w1/worker.log"]
    workers = {device: records(str(host / device)) for device in ("w0", "w1")}
    assert len(workers["w0"]) == len(workers["w1"]) >= 2
    for rounds in workers.values():
        for r in rounds:
            assert "global aggregate" in r["time"]["0"]
            assert r["bytes_sent"] == r["bytes_received"] == STEP_BYTES
            assert "accuracy" not in r  # the evaluator measures, not the ranks
        # the job ended at the evaluator's word, long before the time limit
        assert times[-1] - 1 < rounds[-1]["total_time"] < 30


def test_a_rank_waiting_in_a_collective_does_not_log_the_wait_as_computing(tmp_path):
    """Rank 0 acts 16x slower: rank 1 waits for it at the start of every forward, in the
    broadcast of BatchNorm's buffers from rank 0 (DDP's default), and in the all-reduce.
    Both waits are communication: rank 1's logged computing stays that of its own batch
    (about what rank 0 logs, computing the same), not the 15 computing times rank 0
    sleeps; counted as computing, a slowdown would multiply it. (With 8x, CI's shared
    cores once made rank 1's own batch take 2x rank 0's: 0.0223 s against a bound of
    0.0221; 16x keeps the two outcomes far apart. Then rank 1's batch against a quarter of
    rank 0's sleep: CI's machine once stretched walls 4x the CPU time the sleep is made
    of, 0.029 s against 0.026; now against rank 0's own batch plus half its sleep.)"""
    job = DDPJob(tmp_path, [["--slowdown", "16"], []], ["--max-rounds", "20", "-e", "0"])
    job.check_ok()
    slow, fast = job.rounds(0)[2:], job.rounds(1)[2:]  # after 2 warming-up steps

    def median(rounds, phase):
        return statistics.median(r["time"]["0"][phase] for r in rounds)

    slept = median(slow, "slowdown")
    assert median(fast, "forward and backward") < 4 * median(slow, "forward and backward") + 0.005
    # counted as computing, rank 1's forward and backward would hold the whole of rank 0's
    # sleep besides its own batch; a crowded machine stretches both ranks' batches alike
    # (the sleep is (16 - 1) x rank 0's CPU time, not its wall time: CI's walls ran 4x it)
    assert median(fast, "forward and backward") < (
        median(slow, "forward and backward") + 0.5 * slept)
    assert median(fast, "global aggregate") > 0.5 * slept  # it did wait, as communication


def test_torchrun_starts_the_ranks_and_they_stop_together(tmp_path):
    """torchrun (--standalone: its agent hosts the store on a free port) starts two ranks
    with the same flags; rank 0's time limit ends both after the same round, the other
    rank reading the decision from the agent's store."""
    env = {k: v for k, v in os.environ.items() if k not in CLUSTER_VARIABLES}
    env.update(OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    log_dir = tmp_path / "logs"
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         "2", MAIN, "-m", "ddp", "-n", "lenet", "--time-limit", "3", "-e", "0",
         "--num-threads", "1", "-ld", str(log_dir)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    assert proc.returncode == 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    host = log_dir / socket.gethostname()
    rank0, rank1 = records(str(host / "cpu-rank0")), records(str(host / "cpu-rank1"))
    assert len(rank0) == len(rank1) >= 2
    assert "reached the time limit of 3 s" in output
    assert "rank 0 ended the job" in output
