"""esync/logs_tools/compare.py on small hand-made summaries: 2 configurations x 3 seeds.

Every number asserted below is worked out by hand from the summaries built here (no
training). Targets 0.90, 0.95, 0.97; ESync's speedup is measured at 0.95.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join("src", "esync", "logs_tools", "compare.py")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
NET = "net"
EVAL_BYTES = 7_000_000  # per evaluation: were the evaluator counted, traffic would show it


def record(elapsed, acc=None, samples=100, nbytes=1000):
    n = len(elapsed)
    return {
        "accuracy_list": list(acc) if acc is not None else [None] * n,
        "num_samples_list": [samples] * n,
        "self_iters_list": [1] * n,
        "elapsed_time_list": list(elapsed),
        "aggregate_time_list": [0.0] * n,
        "compute_time_list": [0.5] * n,
        "bytes_list": [nbytes] * n,
        "loss_list": [None] * n,
        "rounds_list": list(range(1, n + 1)),
    }


def job(times, accs, end, nbytes):
    """Two workers (hostA/cpu0, hostB/gpu0), 2 rounds each ending at `end` s, 100
    samples and `nbytes` bytes a round (400 samples, 4 * nbytes bytes in all), and an
    evaluator on hostA testing at `times` (it may go on after the workers' end)."""
    return {"hostA": {"cpu0": record([end / 2, end], nbytes=nbytes),
                      "evaluator": record(times, accs, samples=0, nbytes=EVAL_BYTES)},
            "hostB": {"gpu0": record([end / 2, end], nbytes=nbytes)}}


def alone(end, acc):
    """Standalone: one device evaluating itself, 2 rounds of 50 samples, no traffic."""
    return {"hostA": {"cpu0": record([10, end], acc, samples=50, nbytes=0)}}


def write(out, config, seed, folder, name, summary):
    d = out / config / f"seed{seed}" / NET / folder
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{name}.json"
    path.write_text(summary if isinstance(summary, str) else json.dumps(summary))
    return path


def build(out):
    """Write both configurations; return the broken summary's path."""
    # ---- plain
    # ESync: t(0.90) [2, 3, 1], t(0.95) [4, 5, 6], t(0.97) [6, 8, n/r];
    # final [0.975, 0.98, 0.96]; B/sample 4*nbytes/400 = [10, 20, 15];
    # samples/s 400/end = [100, 80, 50] (the evaluator's later ends 6 and 8 not counted)
    esync = [([0, 2, 4, 6], [0.5, 0.92, 0.96, 0.975], 4, 1000),
             ([0, 3, 5, 8], [0.5, 0.91, 0.955, 0.98], 5, 2000),
             ([0, 1, 6, 7], [0.5, 0.93, 0.95, 0.96], 8, 1500)]
    # SSGD: t(0.90) [5, 4, 6], t(0.95) [10, 12, 15] (speedup 2.5, 2.4, 2.5),
    # t(0.97) [20, n/r, n/r]; 20 B/sample; samples/s [20, 13.33, 16]
    sync = [([0, 5, 10, 20], [0.4, 0.9, 0.95, 0.97], 20, 2000),
            ([0, 4, 12, 30], [0.4, 0.9, 0.951, 0.965], 30, 2000),
            ([0, 6, 15, 25], [0.4, 0.92, 0.96, 0.962], 25, 2000)]
    # DDP: seed2 is broken; t(0.90) [3, 2], t(0.95) [8, n/r] (speedup 8/4 = 2),
    # final [0.95, 0.94]; 5 B/sample; samples/s [50, 44.44]
    ddp = [([0, 3, 8], [0.5, 0.9, 0.95], 8, 500),
           ([0, 2, 9], [0.6, 0.91, 0.94], 9, 500)]
    for seed in range(3):
        write(out, "plain", seed, "esync", "ESync", job(*esync[seed]))
        write(out, "plain", seed, "sync", "Sync", job(*sync[seed]))
        # Standalone: 0.91 at [40, 50, 45] s, samples/s 100/end
        write(out, "plain", seed, "local", "Local", alone([40, 50, 45][seed], [0.8, 0.91]))
    for seed in range(2):
        write(out, "plain", seed, "ddp", "DDP", job(*ddp[seed]))
    broken = write(out, "plain", 2, "ddp", "DDP", "{not json")

    # ---- links
    # ESync: t [3,4,5] / [6,7,8] / [9,10,11]; SSGD in seeds 0 and 1 only (seed2 has no
    # sync folder): t(0.95) [12, 21] -> speedup [2, 3]
    for seed in range(3):
        write(out, "links", seed, "esync", "ESync",
              job([0, 3 + seed, 6 + seed, 9 + seed], [0.5, 0.9, 0.95, 0.975 + seed / 1000],
                  10, 1000))
    write(out, "links", 0, "sync", "Sync", job([0, 12], [0.5, 0.95], 12, 1000))
    write(out, "links", 1, "sync", "Sync", job([0, 21], [0.5, 0.95], 21, 1000))
    # non-IID: ESync t(0.95) [20, n/r, 30]; DDP t(0.95) [40, 50, n/r] -> speedup [2, -, -]
    for seed, (t_esync, t_ddp) in enumerate([(20, 40), (None, 50), (30, None)]):
        write(out, "links", seed, "esync-niid", "ESync-Non-IID",
              job([0, 10 + 2 * seed, t_esync or 90], [0.5, 0.9, 0.95 if t_esync else 0.94],
                  90, 1000))
        write(out, "links", seed, "ddp-niid", "DDP-Non-IID",
              job([0, 30, t_ddp or 95], [0.5, 0.9, 0.95 if t_ddp else 0.93], 95, 1000))
    # not a seed of ours: no net/ folder; not a configuration: no seed folder
    (out / "links" / "seed3" / "othernet").mkdir(parents=True)
    (out / "notes").mkdir()
    return broken


def run(*args):
    env = dict(os.environ, MPLBACKEND="Agg")
    return subprocess.run([sys.executable, SCRIPT, *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    out = tmp_path_factory.mktemp("experiment")
    broken = build(out)
    proc = run("--out", out, "-n", NET, "--targets", "0.97,0.90,0.95",
               "--configs", "plain,links")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "results.json").read_text())
    return {"out": out, "proc": proc, "doc": doc, "broken": broken,
            "md": (out / "results.md").read_text()}


def algos(done, config):
    return done["doc"]["configs"][config]["algorithms"]


def approx_list(values):
    return [None if v is None else pytest.approx(v) for v in values]


def check(stats, per_seed, median, lo, hi):
    assert stats["per_seed"] == approx_list(per_seed)
    assert stats["median"] == (None if median is None else pytest.approx(median))
    assert stats["min"] == (None if lo is None else pytest.approx(lo))
    assert stats["max"] == (None if hi is None else pytest.approx(hi))


def test_top_level(done):
    doc = done["doc"]
    assert doc["network"] == NET
    assert doc["targets"] == [0.9, 0.95, 0.97]  # sorted
    assert doc["speedup_target"] == 0.95
    assert list(doc["configs"]) == ["plain", "links"]  # the order given
    assert doc["configs"]["plain"]["seeds"] == ["seed0", "seed1", "seed2"]
    assert doc["configs"]["links"]["seeds"] == ["seed0", "seed1", "seed2"]


def test_rows_in_registry_order(done):
    plain, links = algos(done, "plain"), algos(done, "links")
    assert list(plain) == ["ESync", "SSGD", "DDP", "Standalone"]
    assert list(links) == ["ESync", "SSGD", "ESync (non-IID)", "DDP (non-IID)"]
    assert plain["DDP"]["seeds"] == ["seed0", "seed1"]  # seed2's summary is broken
    assert links["SSGD"]["seeds"] == ["seed0", "seed1"]
    assert plain["DDP"]["mode"] == "ddp" and plain["DDP"]["data"] == "IID"
    assert links["DDP (non-IID)"]["mode"] == "ddp-niid"
    assert links["DDP (non-IID)"]["data"] == "non-IID"
    assert links["DDP (non-IID)"]["speedup_of"] == "ESync (non-IID)"
    assert plain["Standalone"]["speedup_of"] == "ESync"


def test_times_to_target(done):
    plain, links = algos(done, "plain"), algos(done, "links")
    t = plain["ESync"]["time_to_target"]
    assert list(t) == ["0.90", "0.95", "0.97"]
    check(t["0.90"], [2, 3, 1], 2, 1, 3)
    check(t["0.95"], [4, 5, 6], 5, 4, 6)
    check(t["0.97"], [6, 8, None], 8, 6, None)  # 2 of 3: the middle of 6, 8, n/r
    assert [t[k]["reached"] for k in t] == [3, 3, 2]
    t = plain["SSGD"]["time_to_target"]
    check(t["0.90"], [5, 4, 6], 5, 4, 6)
    check(t["0.95"], [10, 12, 15], 12, 10, 15)
    check(t["0.97"], [20, None, None], None, 20, None)  # 1 of 3: no median
    t = plain["DDP"]["time_to_target"]
    check(t["0.90"], [3, 2], 2.5, 2, 3)  # two seeds: the mean of both
    check(t["0.95"], [8, None], 8, 8, None)  # half reached: the lower middle
    check(t["0.97"], [None, None], None, None, None)
    t = plain["Standalone"]["time_to_target"]
    check(t["0.90"], [40, 50, 45], 45, 40, 50)
    check(t["0.95"], [None] * 3, None, None, None)
    t = links["ESync (non-IID)"]["time_to_target"]
    check(t["0.90"], [10, 12, 14], 12, 10, 14)
    check(t["0.95"], [20, None, 30], 30, 20, None)
    t = links["DDP (non-IID)"]["time_to_target"]
    check(t["0.95"], [40, 50, None], 50, 40, None)


def test_speedups(done):
    plain, links = algos(done, "plain"), algos(done, "links")
    for a in list(plain.values()) + list(links.values()):
        assert a["speedup"]["target"] == 0.95
    check(plain["ESync"]["speedup"], [1, 1, 1], 1, 1, 1)
    check(plain["SSGD"]["speedup"], [2.5, 2.4, 2.5], 2.5, 2.4, 2.5)
    check(plain["DDP"]["speedup"], [2, None], 2, 2, 2)
    check(plain["Standalone"]["speedup"], [None] * 3, None, None, None)
    check(links["SSGD"]["speedup"], [2, 3], 2.5, 2, 3)
    # against ESync (non-IID), which reached 0.95 in seeds 0 and 2 only
    check(links["DDP (non-IID)"]["speedup"], [2, None, None], 2, 2, 2)


def test_samples_to_target_count_the_workers_rounds_ended_by_then(done):
    plain = algos(done, "plain")
    # ESync reached 0.95 at 4, 5, 6 s; its 2 workers' rounds of 100 samples ended at
    # (2, 4), (2.5, 5), (4, 8): 400, 400, 200; the evaluator's samples do not count
    check(plain["ESync"]["samples_to_target"]["0.95"], [400, 400, 200], 400, 200, 400)
    check(plain["Standalone"]["samples_to_target"]["0.90"], [100] * 3, 100, 100, 100)
    assert plain["Standalone"]["samples_to_target"]["0.95"]["per_seed"] == [None] * 3


def test_final_accuracy_traffic_throughput(done):
    plain, links = algos(done, "plain"), algos(done, "links")
    check(plain["ESync"]["final_accuracy"], [0.975, 0.98, 0.96], 0.975, 0.96, 0.98)
    check(plain["DDP"]["final_accuracy"], [0.95, 0.94], 0.945, 0.94, 0.95)
    check(links["ESync"]["final_accuracy"], [0.975, 0.976, 0.977], 0.976, 0.975, 0.977)
    # the evaluator's bytes, samples and late ends are left out
    check(plain["ESync"]["traffic_bytes_per_sample"], [10, 20, 15], 15, 10, 20)
    check(plain["SSGD"]["traffic_bytes_per_sample"], [20] * 3, 20, 20, 20)
    check(plain["DDP"]["traffic_bytes_per_sample"], [5, 5], 5, 5, 5)
    check(plain["Standalone"]["traffic_bytes_per_sample"], [0] * 3, 0, 0, 0)
    check(plain["ESync"]["throughput_samples_per_s"], [100, 80, 50], 80, 50, 100)
    check(plain["SSGD"]["throughput_samples_per_s"], [20, 400 / 30, 16], 16, 400 / 30, 20)
    check(plain["DDP"]["throughput_samples_per_s"], [50, 400 / 9],
          (50 + 400 / 9) / 2, 400 / 9, 50)
    check(plain["Standalone"]["throughput_samples_per_s"], [2.5, 2, 100 / 45],
          100 / 45, 2, 2.5)


PLAIN_TABLE = """\
## plain

| Algorithm | Time to 0.90 (s) | Time to 0.95 (s) | Time to 0.97 (s) | ESync speedup at 0.95 \
| Samples to 0.95 (k) | Final accuracy | Traffic (B/sample) | Throughput (samples/s) |
|---|---:|---:|---:|---:|---:|---:|---:|---:|
| ESync | 2.00 [1.00-3.00] | 5.00 [4.00-6.00] | 8.00 [6.00-n/r] (2/3) | 1.00x [1.00-1.00] \
| 0.4 | 0.9750 [0.9600-0.9800] | 15 | 80 |
| SSGD | 5.00 [4.00-6.00] | 12.00 [10.00-15.00] | not reached (1/3) | 2.50x [2.40-2.50] \
| 0.2 | 0.9650 [0.9620-0.9700] | 20 | 16 |
| DDP | 2.50 [2.00-3.00] | 8.00 [8.00-n/r] (1/2) | not reached (0/2) | 2.00x [2.00-2.00] (1/2) \
| 0.4 | 0.9450 [0.9400-0.9500] | 5 | 47.2 |
| Standalone | 45.00 [40.00-50.00] | not reached (0/3) | not reached (0/3) | n/a \
| n/a | 0.9100 [0.9100-0.9100] | 0 | 2.22 |

Seeds per row (of 3): ESync 3, SSGD 3, DDP 2, Standalone 3. Targets 0.90, 0.95, 0.97: \
median [min-max] s over the seeds, n/r: not reached; ESync's speedup t_row / t_ESync at \
0.95; samples to 0.95: the workers' training samples when the evaluator first saw it, \
median of the seeds that reached it; traffic and throughput: medians.
"""


def test_markdown(done):
    md = done["md"]
    assert md.startswith(f"# Results, {NET}\n\n## plain\n")
    assert PLAIN_TABLE in md
    assert md.index("## plain") < md.index("## links")
    assert ("| ESync (non-IID) | 12.00 [10.00-14.00] | 30.00 [20.00-n/r] (2/3) "
            "| not reached (0/3) | 1.00x [1.00-1.00] (2/3) |") in md
    assert "Seeds per row (of 3): ESync 3, SSGD 2, ESync (non-IID) 3, DDP (non-IID) 3." in md
    assert done["proc"].stdout == md  # also printed


def test_figures_are_pngs(done):
    from matplotlib.image import imread
    for config in ("plain", "links"):
        for name in ("accuracy", "time_to_target", "traffic"):
            path = done["out"] / f"{name}-{config}.png"
            assert path.read_bytes()[:8] == PNG_MAGIC, path
            img = imread(str(path))
            assert img.shape[0] > 100 and img.shape[1] > 100, path
    assert not (done["out"] / "accuracy-notes.png").exists()


def test_notes_for_broken_and_missing(done):
    err = done["proc"].stderr
    out = done["out"]
    assert f"compare.py: note: cannot use {done['broken']} (" in err
    assert "; DDP of plain/seed2 left out" in err
    missing = out / "links" / "seed2" / NET / "sync" / "Sync.json"
    assert f"compare.py: note: no {missing}; SSGD of links/seed2 left out" in err
    # algorithms no seed ran (ASGD, DC-ASGD, ...) are silently absent
    assert "ASGD" not in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 2


def test_default_configs_sorted_and_library(done, tmp_path):
    from esync.logs_tools import compare
    out = tmp_path / "copy"
    shutil.copytree(done["out"], out)
    notes = []
    text = compare.compare(str(out), NET, "0.9,0.95", warn=notes.append)
    doc = json.loads((out / "results.json").read_text())
    assert list(doc["configs"]) == ["links", "plain"]  # no --configs: sorted names
    assert doc["targets"] == [0.9, 0.95] and doc["speedup_target"] == 0.9
    assert text == (out / "results.md").read_text()
    assert len(notes) == 2
    # the SSGD speedup at 0.90 of plain: 5/2, 4/3, 6/1
    check(doc["configs"]["plain"]["algorithms"]["SSGD"]["speedup"],
          [2.5, 4 / 3, 6], 2.5, 4 / 3, 6)
    with pytest.raises(compare.CompareError, match="no such folder"):
        compare.compare(str(tmp_path / "nowhere"), NET)
    (tmp_path / "empty").mkdir()
    with pytest.raises(compare.CompareError, match=re.escape(str(tmp_path / "empty"))):
        compare.compare(str(tmp_path / "empty"), NET)
    with pytest.raises(compare.CompareError, match=r"not in \(0, 1\]"):
        compare.compare(str(out), NET, [0.9, 1.2])


def test_censored_median():
    from esync.logs_tools.compare import censored_median, time_stats
    assert censored_median([3, None, 1]) == 3
    assert censored_median([None, 4, None]) is None
    assert censored_median([1, 2, 3, 4]) == 2.5
    assert censored_median([1, None, 4, 2]) == 3  # 1, 2, 4, n/r
    assert censored_median([None, 5, None, 2]) == 5  # half: the lower middle
    assert censored_median([None, None, None, 2]) is None
    assert time_stats([2, None]) == {"per_seed": [2, None], "reached": 1, "median": 2,
                                     "min": 2, "max": None}


def test_given_config_missing_is_noted(done, tmp_path):
    out = tmp_path / "exp"
    write(out, "plain", 0, "esync", "ESync",
          job([0, 1, 2, 3], [0.5, 0.9, 0.95, 0.97], 3, 300))
    proc = run("--out", out, "-n", NET, "--configs", "plain,links")
    assert proc.returncode == 0, proc.stderr
    assert (f"compare.py: note: no seed<k>/{NET}/ folder in {out / 'links'}; "
            "links left out") in proc.stderr
    doc = json.loads((out / "results.json").read_text())
    assert list(doc["configs"]) == ["plain"]
    check(doc["configs"]["plain"]["algorithms"]["ESync"]["time_to_target"]["0.97"],
          [3], 3, 3, 3)
    assert "| ESync | 1.00 [1.00-1.00] | 2.00 [2.00-2.00] | 3.00 [3.00-3.00] |" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["--targets", "0,0.9"], "compare.py: error: target 0 is not in (0, 1]"),
    (["--targets", "0.9,1.5"], "compare.py: error: target 1.5 is not in (0, 1]"),
    (["--targets", "0.9,abc"], "compare.py: error: target 'abc' is not a number"),
    (["--targets", "nan"], "compare.py: error: target nan is not in (0, 1]"),
    (["--configs", "plain,a/b"], "compare.py: error: --configs wants folder names, "
                                 "got 'a/b'"),
])
def test_cli_bad_input(done, args, message):
    proc = run("--out", done["out"], "-n", NET, *args)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [message]
    assert proc.stdout == ""


