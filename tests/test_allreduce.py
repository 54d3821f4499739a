"""`--backend allreduce` (issue 12): SSGD and ESync without servers, their workers
summing with torch.distributed; the same arithmetic as through the servers; compressed
pushes and ESync's aggregation options in whole jobs; a dead worker ends an all-reduce
job; bad combinations of flags are refused with one line."""
import glob
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.cluster import Cluster
from esync.errors import UserError
from esync.runtime.startup import start
from tests.helpers import (CLUSTER_VARIABLES, REPO, assert_breakdown, evaluator_accuracy,
                           run_main)
from tests.stateserver import StateServer

pytestmark = pytest.mark.slow  # whole clusters of real processes

LAUNCH = os.path.join(REPO, "src", "esync", "launch", "local.py")


def assert_all_exit_0(job, codes):
    assert codes == {name: 0 for name in job.procs}, \
        {n: job.output(n)[-800:] for n, c in codes.items() if c != 0}


def probe(tmp_path, backend, flags):
    """Weights and buffers before and after the probe's rounds (tests/round_probe.py),
    2 workers: (start, end), each by rank."""
    folder = tmp_path / backend
    folder.mkdir()
    servers = 1 if backend == "ps" else 0
    with Cluster(folder, servers, 2) as job:
        job.start("scheduler", "scheduler")
        if servers:
            job.start("server0", "server")
        for w in range(2):
            job.start(f"worker{w}", "worker",
                      [str(folder / "rank{rank}.npy"), "--backend", backend, *flags],
                      program=("-m", "tests.round_probe"))
        assert_all_exit_0(job, job.wait(120))
    results = [np.load(folder / f"rank{rank}.npy") for rank in range(2)]
    if not any(flag.startswith("partial") for flag in flags):  # partial: slices stay local
        np.testing.assert_array_equal(results[0], results[1])  # every worker holds the same
    return np.stack(results, axis=1)  # (start, end) x worker


@pytest.mark.parametrize("flags, tolerance, moved", [
    (["-m", "sync", "--momentum", "0.9", "--weight-decay", "0.01"], 1e-6, 0.9),
    (["-m", "esync", "-gl", "0.8", "--average", "normalized", "--outer-momentum", "0.9"],
     1e-6, 0.9),
    # fp16 pushes: the servers round each worker's gradient, the all-reduce their mean;
    # 3 steps of lr 0.05 on gradients up to ~5 in fp16 (2**-11 relative) stay within 1e-3
    (["-m", "sync", "--compress", "fp16"], 1e-3, 0.9),
    # SINGA's codecs: the servers decode each worker's sparse values or slice, the
    # all-reduce gathers them or reduces the slice; the same sums. The probe's
    # gradients are 2 N(0, 1): top-k and threshold move a part of the weights
    (["-m", "sync", "--compress", "topk:0.05"], 1e-6, 0.1),
    (["-m", "sync", "--compress", "threshold:3"], 1e-6, 0.1),
    # (the probe gives sync's rule -m's momentum, 0.9 by default, which real jobs keep
    # on the workers: with a momentum of its own the rule would move the other slices)
    (["-m", "sync", "--compress", "partial:3", "--momentum", "0"], 1e-6, 0.9),
    (["-m", "esync", "--compress", "partial:2", "--average", "normalized"], 1e-6, 0.9),
    # averaged by steps, BatchNorm's buffers weigh as their worker's steps too: the
    # servers weigh each worker's, the all-reduce's workers their own
    (["-m", "esync", "--average", "steps", "-n", "tests.round_probe:bn_model"], 1e-6, 0.9)],
    ids=["sync", "esync-options", "fp16", "topk", "threshold", "partial", "partial-esync",
         "esync-steps-batchnorm"])
