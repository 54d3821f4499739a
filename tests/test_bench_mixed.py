"""bench/mixed.py: one fast device and N slow ones against the fast device alone. Its
plan in process; one small real run of its GPU form with CPUs in place of the GPU."""
import ast
import json
import os
import re
import subprocess
import sys

import pytest

from bench import mixed
from esync.algorithms.esync import ESync
from esync.errors import UserError
from esync.logs_tools import speedup
from tests.helpers import REPO
from tests.test_speedup import alone_runs, job

MIXED = os.path.join(REPO, "bench", "mixed.py")


def test_a_cell_is_one_fast_device_and_n_devices_r_times_slower():
    small, wide = mixed.parse_cells("2x3,16x7")
    assert small.job_flags == ["--workers", "4", "--slowdown", "2,4,4,4"]
    assert small.nominal_ideal == 2.5
    assert wide.job_flags == ["--workers", "8", "--slowdown", "2,32,32,32,32,32,32,32"]
    assert wide.nominal_ideal == pytest.approx(1.4375)
    # the baseline is the fast device alone, the same for both cells
    assert small.alone_flags == wide.alone_flags == ["--workers", "1", "--slowdown", "2"]
    assert small.alone_folder == wide.alone_folder
    assert [c.nominal_ideal for c in mixed.parse_cells(mixed.DEFAULT_CELLS)] == \
        pytest.approx([2.5, 2.75, 2.875, 1.4375])


def test_the_fast_device_can_be_slowed_further_so_that_a_cell_fits_one_core():
    """--fast-slowdown 2.75 at 4x7: the fast device at 2.75, the slow ones at 11 (their
    computing together one core's), the baseline alone at 2.75, in folders of their own."""
    (cell,) = mixed.plan(["--cells", "4x7", "--fast-slowdown", "2.75"]).cells
    assert cell.job_flags == ["--workers", "8", "--slowdown", ",".join(["2.75"] + ["11"] * 7)]
    assert cell.alone_flags == ["--workers", "1", "--slowdown", "2.75"]
    assert cell.nominal_ideal == 2.75
    assert (cell.folder, cell.alone_folder) == ("R4-N7-x2.75", "alone-x2.75")
    assert mixed.plan(["--cells", "4x7"]).cells[0].folder == "R4-N7"


def test_the_gpu_form_runs_the_methods_on_every_device_and_the_first_alone():
    run = mixed.plan(["--devices", "gpu,cpu,cpu"])
    (cell,) = run.cells
    assert cell.job_flags == ["--workers", "3", "--slowdown", "1", "--devices", "gpu,cpu,cpu"]
    assert cell.alone_flags == ["--workers", "1", "--slowdown", "1", "--devices", "gpu"]
    assert cell.nominal_ideal is None
    assert list(run.workloads) == ["charlm"] and run.seeds == 1 and run.time_limit == 45
    matrix = mixed.plan([])
    assert list(matrix.workloads) == ["charlm", "resnet"] and matrix.seeds == 3
    assert len(matrix.cells) == 4 and matrix.grid == [1, 2, 4]
    assert matrix.methods == mixed.DEFAULT_METHODS.split(",")


@pytest.mark.parametrize("argv, message", [
    (["--cells", "2x0"], "--cells"), (["--cells", "0.5x3"], "--cells"),
    (["--cells", "2x3", "--devices", "gpu,cpu"], "give one"),
    (["--fast-slowdown", "3", "--devices", "gpu,cpu"], "give one"),
    (["--devices", "gpu"], "--devices"), (["--lr-grid", "1,-2"], "--lr-grid"),
    (["--methods", "esync,nope"], "nope"), (["--methods", "local"], "local"),
    (["--workloads", "mnist"], "mnist"), (["--seeds", "0"], "--seeds"),
    (["--slowdown", "1,4"], "set by the bench"), (["--modes=sync"], "--modes")])
def test_bad_input_is_refused_before_any_job(argv, message):
    with pytest.raises(UserError, match=message):
        mixed.plan(argv)


