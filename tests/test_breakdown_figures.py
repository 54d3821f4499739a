"""Where the time went: summary.py's breakdown lists and per-device totals, and the
drawer's breakdown.png and rates.png (esync/logs_tools/breakdown.py), on iteration files
written here and on the logs of a real job (esync/launch/local.py, two workers, one slowed)."""
import json
import os
import subprocess
import sys

import pytest

import esync.logs.breakdown
from esync.logs_tools import breakdown, drawer, summary
from tests.helpers import REPO
from tests.test_drawer import PNG_MAGIC
from tests.test_launch_local import LAUNCH, children_of
from tests.test_summary import FIELDS, write_round

CATEGORIES = list(esync.logs.breakdown.CATEGORIES)
NEW_LISTS = [f"breakdown_{c}_list" for c in CATEGORIES] + [
    "prep_seconds_list", "read_bytes_list", "read_seconds_list", "cache_hits_list",
    "remote_batches_list"]
# the colours of the compute segment and of the first two devices' lines
COMPUTE_RGB, LINE_RGBS = (0.173, 0.627, 0.173), [(0.122, 0.467, 0.706), (1.0, 0.498, 0.055)]


def split(**seconds):
    """A round's breakdown: the categories given, the others 0."""
    return {c: seconds.get(c, 0.0) for c in CATEGORIES}


def quiet(line):
    raise AssertionError(f"unexpected warning: {line}")


def summarize(base, mode="esync", warn=quiet):
    return summary.summarize(str(base), "lenet", mode, warn=warn)


# --- the summary's new fields, on files written here -------------------------------------

def test_lists_and_totals_of_a_device_with_a_breakdown(tmp_path):
    dev = str(tmp_path / "lenet" / "esync" / "h" / "w0")
    write_round(dev, 1, num_samples=64, total_time=2.0,
                breakdown=split(prep=0.25, compute=1.0, communication=0.5, wait=0.125,
                                state_server=0.0625, other=0.0625),
                prep_seconds=0.5, read_bytes=1_000_000, read_seconds=0.5)
    # DDP-like: no `wait` in the breakdown (it counts 0); a cache hit and a remote batch
    write_round(dev, 2, num_samples=128, total_time=4.0,
                breakdown={"fetch": 0.5, "prep": 0.0, "compute": 1.25,
                           "communication": 0.25, "state_server": 0.0, "other": 0.0},
                prep_seconds=0.25, read_bytes=3_000_000, read_seconds=1.5, cache_hits=3,
                remote_batches=1)
    rec = summarize(tmp_path)["h"]["w0"]
    assert list(rec) == FIELDS + NEW_LISTS + ["totals"]
    assert rec["breakdown_compute_list"] == [1.0, 1.25]
    assert rec["breakdown_wait_list"] == [0.125, 0]
    assert rec["breakdown_fetch_list"] == [0.0, 0.5]
    assert rec["prep_seconds_list"] == [0.5, 0.25]
    assert rec["read_bytes_list"] == [1_000_000, 3_000_000]
    assert rec["read_seconds_list"] == [0.5, 1.5]
    assert rec["cache_hits_list"] == [None, 3] and rec["remote_batches_list"] == [None, 1]
    # the old lists are as they were
    assert rec["compute_time_list"] == [1.5, 1.5] and rec["elapsed_time_list"] == [2.0, 4.0]
    t = rec["totals"]
    assert t["seconds"] == {"fetch": 0.5, "prep": 0.25, "compute": 2.25,
                            "communication": 0.75, "wait": 0.125, "state_server": 0.0625,
                            "other": 0.0625}
    assert t["breakdown_seconds"] == 4.0 and t["breakdown_rounds"] == 2 == t["rounds"]
    assert t["share"]["compute"] == pytest.approx(2.25 / 4)
    assert sum(t["share"].values()) == pytest.approx(1.0)
    assert t["samples"] == 192 and t["elapsed_seconds"] == 4.0
    assert t["samples_per_second"] == pytest.approx(48.0)
    assert t["prep_seconds"] == 0.75
    assert t["read_bytes"] == 4_000_000 and isinstance(t["read_bytes"], int)
    assert t["read_seconds"] == 2.0 and t["read_MB_per_s"] == pytest.approx(2.0)
    assert t["cache_hits"] == 3 and t["remote_batches"] == 1
    # and the summary file says the same (strict JSON)
    out, written = summary.write_summary(str(tmp_path), "lenet", "esync", warn=quiet)
    assert json.loads(open(out).read()) == written == {"h": {"w0": rec}}