def test_a_round_gives_the_same_weights_with_either_backend(tmp_path, flags, tolerance,
                                                            moved):
    (start, ps), (start_too, allreduce) = probe(tmp_path, "ps", flags), \
        probe(tmp_path, "allreduce", flags)
    np.testing.assert_array_equal(start, start_too)
    np.testing.assert_allclose(allreduce, ps, rtol=tolerance, atol=tolerance)
    assert np.mean(ps != start) > moved  # the rounds moved (nearly) every value


# (ps, sync, 2 workers) and (ps, esync, 4 workers) are test_cluster_training's and
# test_esync's jobs
@pytest.mark.parametrize("backend, mode, workers", [
    ("allreduce", "sync", 2), ("allreduce", "sync", 4), ("allreduce", "esync", 2),
    ("allreduce", "esync", 4), ("ps", "sync", 4), ("ps", "esync", 2)])
def test_job_started_by_env_vars_reaches_90_percent(tmp_path, backend, mode, workers):
    flags = ["-m", mode, "--backend", backend, "-n", "lenet", "--num-threads", "1",
             "--target-accuracy", "0.9", "--max-rounds", "400", "-e", "5"]
    slowdowns = {2: [1, 4], 4: [1, 1, 4, 4]}[workers] if mode == "esync" else [1] * workers
    servers = 1 if backend == "ps" else 0
    with StateServer(tmp_path) if mode == "esync" else _Nothing() as state, \
            Cluster(tmp_path, servers, workers) as job:
        if state is not None:
            flags += ["-port", str(state.port)]
        job.start("scheduler", "scheduler")
        if servers:
            job.start("server0", "server")
        for w, slowdown in enumerate(slowdowns):
            job.start(f"worker{w}", "worker", [*flags, "--slowdown", str(slowdown),
                                                "--device-name", f"w{w}", "-ld", job.log_dir])
        assert_all_exit_0(job, job.wait(240))
        outputs = [job.output(f"worker{w}") for w in range(workers)]
        assert any(f"all-reduce (gloo) among {workers} workers" in o
                   for o in outputs) == (backend == "allreduce")
        rank0 = next(w for w, o in enumerate(outputs) if "rank 0 of" in o)
        accuracy = [r["accuracy"] for r in job.rounds(rank0) if "accuracy" in r]
        assert accuracy[-1] >= 0.90, accuracy
        for w in range(workers):  # every worker stopped after the same round
            assert len(job.rounds(w)) == len(job.rounds(rank0))
            assert_breakdown(job.rounds(w), waits=mode == "sync" and w == rank0)
            assert job.rounds(w)[-1]["bytes_sent"] > 0
        if mode == "esync":  # budgets by speed: the fast workers ran more local steps
            budgets = [max(r.get("budget", 0) for r in job.rounds(w)) for w in range(workers)]
            assert max(budgets) > 1, budgets


class _Nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None