def test_the_learning_rate_goes_to_the_script_or_to_main_py_and_only_the_baseline_scales_it():
    run = mixed.plan(["--cells", "2x3", "--workloads", "charlm,quick", "-b", "16"])
    (cell,) = run.cells
    lm = mixed.experiment_argv(run, "charlm", cell.alone_flags, ["local"], "o", 4.0)
    script = lm.index("examples/charlm_esync.py")
    assert lm[-2:] == ["--lr", f"{3e-3 * 4:g}"] and script < len(lm) - 2
    assert lm.index("-b") < script  # a passed-through flag goes to the job, not the script
    quick = mixed.experiment_argv(run, "quick", cell.alone_flags, ["local"], "o", 2.0)
    assert quick[quick.index("-l") + 1] == "0.1" and "examples" not in " ".join(quick)
    methods = mixed.experiment_argv(run, "quick", cell.job_flags, run.methods, "o")
    assert "-l" not in methods and methods[methods.index("--num-threads") + 1] == "1"
    assert methods[methods.index("--slowdown") + 1] == "2,4,4,4"


def test_a_method_s_own_flags_go_to_its_jobs_only_with_their_values():
    run = mixed.plan(["--cells", "2x3", "--workloads", "quick", "--methods",
                      "ddp-balanced,esync", "--global-batch", "fastest", "--min-batch=2",
                      "--least-speed", "0", "-b", "16"])
    (cell,) = run.cells
    alone = mixed.experiment_argv(run, "quick", cell.alone_flags, ["local"], "o")
    ddp = mixed.experiment_argv(run, "quick", cell.job_flags, ["ddp-balanced"], "o")
    esync = mixed.experiment_argv(run, "quick", cell.job_flags, ["esync"], "o")
    both = mixed.experiment_argv(run, "quick", cell.job_flags, run.methods, "o")
    for argv in (alone, esync, both):
        assert "--global-batch" not in argv and "fastest" not in argv and \
            "--min-batch=2" not in argv
    assert ddp[ddp.index("--global-batch") + 1] == "fastest" and "--min-batch=2" in ddp
    assert esync[esync.index("--least-speed") + 1] == "0"
    for argv in (alone, ddp, both):
        assert "--least-speed" not in argv
    for argv in (alone, ddp, esync, both):  # a flag of every job's stays
        assert argv[argv.index("-b") + 1] == "16"


def test_the_paper_s_esync_is_a_method_of_its_own_with_the_paper_s_settings_last():
    """`esync-paper` runs ESync's mode with ESync.PAPER's flags after the command
    line's own (a --least-speed given for ESync's defaults does not change it), in a
    folder of its own, under a name of its own."""
    run = mixed.plan(["--cells", "2x3", "--workloads", "quick", "--methods",
                      "esync,esync-paper", "--least-speed", "0.3"])
    (cell,) = run.cells
    assert "esync-paper" in mixed.DEFAULT_METHODS.split(",")
    assert ESync.paper_flags() == ["--average", "mean", "--coordination-share", "0",
                                   "--least-speed", "0"]
    ours = mixed.method_argv(run, "quick", cell, "esync")
    paper = mixed.method_argv(run, "quick", cell, "esync-paper")
    for argv in (ours, paper):
        assert argv[argv.index("--modes") + 1] == "esync"
    assert ours[ours.index("--least-speed") + 1] == "0.3" and "--average" not in ours
    last = len(paper) - 1 - paper[::-1].index("--least-speed")
    assert paper[last + 1] == "0" and last > paper.index("0.3")
    assert paper[paper.index("--average") + 1] == "mean"
    assert mixed.method_out(run, "quick", cell, "esync") == os.path.join(
        run.out, "quick", "R2-N3")
    assert mixed.method_out(run, "quick", cell, "esync-paper") == os.path.join(
        run.out, "quick", "R2-N3", "esync-paper")
    assert paper[paper.index("--out") + 1] == mixed.method_out(run, "quick", cell,
                                                              "esync-paper")
    assert (mixed.variant("esync").display, mixed.variant("esync-paper").display) == \
        ("ESync", "ESync (the paper's rule)")