def test_cli_missing_or_empty_out(tmp_path):
    proc = run("--out", tmp_path / "nowhere", "-n", NET)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"compare.py: error: no such folder: {tmp_path / 'nowhere'}"]
    assert not (tmp_path / "nowhere").exists()
    # seed folders, but every summary broken: notes, then the error
    write(tmp_path, "plain", 0, "esync", "ESync", "[]")
    proc = run("--out", tmp_path, "-n", NET)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines[-1] == (f"compare.py: error: no <config>/seed<k>/{NET}/ with a usable "
                         f"summary in {tmp_path}")
    assert all(line.startswith("compare.py: note: ") for line in lines[:-1])
    assert not (tmp_path / "results.md").exists()


def test_console_main_and_no_torch():
    code = ("import sys; import esync.logs_tools.compare as c; "
            "assert callable(c.console_main) and callable(c.collect); "
            # the tool's own package aside
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('esync', 'torch') "
            "and not m.startswith(('esync.launch', 'esync.logs_tools', 'esync.config'))))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['esync', 'esync.logs', 'esync.logs.breakdown', 'esync.registry']"


# ---------------------------------------------------------------- runs of --metric loss

def loss_job(times, losses, end, nbytes=1000):
    """job() of a `--metric loss` run: the evaluator's val_loss_list in place of
    accuracies (every list of summary.py's, val_loss_list included)."""
    summary = job(times, None, end, nbytes)
    for host in summary.values():
        for device, rec in host.items():
            rec["val_loss_list"] = (list(losses) if device == "evaluator"
                                    else [None] * len(rec["rounds_list"]))
    return summary


def build_loss(out):
    """plain, 3 seeds, val_loss targets 1.0 and 0.5 (reached at or below).
    ESync: t(1.0) [2, 3, 1], t(0.5) [4, 6, n/r]; final [0.45, 0.5, 0.6]; 10 B/sample.
    SSGD: t(1.0) [6, 6, n/r] (speedup [3, 2, -]), t(0.5) [12, n/r, n/r];
    final [0.4, 0.7, 1.2]."""
    esync = [([0, 2, 4], [2.0, 0.9, 0.45]), ([0, 3, 6], [2.0, 1.0, 0.5]),
             ([0, 1, 5], [2.1, 0.95, 0.6])]
    sync = [([0, 6, 12], [2.0, 1.0, 0.4]), ([0, 6, 9], [2.0, 0.8, 0.7]),
            ([0, 2, 4], [2.0, 1.5, 1.2])]
    for seed in range(3):
        write(out, "plain", seed, "esync", "ESync", loss_job(*esync[seed], 4))
        write(out, "plain", seed, "sync", "Sync", loss_job(*sync[seed], 12))


@pytest.fixture(scope="module")
def lossy(tmp_path_factory):
    out = tmp_path_factory.mktemp("lossy")
    build_loss(out)
    proc = run("--out", out, "-n", NET, "--target-loss", "0.5", "1.0")
    assert proc.returncode == 0, proc.stderr
    return {"out": out, "proc": proc, "doc": json.loads((out / "results.json").read_text()),
            "md": (out / "results.md").read_text()}


def test_loss_targets_and_times(lossy):
    doc = lossy["doc"]
    assert list(doc)[:2] == ["network", "metric"] and doc["metric"] == "val_loss"
    assert doc["targets"] == [1.0, 0.5]  # the easiest first: the highest loss
    assert doc["speedup_target"] == 1.0
    plain = algos(lossy, "plain")
    assert list(plain) == ["ESync", "SSGD"]
    t = plain["ESync"]["time_to_target"]
    assert list(t) == ["1.00", "0.50"]
    check(t["1.00"], [2, 3, 1], 2, 1, 3)  # seed1's 1.0 counts: at or below
    check(t["0.50"], [4, 6, None], 6, 4, None)
    t = plain["SSGD"]["time_to_target"]
    check(t["1.00"], [6, 6, None], 6, 6, None)
    check(t["0.50"], [12, None, None], None, 12, None)
    check(plain["SSGD"]["speedup"], [3, 2, None], 2.5, 2, 3)
    check(plain["ESync"]["final_val_loss"], [0.45, 0.5, 0.6], 0.5, 0.45, 0.6)
    check(plain["SSGD"]["final_val_loss"], [0.4, 0.7, 1.2], 0.7, 0.4, 1.2)
    assert "final_accuracy" not in plain["ESync"]
    check(plain["ESync"]["traffic_bytes_per_sample"], [10] * 3, 10, 10, 10)


def test_loss_markdown_and_figures(lossy):
    from matplotlib.image import imread
    md = lossy["md"]
    assert ("| Algorithm | Time to 1.00 (s) | Time to 0.50 (s) | ESync speedup at 1.00 "
            "| Samples to 1.00 (k) | Final val_loss | Traffic (B/sample) | Throughput (samples/s) |") in md
    assert ("| ESync | 2.00 [1.00-3.00] | 6.00 [4.00-n/r] (2/3) | 1.00x [1.00-1.00] "
            "| 0.2 | 0.5000 [0.4500-0.6000] | 10 | 100 |") in md
    assert ("| SSGD | 6.00 [6.00-n/r] (2/3) | not reached (1/3) | 2.50x [2.00-3.00] (2/3) "
            "| 0.2 | 0.7000 [0.4000-1.2000] |") in md
    assert "Targets (val_loss at or below) 1.00, 0.50: median [min-max] s" in md
    assert "accuracy" not in md
    assert lossy["proc"].stdout == md and lossy["proc"].stderr == ""
    for name in ("accuracy", "time_to_target", "traffic"):  # the same file names
        path = lossy["out"] / f"{name}-plain.png"
        assert path.stat().st_size > 0 and path.read_bytes()[:8] == PNG_MAGIC, path
        assert imread(str(path)).shape[0] > 100, path


def test_loss_targets_comma_separated_and_library(lossy, tmp_path):
    from esync.logs_tools import compare
    out = tmp_path / "copy"
    shutil.copytree(lossy["out"], out)
    proc = run("--out", out, "-n", NET, "--target-loss", "1.0,0.5")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "results.json").read_text()) == lossy["doc"]
    text = compare.compare(str(out), NET, [0.5], metric="val_loss")
    assert "| ESync | 6.00 [4.00-n/r] (2/3) |" in text
    with pytest.raises(compare.CompareError, match=r"--targets gives accuracy targets"):
        compare.compare(str(out), NET)


