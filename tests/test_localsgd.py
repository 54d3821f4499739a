"""Local SGD with a fixed period (`-m localsgd`, esync.algorithms.localsgd): a whole job's
rounds hold `--period` local iterations after `--warmup-steps` rounds of one; after each
round every worker holds the mean of the workers' models (or, with --outer-momentum,
DiLoCo's Nesterov step on it), through the servers and by all-reduce; its flags are
refused with one line where they do not apply."""
import numpy as np
import pytest
import torch

import esync

from tests.cluster import Cluster
from tests.helpers import assert_breakdown, assert_no_traceback, run_main

pytestmark = pytest.mark.slow  # whole clusters of real processes


def assert_all_exit_0(job, codes):
    assert codes == {name: 0 for name in job.procs}, \
        {n: job.output(n)[-800:] for n, c in codes.items() if c != 0}


def test_a_job_runs_period_local_iterations_a_round_after_its_warmup(tmp_path):
    with Cluster(tmp_path, num_servers=1, num_workers=2) as job:
        job.start_all(["-m", "localsgd", "--period", "4", "--warmup-steps", "2",
                       "--max-rounds", "8", "-e", "4", "--num-threads", "1"])
        assert_all_exit_0(job, job.wait(180))
        assert_no_traceback(job.outputs())
        assert "rule localsgd" in job.output("server0")
        outputs = job.output("worker0") + job.output("worker1")
        assert outputs.count("finished 8 rounds") == 2
        for w in range(2):
            rounds = job.rounds(w)
            assert [r["num_iters"] for r in rounds] == list(range(1, 9))
            assert [len(r["time"]) for r in rounds] == [1, 1] + [4] * 6
            assert [r["num_samples"] for r in rounds] == [64, 64] + [256] * 6
            for r in rounds:  # push, wait and pull after the round's last local iteration
                assert "global aggregate" in r["time"][str(len(r["time"]) - 1)]
            assert_breakdown(rounds)
        evaluated = [r["accuracy"] for w in range(2) for r in job.rounds(w) if "accuracy" in r]
        assert len(evaluated) == 2  # rank 0, after rounds 4 and 8
        assert evaluated[-1] > 0.5, evaluated  # 28 local iterations on lenet and digits


def probe(tmp_path, backend, flags):
    """Each worker's record of a probe run (tests/localsgd_probe.py), by rank."""
    folder = tmp_path / backend
    folder.mkdir()
    with Cluster(folder, 1 if backend == "ps" else 0, 2) as job:
        job.start_all([str(folder / "rank{rank}.npz"), "-m", "localsgd", "--backend", backend,
                       *flags], program=("-m", "tests.localsgd_probe"))
        assert_all_exit_0(job, job.wait(120))
    return [dict(np.load(folder / f"rank{rank}.npz")) for rank in range(2)]


def nesterov(start, before, lr, momentum):
    """The weights after each round of DiLoCo's outer step (torch's own SGD with Nesterov
    momentum) on the pseudo-gradient: the round's start minus the workers' mean."""
    w = torch.tensor(start, dtype=torch.float64, requires_grad=True)
    outer = torch.optim.SGD([w], lr=lr, momentum=momentum, nesterov=True)
    out = []
    for models in before:  # (workers, values) of one round
        w.grad = w.detach() - torch.tensor(np.mean(models, axis=0), dtype=torch.float64)
        outer.step()
        out.append(w.detach().numpy().copy())
    return np.stack(out)


@pytest.mark.parametrize("backend, flags", [
    ("ps", []), ("allreduce", []),
    ("ps", ["-gl", "0.7", "--outer-momentum", "0.9"])], ids=["ps", "allreduce", "outer"])
def test_every_worker_holds_the_mean_of_the_workers_models_after_each_round(
        tmp_path, backend, flags):
    ranks = probe(tmp_path, backend, ["--period", "3", "--warmup-steps", "2", *flags])
    for r in ranks:
        assert list(r["iterations"]) == [1, 1, 3, 3, 3]
    np.testing.assert_array_equal(ranks[0]["start"], ranks[1]["start"])  # the job's model
    before = np.stack([r["before"] for r in ranks], axis=1)  # (rounds, workers, values)
    # the workers trained on different batches: their models differ before each average
    assert all(np.mean(b[0] != b[1]) > 0.9 for b in before)
    mean = before.mean(axis=1)
    expected = mean
    if flags:  # the weights take the outer step; the buffers stay the plain mean
        weights = int(ranks[0]["params"])
        expected = mean.copy()
        expected[:, :weights] = nesterov(ranks[0]["start"][:weights], before[:, :, :weights],
                                         lr=0.7, momentum=0.9)
        assert not np.allclose(expected[:, :weights], mean[:, :weights], atol=1e-3)
    for r in ranks:
        np.testing.assert_allclose(r["after"], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(ranks[0]["after"], ranks[1]["after"])


def test_built_from_keywords_its_rounds_follow_the_warmup_then_the_period():
    from esync.algorithms.base import Job
    from esync.algorithms.localsgd.worker import LocalSGDWorker
    from esync.options import parse_options

    policy = esync.LocalSGD(period=4, warmup_steps=2)
    assert [policy.local_iterations(r) for r in range(1, 6)] == [1, 1, 4, 4, 4]
    job = Job(node=None, rank=0, num_workers=2, servers=[], id="job")
    hooks = LocalSGDWorker.with_policy(policy, parse_options(["-m", "localsgd"]), job)
    assert [hooks.policy.local_iterations(r) for r in (1, 3)] == [1, 4]
    assert hooks.rule.to_header() == {  # the plain mean, on the servers or all-reduced
        "name": "localsgd", "num_workers": 2, "lr": 1.0, "momentum": 0.0,
        "weight_decay": 0.0, "lamda": 0.0, "normalize": False, "by_steps": False,
        "anchored": False}
    assert [esync.LocalSGD(period=3).local_iterations(r) for r in (1, 2)] == [3, 3]
    # the policy's defaults are its flags' defaults: one declaration
    assert esync.LocalSGD() == esync.LocalSGD.from_options(parse_options(["-m", "localsgd"]))
    for bad in ({"period": 0}, {"period": 2, "warmup_steps": -1}, {"period": 2.5}):
        with pytest.raises(ValueError, match="LocalSGD"):
            esync.LocalSGD(**bad)


@pytest.mark.parametrize("args, message", [
    (["-m", "localsgd", "--period", "0"],
     "argument --period: expected a positive integer, got '0'"),
    (["-m", "localsgd", "--warmup-steps", "-1"],
     "argument --warmup-steps: expected an integer >= 0, got '-1'"),
    (["-m", "sync", "--period", "4"], "--period applies to -m localsgd only, not -m sync"),
    (["-m", "esync", "--warmup-steps", "10"],
     "--warmup-steps applies to -m localsgd only, not -m esync"),
    (["-m", "sync", "--outer-momentum", "0.9"],
     "--outer-momentum applies to -m esync or localsgd only, not -m sync"),
    (["-m", "localsgd", "--round-time", "2"], "--round-time applies to -m esync only"),
])
def test_bad_flags_are_refused_with_one_line(args, message):
    cluster = {"DMLC_ROLE": "worker", "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "1",
               "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "1"}
    result = run_main(args, env=cluster, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
