"""bench/oracle.py: the large-batch oracle's arithmetic in process, a small real run."""
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench import oracle  # noqa: E402


def test_the_best_learning_rate_is_the_one_with_the_fewest_median_steps():
    assert oracle.best({"1": [900, 950, 1000], "2": [800, 1500, 850]}) == "2"
    assert oracle.best({"1": [900, None, 1000], "2": [None, None, 850]}) == "1"
    assert oracle.best({"1": [None], "2": [None]}) is None
    # a run that never reached it counts as slower than every run that did
    assert oracle.best({"1": [900, 910, 920], "2": [None, None, 100]}) == "1"


def test_the_table_gives_each_batch_its_bound_over_the_fast_device_alone():
    def row(batch, ideal, median, runs):
        return {"batch": batch, "ideal": ideal,
                "targets": {"1.8": {"lr": "1", "median": median, "runs": runs}}}
    text = oracle.table({"batches": [row(32, 1.0, 900, [900, 880, 950]),
                                     row(80, 2.5, 600, [600, 650, 590]),
                                     row(88, 2.75, None, [None, None, 700])]}, [1.8])
    lines = text.splitlines()
    assert lines[2] == "| 32 | 1 | 900 [880-950] (lr x1) | 1.00x |"
    assert lines[3] == "| 80 | 2.5 | 600 [590-650] (lr x1) | 1.50x |"
    assert lines[4] == "| 88 | 2.75 | — | — |"


def test_variant_rows_say_how_stale_their_extra_part_is_or_which_steps_were_not_taken():
    def row(batch, ideal, staleness, median, skipped=0):
        return {"batch": batch, "ideal": ideal, "staleness": staleness, "skipped": skipped,
                "targets": {"1.8": {"lr": "1", "median": median, "runs": [median]}}}
    text = oracle.table({"batches": [row(32, 1.0, 0, 900), row(32, 1.0, 0, 1000, 1),
                                     row(88, 2.75, 0, 600), row(88, 2.75, 4, 1800)]},
                        [1.8])
    lines = text.splitlines()
    assert lines[0].startswith("| Batch | Ideal | Variant | Steps to 1.8")
    assert lines[3] == "| 32 | 1 | first 1 step not taken | 1000 [1000-1000] (lr x1) | 0.90x |"
    assert lines[4] == "| 88 | 2.75 | — | 600 [600-600] (lr x1) | 1.50x |"
    assert lines[5] == "| 88 | 2.75 | stale by 4 steps | 1800 [1800-1800] (lr x1) | 0.50x |"


def run(*args, timeout=120):
    return subprocess.run([sys.executable, os.path.join(REPO, "bench", "oracle.py"), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


def test_bad_input_is_one_line_and_status_2():
    done = run("--lr-grid", "1,x")
    assert done.returncode == 2
    assert done.stderr.strip() == \
        "bench/oracle.py: error: --lr-grid '1,x': expected positive numbers, comma-separated"


@pytest.mark.slow
def test_a_small_run_counts_steps_to_the_target_at_each_batch(tmp_path):
    done = run("--ideals", "2", "--lr-grid", "1,2", "--seeds", "1", "--targets", "3.2",
               "--max-steps", "60", "--eval-every", "5", "--processes", "2",
               "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    results = json.load(open(tmp_path / "oracle.json"))
    assert [row["batch"] for row in results["batches"]] == [32, 64]
    for row in results["batches"]:
        target = row["targets"]["3.2"]
        assert set(target["by_lr"]) == {"1", "2"}
        for steps in (s for runs in target["by_lr"].values() for s in runs):
            assert steps is None or (steps % 5 == 0 and 5 <= steps <= 60)
    assert "| 32 | 1 |" in done.stdout and "Speed-up bound at 3.2" in done.stdout
    assert open(tmp_path / "oracle.md").read().strip() == done.stdout.strip()


@pytest.mark.slow
def test_a_stale_run_takes_its_extra_part_at_older_weights(tmp_path):
    done = run("--ideals", "2", "--staleness", "3", "--skipped", "2", "--lr-grid", "1",
               "--seeds", "1", "--targets", "3.2", "--max-steps", "30", "--eval-every", "5",
               "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    rows = json.load(open(tmp_path / "oracle.json"))["batches"]
    assert [(r["batch"], r["staleness"], r["skipped"]) for r in rows] == [
        (32, 0, 0), (32, 0, 2), (64, 0, 0), (64, 3, 0)]
    assert "| 64 | 2 | stale by 3 steps |" in done.stdout
    assert "| 32 | 1 | first 2 steps not taken |" in done.stdout