def test_loss_target_for_accuracy_runs_is_an_error(tmp_path):
    write(tmp_path, "plain", 0, "esync", "ESync",
          job([0, 1, 2, 3], [0.5, 0.9, 0.95, 0.97], 3, 300))
    proc = run("--out", tmp_path, "-n", NET, "--target-loss", "0.5")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "compare.py: error: --target-loss gives val_loss targets, but ESync of "
        "plain/seed0 measured accuracy; give --targets"]
    assert proc.stdout == "" and not (tmp_path / "results.md").exists()


def test_accuracy_targets_for_loss_runs_are_an_error(tmp_path):
    build_loss(tmp_path)
    for args in ([], ["--targets", "0.9"]):  # the default targets are accuracies too
        proc = run("--out", tmp_path, "-n", NET, *args)
        assert proc.returncode == 2
        assert proc.stderr.strip().splitlines() == [
            "compare.py: error: --targets gives accuracy targets, but ESync of "
            "plain/seed0 measured val_loss; give --target-loss"]
        assert proc.stdout == "" and not (tmp_path / "results.json").exists()


@pytest.mark.parametrize("args, message", [
    (["--target-loss", "0.5", "-1"], "compare.py: error: target loss -1 is not a finite "
                                     "number >= 0"),
    (["--target-loss", "abc"], "compare.py: error: target loss 'abc' is not a number"),
    (["--target-loss", "inf"], "compare.py: error: target loss inf is not a finite "
                               "number >= 0"),
    (["--target-loss", "0.5", "--targets", "0.9"],
     "compare.py: error: give --targets (accuracy) or --target-loss (val_loss), not both"),
])
def test_cli_bad_loss_targets(lossy, args, message):
    proc = run("--out", lossy["out"], "-n", NET, *args)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [message]
    assert proc.stdout == ""


def test_seed_band_holds_each_curve_between_evaluations_and_spans_the_seeds():
    from esync.logs_tools import compare

    times, median, low, high = compare.seed_band(
        [([1.0, 3.0], [0.2, 0.6]), ([2.0, 5.0], [0.4, 0.8]), ([], [])], points=9)
    assert times[0] == 1.0 and times[-1] == 5.0 and len(times) == 9  # 1.0, 1.5, ... 5.0
    at = {float(t): (float(m), float(lo), float(hi))
          for t, m, lo, hi in zip(times, median, low, high)}
    assert at[1.5] == (0.2, 0.2, 0.2)  # only the first seed has begun
    assert at[2.5] == pytest.approx((0.3, 0.2, 0.4))  # both, each held at its last value
    assert at[3.0] == pytest.approx((0.5, 0.4, 0.6))
    assert at[4.0] == (0.4, 0.4, 0.4)  # the first seed ended at 3.0: only the second
    assert at[5.0] == (0.8, 0.8, 0.8)
    assert compare.seed_band([([], [])]) is None
