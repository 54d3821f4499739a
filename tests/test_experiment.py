"""launch/experiment.py end to end on a small scale: jobs through the launcher, then
summary.py and drawer.py on their logs."""
import json
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO

EXPERIMENT = os.path.join(REPO, "launch", "experiment.py")
FIGURES = ("accuracy_iid.png", "accuracy_noniid.png", "throughput.png", "traffic.png",
           "computing_ratio.png")


@pytest.mark.slow
def test_a_small_experiment_gives_summaries_figures_and_the_table(tmp_path):
    result = subprocess.run(
        [sys.executable, EXPERIMENT, "--modes", "esync,sync,local", "--time-limit", "1",
         "--workers", "2", "--slowdown", "1,3", "--out", str(tmp_path), "-e", "2"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    network = tmp_path / "lenet"
    for mode, name in (("esync", "ESync"), ("sync", "Sync"), ("local", "Local")):
        summary = json.loads((network / mode / f"{name}.json").read_text())
        devices = [d for host in summary.values() for d in host]
        assert len(devices) == (1 if mode == "local" else 2)
    for figure in FIGURES:
        assert (network / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = json.loads((network / "speedup.json").read_text())
    rows = {row["algorithm"]: row for row in table["rows"]}
    assert {"ESync", "SSGD", "Standalone"} <= set(rows)
    assert rows["SSGD"]["speedup_vs_ssgd"] in (1.0, None)
    assert "note: no" in result.stderr and "ASGD left out" in result.stderr
    assert "3 of 3 jobs done" in result.stderr


def test_a_bad_worker_flag_is_refused_before_any_job(tmp_path):
    result = subprocess.run([sys.executable, EXPERIMENT, "--modes", "sync,local",
                             "--out", str(tmp_path), "--shuffle", "sideways"], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("launch/experiment.py: error: argument --shuffle")
    assert len(result.stderr.splitlines()) == 1
    assert not os.listdir(tmp_path)


def test_jobs_come_from_the_registry():
    from esync import registry
    from launch import experiment
    jobs = experiment.jobs()
    assert list(jobs) == ["esync", "sync", "async", "dcasgd", "esync-niid", "sync-niid",
                          "async-niid", "dcasgd-niid", "local"]
    assert jobs["dcasgd-niid"] == (["-m", "async", "-dcasgd", "1", "-s", "1"], 25)
    assert jobs["esync"] == (["-m", "esync"], registry.ALGORITHMS["esync"].eval_every)
    args = experiment.build_parser().parse_args([])
    import config
    assert (args.network, args.dataset, args.out) == (config.NETWORK, config.DATASET,
                                                      config.RUNS_DIR)


def test_unknown_modes_are_refused(tmp_path):
    result = subprocess.run([sys.executable, EXPERIMENT, "--modes", "esync,fast",
                             "--out", str(tmp_path)], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2 and "--modes: unknown fast" in result.stderr
    assert not os.listdir(tmp_path)
