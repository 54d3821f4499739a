"""The public API (esync.runtime.api) under a user's own script (tests/api_script.py), started
by esync-run as a real job: BatchNorm's statistics averaged with the weights, a
learning-rate schedule that follows the job's steps, parameters without a gradient,
a step AMP's GradScaler skips, and every mode and backend."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from esync.comm.compress import Compression
from tests.helpers import REPO

SCRIPT = os.path.join(REPO, "tests", "api_script.py")


def esync_run(tmp_path, flags, script_args=(), timeout=180):
    """Run esync-run with `flags` on tests/api_script.py; its results by device."""
    out = tmp_path / "seen"
    out.mkdir(exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-m", "esync.launch.run", "--out", str(tmp_path / "runs"),
         "--no-progress", "--num-threads", "1", *flags, SCRIPT, str(out), *script_args],
        cwd=tmp_path, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {f[:-5]: json.load(open(out / f)) for f in sorted(os.listdir(out))}


def _records(tmp_path, mode_folder, device):
    folder = tmp_path / "runs" / "api_script" / mode_folder
    (host,) = [h for h in folder.iterdir() if h.is_dir()]
    path = host / device
    count = len([f for f in os.listdir(path) if f.startswith("iter-")])
    return [json.load(open(path / f"iter-{n}.json")) for n in range(1, count + 1)]


@pytest.mark.slow
@pytest.mark.parametrize("flags", [["-m", "sync"], ["-m", "esync"],
                                   ["-m", "sync", "--backend", "allreduce"]],
                         ids=["sync", "esync", "sync-allreduce"])
def test_batchnorm_statistics_that_differ_per_worker_are_averaged(tmp_path, flags):
    """Split by class, the two workers' inputs differ, and so do their BatchNorm
    statistics; after the job's last round both hold the same (the average), while
    each keeps its own count of batches."""
    seen = esync_run(tmp_path, ["--workers", "2", "-s", "1", *flags], ["--model", "bn"])
    w0, w1 = seen["w0"], seen["w1"]
    for name in ("1.running_mean", "1.running_var"):
        np.testing.assert_allclose(w0["buffers"][name], w1["buffers"][name], rtol=1e-6)
    np.testing.assert_allclose(w0["weights"], w1["weights"], rtol=1e-6, atol=1e-7)
    # BatchNorm's count is each worker's own (forward passes in training mode)
    for w in (w0, w1):
        assert w["buffers"]["1.num_batches_tracked"] == w["loop_iterations"]
        # the optimizer's state_dict carries the round (taken before the farewell round)
        assert 0 < w["rounds"] - 1 <= w["state"]["round"] <= w["rounds"]


@pytest.mark.slow
def test_a_learning_rate_schedule_follows_rounds_alike_on_a_fast_and_a_slow_device(tmp_path):
    seen = esync_run(tmp_path, ["--workers", "2", "-m", "esync", "--slowdown", "1,4",
                                # the paper's rule: the slow one trains, 1 a round
                                "--coordination-share", "0", "--least-speed", "0"],
                     ["--scheduler", "--epochs", "12"])
    fast, slow = seen["w0"], seen["w1-x4"]
    # the fast device ran several local iterations in some rounds, the slow one fewer
    # (1 a round on a quiet machine; a loaded one, slowing the fast device's computing
    # more than the slow one's sleep, gave it 2 in some rounds: 45 in 38 rounds once)
    assert fast["iterations"] > fast["rounds"] + 3
    assert slow["iterations"] < fast["iterations"]
    # the learning rate each saw after its last step of round r (the job's last round,
    # which a worker may leave half-way, aside): StepLR(1, 0.9) stepped by the job's
    # steps (its samples over 2 workers' batches of 32: at least one a round, as many
    # more as the fast device's extra local steps), the same on both devices
    common = sorted(set(fast["lrs"]) & set(slow["lrs"]), key=int)[:-1]
    assert len(common) >= 5
    steps = []
    for r in common:
        assert slow["lrs"][r] == pytest.approx(fast["lrs"][r], rel=1e-6)
        k = math.log(fast["lrs"][r] / 1e-2) / math.log(0.9)
        assert k == pytest.approx(round(k), abs=1e-6) and round(k) >= int(r)
        steps.append(round(k))
    assert steps[-1] > int(common[-1])  # the fast device's extra steps moved the schedule


@pytest.mark.slow
def test_a_worker_that_leaves_after_its_first_iteration_ends_the_job_with_it(tmp_path):
    """The first round (every device measuring its speed) is pushed without waiting for
    its answers; the slow worker's loop ends after that round's one iteration. It says
    so with the push of the round it is in then (2, or a later one where it sat rounds
    out inside that iteration's step: 8 times slower, it does), after taking round 1's
    answers; the fast ones, training from round 2 on, stop after that same round, all
    holding the job's model, and nobody hangs."""
    seen = esync_run(tmp_path, ["--workers", "3", "-m", "esync", "--slowdown", "1,1,8"],
                     ["--leave-after", "1", "--epochs", "1000"], timeout=120)
    slow = seen["w2-x8"]
    assert slow["loop_iterations"] == 1 and slow["iterations"] == 1 and slow["rounds"] >= 2
    for w in ("w0", "w1"):
        assert seen[w]["rounds"] == slow["rounds"], (seen[w], slow)
        assert seen[w]["stop"].startswith("the job ends"), seen[w]
        np.testing.assert_allclose(seen[w]["weights"], slow["weights"], rtol=1e-6, atol=1e-7)
    # round 2 trains, from the start, on a fast device at least: its budget follows
    # whichever times reached the state server first (under load the others' may come
    # before a device asks: budget 1 then), and one whose first iteration, its warm-up,
    # took 5 times the other's interim time sits it out (budget 0; CI, 11-29)
    assert max(seen[w]["iterations"] for w in ("w0", "w1")) > 1
    records = {w: _records(tmp_path, "esync", w) for w in ("w0", "w1")}
    assert all(r[0].get("measuring") for r in records.values())
    assert max(r[1]["budget"] for r in records.values()) >= 1, records


@pytest.mark.slow
def test_a_fast_device_whose_first_iteration_was_a_warm_up_trains_once_it_measures_again(
        tmp_path):
    """Rank 0's first local iteration takes 1.5 s longer (a GPU loading its kernels),
    so in the round that measures speeds it looks far slower than the device at
    --slowdown 30 and sits out (the default least speed, 0.2). Its only time a warm-up,
    in its 2nd round out it measures again (budget 1, its step not taken; in its 4th if
    that round's time was a warm-up too); its time, far below half of what it
    measured, replaces the moving average, and it trains every round after, while the
    device at 30 sits out (its iterations, of a tiny model, are not 30 times as long,
    but far below a fifth of the fast one's speed). (Without measuring again it sat the job out; with
    its times averaged, it would have stayed out for a dozen rounds more.)"""
    esync_run(tmp_path, ["-m", "esync", "--workers", "2", "--slowdown", "1,30",
                         "--max-rounds", "14"], ["--warm-up", "1.5", "--epochs", "1000"])
    warm, slow = _records(tmp_path, "esync", "w0"), _records(tmp_path, "esync", "w1-x30")
    budgets = [(r["budget"], bool(r.get("measuring"))) for r in warm]
    assert budgets[0] == (1, True), budgets  # round 1 measures everyone
    back = next(k for k, (budget, measuring) in enumerate(budgets) if budget > 1)
    # out (budget 0) from round 2 or 3; its 2nd (or 4th) round out measures again
    assert budgets[back - 1] == (1, True) and 3 <= back <= 6, budgets
    assert budgets[1:back - 1] and all(b == (0, False) for b in budgets[1:back - 1]), budgets
    assert all(budget > 1 and not measuring for budget, measuring in budgets[back:]), budgets
    # the slow device sits out in turn, most rounds (it measures again every 4th, and
    # where the load on the 2 cores brings it within 5x, trains a round or two after)
    later = [(r["budget"], bool(r.get("measuring"))) for r in slow[back + 1:]]
    assert later.count((0, False)) >= len(later) / 2, later


@pytest.mark.slow
def test_a_device_training_while_the_others_sit_out_takes_its_alone_s_steps(tmp_path):
    """With the device at --slowdown 200 sitting out (the default least speed), the
    fast device's job is its alone's: round 1 measures, and its step is kept (round 2's
    delta carries it), so that after 40 iterations its weights are the script's alone
    (same data order, same AdamW steps), up to the servers' float arithmetic. Had the
    first step not been taken, they would differ by a whole step."""
    seen = esync_run(tmp_path, ["--workers", "2", "-m", "esync", "--slowdown", "1,200"],
                     ["--model", "branches", "--iterations", "40", "--epochs", "1000"])
    fast, slow = seen["w0"], seen["w1-x200"]
    assert fast["loop_iterations"] == fast["iterations"] == 40, fast
    budgets = [(r["budget"], bool(r.get("measuring")))
               for r in _records(tmp_path, "esync", "w1-x200")]
    assert budgets[0] == (1, True) and all(b == 0 or m for b, m in budgets[1:]), budgets
    # round 2 was open: the fast device computed on through the slow device's first
    # iteration (200 of its own) rather than its 5 iterations and a wait
    second = _records(tmp_path, "esync", "w0")[1]
    assert second.get("open") is True and len(second["time"]) > 5, second
    alone = tmp_path / "alone"
    alone.mkdir()
    proc = subprocess.run([sys.executable, SCRIPT, str(alone), "--model", "branches",
                           "--iterations", "40", "--epochs", "1000"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (name,) = os.listdir(alone)
    by_itself = json.load(open(alone / name))
    assert by_itself["loop_iterations"] == 40
    np.testing.assert_allclose(fast["weights"], by_itself["weights"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(slow["weights"], fast["weights"], rtol=1e-6, atol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["ps", "allreduce"])
def test_parameters_without_a_gradient_are_still_synchronised(tmp_path, backend):
    """Each worker's steps leave the other worker's head without a gradient: the set of
    synchronised tensors is fixed, so the job neither hangs nor diverges, and both
    workers end with the same weights, both heads trained."""
    seen = esync_run(tmp_path, ["--workers", "2", "-m", "sync", "--backend", backend],
                     ["--model", "branches", "--optimizer", "sgd"])
    np.testing.assert_allclose(seen["w0"]["weights"], seen["w1"]["weights"], rtol=1e-6,
                               atol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("flags", [
    ["-m", "esync", "--compress", "partial:3", "--slowdown", "1,2"],
    ["-m", "sync", "--backend", "allreduce", "--compress", "topk:0.1"]],
    ids=["esync-partial", "sync-allreduce-topk"])
def test_the_optimizer_wrapper_takes_singa_s_codecs(tmp_path, flags):
    """`--compress` reaches a user's loop through esync-run and DistributedOptimizer as
    it reaches main.py's: partial synchronises one slice of the model's weights a round
    (both workers end with that slice alike, and differ elsewhere: the rest is local),
    top-k on the all-reduce sends 10% of them each round."""
    seen = esync_run(tmp_path, ["--workers", "2", *flags])
    compression = Compression.parse(flags[flags.index("--compress") + 1])
    n = len(seen["w0"]["weights"])
    windows = set()
    for device in seen:
        records = _records(tmp_path, flags[1], device)
        assert len(records) > compression.slices
        for round_, record in enumerate(records, 1):
            if compression.kind == "partial":
                assert record["synced"] == list(compression.window(round_, n))
                windows.add(tuple(record["synced"]))
            else:
                assert record["pushed_values"] == math.ceil(0.1 * n), record
    w0, w1 = (np.array(seen[d]["weights"]) for d in sorted(seen))
    if compression.kind == "partial":
        assert len(windows) == compression.slices
        lo, hi = records[-1]["synced"]
        np.testing.assert_allclose(w0[lo:hi], w1[lo:hi], rtol=1e-6, atol=1e-7)
        assert (np.delete(w0, np.s_[lo:hi]) != np.delete(w1, np.s_[lo:hi])).any()
    else:
        np.testing.assert_allclose(w0, w1, rtol=1e-6, atol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["esync", "sync"])
def test_a_step_amp_skips_counts_and_joins_the_synchronisation(tmp_path, mode):
    # both devices must reach iteration 5: under load ESync's default sat worker 0 out
    # after its warm-up measured it below a fifth of worker 1 (2 loop iterations, none
    # skipped: CI, 2026-12-07), so no device here sits out
    keep = ["--least-speed", "0"] if mode == "esync" else []
    seen = esync_run(tmp_path, ["--workers", "2", "-m", mode, *keep], ["--amp-skip", "5"])
    for device, w in seen.items():
        assert w["skipped"] == 1
        # every iteration of the loop, the skipped one included, is a local iteration
        assert w["iterations"] == w["loop_iterations"]
        records = _records(tmp_path, mode, device)
        assert sum(len(r["time"]) for r in records) >= w["loop_iterations"]
    np.testing.assert_allclose(seen["w0"]["weights"], seen["w1"]["weights"], rtol=1e-6,
                               atol=1e-7)


def test_a_script_alone_trains_and_logs_like_any_mode(tmp_path):
    out = tmp_path / "seen"
    out.mkdir()
    proc = subprocess.run([sys.executable, SCRIPT, str(out), "--epochs", "2"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, ESYNC_ARGS='["--num-threads", "1"]'))
    assert proc.returncode == 0, proc.stderr
    (seen,) = [json.load(open(out / f)) for f in os.listdir(out)]
    assert seen["iterations"] == seen["loop_iterations"] == 2 * 512 // 32
    logged = sorted((tmp_path / "logs").glob("*/*/iter-*.json"))
    assert len(logged) == seen["iterations"]  # -m local: a round is -e 1 iteration
    losses = [json.load(open(f))["loss"] for f in logged]
    assert all(isinstance(v, float) for v in losses)


@pytest.mark.parametrize("variable, message", [
    ('["-m", "sideways"]', "argument -m/--mode: invalid choice: 'sideways'"),
    ('{"-m": 1}', "ESYNC_ARGS: expected a JSON list of strings"),
    ('["-m", "sync"]', "-m/--mode sync runs in a cluster"),
])
def test_bad_settings_end_the_script_with_one_line(tmp_path, variable, message):
    proc = subprocess.run([sys.executable, SCRIPT, str(tmp_path)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, ESYNC_ARGS=variable))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr


@pytest.mark.parametrize("argv, message", [
    (["--workers", "2"], "no training script"),
    (["--workers", "2", "-m", "sync", "missing.py"], "missing.py: no such training script"),
    (["--workers", "2", "-m", "sync", "--learning-rate", "x", SCRIPT], "-l/--learning-rate"),
])
def test_esync_run_refuses_bad_input_with_one_line(tmp_path, argv, message):
    proc = subprocess.run([sys.executable, "-m", "esync.launch.run", "--out", str(tmp_path), *argv],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("esync-run: error: ") and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "api_script").exists()


@pytest.mark.slow
def test_a_script_resumes_from_the_job_s_checkpoint_at_its_next_sample(tmp_path):
    """A user's script killed... here: stopped at round 12, checkpointed every 5 rounds,
    then started again with --resume 1: every worker goes on from round 11 (after the
    checkpoint of round 10) at the data position its log had reached."""
    common = ["--workers", "2", "-m", "sync", "--checkpoint-dir", str(tmp_path / "ck"),
              "--checkpoint-every", "5"]
    esync_run(tmp_path, [*common, "--max-rounds", "12"], ["--epochs", "20"])
    before = _records(tmp_path, "sync", "w0")
    esync_run(tmp_path, [*common, "--max-rounds", "20", "--resume", "1"], ["--epochs", "20"])
    after = _records(tmp_path, "sync", "w0")
    assert len(after) > 12
    assert after[:10] == before[:10]  # kept; round 11 onwards trained again
    assert after[10]["epoch"] == pytest.approx(before[10]["epoch"])
    folder = tmp_path / "runs" / "api_script" / "sync"
    (host,) = [h for h in folder.iterdir() if h.is_dir()]
    for device in ("w0", "w1"):
        assert "continuing the job from round 11" in (host / device / "worker.log").read_text()
