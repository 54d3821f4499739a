"""Speed-balanced DDP (`-m ddp --balance-batches 1`, esync/algorithms/ddp/balanced.py): the
batches' arithmetic in-process, the gradient weighing in a real gloo group of two
processes, and whole jobs of real processes on loopback."""
import io
import json
import os
import socket
import statistics
import subprocess
import sys
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch import nn

from esync.algorithms.ddp.balanced import BalancedDDPWorker as BalancedDDP, apportion, \
    fastest_keeps
from esync.algorithms.base import Job
from esync.comm.link import Link
from esync.launch import local
from tests.helpers import REPO, assert_no_traceback, run_main
from tests.test_ddp import DDPJob, records

# --- apportion: in proportion, at least the floor, summing to the global batch ------------


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(0.01, 1000.0), min_size=1, max_size=16), st.integers(1, 16),
       st.integers(0, 400))
# speeds an ulp apart whose shares come out equal: the faster rank gets the extra sample
@example([283.0, 976.0, 1000.0, 1000.0, 1000.0, 999.9999999999999, 1000.0], 2, 103)
def test_batches_sum_to_the_global_batch_none_below_the_floor(speeds, floor, extra):
    total = floor * len(speeds) + extra
    batches = apportion(total, speeds, floor)
    assert sum(batches) == total
    assert min(batches) >= floor
    # a faster rank never gets a smaller batch
    for (s1, b1), (s2, b2) in zip(sorted(zip(speeds, batches)), sorted(zip(speeds, batches))[1:]):
        assert s1 == s2 or b1 <= b2, (speeds, batches)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.5, 2.0), min_size=2, max_size=8), st.integers(200, 2000))
def test_batches_are_in_proportion_where_the_floor_does_not_bind(speeds, total):
    batches = apportion(total, speeds, 1)
    for speed, batch in zip(speeds, batches):
        assert abs(batch - total * speed / sum(speeds)) < 1  # rounding only


def test_batches_of_the_issue_s_clusters():
    assert apportion(256, [4, 4, 1, 1], 8) == [102, 102, 26, 26]
    assert apportion(256, [16, 16, 16, 1], 8) == [83, 83, 82, 8]  # the slow one at the floor
    assert apportion(16, [1, 5], 8) == [8, 8]
    with pytest.raises(ValueError):
        apportion(15, [1, 1], 8)


def test_the_fastest_keeps_its_batch_and_the_others_add_what_they_compute_meanwhile():
    """--global-batch fastest: one device at 1, three at 1/2 (bench/mixed.py's 2x3 cell):
    80 samples a step where the fast one takes 32, bench/oracle.py's batch at an ideal of
    2.5; where the floor would make the slowest rank's step longer, every rank computes
    for as long as it needs for the floor."""
    assert fastest_keeps([32] * 4, [2, 1, 1, 1], 8) == 80
    assert apportion(80, [2, 1, 1, 1], 8) == [32, 16, 16, 16]
    assert fastest_keeps([32] * 8, [1] + [0.25] * 7, 8) == 88  # 4x7: the slow ones at 8
    assert fastest_keeps([32] * 8, [1] + [1 / 16] * 7, 2) == 46  # 16x7 at a floor of 2
    # 16x7 at the floor of 8: a slow rank's 8 samples take as long as 128 of the fast one's
    assert fastest_keeps([32] * 8, [1] + [1 / 16] * 7, 8) == 184
    assert apportion(184, [1] + [1 / 16] * 7, 8) == [128] + [8] * 7
    assert fastest_keeps([32, 64], [1, 4], 8) == 80  # the fastest's own loader's batch


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize("flags, line", [
    (["--balance-batches", "1"], "--balance-batches applies to -m ddp only, not -m local"),
    (["--global-batch", "fastest"],
     "--global-batch fastest applies to -m ddp only, not -m local"),
])
def test_balanced_ddp_s_flags_with_another_mode_are_one_line(flags, line):
    result = run_main(["-m", "local", *flags, "--max-rounds", "1"], timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [f"main.py: error: {line}"]


def refused_by_the_launcher(tmp_path, flags):
    """The local launcher's stderr for `-m ddp --workers 2 FLAGS`, which it refuses (exit
    2) with one line before anything starts."""
    proc = subprocess.run([sys.executable, os.path.join(REPO, "src", "esync", "launch", "local.py"), "-m",
                           "ddp", *flags, "--workers", "2", "--out", str(tmp_path)],
                          cwd=REPO, text=True, capture_output=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "lenet").exists()
    return proc.stderr


def test_a_global_batch_without_balanced_batches_is_refused_before_anything_starts(tmp_path):
    stderr = refused_by_the_launcher(tmp_path, ["--global-batch", "fastest"])
    assert stderr.strip().splitlines()[-1].endswith(
        "--global-batch fastest needs --balance-batches 1 (plain DDP's ranks each take -b)")


def test_a_floor_above_the_batch_is_refused_before_anything_starts(tmp_path):
    stderr = refused_by_the_launcher(tmp_path, ["--balance-batches", "1", "--min-batch", "100"])
    assert "--min-batch 100 is more than -b 64" in stderr


# --- the gradient: weighed so that DDP's average is the global batch's mean ---------------

INPUTS = torch.linspace(-1, 1, 8 * 4).reshape(8, 4)
LABELS = torch.tensor([0, 1, 2, 0, 1, 2, 2, 1])
BATCHES = [3, 5]  # rank 0 trains on the first 3 samples, rank 1 on the other 5


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))