def test_older_logs_keep_their_record_beside_newer_ones(tmp_path):
    """A device whose logs have no breakdown (older logs, the evaluator) keeps the record
    it had; a device that gained one part-way has nulls in its older rounds."""
    host = tmp_path / "lenet" / "sync" / "h"
    for n in (1, 2):
        write_round(str(host / "old"), n, num_samples=10, total_time=float(n))
        write_round(str(host / "evaluator"), n, time={"0": {"pull": 0.1, "evaluate": 0.2}},
                    num_samples=0, total_time=n - 1.0, accuracy=0.5, loss=None)
    write_round(str(host / "resumed"), 1, num_samples=10, total_time=1.0)
    write_round(str(host / "resumed"), 2, num_samples=30, total_time=3.0,
                breakdown=split(compute=1.5, wait=0.5))
    data = summarize(tmp_path, "sync")["h"]
    assert list(data["old"]) == FIELDS and list(data["evaluator"]) == FIELDS
    rec = data["resumed"]
    assert rec["breakdown_compute_list"] == [None, 1.5]
    assert rec["read_bytes_list"] == [None, None] and rec["prep_seconds_list"] == [None, None]
    t = rec["totals"]
    assert t["breakdown_rounds"] == 1 and t["rounds"] == 2
    assert t["breakdown_seconds"] == 2.0  # round 2's wall time only
    assert t["share"]["compute"] == 0.75 and t["share"]["wait"] == 0.25
    assert t["samples_per_second"] == pytest.approx(40 / 3.0)  # all rounds
    assert t["read_bytes"] is None and t["read_MB_per_s"] is None
    assert t["cache_hits"] is None and t["prep_seconds"] is None


def test_shard_counters_without_a_breakdown(tmp_path):
    """Logs of shards from before the breakdown: read rate, no seconds and no share."""
    dev = str(tmp_path / "lenet" / "esync" / "h" / "w0")
    write_round(dev, 1, read_bytes=5_000_000, read_seconds=0.0)
    write_round(dev, 2, read_bytes=0, read_seconds=0.0)
    t = summarize(tmp_path)["h"]["w0"]["totals"]
    assert t["seconds"] is None and t["share"] is None and t["breakdown_seconds"] is None
    assert t["breakdown_rounds"] == 0
    assert t["read_bytes"] == 5_000_000 and t["read_MB_per_s"] is None  # no read time
    # not drawn in breakdown.png, without a note
    groups = [("ESync", [("w0", summarize(tmp_path)["h"]["w0"])])]
    assert breakdown.breakdown_rows(groups, quiet) == []


@pytest.mark.parametrize("fields, reason", [
    ({"breakdown": [1, 2]}, "'breakdown' is not an object: [1, 2]"),
    ({"breakdown": {"compute": "1.0"}}, "'breakdown'['compute'] is not a number: '1.0'"),
    ({"breakdown": {"wait": True}}, "'breakdown'['wait'] is not a number: True"),
    ({"read_bytes": -1}, "'read_bytes' is not a count: -1"),
    ({"prep_seconds": "0.5"}, "'prep_seconds' is not a number: '0.5'"),
    ({"cache_hits": 1.5}, "'cache_hits' is not a count: 1.5"),
])
def test_a_malformed_breakdown_skips_its_file_by_name(tmp_path, fields, reason):
    dev = str(tmp_path / "lenet" / "esync" / "h" / "w0")
    write_round(dev, 1, breakdown=split(compute=1.0))
    bad = write_round(dev, 2, **fields)
    write_round(dev, 3, total_time=3.0, breakdown=split(compute=2.0))
    lines = []
    rec = summarize(tmp_path, warn=lines.append)["h"]["w0"]
    assert lines == [f"summary.py: skipped {bad}: {reason}"]
    assert rec["rounds_list"] == [1, 3] and rec["breakdown_compute_list"] == [1.0, 2.0]


# --- the drawer's parts, in process ------------------------------------------------------