def script_lr(path):
    """The default of a training script's --lr, read from its argparse call."""
    for node in ast.walk(ast.parse(open(os.path.join(REPO, path)).read())):
        if isinstance(node, ast.Call) and node.args and \
                isinstance(node.args[0], ast.Constant) and node.args[0].value == "--lr":
            return next(k.value.value for k in node.keywords if k.arg == "default")
    raise AssertionError(f"{path} has no --lr")


def test_the_learning_rates_are_the_scripts_own_defaults():
    work = mixed.workloads("o")
    for name in ("charlm", "resnet"):
        assert mixed.LEARNING_RATES[name].default == script_lr(work[name].script[0])


def test_targets_are_read_as_the_jobs_will_read_them():
    run = mixed.plan(["--workloads", "charlm,quick", "--cells", "2x3"])
    lm = mixed.reading(run, "charlm")
    assert (lm.network, lm.metric, lm.targets) == ("charlm_esync", "val_loss", [1.8, 1.65])
    assert mixed.reading(run, "quick").targets == [0.97, 0.98]
    given = mixed.plan(["--workloads", "quick", "--cells", "2x3", "--targets", "0.8,0.5"])
    assert mixed.reading(given, "quick").targets == [0.5, 0.8]


def test_the_table_names_the_baselines_learning_rate_and_shows_not_reached_as_a_dash():
    alone = speedup.alone(alone_runs(), [0.9, 0.95])
    sync = {f"seed{k}": job([(t, 0.9)], (100, 0.1, [1, 2, 3, 4, 5]), (100, 0.4, [2, 5]))
            for k, t in enumerate([4.0, 2.0, 3.0])}
    result = {"alone": alone, "methods": {"sync": speedup.job(sync, alone, [0.9, 0.95])}}
    rows = {line.split(" | ")[0]: line.split(" | ")[1:]
            for line in mixed.table(result, [0.9, 0.95]).splitlines()}
    # time, speed-up, of ideal per target; ideal, computing over alone, samples/s, of ideal
    assert rows["| Fast device alone"][:4] == ["5.00 [4.00-n/r] (2/3) (lr x2)", "1.00x", "",
                                               "—"]
    assert rows["| SSGD"] == ["3.00 [2.00-4.00]", "1.67x", "1.33", "— (0/3)", "—", "—", "1.25",
                              "1.25", "140", "1.12 |"]
    assert mixed.learning_rate_line(alone) == \
        "0.90: x1 8.00 s, x2 5.00 s; 0.95: x1 —, x2 —"
    lines = mixed.device_lines(result)
    assert lines == ["- Fast device alone: w0 1000", "- SSGD: w0 1000, w1 250"]
    # paired: the alone's best (x2) seeds at 4, never, 5 s against 4, 2, 3 s
    paired = {line.split(" | ")[0]: line.split(" | ")[1:]
              for line in mixed.paired_table(result, [0.9, 0.95]).splitlines()}
    assert paired["| SSGD"] == ["1.33x (1.00, —, 1.67)", "1.33x (1.00, —, 1.67)",
                                "— (—, —, —)", "— (—, —, —) |"]
    assert "Paired, seed by seed" in mixed.section(
        "quick", {**result, "title": "t", "nominal_ideal": None},
        mixed.Reading("lenet", "accuracy", [0.9, 0.95]), mixed.plan(["--workloads", "quick"]))


def test_the_alone_runs_first_in_even_seeds_and_last_in_odd_ones():
    assert mixed.seed_order(0, [1, 2], ["esync", "sync"]) == [1.0, 2.0, "esync", "sync"]
    assert mixed.seed_order(1, [1, 2], ["esync", "sync"]) == ["esync", "sync", 1.0, 2.0]
    assert mixed.seed_order(1, [], ["esync"]) == ["esync"]


