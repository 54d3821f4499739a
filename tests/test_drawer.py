"""esync/logs_tools/drawer.py run as a script on small hand-made summaries."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join("src", "esync", "logs_tools", "drawer.py")
PNGS = ("accuracy_iid.png", "accuracy_noniid.png", "throughput.png", "traffic.png",
        "computing_ratio.png")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
NET = "net"


def record(elapsed, acc=None, samples=100, compute=1.0, nbytes=1_000_000):
    """A record of len(elapsed) rounds; acc None means a device that never evaluates."""
    n = len(elapsed)
    return {
        "accuracy_list": list(acc) if acc is not None else [None] * n,
        "num_samples_list": [samples] * n,
        "self_iters_list": [2] * n,
        "elapsed_time_list": list(elapsed),
        "aggregate_time_list": [0.1] * n,
        "compute_time_list": [compute] * n,
        "bytes_list": [nbytes] * n,
        "loss_list": [1.0] * n,
        "rounds_list": list(range(1, n + 1)),
    }


def write(base, folder, name, summary):
    d = base / NET / folder
    d.mkdir(parents=True, exist_ok=True)
    path = d / (name + ".json")
    path.write_text(summary if isinstance(summary, str) else json.dumps(summary))
    return path


def three_devices(elapsed, acc, eval_at="gpu0"):
    """hostA/cpu0, hostA/cpu1, hostB/gpu0; only eval_at (never the first) has accuracies."""
    devs = {("hostA", "cpu0"): record(elapsed),
            ("hostA", "cpu1"): record(elapsed),
            ("hostB", "gpu0"): record(elapsed)}
    key = ("hostB", "gpu0") if eval_at == "gpu0" else ("hostA", eval_at)
    devs[key] = record(elapsed, acc)
    out = {}
    for (h, d), r in devs.items():
        out.setdefault(h, {})[d] = r
    return out


def run(*args):
    env = dict(os.environ, MPLBACKEND="Agg")
    return subprocess.run([sys.executable, SCRIPT, *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)


def assert_pngs(outdir):
    from matplotlib.image import imread
    for name in PNGS:
        path = outdir / name
        assert path.is_file(), name
        data = path.read_bytes()
        assert len(data) > 0 and data[:8] == PNG_MAGIC, name
        img = imread(str(path))
        assert img.shape[0] > 100 and img.shape[1] > 100, name


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """All modes but async-niid; dcasgd-niid is broken JSON.  Target 0.8."""
    base = tmp_path_factory.mktemp("logs")
    # IID.  SSGD reaches 0.8 at 40 s.
    sync = three_devices([10, 20, 30, 40], [None, 0.5, 0.7, 0.85])
    # hostA/cpu0 ends at 38 s and computes 4 s a round there; the job lasts 40 s
    sync["hostA"]["cpu0"] = record([9.5, 19, 28.5, 38], compute=4.0)
    write(base, "sync", "Sync", sync)
    # ESync at 10 s -> 4x; evaluating on hostA/cpu1 (second device)
    write(base, "esync", "ESync",
          three_devices([5, 10, 15, 20], [0.6, 0.82, 0.9, 0.91], eval_at="cpu1"))
    # ASGD at 24 s -> 40/24; final 0.79 below its best 0.81
    write(base, "async", "Async",
          three_devices([8, 16, 24, 32], [0.5, 0.6, 0.81, 0.79]))
    # DC-ASGD never reaches the target
    write(base, "dcasgd", "DCASGD",
          three_devices([10, 20, 30, 40], [0.3, 0.4, None, 0.6]))
    # Standalone: one device, every round evaluated, best 0.90, target at 20 s
    write(base, "local", "Local",
          {"hostA": {"cpu0": record([10, 20, 30, 40], [0.7, 0.88, 0.9, 0.89],
                                    samples=50, nbytes=0)}})
    # non-IID: SSGD at 50 s, ESync at 25 s -> 2x
    write(base, "sync-niid", "Sync-Non-IID",
          three_devices([25, 50, 75], [0.5, 0.8, 0.82]))
    write(base, "esync-niid", "ESync-Non-IID",
          three_devices([12.5, 25, 37.5], [0.7, 0.85, 0.86], eval_at="cpu1"))
    bad = write(base, "dcasgd-niid", "DCASGD-Non-IID", "{not json")
    out = base / "out"
    proc = run("-b", base, "-n", NET, "-o", out, "--target", 0.8)
    doc = json.loads((out / "speedup.json").read_text()) if proc.returncode == 0 else None
    return {"base": base, "out": out, "proc": proc, "doc": doc, "bad": bad}


def rows_by_name(doc):
    return {r["algorithm"]: r for r in doc["rows"]}


def test_runs_and_writes_all_pngs(full):
    assert full["proc"].returncode == 0, full["proc"].stderr
    assert_pngs(full["out"])


def test_time_to_target_and_speedup(full):
    rows = rows_by_name(full["doc"])
    assert list(rows) == ["ESync", "SSGD", "ASGD", "DC-ASGD", "Standalone",
                          "ESync (non-IID)", "SSGD (non-IID)"]
    expect = {  # name: (time to 0.8, speedup over SSGD on the same data)
        "ESync": (10, 4.0), "SSGD": (40, 1.0), "ASGD": (24, 40 / 24),
        "DC-ASGD": (None, None), "Standalone": (20, 2.0),
        "ESync (non-IID)": (25, 2.0), "SSGD (non-IID)": (50, 1.0),
    }
    for name, (t, s) in expect.items():
        assert rows[name]["time_to_target_s"] == t, name
        assert rows[name]["speedup_vs_ssgd"] == pytest.approx(s), name


def test_accuracies_and_standalone(full):
    doc = full["doc"]
    rows = rows_by_name(doc)
    assert doc["standalone_best_accuracy"] == pytest.approx(0.90)
    expect = {  # name: (final, best, final - standalone best)
        "ESync": (0.91, 0.91, 0.01), "SSGD": (0.85, 0.85, -0.05),
        "ASGD": (0.79, 0.81, -0.11), "DC-ASGD": (0.6, 0.6, -0.30),
        "ESync (non-IID)": (0.86, 0.86, -0.04),
    }
    for name, (final, best, diff) in expect.items():
        assert rows[name]["final_accuracy"] == pytest.approx(final), name
        assert rows[name]["best_accuracy"] == pytest.approx(best), name
        assert rows[name]["final_minus_standalone"] == pytest.approx(diff), name


def test_evaluating_device_is_the_one_with_accuracies(full):
    rows = rows_by_name(full["doc"])
    assert rows["ESync"]["evaluating_device"] == "hostA/cpu1"
    assert rows["SSGD"]["evaluating_device"] == "hostB/gpu0"
    assert rows["ESync (non-IID)"]["evaluating_device"] == "hostA/cpu1"
    assert rows["Standalone"]["evaluating_device"] == "hostA/cpu0"


def test_throughput_traffic_computing_ratio(full):
    doc = full["doc"]
    # SSGD: 3 devices x 4 rounds x 100 samples over 40 s; 12 MB over 40 s
    assert doc["throughput_samples_per_s"]["SSGD"] == pytest.approx(30.0)
    assert doc["throughput_samples_per_s"]["ESync"] == pytest.approx(1200 / 20)
    assert doc["throughput_samples_per_s"]["Standalone"] == pytest.approx(200 / 40)
    assert doc["traffic_MB_per_s"]["SSGD"] == pytest.approx(0.3)
    assert doc["traffic_MB_per_s"]["ASGD"] == pytest.approx(12 / 32)
    assert "Standalone" not in doc["traffic_MB_per_s"]
    ratio = doc["computing_ratio"]
    assert set(ratio) == {"ESync", "SSGD", "ASGD", "DC-ASGD"}
    assert ratio["SSGD"]["hostA/cpu0"] == pytest.approx(16 / 38)
    assert ratio["SSGD"]["hostB/gpu0"] == pytest.approx(4 / 40)
    assert ratio["ESync"]["hostA/cpu1"] == pytest.approx(4 / 20)


def test_markdown_table(full):
    md = (full["out"] / "speedup.md").read_text()
    stdout = full["proc"].stdout
    for text in (md, stdout):
        assert "| ESync | 10.00 | 4.00x | 0.9100 | 0.9100 | +0.0100 |" in text
        assert "| SSGD | 40.00 | 1.00x | 0.8500 | 0.8500 | -0.0500 |" in text
        assert "| ASGD | 24.00 | 1.67x | 0.7900 | 0.8100 | -0.1100 |" in text
        assert "| DC-ASGD | not reached | n/a | 0.6000 | 0.6000 | -0.3000 |" in text
        assert "| ESync (non-IID) | 25.00 | 2.00x |" in text


SPEEDUP_MD = """\
# Speedup, net

