"""--data-split for map-style data, in a real job of a user's script (tests/ids_script.py,
whose samples carry their index) started by esync-run: static gives each worker its own
share; whole lets each draw from every sample in an order of its own, so that the device
that trains more does not go round its share, while the job's epochs stay the size of
the data set."""
import json
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO

SCRIPT = os.path.join(REPO, "tests", "ids_script.py")
SAMPLES = 4800  # ids_script.SAMPLES
ROUND_MOST = 2 * 64 * 16  # two devices' --max-local-steps batches of 16


def drawn_by_rank(tmp_path, split, slowdown):
    """ids_script.py's 3 epochs on two devices at `slowdown`: what each drew, by rank."""
    out = tmp_path / split
    out.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "esync.launch.run", "--out", str(tmp_path / "runs"),
         "--no-progress", "--num-threads", "1", "--workers", "2", "-m", "esync",
         "--slowdown", slowdown, *([] if split == "default" else ["--data-split", split]),
         SCRIPT, str(out), "--epochs", "3"],
        cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = [json.load(open(out / f)) for f in os.listdir(out)]
    return sorted(seen, key=lambda s: s["rank"])


@pytest.mark.slow
@pytest.mark.parametrize("split", ["static", "whole"])
def test_a_device_sitting_rounds_out_ends_its_passes_after_the_others_round(tmp_path,
                                                                            split):
    """At --slowdown 1,30 the slow device sits rounds out (below the least speed): each
    of its passes ends after the round that ended the job's epoch, as the fast one's
    does, not one sat-out round later (it ran 17 rounds to the fast one's 16: the
    last one answered only as the fast one left)."""
    ranks = drawn_by_rank(tmp_path, split, slowdown="1,30")
    assert [r["passes"] for r in ranks] == [3, 3]
    assert ranks[0]["rounds"] == ranks[1]["rounds"], ranks[0]["rounds"]
    assert len(ranks[0]["drawn"]) > 10 * len(ranks[1]["drawn"])  # it sat most rounds out


@pytest.mark.slow
@pytest.mark.parametrize("split", ["static", "whole", "default"])  # default: whole
def test_each_split_draws_what_it_says_and_ends_the_job_s_epochs_together(tmp_path, split):
    # static at 2,6: every device slowed (2/3 of a core together), the slow one still
    # measures a third of the fast one's speed under CI's load and covers its share (at
    # 1,3 it sometimes sat rounds out); whole at 1,3, where it must train more than a
    # half's samples
    ranks = drawn_by_rank(tmp_path, split, "2,6" if split == "static" else "1,3")
    assert [r["passes"] for r in ranks] == [3, 3]
    assert ranks[0]["rounds"] == ranks[1]["rounds"]
    total = sum(len(r["drawn"]) for r in ranks)
    # three epochs of the job: three times the data set, ended after the round that
    # reached it
    assert 3 * SAMPLES <= total <= 3 * SAMPLES + ROUND_MOST
    sets = [set(r["drawn"]) for r in ranks]
    more = max(ranks, key=lambda r: len(r["drawn"]))
    assert len(more["drawn"]) >= 1.5 * SAMPLES
    if split == "static":
        # each its own half, whichever trains more
        assert not sets[0] & sets[1]
        assert len(sets[0]) == len(sets[1]) == SAMPLES // 2
    else:
        # the one that trains more drew every sample, each once in its first epoch
        assert len(set(more["drawn"][:SAMPLES])) == SAMPLES
        # and the other went on in its own order of every sample, not in a half: its
        # draws, each once, meet the half the other drew first (a static share would
        # be disjoint from it). Not by their count: under CI's load the slow device
        # measured slower and drew 1,632, fewer than a half's 2,400.
        less = min(ranks, key=lambda r: len(r["drawn"]))
        first = less["drawn"][:SAMPLES]
        assert len(set(first)) == len(first) >= 64
        assert set(first) & set(more["drawn"][:SAMPLES // 2])