@pytest.mark.slow
def test_the_gpu_form_on_cpus_measures_the_speed_up_over_the_first_device_alone(tmp_path):
    """The fast device alone, SSGD, ASGD and the paper's ESync on two CPUs, lenet on
    digits, two seeds,
    easy targets, run seed by seed (the alone first in seed 0 and last in seed 1, so that
    a drift in the machine's speed favours neither); SSGD's table is printed before ASGD's last
    job runs (a run cut short keeps it); run again with --skip-done, no job runs and the
    tables come back."""
    argv = [sys.executable, MIXED, "--out", str(tmp_path), "--devices", "cpu,cpu",
            "--workloads", "quick", "--seeds", "2", "--methods", "sync,async,esync-paper",
            "--lr-grid", "1",
            "--time-limit", "8", "--targets", "0.5,0.8", "--eval-interval", "0.5",
            "--hold", "0.5", "--skip-done"]
    first = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert first.returncode == 0, first.stderr[-3000:]
    ran = [(line.split("--only-seed ")[1].split()[0], line.split("--modes ")[1].split()[0])
           for line in first.stderr.splitlines()
           if line.startswith("mixed: esync-experiment") and "--only-seed" in line]
    assert ran == [(seed, mode) for seed, modes in (("0", ("local", "sync", "async", "esync")),
                                                    ("1", ("sync", "async", "esync", "local")))
                   for mode in modes], ran
    rows, paired = {}, {}  # a method's row of the main table, of the paired one
    for line in first.stdout.splitlines():
        if line.startswith("| "):
            name = line.split(" | ")[0]
            (paired if name in rows else rows)[name] = line
    assert "| Fast device alone" in rows and "| SSGD" in rows, first.stdout
    assert re.search(r"\| [0-9]+\.[0-9]{2}x \|", rows["| SSGD"]), rows["| SSGD"]
    assert re.match(r"\| SSGD \| [0-9]+\.[0-9]{2}x \([0-9]+\.[0-9]{2}, [0-9]+\.[0-9]{2}\) \|",
                    paired["| SSGD"]), paired["| SSGD"]
    assert (tmp_path / "mixed.md").read_text().count("| SSGD") == 2
    so_far = first.stdout.index("mixed: so far (sync of sync, async, esync-paper)")
    table_so_far = first.stdout[so_far:first.stdout.index("mixed: so far (sync, async of",
                                                          so_far)]
    assert "| SSGD" in table_so_far and "| ASGD" not in table_so_far, first.stdout
    assert "| ASGD" in rows and "| ASGD" in (tmp_path / "mixed.md").read_text()
    assert "| ESync (the paper's rule)" in rows, first.stdout
    doc = json.loads((tmp_path / "mixed.json").read_text())
    cell = doc["workloads"]["quick"]["cells"]["devices-cpu-cpu"]
    sync = cell["methods"]["sync"]
    assert sync["targets"]["0.50"]["speedup"] > 0
    assert 1 < sync["ideal"]["median"] <= 2  # two devices of about one speed
    assert set(sync["device_rates"][0]) == {"w0", "w1"}
    assert cell["alone"]["targets"]["0.80"]["lr"] == 1
    assert cell["alone"]["samples_per_s"] > 0
    alone = tmp_path / "quick" / "alone-cpu" / "lr1" / "plain" / "seed0" / "lenet" / "local"
    assert (alone / "Local.json").is_file()
    # each worker's command (its log's first line): its device and one torch thread
    sync_folder = tmp_path / "quick" / "devices-cpu-cpu" / "plain" / "seed0" / "lenet" / "sync"
    paper = tmp_path / "quick" / "devices-cpu-cpu" / "esync-paper" / "plain" / "seed1" / \
        "lenet" / "esync"
    assert set(doc["workloads"]["quick"]["cells"]["devices-cpu-cpu"]["methods"]) == \
        {"sync", "async", "esync-paper"}
    (paper_log,) = paper.glob("*/w1/worker.log")
    assert " --average mean " in paper_log.read_text().splitlines()[0]
    logs = [*alone.glob("*/w0/worker.log"), *sync_folder.glob("*/w1/worker.log")]
    assert len(logs) == 2, logs
    for log in logs:
        command = log.read_text().splitlines()[0]
        assert " -c 1 " in command and " --num-threads 1 " in command, command

    again = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr[-3000:]
    # the fast device alone's and each method's jobs, seed by seed, and the
    # experiment's tables of both again
    assert again.stderr.count("done before") == 12, again.stderr
    assert "launch:" not in again.stderr
    assert json.loads((tmp_path / "mixed.json").read_text())["workloads"] == doc["workloads"]