def _rank(rank, port, out):
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    try:
        ddp = BalancedDDP(Job(None, rank, 2, [], "test", store=store), 0, Link(), None,
                          batch_size=4, min_batch=1)
        model = _model()
        ddp.setup(model, torch.device("cpu"))
        ddp.use(BATCHES)
        start = sum(BATCHES[:rank])
        rows = slice(start, start + ddp.batch_size())
        F.cross_entropy(ddp.training_module(model)(INPUTS[rows]), LABELS[rows]).backward()
        torch.save({n: p.grad.clone() for n, p in model.named_parameters()},
                   os.path.join(out, f"rank{rank}.pt"))
        ddp.finish()
    finally:
        dist.destroy_process_group()


def test_the_all_reduced_gradient_is_the_global_batch_s_mean(tmp_path):
    store = dist.TCPStore("127.0.0.1", 0, 3, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=60))
    mp.spawn(_rank, args=(store.port, str(tmp_path)), nprocs=2, join=True)
    model = _model()
    F.cross_entropy(model(INPUTS), LABELS).backward()  # the mean over all 8 samples
    unweighted = {}  # what DDP's plain average of the two batch means would be
    for rows in (slice(0, 3), slice(3, 8)):
        part = _model()
        F.cross_entropy(part(INPUTS[rows]), LABELS[rows]).backward()
        for n, p in part.named_parameters():
            unweighted[n] = unweighted.get(n, 0) + p.grad / 2
    for rank in (0, 1):
        grads = torch.load(os.path.join(tmp_path, f"rank{rank}.pt"), weights_only=True)
        for n, p in model.named_parameters():
            torch.testing.assert_close(grads[n], p.grad, rtol=1e-5, atol=1e-6)
            assert not torch.allclose(grads[n], unweighted[n], rtol=1e-3, atol=1e-5), n


# --- whole jobs ----------------------------------------------------------------------------


def _batches(rounds):
    return [r["batch_sizes"] for r in rounds]


@pytest.mark.slow
def test_balanced_ddp_trains_to_90_percent_no_batch_below_the_floor(tmp_path):
    """4 workers, one 16x slower, -b 16 (a global batch of 64): its share would be 1 or 2
    samples; it gets the floor of 8, the others the rest. The evaluator measures 0.90."""
    out = io.StringIO()
    code = local.run(["-m", "ddp", "--balance-batches", "1", "--workers", "4",
                      "--slowdown", "1,1,1,16", "-b", "16", "-n", "lenet",
                      "--out", str(tmp_path), "--target-accuracy", "0.9",
                      "--time-limit", "90"], progress=False, out=out)
    host = tmp_path / "lenet" / "ddp-balanced" / socket.gethostname()
    logs = {str(p.relative_to(host)): p.read_text() for p in host.rglob("*.log")}
    assert code == 0, (out.getvalue(), logs)
    assert_no_traceback(logs)
    accuracies = [r["accuracy"] for r in records(str(host / "evaluator"))]
    assert max(accuracies) >= 0.90, accuracies
    ranks = [records(str(host / device)) for device in ("w0", "w1", "w2", "w3-x16")]
    assert len({len(rounds) for rounds in ranks}) == 1
    for k, rounds in enumerate(ranks):
        for r in rounds:
            assert sum(r["batch_sizes"]) == 64 and min(r["batch_sizes"]) >= 8, r
            assert r["num_samples"] == r["batch_sizes"][k]
        assert _batches(rounds) == _batches(ranks[0])  # every rank agrees
    assert ranks[0][0]["batch_sizes"] == [16] * 4  # it starts as plain DDP
    assert [8] == sorted({r["batch_sizes"][3] for r in ranks[3][-10:]})
    assert "batches" in logs["w0/worker.log"]


#: the phases of a step that the balancer counts as its computing (esync.runtime.session's
#: iteration_timed: the batch's fetch, forward and backward, the update, the slowdown)
COMPUTING = ("get_batch", "forward and backward", "local update", "slowdown")


def seconds_per_sample(records):
    """Each round's computing seconds per sample, from a rank's log (one step a round)."""
    return [sum(r["time"]["0"].get(p, 0.0) for p in COMPUTING) / r["num_samples"]
            for r in records]