def test_samples_per_second_per_round_and_over_a_window():
    rec = {"elapsed_time_list": [1.0, 3.0, 3.0, 4.0], "num_samples_list": [10, 40, 5, None]}
    # round 3 took no time (left out); a null count is 0 samples
    assert breakdown.samples_per_second(rec, 1) == ([1.0, 3.0, 4.0], [10.0, 20.0, 0.0])
    xs, ys = breakdown.samples_per_second(rec, 2)  # the last two rounds' samples and time
    assert xs == [1.0, 3.0, 3.0, 4.0] and ys == pytest.approx([10.0, 50 / 3, 22.5, 5.0])
    assert breakdown.window(99) == 1 and breakdown.window(275) == 5


def test_bars_are_the_shares_of_each_device_s_time():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [("ESync", [("w0", split(compute=3.0, communication=1.0)),
                       ("w1", split(fetch=1.0, compute=1.0))]),
            ("SSGD", [("w0", split(compute=1.0, wait=1.0))])]
    fig, ax = plt.subplots()
    try:
        breakdown.plot_breakdown(ax, rows)
        bars = {}
        for container, category in zip(ax.containers, CATEGORIES):
            for patch, (mode, device) in zip(container, [("ESync", "w0"), ("ESync", "w1"),
                                                          ("SSGD", "w0")]):
                bars[(mode, device, category)] = (patch.get_x(), patch.get_width())
        assert bars[("ESync", "w0", "compute")] == (0.0, 0.75)
        assert bars[("ESync", "w0", "communication")] == (0.75, 0.25)
        assert bars[("ESync", "w1", "fetch")] == (0.0, 0.5)
        assert bars[("ESync", "w1", "compute")] == (0.5, 0.5)
        assert bars[("SSGD", "w0", "wait")] == (0.5, 0.5)
        assert [t.get_text() for t in ax.get_yticklabels()] == ["w0", "w1", "w0"]
        texts = [t.get_text() for t in ax.texts]
        assert "ESync" in texts and "SSGD" in texts and "4 s" in texts
    finally:
        plt.close(fig)


def test_unusable_totals_are_noted_and_left_out():
    good = {"totals": {"seconds": split(compute=1.0)}}
    bad = {"totals": {"seconds": {"compute": -1.0}}}
    notes = []
    rows = breakdown.breakdown_rows([("ESync", [("w0", good), ("w1", bad)])], notes.append)
    assert rows == [("ESync", [("w0", split(compute=1.0))])]
    assert notes == ["ESync w1: totals.seconds['compute'] is -1.0; left out of "
                     "breakdown.png"]


def test_without_a_breakdown_the_figure_is_skipped_with_a_note(tmp_path, capsys):
    for n in (1, 2):
        write_round(str(tmp_path / "lenet" / "sync" / "h" / "w0"), n, total_time=float(n))
    summary.write_summary(str(tmp_path), "lenet", "sync", warn=quiet)
    drawer.draw(str(tmp_path), "lenet", outdir=str(tmp_path / "figs"))
    err = capsys.readouterr().err
    assert "breakdown.png not written" in err and "logs older than it" in err
    assert not (tmp_path / "figs" / "breakdown.png").exists()
    assert (tmp_path / "figs" / "rates.png").read_bytes()[:8] == PNG_MAGIC


# --- a real job's logs -------------------------------------------------------------------

