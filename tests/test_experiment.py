"""launch/experiment.py end to end on a small scale: jobs through the launcher with
seeds and configurations, then summary.py and compare.py on their logs."""
import json
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO

EXPERIMENT = os.path.join(REPO, "launch", "experiment.py")
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_a_small_experiment_gives_summaries_figures_and_the_tables(tmp_path):
    """Balanced DDP (a mode with a variant's flag, -m ddp --balance-batches 1) and
    standalone training, 2 seeds, both configurations."""
    result = subprocess.run(
        [sys.executable, EXPERIMENT, "--modes", "ddp-balanced,local", "--seeds", "2",
         "--time-limit", "2", "--workers", "2", "--slowdown", "1,3",
         "--links-bandwidth", "none,50", "--links-latency", "0,2", "--targets", "0.5,0.8",
         "--hold", "0.3", "--eval-interval", "0.2", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    for seed in ("seed0", "seed1"):
        for config, modes in (("plain", ("ddp-balanced", "local")),
                              ("links", ("ddp-balanced",))):
            for mode in modes:
                folder = tmp_path / config / seed / "lenet" / mode
                name = {"ddp-balanced": "DDP-Balanced", "local": "Local"}[mode]
                summary = json.loads((folder / f"{name}.json").read_text())
                devices = {d for host in summary.values() for d in host}
                # distributed jobs have their evaluator; training alone evaluates itself
                assert ("evaluator" in devices) == (mode != "local"), devices
                assert len(devices) == (1 if mode == "local" else 3)
        assert not (tmp_path / "links" / seed / "lenet" / "local").exists()
    doc = json.loads((tmp_path / "results.json").read_text())
    for config in ("plain", "links"):
        rows = doc["configs"][config]["algorithms"]
        assert "Balanced DDP" in rows
        assert len(rows["Balanced DDP"]["time_to_target"]["0.50"]["per_seed"]) == 2
        for name in ("accuracy", "time_to_target", "traffic"):
            assert (tmp_path / f"{name}-{config}.png").read_bytes()[:8] == PNG
    assert "Standalone" in doc["configs"]["plain"]["algorithms"]
    assert "## plain" in result.stdout and "## links" in result.stdout
    assert "6 of 6 jobs done" in result.stderr


def test_a_bad_worker_flag_is_refused_before_any_job(tmp_path):
    result = subprocess.run([sys.executable, EXPERIMENT, "--modes", "sync,local",
                             "--out", str(tmp_path), "--shuffle", "sideways"], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("launch/experiment.py: error: argument --shuffle")
    assert len(result.stderr.splitlines()) == 1
    assert not os.listdir(tmp_path)


def test_jobs_and_their_order_come_from_the_registry():
    from launch import experiment

    jobs = experiment.jobs()
    assert list(jobs) == ["esync", "sync", "async", "dcasgd", "ddp", "ddp-balanced",
                          "esync-niid", "sync-niid", "async-niid", "dcasgd-niid", "ddp-niid",
                          "ddp-balanced-niid", "local"]
    assert jobs["dcasgd-niid"] == ["-m", "async", "-dcasgd", "1", "-s", "1"]
    assert jobs["ddp-balanced"] == ["-m", "ddp", "--balance-batches", "1"]
    args, extra = experiment.build_parser().parse_known_args(["--seeds", "2", "-b", "32"])
    planned = experiment.plan(args, extra)
    # seed by seed, configuration by configuration; no standalone run on emulated links
    assert [(c, f, s) for c, f, s, _ in planned][:7] == [
        ("plain", m, 0) for m in ("esync", "sync", "async", "dcasgd", "ddp", "ddp-balanced")] + [
        ("plain", "local", 0)]
    assert len(planned) == 2 * (7 + 6)
    links_ddp = next(argv for c, f, s, argv in planned if (c, f, s) == ("links", "ddp", 1))
    assert links_ddp[links_ddp.index("--bandwidth") + 1] == "none,none,100,100"
    assert links_ddp[links_ddp.index("--out") + 1] == os.path.join("runs", "links", "seed1")
    assert links_ddp[links_ddp.index("--target-accuracy") + 1] == "0.97"
    assert links_ddp[-2:] == ["-b", "32"]


@pytest.mark.parametrize("args,message", [
    (["--modes", "esync,fast"], "--modes: unknown fast"),
    (["--configs", "plain,moon"], "--configs 'plain,moon': choose from plain, links"),
    (["--links-bandwidth", "1,2"], "--bandwidth '1,2': expected 4 value(s)"),
])
def test_bad_input_is_refused_before_any_job(tmp_path, args, message):
    result = subprocess.run([sys.executable, EXPERIMENT, *args, "--out", str(tmp_path)],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert not os.listdir(tmp_path)


def test_backend_allreduce_goes_to_the_modes_that_can_all_reduce():
    from launch import experiment, local

    args, extra = experiment.build_parser().parse_known_args(
        ["--backend", "allreduce", "--modes", "esync,sync,async,ddp"])
    planned = {(c, f): argv for c, f, _, argv in experiment.plan(args, extra)}
    for folder in ("esync", "sync"):
        argv = planned[("plain", folder)]
        assert argv[argv.index("--backend") + 1] == "allreduce" and "--servers" not in argv
        assert local.plan(argv).servers == 0  # the launcher starts no servers for it
    for folder in ("async", "ddp"):
        assert "--backend" not in planned[("plain", folder)]
    assert local.plan(planned[("plain", "async")]).servers == 1
