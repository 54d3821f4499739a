"""Standalone training as a user runs it: main.py's `main` (one real `python main.py`
process, the rest in this process), real data, real log files."""
import glob
import json
import os
import socket
from types import SimpleNamespace

import pytest

from esync.cli import main
from esync.infra.clock import Slowdown
from esync.logs.recorder import Recorder
from tests.helpers import CLUSTER_VARIABLES, assert_breakdown, make_idx_dataset, run_main


@pytest.fixture
def standalone(capsys, monkeypatch):
    """Runs main.py's main in this process: (returncode, stdout, stderr) as attributes."""
    for var in CLUSTER_VARIABLES:
        monkeypatch.delenv(var, raising=False)

    def run(args):
        capsys.readouterr()
        code = main(list(args), prog="main.py")
        out, err = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out, stderr=err)
    return run

PHASES = {"get_batch", "forward and backward", "local update"}


def _rounds(log_dir, device="cpu"):
    folder = os.path.join(log_dir, socket.gethostname(), device)
    files = glob.glob(os.path.join(folder, "iter-*.json"))
    return [json.load(open(os.path.join(folder, f"iter-{n}.json")))
            for n in range(1, len(files) + 1)]


@pytest.mark.slow  # a real process trains to 90%
def test_quick_start_reaches_90_percent_on_digits(tmp_path):
    result = run_main(["-m", "local", "-n", "lenet", "--epochs", "3", "-ld", str(tmp_path)])
    assert result.returncode == 0, result.stderr
    rounds = _rounds(str(tmp_path))
    assert rounds, "no iteration logs written"
    assert_breakdown(rounds)
    for n, record in enumerate(rounds, 1):
        assert record["num_iters"] == n
        assert set(record) >= {"num_iters", "time", "num_samples", "total_time", "loss",
                               "bytes_sent", "bytes_received", "accuracy"}
        assert set(record["time"]) == {"0"}  # -e 1: one local iteration per round
        assert set(record["time"]["0"]) == PHASES
        assert record["num_samples"] == 64 and record["bytes_sent"] == 0
    assert [r["total_time"] for r in rounds] == sorted(r["total_time"] for r in rounds)
    assert 2.99 < rounds[-1]["epoch"] < 3.1
    assert rounds[-1]["accuracy"] >= 0.90, rounds[-1]
    assert "finished 3 epochs" in result.stdout
    # one printed line per evaluation
    assert result.stdout.count("test accuracy") == len(rounds) + 1


def test_fashion_mnist_from_idx_files(tmp_path, standalone):
    make_idx_dataset(str(tmp_path / "data"), "fashion-mnist", n_train=400, n_test=100)
    result = standalone(["-m", "local", "-n", "lenet", "--dataset", "fashion-mnist",
                       "-dd", str(tmp_path / "data"), "--epochs", "1", "-e", "2",
                       "-ld", str(tmp_path / "logs")])
    assert result.returncode == 0, result.stderr
    rounds = _rounds(str(tmp_path / "logs"))
    assert "400 samples" in result.stdout
    assert len(rounds) == 4  # 400 samples / 64 = 7 iterations, -e 2: rounds of 2, 2, 2, 1
    assert [len(r["time"]) for r in rounds] == [2, 2, 2, 1]
    assert sum(r["num_samples"] for r in rounds) == 7 * 64
    assert rounds[-1]["accuracy"] > 0.5  # the bars are easy to tell apart


def test_stop_criteria(tmp_path, standalone):
    by_rounds = standalone(["--max-rounds", "4", "-ld", str(tmp_path / "a")])
    assert by_rounds.returncode == 0 and len(_rounds(str(tmp_path / "a"))) == 4
    assert "finished 4 rounds" in by_rounds.stdout
    by_target = standalone(["--target-accuracy", "0.6", "--epochs", "20", "-ld", str(tmp_path / "b")])
    rounds = _rounds(str(tmp_path / "b"))
    assert by_target.returncode == 0 and "reached target accuracy 0.6" in by_target.stdout
    assert rounds[-1]["accuracy"] >= 0.6 and all(r["accuracy"] < 0.6 for r in rounds[:-1])
    by_time = standalone(["--time-limit", "1", "--epochs", "1000", "-ld", str(tmp_path / "c")])
    assert by_time.returncode == 0 and "reached the time limit of 1 s" in by_time.stdout
    assert 1 <= _rounds(str(tmp_path / "c"))[-1]["total_time"] < 30


def test_slowdown_waits_in_proportion_to_compute(tmp_path, standalone):
    """--slowdown 3 on a CPU with one thread: each local iteration lasts 3 times the
    lower quartile of the recent iterations' CPU time computing (its record's
    compute_cpu; not the batch's loading) in all: it waits that less its own computing,
    part of it (slowdown_ahead) before the computing, from the third iteration on (none
    where an overrun is still owed)."""
    result = standalone(["--slowdown", "3", "--max-rounds", "5", "-ld", str(tmp_path)])
    assert result.returncode == 0, result.stderr
    rounds = _rounds(str(tmp_path))
    waited, rule, aheads = 0.0, Slowdown(3, seed=0), []  # the rule, replayed on the records
    for record in rounds:
        phases = record["time"]["0"]
        computed = sum(phases[p] for p in PHASES - {"get_batch"})
        (cpu,) = record["compute_cpu"]  # one per local iteration
        assert 0 < cpu <= computed + 1e-3  # the thread's CPU time within the wall's
        # part of the wait came before the computing, as rank 0's draws make it
        (ahead,) = record["slowdown_ahead"]
        assert ahead == pytest.approx(rule.ahead_of_computing(), abs=1e-5)
        aheads.append(ahead)
        expected = rule.due(computed, cpu_seconds=cpu)
        assert abs(phases["slowdown"] - expected) < 1e-4, (phases, list(rule.recent))
        waited += phases["slowdown"]
    assert waited > 0 and aheads[:2] == [0.0, 0.0] and any(a > 0 for a in aheads[2:])
    assert rounds[-1]["total_time"] >= waited  # the waits really happened


def test_same_device_label_is_refused_while_in_use(tmp_path, standalone):
    with Recorder(str(tmp_path), socket.gethostname(), "cpu"):
        result = standalone(["--max-rounds", "1", "-ld", str(tmp_path)])
        assert result.returncode == 2
        assert "is in use by another running process" in result.stderr
        labelled = standalone(["--max-rounds", "1", "-ld", str(tmp_path), "--device-name", "cpu-1"])
        assert labelled.returncode == 0, labelled.stderr
    assert len(_rounds(str(tmp_path), "cpu-1")) == 1


def test_diverging_run_stops_with_exit_1(tmp_path, standalone):
    result = standalone(["-l", "1e30", "--max-rounds", "50", "-ld", str(tmp_path)])
    assert result.returncode == 1
    assert "the training loss is not finite" in result.stdout
    rounds = _rounds(str(tmp_path))
    assert len(rounds) < 50 and rounds[-1]["loss"] is None  # written as JSON null, not NaN