| Algorithm | Time to 0.8 accuracy (s) | Speedup vs SSGD | Final accuracy | Best accuracy \
| Final - standalone best |
|---|---:|---:|---:|---:|---:|
| ESync | 10.00 | 4.00x | 0.9100 | 0.9100 | +0.0100 |
| SSGD | 40.00 | 1.00x | 0.8500 | 0.8500 | -0.0500 |
| ASGD | 24.00 | 1.67x | 0.7900 | 0.8100 | -0.1100 |
| DC-ASGD | not reached | n/a | 0.6000 | 0.6000 | -0.3000 |
| Standalone | 20.00 | 2.00x | 0.8900 | 0.9000 | -0.0100 |
| ESync (non-IID) | 25.00 | 2.00x | 0.8600 | 0.8600 | -0.0400 |
| SSGD (non-IID) | 50.00 | 1.00x | 0.8200 | 0.8200 | -0.0800 |
"""


def test_speedup_md_is_byte_for_byte_the_same(full):
    """The exact file the drawer wrote before it took its names from esync.registry."""
    assert (full["out"] / "speedup.md").read_bytes() == SPEEDUP_MD.encode()


def test_names_from_the_registry_and_no_torch():
    code = ("import sys; import esync.logs_tools.drawer as d; "
            "assert callable(d.draw) and callable(d.main); "
            "print(d.RUNS, d.STANDALONE_RUN, d.BASELINE); "
            # the tool's own package aside
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('esync', 'torch') "
            "and not m.startswith(('esync.launch', 'esync.logs_tools', 'esync.config'))))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    modes, imported = proc.stdout.splitlines()
    assert imported == "['esync', 'esync.logs', 'esync.logs.breakdown', 'esync.registry']"
    assert modes == ("[('esync', 'ESync', False), ('sync', 'SSGD', False), "
                     "('async', 'ASGD', False), ('dcasgd', 'DC-ASGD', False), "
                     "('ddp', 'DDP', False), ('ddp-balanced', 'Balanced DDP', False), "
                     "('esync-niid', 'ESync', True), ('sync-niid', 'SSGD', True), "
                     "('async-niid', 'ASGD', True), ('dcasgd-niid', 'DC-ASGD', True), "
                     "('ddp-niid', 'DDP', True), ('ddp-balanced-niid', 'Balanced DDP', True)] "
                     "('local', 'Standalone', False) SSGD")


def test_missing_and_invalid_modes_noted(full):
    err = full["proc"].stderr
    missing = os.path.join(str(full["base"]), NET, "async-niid", "Async-Non-IID.json")
    assert f"drawer.py: note: no {missing}; ASGD (non-IID) left out" in err
    assert "drawer.py: note: cannot use " + str(full["bad"]) in err
    assert "DC-ASGD (non-IID) left out" in err
    assert "Traceback" not in err
    assert "ASGD (non-IID)" not in rows_by_name(full["doc"])


def test_most_accuracies_wins_and_default_outdir(tmp_path):
    # two devices evaluate: hostA/cpu0 once (0.9 at 1 s), hostB/gpu0 three times
    s = three_devices([1, 2, 3], [0.5, 0.85, 0.9])
    s["hostA"]["cpu0"] = record([1, 2, 3], [0.9, None, None])
    write(tmp_path, "sync", "Sync", s)
    proc = run("-b", tmp_path, "-n", NET)
    assert proc.returncode == 0, proc.stderr
    outdir = tmp_path / NET
    assert_pngs(outdir)
    (row,) = json.loads((outdir / "speedup.json").read_text())["rows"]
    assert row["evaluating_device"] == "hostB/gpu0"
    assert row["time_to_target_s"] == 2
    assert row["final_minus_standalone"] is None
    assert "Local.json; Standalone left out" in proc.stderr


def test_no_data_still_writes_everything(tmp_path):
    (tmp_path / NET).mkdir()
    write(tmp_path, "esync", "ESync", {"hostA": {"cpu0": {"accuracy_list": "nope"}}})
    out = tmp_path / "figs"
    proc = run("-b", tmp_path, "-n", NET, "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert_pngs(out)
    assert json.loads((out / "speedup.json").read_text())["rows"] == []
    assert (out / "speedup.md").is_file()
    assert "cannot use" in proc.stderr and "ESync.json" in proc.stderr


def test_missing_base_is_an_error(tmp_path):
    proc = run("-b", tmp_path / "nowhere", "-n", NET)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("drawer.py: error: ")
    assert not (tmp_path / "nowhere").exists()


# ---------------------------------------------------------------- evaluator, DDP, log axis

EVALUATOR = "evaluator"  # esync.registry.EVALUATOR (checked below)


def workers(elapsed, acc0=None, compute=2.0):
    """hostA/cpu0 (with accuracies acc0, worker 0 of a run that evaluates itself) and
    hostB/gpu0, each 100 samples, 1 MB and `compute` s a round."""
    return {"hostA": {"cpu0": record(elapsed, acc0, compute=compute)},
            "hostB": {"gpu0": record(elapsed, compute=compute)}}


def with_evaluator(summary, elapsed, acc, host="hostA"):
    """summary plus host/evaluator: no samples, no compute, 5 MB a round (had it been
    counted, throughput, traffic and ratios would show it)."""
    summary[host][EVALUATOR] = record(elapsed, acc, samples=0, compute=0.0,
                                      nbytes=5_000_000)
    return summary


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """SSGD and DDP measured by an evaluator, IID and non-IID; target 0.8."""
    base = tmp_path_factory.mktemp("evaluated")
    # SSGD: workers end at 40 s, the evaluator tests from 0 s to 45 s; 0.82 at 30 s
    write(base, "sync", "Sync", with_evaluator(
        workers([10, 20, 30, 40]), [0, 15, 30, 45], [0.1, 0.5, 0.82, 0.9]))
    # DDP: worker 0 also evaluates, more often (0.81 at 10 s), but the evaluator is
    # preferred: 0.85 at 20 s -> speedup 30 / 20 over SSGD
    write(base, "ddp", "DDP", with_evaluator(
        workers([10, 20, 30], [0.81, 0.83, 0.86], compute=3.0), [5, 20], [0.5, 0.85]))
    # non-IID: SSGD without an evaluator (worker 0 evaluates: 0.8 at 50 s), DDP with
    # one on hostB (0.8 at 25 s) -> 2x
    write(base, "sync-niid", "Sync-Non-IID", workers([25, 50, 75], [0.5, 0.8, 0.82]))
    write(base, "ddp-niid", "DDP-Non-IID", with_evaluator(
        workers([25, 50]), [0, 25, 60], [0.2, 0.8, 0.84], host="hostB"))
    out = base / "out"
    proc = run("-b", base, "-n", NET, "-o", out, "--target", 0.8)
    assert proc.returncode == 0, proc.stderr
    return {"base": base, "out": out, "proc": proc,
            "doc": json.loads((out / "speedup.json").read_text())}


def test_evaluator_name_is_the_registry_s():
    from esync import registry
    assert registry.EVALUATOR == EVALUATOR


def test_ddp_rows_iid_and_non_iid(evaluated):
    rows = rows_by_name(evaluated["doc"])
    assert list(rows) == ["SSGD", "DDP", "SSGD (non-IID)", "DDP (non-IID)"]
    assert rows["DDP"]["mode"] == "ddp" and rows["DDP"]["data"] == "IID"
    assert rows["DDP (non-IID)"]["mode"] == "ddp-niid"
    assert rows["DDP (non-IID)"]["data"] == "non-IID"
    expect = {"SSGD": (30, 1.0), "DDP": (20, 1.5),
              "SSGD (non-IID)": (50, 1.0), "DDP (non-IID)": (25, 2.0)}
    for name, (t, s) in expect.items():
        assert rows[name]["time_to_target_s"] == t, name
        assert rows[name]["speedup_vs_ssgd"] == pytest.approx(s), name
    md = (evaluated["out"] / "speedup.md").read_text()
    assert "| DDP | 20.00 | 1.50x | 0.8500 | 0.8500 | n/a |" in md
    assert "| DDP (non-IID) | 25.00 | 2.00x | 0.8400 | 0.8400 | n/a |" in md
    assert_pngs(evaluated["out"])


def test_evaluator_preferred(evaluated):
    rows = rows_by_name(evaluated["doc"])
    assert rows["SSGD"]["evaluating_device"] == "hostA/evaluator"
    # worker 0 has more accuracies (3 against 2), the evaluator still wins
    assert rows["DDP"]["evaluating_device"] == "hostA/evaluator"
    assert rows["DDP"]["final_accuracy"] == pytest.approx(0.85)
    assert rows["DDP (non-IID)"]["evaluating_device"] == "hostB/evaluator"
    # without an evaluator, worker 0 evaluates as before
    assert rows["SSGD (non-IID)"]["evaluating_device"] == "hostA/cpu0"


def test_evaluator_not_in_throughput_traffic_ratios(evaluated):
    doc = evaluated["doc"]
    # SSGD: 2 workers x 4 rounds x 100 samples over 40 s (the workers' end, not the
    # evaluator's 45 s); 8 MB over 40 s (the evaluator's 20 MB not counted)
    assert doc["throughput_samples_per_s"] == {"SSGD": pytest.approx(20.0),
                                               "DDP": pytest.approx(600 / 30)}
    assert doc["traffic_MB_per_s"] == {"SSGD": pytest.approx(0.2),
                                       "DDP": pytest.approx(6 / 30)}
    ratio = doc["computing_ratio"]
    assert ratio == {"SSGD": {"hostA/cpu0": pytest.approx(8 / 40),
                              "hostB/gpu0": pytest.approx(8 / 40)},
                     "DDP": {"hostA/cpu0": pytest.approx(9 / 30),
                             "hostB/gpu0": pytest.approx(9 / 30)}}


def test_evaluator_metrics_in_process():
    from esync.logs_tools import drawer
    s = with_evaluator(workers([10, 20]), [0, 30], [0.5, 0.9])
    assert drawer.duration(s) == 20
    assert [d for _, d, _ in drawer.training_records(s)] == ["cpu0", "gpu0"]
    assert drawer.total(s, "bytes_list") == 4_000_000
    assert drawer.accuracy_curve(s) == ([0, 30], [0.5, 0.9])
    # an evaluator that never evaluated is passed over
    s["hostA"][EVALUATOR]["accuracy_list"] = [None, None]
    assert drawer.evaluating_device(s) is None
    s["hostB"]["gpu0"]["accuracy_list"] = [None, 0.7]
    assert drawer.evaluating_device(s)[:2] == ("hostB", "gpu0")


def _drawn_axes(monkeypatch, tmp_path, **kwargs):
    """Draw the IID accuracy figure of an evaluated SSGD run starting at 0 s; return
    (x scale, x data of the curve, x limits)."""
    from esync.logs_tools import drawer
    seen = []

    def save(fig, path, show):
        ax = fig.axes[0]
        seen.append((ax.get_xscale(), list(ax.lines[0].get_xdata()), ax.get_xlim()))
        drawer.pyplot().close(fig)
        return path

    monkeypatch.setattr(drawer, "_save", save)
    data = {("SSGD", False): with_evaluator(workers([10, 20]), [0, 0.5, 4, 30],
                                            [0.1, 0.3, 0.6, 0.9])}
    drawer.draw_accuracy(data, False, str(tmp_path / "a.png"), **kwargs)
    (result,) = seen
    return result


def test_accuracy_time_axis_is_log_and_zero_is_clipped(monkeypatch, tmp_path):
    scale, xs, (lo, hi) = _drawn_axes(monkeypatch, tmp_path)
    assert scale == "log"
    assert xs == [0.25, 0.5, 4, 30]  # 0 s drawn at half the smallest positive time
    assert 0 < lo <= 0.25 and hi >= 30


def test_accuracy_time_axis_linear_on_request(monkeypatch, tmp_path):
    scale, xs, _ = _drawn_axes(monkeypatch, tmp_path, linear_time=True)
    assert scale == "linear"
    assert xs == [0, 0.5, 4, 30]


def test_linear_time_flag(evaluated, tmp_path):
    proc = run("-b", evaluated["base"], "-n", NET, "-o", tmp_path, "--linear-time")
    assert proc.returncode == 0, proc.stderr
    assert_pngs(tmp_path)
    assert proc.stdout == evaluated["proc"].stdout  # the table does not change


# ---------------------------------------------------------------- runs of --metric loss

def loss_record(elapsed, val_loss=None, **kwargs):
    """record() of a `--metric loss` run: val_loss_list in place of accuracies."""
    rec = record(elapsed, **kwargs)
    rec["val_loss_list"] = list(val_loss) if val_loss is not None else [None] * len(elapsed)
    return rec


def loss_job(elapsed, eval_at, val_loss):
    """Two workers ending at elapsed[-1] and an evaluator measuring val_loss."""
    return {"hostA": {"cpu0": loss_record(elapsed),
                      EVALUATOR: loss_record(eval_at, val_loss, samples=0, compute=0.0,
                                             nbytes=5_000_000)},
            "hostB": {"gpu0": loss_record(elapsed)}}


@pytest.fixture(scope="module")
def lossy(tmp_path_factory):
    """SSGD, ESync and Standalone measured by val_loss (lower is better); target 1.0."""
    base = tmp_path_factory.mktemp("lossy")
    # SSGD: 1.0 or below first at 30 s (0.9); ESync at 10 s (1.0 itself) -> 3x
    write(base, "sync", "Sync", loss_job([10, 20, 30, 40], [0, 15, 30, 45],
                                         [2.3, 1.4, 0.9, 0.8]))
    write(base, "esync", "ESync", loss_job([5, 10, 15, 20], [0, 10, 20],
                                           [2.3, 1.0, 0.7]))
    # Standalone evaluates itself: lowest 0.6, final 0.65, at or below 1.0 at 20 s
    write(base, "local", "Local", {"hostA": {"cpu0": loss_record(
        [10, 20, 30], [1.2, 0.6, 0.65], samples=50, nbytes=0)}})
    out = base / "out"
    proc = run("-b", base, "-n", NET, "-o", out, "--target-loss", 1.0)
    assert proc.returncode == 0, proc.stderr
    return {"base": base, "out": out, "proc": proc,
            "doc": json.loads((out / "speedup.json").read_text())}


def test_metric_of_says_which_list_has_values():
    from esync.logs_tools import drawer
    assert drawer.metric_of(loss_job([1], [0, 1], [2.0, 1.5])) == "val_loss"
    accuracy = with_evaluator(workers([1]), [0], [0.5])
    assert drawer.metric_of(accuracy) == "accuracy"  # a summary without val_loss_list
    never = loss_job([1], [0], [None])
    assert drawer.metric_of(never) == "accuracy" and drawer.metric_of(never, None) is None
    assert drawer.common_metric([never, loss_job([1], [0], [2.0])]) == "val_loss"
    assert drawer.common_metric([]) == "accuracy"


def test_loss_run_times_and_values(lossy):
    doc = lossy["doc"]
    assert doc["metric"] == "val_loss" and doc["target"] == 1.0
    assert doc["standalone_best_val_loss"] == pytest.approx(0.6)
    assert "standalone_best_accuracy" not in doc
    rows = rows_by_name(doc)
    assert list(rows) == ["ESync", "SSGD", "Standalone"]
    expect = {  # name: (time to 1.0 or below, speedup, final, best (lowest))
        "ESync": (10, 3.0, 0.7, 0.7), "SSGD": (30, 1.0, 0.8, 0.8),
        "Standalone": (20, 1.5, 0.65, 0.6)}
    for name, (t, s, final, best) in expect.items():
        assert rows[name]["time_to_target_s"] == t, name
        assert rows[name]["speedup_vs_ssgd"] == pytest.approx(s), name
        assert rows[name]["final_val_loss"] == pytest.approx(final), name
        assert rows[name]["best_val_loss"] == pytest.approx(best), name
        assert "final_accuracy" not in rows[name]
    assert rows["SSGD"]["evaluating_device"] == "hostA/evaluator"
    assert rows["SSGD"]["final_minus_standalone"] == pytest.approx(0.2)
    # the workers' throughput, as for accuracy runs: 2 x 4 x 100 samples over 40 s
    assert doc["throughput_samples_per_s"]["SSGD"] == pytest.approx(20.0)


def test_loss_run_table_and_figures(lossy):
    md = (lossy["out"] / "speedup.md").read_text()
    assert ("| Algorithm | Time to 1 val_loss (s) | Speedup vs SSGD | Final val_loss "
            "| Best val_loss | Final - standalone best |") in md
    assert "| ESync | 10.00 | 3.00x | 0.7000 | 0.7000 | +0.1000 |" in md
    assert md.endswith(lossy["proc"].stdout)
    assert_pngs(lossy["out"])  # the same file names, accuracy_iid.png included
    assert "Traceback" not in lossy["proc"].stderr


def test_loss_figure_axis_says_validation_loss(monkeypatch, tmp_path, lossy):
    from esync.logs_tools import drawer
    seen = []

    def save(fig, path, show):
        ax = fig.axes[0]
        seen.append((ax.get_ylabel(), ax.get_title(), [list(line.get_ydata())
                                                       for line in ax.lines]))
        drawer.pyplot().close(fig)
        return path

    monkeypatch.setattr(drawer, "_save", save)
    data = drawer.load_all(str(lossy["base"]), NET)
    drawer.draw_accuracy(data, False, str(tmp_path / "a.png"), NET)
    ((ylabel, title, lines),) = seen
    assert ylabel == "Validation loss" and title == f"Validation loss, IID data ({NET})"
    assert [2.3, 1.0, 0.7] in lines and [2.3, 1.4, 0.9, 0.8] in lines
    assert [0.6, 0.6] in lines  # the standalone's lowest, dashed


def test_loss_run_without_target_loss_is_noted(lossy, tmp_path):
    proc = run("-b", lossy["base"], "-n", NET, "-o", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert ("drawer.py: note: the summaries under "
            f"{os.path.join(str(lossy['base']), NET)} measured val_loss; no time to target "
            "without --target-loss") in proc.stderr
    assert "| Algorithm | Time to val_loss target (s) |" in proc.stdout
    assert "| ESync | n/a | n/a | 0.7000 | 0.7000 | +0.1000 |" in proc.stdout
    assert_pngs(tmp_path)


def test_target_loss_for_accuracy_runs_is_an_error(evaluated, tmp_path):
    proc = run("-b", evaluated["base"], "-n", NET, "-o", tmp_path / "o",
               "--target-loss", 0.5)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines[-1] == (
        f"drawer.py: error: --target-loss: the summaries under "
        f"{os.path.join(str(evaluated['base']), NET)} measured accuracy, not val_loss; "
        "give --target")
    assert all(line.startswith("drawer.py: note: no ") for line in lines[:-1])
    assert proc.stdout == "" and not (tmp_path / "o" / "speedup.md").exists()


@pytest.mark.parametrize("bad, reason", [
    (["low", None], "bad value 'low' in val_loss_list"),
    ([1.0], "lists of different lengths"),
    ("none", "val_loss_list missing or not a list"),
])
def test_bad_val_loss_list_left_out(tmp_path, bad, reason):
    s = loss_job([1, 2], [0, 1], [2.0, 1.0])
    s["hostA"][EVALUATOR]["val_loss_list"] = bad
    path = write(tmp_path, "sync", "Sync", s)
    proc = run("-b", tmp_path, "-n", NET, "--target-loss", 1)
    assert proc.returncode == 0, proc.stderr
    assert f"drawer.py: note: cannot use {path} (" in proc.stderr and reason in proc.stderr