@pytest.mark.slow
@pytest.mark.alone
def test_a_4x_faster_worker_settles_at_about_4x_the_batch(tmp_path):
    """--slowdown 2,8 by hand (both devices slowed, so that the emulation's CPU time
    measures each: a worker at 1 would take the other's load on the machine's cores in
    full), -b 512 (a global batch of 1,024), three estimates of the workers' speeds
    (after rounds 10, 20 and 30). Each estimate's batches are in the ratio of the two
    workers' speeds as their own logs measured them (the median of their last 20
    rounds' computing seconds per sample), within 5%; and the fast worker gets several
    times the slow one's batch (4 by the factors; the emulation's own spread aside)."""
    job = DDPJob(tmp_path, [["--slowdown", "2"], ["--slowdown", "8"]],
                 ["--balance-batches", "1", "-b", "512", "--max-rounds", "31", "-e", "0",
                  "--num-threads", "1"])
    job.check_ok()
    assert_no_traceback({k: job.output(k) for k in (0, 1)})
    batches = _batches(job.rounds(0))
    assert len(batches) == len(job.rounds(1)) == 31
    assert all(sum(b) == 1024 for b in batches)
    assert batches[:10] == [[512, 512]] * 10  # plain DDP until the first estimate
    per_sample = [seconds_per_sample(job.rounds(k)) for k in (0, 1)]
    for estimate in (10, 20, 30):  # batches[estimate]: the round after it
        measured = [statistics.median(seconds[max(0, estimate - 20):estimate])
                    for seconds in per_sample]
        ratio = batches[estimate][0] / batches[estimate][1]
        assert ratio == pytest.approx(measured[1] / measured[0], rel=0.05), \
            (estimate, batches[estimate], measured)
    ratio = statistics.median(batches[k][0] / batches[k][1] for k in (10, 20, 30))
    assert 2.5 <= ratio <= 8.0, batches
    assert all(b[0] > b[1] for b in batches[10:]), batches
    for k in (0, 1):
        assert [r["num_samples"] for r in job.rounds(k)] == [b[k] for b in batches]
    print(json.dumps(batches[::10]))


@pytest.mark.slow
@pytest.mark.parametrize("rank1, message", [
    ([], "--balance-batches: rank 1 gives 0, rank 0 gives 1"),
    (["--balance-batches", "1", "-b", "32"], "-b: rank 1 gives 32, rank 0 gives 64"),
])
def test_ranks_that_disagree_all_stop_with_one_line(tmp_path, rank1, message):
    """Ranks started by hand with different balancing flags would disagree on their
    collectives (and hang) or on the global batch: every rank stops at the start with
    the same line, exit 2."""
    job = DDPJob(tmp_path, [["--balance-batches", "1"], rank1],
                 ["--max-rounds", "5", "-e", "0"], timeout=120)
    assert job.codes == [2, 2], {k: job.output(k)[-1500:] for k in (0, 1)}
    for k in (0, 1):
        assert job.output(k).strip().splitlines()[-1] == (
            f"main.py: error: {message}; every rank of a DDP job must give the same")
    assert_no_traceback({k: job.output(k) for k in (0, 1)})


@pytest.mark.slow
@pytest.mark.alone
def test_with_global_batch_fastest_the_fast_worker_keeps_its_batch(tmp_path):
    """--slowdown 2,8, -b 128, --global-batch fastest: plain DDP's batches until the first
    estimate (round 10), then the fast worker keeps 128 and the slow one gets what it
    computes meanwhile (about 32 by the factors), the global batch their sum, from the
    speeds the two logs measured (the median of their last rounds' seconds per sample)."""
    job = DDPJob(tmp_path, [["--slowdown", "2"], ["--slowdown", "8"]],
                 ["--balance-batches", "1", "--global-batch", "fastest", "-b", "128",
                  "--max-rounds", "21", "-e", "0", "--num-threads", "1"])
    job.check_ok()
    assert_no_traceback({k: job.output(k) for k in (0, 1)})
    batches = _batches(job.rounds(0))
    assert len(batches) == len(job.rounds(1)) == 21
    assert batches[:10] == [[128, 128]] * 10
    per_sample = [seconds_per_sample(job.rounds(k)) for k in (0, 1)]
    for estimate in (10, 20):  # batches[estimate]: the round after it
        measured = [statistics.median(seconds[max(0, estimate - 20):estimate])
                    for seconds in per_sample]
        fast, slow = batches[estimate]
        assert abs(fast - 128) <= 1, batches[estimate]  # rounding only
        assert slow / fast == pytest.approx(measured[0] / measured[1], rel=0.05), \
            (estimate, batches[estimate], measured)
        assert 8 <= slow < fast / 2, batches[estimate]
    for k in (0, 1):
        assert [r["num_samples"] for r in job.rounds(k)] == [b[k] for b in batches]
