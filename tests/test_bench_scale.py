"""bench/scale.py: a round's cost beyond computing against the number of workers. Its
model and its reading of the workers' records in process; one small real run."""
import json
import os
import re
import subprocess
import sys
import time

import pytest

from bench import scale
from tests.helpers import REPO

SCALE = os.path.join(REPO, "bench", "scale.py")


def test_the_ballast_model_has_the_size_asked_and_sleeps_its_step_only_in_training(
        monkeypatch):
    monkeypatch.setenv(scale.MB_ENV, "0.4")
    monkeypatch.setenv(scale.STEP_ENV, "0.05")
    model = scale.ballast(num_classes=10)
    assert sum(p.numel() for p in model.parameters()) == scale.values_of(0.4)
    assert model.step == 0.05
    model.eval()
    import torch
    assert model(torch.zeros(3, 1, 8, 8)).shape == (3, 10)


def _record(folder, worker, n, total_time, compute, wait, communication, state=0.0,
            other=0.0):
    path = folder / "net" / "esync" / "host" / worker
    path.mkdir(parents=True, exist_ok=True)
    (path / f"iter-{n}.json").write_text(json.dumps({
        "total_time": total_time,
        "breakdown": {"fetch": 0.0, "prep": 0.0, "compute": compute, "wait": wait,
                      "communication": communication, "state_server": state,
                      "other": other}}))


def test_a_round_is_split_into_computing_waiting_bytes_and_the_rest(tmp_path):
    """The start-up's rounds (the first WARMUP, and those that ended in the first
    `settle` seconds) are left out; the bytes are the breakdown's communication (the
    wait is already out of it); the figures are the median over workers of their mean
    round."""
    for worker, wait in (("w0", 0.01), ("w1", 0.03), ("w2", 0.05)):
        for n in range(1, 12):
            early = n <= scale.WARMUP + 2  # rounds 6 and 7 end before `settle`
            _record(tmp_path, worker, n, total_time=n, compute=9.0 if early else 0.5,
                    wait=wait, communication=0.02, other=0.001)
    parts = scale.round_parts(tmp_path, settle=7.5)
    assert parts["rounds"] == 4
    assert parts["compute"] == pytest.approx(0.5)
    assert parts["wait"] == pytest.approx(0.03)
    assert parts["bytes"] == pytest.approx(0.02)
    assert parts["round"] == pytest.approx(0.5 + 0.03 + 0.02 + 0.001)
    with pytest.raises(RuntimeError, match="no worker ran rounds"):
        scale.round_parts(tmp_path, settle=100)


def test_the_watch_counts_each_roles_cpu_and_memory():
    """A child that computes for a while as a job's worker (DMLC_ROLE), another that
    sleeps as its server: the worker's CPU seconds between two moments of its life, none
    of the server's, and each one's memory."""
    burn = "import time\nend = time.process_time() + 1.5\nwhile time.process_time() < end: pass"
    with scale.ProcessWatch() as watch:
        children = [subprocess.Popen([sys.executable, "-c", code],
                                     env=dict(os.environ, DMLC_ROLE=role))
                    for role, code in (("worker", burn), ("server", "import time; time.sleep(2)"))]
        started = time.time()
        for child in children:
            child.wait(timeout=60)
        ended = time.time()
        while not watch.samples or watch.samples[-1][0] < ended + 0.5:  # a sample after
            time.sleep(0.1)
    used = watch.cpu_between(started, ended + 1)
    assert 0.5 < used["worker"] <= 2.0
    assert used.get("server", 0.0) < 0.2
    assert watch.peak["worker"] > 1 and watch.peak["server"] > 1  # MiB


def test_one_small_run_prints_its_table():
    """Two workers of the paper's ESync, a 0.4 MB model, steps of 20 ms, one run: a row
    with the round, its parts, the bare-ZeroMQ cost of the same bytes in clear and
    encrypted as the job's are (a job key), and the memory."""
    done = subprocess.run(
        [sys.executable, SCALE, "--workers", "2", "--modes", "esync-paper", "--repeats", "1",
         "--mb", "0.4", "--step", "0.02", "--time-limit", "6", "--settle", "1"],
        capture_output=True, text=True, timeout=240, cwd=REPO)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    header = next(line for line in lines if line.startswith("| mode |"))
    row = next(line for line in lines if line.startswith("| esync-paper | 2 | 1 |"))
    cell = dict(zip((c.strip() for c in header.strip("|").split("|")[1:]),
                    (float(c.split()[0]) for c in row.strip("|").split("|")[1:])))
    assert 0.02 <= cell["computing"] / 1e3 < cell["s/round"]  # a round: its step and more
    assert cell["computing"] / 1e3 < 0.02 * 3  # the paper's rule: one local iteration
    assert cell["bare ZeroMQ ms"] > 0 and cell["bare CurveZMQ ms"] > 0
    # CPU per round: the workers' steps, the server's sums, the state server's budgets
    assert cell["CPU workers ms"] > 0 and cell["CPU servers ms"] > 0
    assert cell["CPU state server ms"] > 0
    assert re.fullmatch(r"\d+ \[\d+-\d+\]", row.strip("|").split("|")[-2].strip())  # MiB


def test_with_ssgd_the_table_pairs_each_run_with_ssgds_of_the_same_repetition():
    """'/ SSGD paired': each run's overhead over the SSGD run beside it, not the ratio of
    the medians (3 runs where the machine's load doubled in the second)."""
    def runs(overheads):
        return [{"overhead": o, "round": 0.2, "bare": 0.05, "compute": 0.1, "wait": 0.0,
                 "bytes": 0.0, "state_server": 0.0, "other": 0.0, "rss_worker": 270.0,
                 "rss_job": 4500.0} for o in overheads]
    lines = scale.table({("esync", 16, 1): runs([0.088, 0.220, 0.099]),
                         ("sync", 16, 1): runs([0.080, 0.200, 0.090]),
                         ("esync", 8, 1): runs([0.05, 0.05, 0.05])})
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:3]):
            dict(zip(header, (c.strip() for c in line.strip("|").split("|"))))
            for line in lines[2:]}
    assert rows["esync", "16", "1"]["/ SSGD paired"] == "1.10 [1.10-1.10]"
    assert rows["esync", "16", "1"]["overhead ms"] == "99 [88-220]"
    assert rows["sync", "16", "1"]["/ SSGD paired"] == "1.00 [1.00-1.00]"
    assert rows["esync", "8", "1"]["/ SSGD paired"] == "—"  # no SSGD at 8 workers
    assert "/ SSGD paired" not in scale.table({("esync", 16, 1): runs([0.1])})[0]


def test_the_figure_is_drawn_from_the_json_files(tmp_path):
    """--plot: one line per file and mode, the bare costs, a PNG."""
    run = {"overhead": 0.05, "round": 0.2, "bare": 0.01, "bare_key": 0.04}
    for name, factor in (("a", 1.0), ("b", 0.5)):
        (tmp_path / f"{name}.json").write_text(json.dumps(
            {f"{mode} {n}x1": [{k: v * factor * n for k, v in run.items()}] * 3
             for mode in ("esync", "sync") for n in (4, 8)}))
    figure = tmp_path / "scale.png"
    scale.plot([f"before={tmp_path / 'a.json'}", f"after={tmp_path / 'b.json'}"], str(figure))
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