@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """An ESync job of two workers, the second one slowed down 4x, its summary (the
    command) and the drawer's figures (the command) from its logs."""
    out = tmp_path_factory.mktemp("job")
    proc = subprocess.Popen(
        [sys.executable, LAUNCH, "-m", "esync", "--workers", "2", "--servers", "1",
         "--slowdown", "1,4", "-n", "lenet", "--num-threads", "1", "--time-limit", "6",
         "--out", str(out), "--no-progress"],
        cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        log, _ = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, log
    assert not children_of(proc.pid)
    tool = lambda *args: subprocess.run(  # noqa: E731
        [sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=120,
        env=dict(os.environ, MPLBACKEND="Agg"))
    made = tool(os.path.join("src", "esync", "logs_tools", "summary.py"), "-b", str(out), "-n", "lenet",
                "-m", "esync")
    assert made.returncode == 0, made.stderr
    drawn = tool(os.path.join("src", "esync", "logs_tools", "drawer.py"), "-b", str(out), "-n", "lenet",
                 "-o", str(out / "figures"))
    assert drawn.returncode == 0, drawn.stderr
    (host,) = json.loads((out / "lenet" / "esync" / "ESync.json").read_text()).values()
    return {"out": out, "devices": host, "figures": out / "figures", "drawn": drawn}


def coloured_pixels(path, rgb, tolerance=0.03):
    """How many pixels of the PNG at path have colour rgb."""
    import numpy as np
    from matplotlib.image import imread
    image = imread(str(path))
    return int((np.abs(image[:, :, :3] - np.array(rgb)).max(axis=2) < tolerance).sum())


def test_the_job_s_figures_are_drawn(job):
    assert "Traceback" not in job["drawn"].stderr
    assert "breakdown.png not written" not in job["drawn"].stderr
    from matplotlib.image import imread
    for name in ("breakdown.png", "rates.png"):
        path = job["figures"] / name
        data = path.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 10_000, name
        height, width = imread(str(path)).shape[:2]
        assert height > 300 and width > 500, name
    # the compute segments of the two workers' bars, and the two workers' rate lines
    assert coloured_pixels(job["figures"] / "breakdown.png", COMPUTE_RGB) > 5_000
    for rgb in LINE_RGBS:
        assert coloured_pixels(job["figures"] / "rates.png", rgb) > 300


def test_the_job_s_breakdown_sums_to_each_device_s_time(job):
    devices = job["devices"]
    assert sorted(devices) == ["evaluator", "w0", "w1-x4"]
    assert "totals" not in devices["evaluator"]  # it trains on nothing
    for name in ("w0", "w1-x4"):
        rec = devices[name]
        t = rec["totals"]
        assert t["rounds"] == t["breakdown_rounds"] == len(rec["rounds_list"]) > 10, name
        assert t["breakdown_seconds"] == pytest.approx(t["elapsed_seconds"], rel=0.02), name
        assert sum(t["share"].values()) == pytest.approx(1.0)
        assert t["seconds"]["compute"] > 0 and t["seconds"]["communication"] > 0, name
        assert t["samples"] == sum(rec["num_samples_list"]) > 0
        assert t["elapsed_seconds"] == rec["elapsed_time_list"][-1]
        assert t["samples_per_second"] == pytest.approx(t["samples"] / t["elapsed_seconds"])
        for c in CATEGORIES:  # the totals are the lists' sums
            assert t["seconds"][c] == pytest.approx(sum(rec[f"breakdown_{c}_list"]))
        # round by round, the categories are the round's time (elapsed differences)
        walls = [sum(rec[f"breakdown_{c}_list"][i] for c in CATEGORIES)
                 for i in range(len(rec["rounds_list"]))]
        steps = [b - a for a, b in zip([0.0] + rec["elapsed_time_list"],
                                       rec["elapsed_time_list"])]
        off = sorted(abs(w - s) for w, s in zip(walls, steps))
        assert off[len(off) // 2] < 0.001, (name, off[-5:])


def test_the_slowed_worker_computes_longer_per_sample_and_trains_slower(job):
    # The slowdown waits (F - 1) x the worker's CPU time, while a crowded machine
    # stretches both workers' wall time: at 4x the margin holds with walls 10x CPU.
    fast, slow = (job["devices"][d]["totals"] for d in ("w0", "w1-x4"))
    per_sample = lambda t: t["seconds"]["compute"] / t["samples"]  # noqa: E731
    assert per_sample(slow) > 1.3 * per_sample(fast)
    assert fast["samples_per_second"] > 1.3 * slow["samples_per_second"]
    # the rate lines say the same, round by round
    import statistics
    rates = {d: statistics.median(breakdown.samples_per_second(job["devices"][d])[1])
             for d in ("w0", "w1-x4")}
    assert rates["w0"] > 1.3 * rates["w1-x4"]


def test_the_drawer_draws_the_job_s_workers(job):
    data = drawer.load_all(str(job["out"]), "lenet")
    rows = breakdown.breakdown_rows(drawer.device_groups(data), quiet)
    assert [(mode, [d for d, _ in devices]) for mode, devices in rows] == \
        [("ESync", ["w0", "w1-x4"])]
    series = breakdown.rate_series(drawer.device_groups(data))
    assert [(mode, [d for d, _, _ in lines]) for mode, lines in series] == \
        [("ESync", ["w0", "w1-x4"])]