def launch(tmp_path, args, timeout=240):
    proc = subprocess.run([sys.executable, LAUNCH, *args, "-n", "lenet", "--no-auth",
                           "--out", str(tmp_path), "--target-accuracy", "0.9",
                           "--time-limit", "90"], cwd=REPO, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    return proc.returncode, proc.stdout


def round_bytes(tmp_path, folder, worker="w0"):
    """bytes_sent of worker `worker`'s second round (the first may differ)."""
    import glob
    import json

    path, = glob.glob(os.path.join(tmp_path, "lenet", folder, "*", worker, "iter-2.json"))
    return json.load(open(path))["bytes_sent"]


@pytest.mark.parametrize("args", [
    ["-m", "sync", "--backend", "allreduce", "--workers", "4", "--compress", "fp16"],
    ["-m", "esync", "--backend", "allreduce", "--workers", "2", "--average", "normalized",
     "--round-time", "0.3"],
    ["-m", "esync", "--workers", "4", "--slowdown", "1,1,4,4", "--compress", "topk:0.01",
     "--outer-momentum", "0.5", "--average", "mean"],
], ids=["sync-allreduce-fp16", "esync-allreduce-normalized-round-time",
        "esync-ps-topk-momentum-mean"])
def test_launcher_runs_backends_and_options_to_90_percent(tmp_path, args):
    code, output = launch(tmp_path, args)
    assert code == 0, output[-2000:]
    assert "0 server(s)" in output if "allreduce" in args else "1 server(s)" in output
    assert evaluator_accuracy(tmp_path, args[1]) >= 0.90
    if "--round-time" in args:  # equal devices: 1 local step each by the slowest's rule;
        # 0.3 s a round holds several of lenet's (tens of ms) on both
        for worker in ("w0", "w1"):
            budgets = [json.load(open(p)).get("budget", 1) for p in glob.glob(os.path.join(
                tmp_path, "lenet", "esync", "*", worker, "iter-*.json"))]
            assert budgets and max(budgets) > 1, (worker, budgets)
    if "topk:0.01" in args:  # 1% of the weights as int32 indices and float32 values
        topk = 8 * -(-LENET_WEIGHTS // 100) + 4 * LENET_BUFFERS
        assert topk < round_bytes(tmp_path, args[1]) < topk + HEADERS


#: lenet's weights (compressed when pushed) and BatchNorm values (never compressed)
LENET_WEIGHTS, LENET_BUFFERS = 62158, 452
HEADERS = 300  # bytes of a round's msgpack headers, at most


def test_compression_shows_in_the_logged_bytes(tmp_path):
    """The logs count the real bytes (uncompressed: 4 per value, test_cluster_training);
    fp16: 2 per weight. (top-k's: test_launcher_runs_backends_and_options_to_90_percent.)"""
    code, output = launch(tmp_path, ["-m", "sync", "--workers", "2", "--compress", "fp16",
                                     "-e", "0", "--max-rounds", "3"])
    assert code == 0, output[-2000:]
    fp16 = 2 * LENET_WEIGHTS + 4 * LENET_BUFFERS
    assert fp16 < round_bytes(tmp_path, "sync") < fp16 + HEADERS


@pytest.mark.parametrize("moment", ["joining", "training"])
def test_a_dead_worker_ends_an_allreduce_job(tmp_path, moment):
    """Killed while the others form the process group (as soon as it says it trains) or
    once rounds run (the others have logged one): either way the job ends, naming it."""
    flags = ["-m", "sync", "--backend", "allreduce", "-n", "lenet", "--num-threads", "1",
             "-e", "0", "--max-rounds", "100000"]
    with Cluster(tmp_path, 0, 3, heartbeat_timeout=2.0) as job:
        job.start_all(flags, server_args=())
        if moment == "joining":
            job.wait_for_output("worker1", "training lenet", timeout=120)
        else:
            deadline = time.monotonic() + 120
            logged = [os.path.join(job.log_dir, socket.gethostname(), f"w{w}", "iter-1.json")
                      for w in (0, 2)]
            while not all(os.path.exists(path) for path in logged):
                assert time.monotonic() < deadline, "no round was logged"
                assert job.procs["worker1"].poll() is None, job.output("worker1")[-1500:]
                time.sleep(0.05)
        job.procs["worker1"].send_signal(signal.SIGKILL)
        codes = job.wait(60)
        assert codes["worker1"] == -signal.SIGKILL
        assert codes["scheduler"] == 1 and codes["worker0"] == 1 and codes["worker2"] == 1, codes
        for w in (0, 2):
            output = job.output(f"worker{w}")
            assert "job aborted" in output, output[-1500:]
            assert "all-reduce" in output or "cannot go on without it" in output, output[-1500:]
            assert "Traceback" not in output, output[-1500:]
        assert "an all-reduce job cannot go on without it" in job.output("scheduler")


CLUSTER_WORKER = {"DMLC_ROLE": "worker", "DMLC_PS_ROOT_URI": "127.0.0.1",
                  "DMLC_PS_ROOT_PORT": "1", "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "1"}


@pytest.mark.parametrize("args, env, message", [
    (["-m", "async", "--backend", "allreduce"], {}, "runs on the parameter servers only"),
    (["-m", "async", "--compress", "partial:4"], {}, "-m sync or esync, not -m async"),
    (["-m", "esync", "--compress", "partial:4", "--outer-momentum", "0.9"], {},
     "which --outer-momentum would move"),
    (["-m", "sync", "--backend", "allreduce", "--checkpoint-dir", "ck"], {},
     "need the servers' shards"),
    (["-m", "sync"], {"DMLC_NUM_SERVER": "0"}, "pass --backend allreduce"),
    (["-m", "sync", "--backend", "allreduce"], {"DMLC_NUM_SERVER": "1"},
     "set DMLC_NUM_SERVER=0"),
    (["-m", "sync", "--average", "normalized"], {},
     "--average normalized applies to -m esync only"),
    (["-m", "async", "--average", "mean"], {}, "applies to -m esync only"),
    (["-m", "sync", "--round-time", "2"], {}, "applies to -m esync only"),
    (["-m", "esync", "--average", "median"], {}, "--average: invalid choice: 'median'"),
    (["-m", "local", "--compress", "fp16"], None, "applies to the parameter-server modes"),
    (["-m", "sync", "--compress", "topk:2"], {}, "expected none, fp16, topk:R (0 < R <= 1)"),
    (["-m", "sync", "--compress", "partial:1"], {}, "partial:K (K >= 2), got 'partial:1'"),
    (["-m", "sync", "--compress", "threshold:-1"], {}, "threshold:T (T >= 0)"),
])
def test_bad_combinations_are_refused_with_one_line(monkeypatch, args, env, message):
    """Refused by main.py's start-up, in this process (the first case below runs main.py
    itself: one line on stderr and exit status 2)."""
    for var in CLUSTER_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    for var, value in ({} if env is None else {**CLUSTER_WORKER, **env}).items():
        monkeypatch.setenv(var, value)
    with pytest.raises(UserError) as refused:
        start(args, "main.py")
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_a_bad_combination_ends_main_py_with_one_line():
    result = run_main(["-m", "async", "--backend", "allreduce"], env=CLUSTER_WORKER,
                      timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert "runs on the parameter servers only" in lines[-1], lines


def test_launcher_refuses_servers_with_allreduce(tmp_path):
    proc = subprocess.run([sys.executable, LAUNCH, "-m", "sync", "--backend", "allreduce",
                           "--servers", "2"], cwd=REPO, text=True, capture_output=True,
                          timeout=60)
    assert proc.returncode == 2
    assert "--servers 2: --backend allreduce runs without servers" in proc.stderr


@pytest.mark.parametrize("devices, backend", [
    (["cuda", "cpu", "cpu"], "gloo"),  # a GPU and CPU workers: one group, through host copies
    (["cpu", "cuda"], "gloo"),
    (["cuda", "cuda"], "nccl"),
    (["cpu", "cpu"], "gloo"),
])
def test_every_rank_agrees_on_one_backend_from_all_the_ranks_devices(devices, backend):
    """A GPU rank deciding from its own device asked for nccl beside the CPU ranks'
    gloo, and a DDP job of a GPU and CPU workers hung at its start (seen on an H100 with
    12 CPU workers): every rank must reach the same answer from every rank's device."""
    from concurrent.futures import ThreadPoolExecutor
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from esync.comm.allreduce import agreed_backend

    world = len(devices)
    master = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=30))

    def rank(r: int) -> str:
        store = master if r == 0 else dist.TCPStore(
            "127.0.0.1", master.port, world, is_master=False,
            timeout=timedelta(seconds=30))
        return agreed_backend(store, r, world, torch.device(devices[r]))

    with ThreadPoolExecutor(world) as pool:
        assert list(pool.map(rank, range(world))) == [backend] * world
