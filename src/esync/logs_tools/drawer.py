#!/usr/bin/env python3
"""Figures and the speedup table from the per-mode summaries of one network.

Reads ``BASE/NETWORK/<mode>/<Name>.json`` (written by ``summary.py``: ``{host: {device:
record}}``, each record a set of per-round lists) and writes into OUTDIR (default
``BASE/NETWORK``):

* ``accuracy_iid.png``, ``accuracy_noniid.png``: test accuracy against wall-clock time of
  the distributed algorithms (ESync, SSGD, ASGD, DC-ASGD, DDP, balanced DDP; IID /
  non-IID data), the standalone best as a dashed line; the time axis is logarithmic
  (curves otherwise pile up in the first seconds; times of 0 are drawn at half the
  smallest positive time), linear with ``--linear-time``;
* ``throughput.png``: samples/s per algorithm (IID modes and Standalone);
* ``traffic.png``: network traffic in MB/s per algorithm (IID modes);
* ``computing_ratio.png``: computing time / wall-clock time per device and algorithm;
* ``breakdown.png``: per mode, a stacked bar per device of the share of its time in each
  category of the rounds' ``breakdown`` (fetch, prep, compute, communication, wait,
  state server, other), from the summaries' ``totals``; only where a summary has them
  (logs older than the breakdown have none: a note, and no file);
* ``rates.png``: each device's samples per second over wall-clock time, one panel per
  mode (every mode, standalone too);
* ``speedup.md`` and ``speedup.json``: time to the target accuracy, speedup over SSGD,
  final and best accuracy and final accuracy minus the standalone's best.

Runs whose evaluations measured a validation loss (``--metric loss``: the summaries'
``val_loss_list``, lower is better) are drawn and tabled the same way with that metric:
the two accuracy figures (same file names) show the validation loss ("Validation loss"
axis, the standalone's lowest as the dashed line), and the table's time to target is the
first evaluation at or below ``--target-loss``, its final, best (lowest) and final minus
standalone best are val_loss (``final_val_loss``, ... in ``speedup.json``, with
``"metric": "val_loss"``). ``metric_of`` says which metric a summary measured.

A job's accuracy (curve, time to target, final and best; or its val_loss) is its
*evaluating device*'s: the evaluator (the device named ``registry.EVALUATOR``, which
tests the global model every few hundred ms) when the summary has one with an accuracy,
else the device with the most accuracies (worker 0 in runs without an evaluator). The
evaluator trains on nothing: throughput, traffic, the job's duration, the computing
ratios, the breakdown and the rates count the other devices (the workers) only. The last
two figures' data and axes are ``esync/logs_tools/breakdown.py``'s.

Usage: ``esync-draw -b BASE -n NETWORK [-o OUTDIR] [--target 0.8]
[--target-loss L] [--linear-time] [--show]``. Missing or unreadable summaries are left
out with a note on stderr; every output file is always written. The algorithms, their
folders and their display names come from ``esync.registry`` (and, through summary.py, the
breakdown's categories from ``esync.logs.breakdown``; nothing else of esync, no
torch); the file names from ``summary.py``. ``breakdown.png`` is not written where no
summary has a breakdown (noted).

Library use (the experiment, compare.py): ``draw(base, network, outdir=None, target=0.8,
linear_time=False, target_loss=None) -> table``, and the metrics below (``metric_of``,
``evaluating_device``, ``metric_curve``, ``time_to_target``, ``throughput``,
``training_records``, ...).
"""

import argparse
import json
import math
import os
import sys

import matplotlib
import matplotlib.ticker

from esync import registry
from esync.logs_tools import user_error
from esync.logs_tools import breakdown
from esync.logs_tools.summary import output_path

PROG = "drawer.py"


def _mode(algorithm, niid):
    """(mode folder, algorithm label, non-IID data?); summary.py names each folder's file."""
    return (algorithm.log_folder(niid), algorithm.display, niid)


# the distributed algorithms on IID data, then on non-IID data (the registry's order)
RUNS = [_mode(a, niid) for a, niid in registry.all_folders() if a.distributed]
STANDALONE_RUN = _mode(registry.ALGORITHMS[registry.STANDALONE], False)
# the tables' row order: IID runs, Standalone, then non-IID runs
TABLE_ORDER = [m for m in RUNS if not m[2]] + [STANDALONE_RUN] + [m for m in RUNS if m[2]]
STANDALONE = STANDALONE_RUN[1]
BASELINE = registry.ALGORITHMS[registry.BASELINE].display

# the per-round lists the drawer reads; other keys of a record are ignored
REQUIRED_LISTS = ("accuracy_list", "num_samples_list", "elapsed_time_list",
                  "compute_time_list", "bytes_list")
# read where present (summaries written before `--metric loss` have no val_loss_list)
OPTIONAL_LISTS = ("val_loss_list",)

# What a job's evaluations measure (one metric a job): test accuracy, or with `--metric
# loss` a validation loss; the summary list holding it, the axis label, and which way is
# better.
METRICS = ("accuracy", "val_loss")
METRIC_LIST = {"accuracy": "accuracy_list", "val_loss": "val_loss_list"}
METRIC_LABEL = {"accuracy": "Test accuracy", "val_loss": "Validation loss"}
LOWER_IS_BETTER = frozenset({"val_loss"})
DEFAULT_METRIC = "accuracy"  # of a summary that never evaluated, and of older ones

OUTPUTS = ("accuracy_iid.png", "accuracy_noniid.png", "throughput.png", "traffic.png",
           "computing_ratio.png", "rates.png", "speedup.md", "speedup.json")
# written where a summary has the rounds' breakdown (logs older than it have none)
BREAKDOWN_OUTPUT = "breakdown.png"

_plt = None


class InvalidSummary(ValueError):
    pass


def note(msg):
    print(f"{PROG}: note: {msg}", file=sys.stderr)


def pyplot(show=False):
    """Import pyplot once, with the Agg backend unless windows are wanted."""
    global _plt
    if _plt is None:
        if not show:
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        _plt = plt
    return _plt


# ---------------------------------------------------------------- reading

def _is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def validate(summary):
    """Raise InvalidSummary unless summary is {host: {device: record}} with usable lists."""
    if not isinstance(summary, dict) or not summary:
        raise InvalidSummary("not a non-empty {host: {device: record}} object")
    for host, devices in summary.items():
        if not isinstance(devices, dict) or not devices:
            raise InvalidSummary(f"host {host!r} has no {{device: record}} object")
        for dev, rec in devices.items():
            where = f"{host}/{dev}"
            if not isinstance(rec, dict):
                raise InvalidSummary(f"record of {where} is not an object")
            keys = REQUIRED_LISTS + tuple(k for k in OPTIONAL_LISTS if k in rec)
            lengths = {_checked_length(where, key, rec.get(key)) for key in keys}
            if len(lengths) > 1:
                raise InvalidSummary(f"{where}: lists of different lengths")


def _checked_length(where, key, values):
    """len(values); InvalidSummary unless values is a list of numbers (or nulls, but in
    elapsed_time_list)."""
    if not isinstance(values, list):
        raise InvalidSummary(f"{where}: {key} missing or not a list")
    for v in values:
        if not (_is_num(v) or (v is None and key != "elapsed_time_list")):
            raise InvalidSummary(f"{where}: bad value {v!r} in {key}")
    return len(values)


def read_summary(path):
    """The validated summary in path; OSError or ValueError (InvalidSummary, bad JSON,
    not UTF-8) if it cannot be used."""
    with open(path, encoding="utf-8") as f:
        summary = json.load(f)
    validate(summary)
    return summary


def load_mode(base, network, mode, warn=None):
    """The summary of one mode as a dict, or None (with a note, through warn: a function
    of the message, default note) if absent or invalid."""
    warn = warn or note
    folder, label, niid = mode
    path = output_path(base, network, folder)  # where summary.py wrote it
    what = _display(label, niid)
    if not os.path.isfile(path):
        warn(f"no {path}; {what} left out")
        return None
    try:
        summary = read_summary(path)
    except (OSError, ValueError) as e:  # UnicodeDecodeError is a ValueError
        warn(f"cannot use {path} ({e}); {what} left out")
        return None
    return summary


def load_all(base, network):
    """{(label, niid): summary} of the present modes, in RUNS order, then Standalone."""
    data = {}
    for mode in RUNS + [STANDALONE_RUN]:
        summary = load_mode(base, network, mode)
        if summary is not None:
            data[(mode[1], mode[2])] = summary
    return data


# ---------------------------------------------------------------- metrics

def records(summary):
    """[(host, device, record)] in file order."""
    return [(h, d, r) for h, devs in summary.items() for d, r in devs.items()]


def is_evaluator(device):
    """The device folder of the evaluator (it tests the global model, trains on nothing)."""
    return device == registry.EVALUATOR


def training_records(summary):
    """[(host, device, record)] of the devices that train (all but the evaluator)."""
    return [(h, d, r) for h, d, r in records(summary) if not is_evaluator(d)]


def metric_values(rec, metric):
    """A record's per-round values of metric ('accuracy' or 'val_loss'), null where the
    round did not evaluate (all null in a summary older than val_loss_list)."""
    values = rec.get(METRIC_LIST[metric])
    return values if values is not None else [None] * len(rec["elapsed_time_list"])


def _evaluations(rec, metric):
    return sum(v is not None for v in metric_values(rec, metric))


def metric_of(summary, default=DEFAULT_METRIC):
    """What summary's evaluations measured: 'accuracy' or 'val_loss', from which list has
    values (a job has one metric; accuracy first should a summary have both); default
    where nothing evaluated (None tells such a summary apart)."""
    for metric in METRICS:
        if any(_evaluations(rec, metric) for _, _, rec in records(summary)):
            return metric
    return default


def metrics_of(summaries):
    """The set of metrics the summaries measured (those that never evaluated add none)."""
    return {metric_of(s, None) for s in summaries} - {None}


def common_metric(summaries):
    """The metric of several summaries drawn on one axis or in one table: accuracy if any
    measured accuracy, else val_loss if any measured it, else accuracy."""
    found = metrics_of(summaries)
    return next((m for m in METRICS if m in found), DEFAULT_METRIC)


def reached(value, target, metric):
    """Whether an evaluation is at target: accuracy at or above, val_loss at or below."""
    return value <= target if metric in LOWER_IS_BETTER else value >= target


def best_of(values, metric):
    """The best of values (the highest accuracy, the lowest val_loss); None if empty."""
    if not values:
        return None
    return min(values) if metric in LOWER_IS_BETTER else max(values)


def _most_evaluations(recs, metric):
    best, best_n = None, 0
    for host, dev, rec in recs:
        n = _evaluations(rec, metric)
        if n > best_n:
            best, best_n = (host, dev, rec), n
    return best


def evaluating_device(summary, metric=None):
    """(host, device, record) whose evaluations are the job's, or None if none evaluated:
    the evaluator when the summary has one with a value of metric (default: metric_of
    summary), else the device with the most non-null values (first on a tie)."""
    metric = metric or metric_of(summary)
    evaluator = _most_evaluations([r for r in records(summary) if is_evaluator(r[1])],
                                  metric)
    return evaluator or _most_evaluations(records(summary), metric)


def metric_curve(summary, metric=None):
    """([elapsed s], [value]) of the evaluating device's evaluated rounds, the values
    those of metric (default: the one summary measured, metric_of)."""
    metric = metric or metric_of(summary)
    ev = evaluating_device(summary, metric)
    if ev is None:
        return [], []
    rec = ev[2]
    pts = [(t, v) for t, v in zip(rec["elapsed_time_list"], metric_values(rec, metric))
           if v is not None]
    return [t for t, _ in pts], [v for _, v in pts]


def accuracy_curve(summary):
    """([elapsed s], [accuracy]) of the evaluating device's evaluated rounds (empty for a
    run that measured val_loss: metric_curve draws either)."""
    return metric_curve(summary, "accuracy")


def best_value(summary, metric=None):
    """The best evaluation of summary's metric (or metric): highest accuracy, lowest
    val_loss; None if it never evaluated."""
    return best_of(metric_curve(summary, metric)[1], metric or metric_of(summary))


def best_accuracy(summary):
    return best_value(summary, "accuracy")


def duration(summary):
    """The job's wall-clock time: the largest last elapsed time among its training
    devices (the evaluator may go on testing after the last round)."""
    ends = [r["elapsed_time_list"][-1] for _, _, r in training_records(summary)
            if r["elapsed_time_list"]]
    return max(ends) if ends else None


def total(summary, key):
    """The sum of one per-round list over the training devices (nulls skipped)."""
    return sum(v for _, _, r in training_records(summary) for v in r[key] if v is not None)


def _rate(summary, key, scale=1.0):
    dur = duration(summary)
    if not dur or dur <= 0:
        return None
    return total(summary, key) / dur / scale


def throughput(summary):
    """Samples per second of all training devices together."""
    return _rate(summary, "num_samples_list")


def traffic(summary):
    """Network traffic of all training devices together, MB/s (1 MB = 1e6 bytes)."""
    return _rate(summary, "bytes_list", 1e6)


def computing_ratios(summary):
    """{(host, device): sum(compute time) / last elapsed time} of the training devices
    that ran."""
    out = {}
    for host, dev, rec in training_records(summary):
        el = rec["elapsed_time_list"]
        if el and el[-1] > 0:
            out[(host, dev)] = sum(v for v in rec["compute_time_list"] if v is not None) / el[-1]
    return out


def time_to_target(summary, target, metric=None):
    """First elapsed time at which the evaluating device reached target, or None: its
    accuracy >= target, or for a run that measured val_loss its val_loss <= target
    (metric: default metric_of summary)."""
    metric = metric or metric_of(summary)
    for t, v in zip(*metric_curve(summary, metric)):
        if reached(v, target, metric):
            return t
    return None


# ---------------------------------------------------------------- figures

def _no_data(ax):
    ax.text(0.5, 0.5, "no data", ha="center", va="center", fontsize=16,
            transform=ax.transAxes)


def _save(fig, path, show):
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    if not show:
        pyplot().close(fig)
    return path


def log_floor(times):
    """Where a log time axis draws times <= 0: half the smallest positive time (1 s if
    there is none)."""
    positive = [t for t in times if t > 0]
    return min(positive) / 2 if positive else 1.0


def on_log_axis(xs, floor):
    """xs with the times <= 0 moved to floor."""
    return [x if x > 0 else floor for x in xs]


def time_axis(ax, times, linear_time=False, label="Wall-clock time (s)"):
    """Label ax's time axis and make it logarithmic unless linear_time (or there are no
    times to draw); return the function that maps a curve's times onto the axis."""
    if linear_time or not times:
        ax.set_xlabel(label)
        return list
    ax.set_xscale("log")
    ax.set_xlabel(f"{label}, log scale")
    for axis_set in (ax.xaxis.set_major_formatter, ax.xaxis.set_minor_formatter):
        axis_set(matplotlib.ticker.LogFormatter(labelOnlyBase=False))  # 3, 10, not 3e0
    floor = log_floor(times)
    return lambda xs: on_log_axis(xs, floor)


def _display(label, niid):
    """'ESync', or 'ESync (non-IID)' for a split-by-class run."""
    return label + (registry.NIID_DISPLAY_SUFFIX if niid else "")


def _iid_labels(data):
    """Labels of the present IID algorithms (distributed ones), in RUNS order."""
    return [m[1] for m in RUNS if not m[2] and (m[1], False) in data]


def legend_corner(metric):
    """Where the legend hides no curve: the lower right for accuracy (the curves rise
    to the top), the upper right for val_loss (they fall to the bottom)."""
    return "upper right" if metric in LOWER_IS_BETTER else "lower right"


def draw_accuracy(data, niid, path, network="", show=False, linear_time=False,
                  metric=None):
    """The figure of the evaluations (of metric, default common_metric of data: test
    accuracy, or validation loss) of the distributed runs on IID or non-IID data, the
    standalone's best as a dashed line."""
    metric = metric or common_metric(data.values())
    plt = pyplot(show)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    curves = [(label, metric_curve(data[(label, niid)], metric))
              for _, label, m_niid in RUNS if m_niid == niid and (label, niid) in data]
    curves = [(label, xs, ys) for label, (xs, ys) in curves if xs]
    place = time_axis(ax, [t for _, xs, _ in curves for t in xs], linear_time)
    for label, xs, ys in curves:
        ax.plot(place(xs), ys, marker="o", markersize=3, label=label)
    drawn = bool(curves)
    local = data.get((STANDALONE, False))
    best = best_value(local, metric) if local is not None else None
    if best is not None:
        ax.axhline(best, linestyle="--", color="gray", label=f"{STANDALONE} ({best:.3f})")
    kind = "non-IID" if niid else "IID"
    ax.set_title(f"{METRIC_LABEL[metric]}, {kind} data"
                 + (f" ({network})" if network else ""))
    ax.set_ylabel(METRIC_LABEL[metric])
    if drawn or best is not None:
        ax.legend(loc=legend_corner(metric))
        ax.grid(True, alpha=0.3)
    if not drawn:  # no curve of this data kind: say so (the standalone line may remain)
        _no_data(ax)
    return _save(fig, path, show)


def _bar_chart(values, title, ylabel, path, show):
    """values: [(label, value)]; None values are left out."""
    plt = pyplot(show)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    values = [(k, v) for k, v in values if v is not None]
    if values:
        bars = ax.bar([k for k, _ in values], [v for _, v in values],
                      color=[f"C{i}" for i in range(len(values))])
        ax.bar_label(bars, fmt="%.3g")
        ax.margins(y=0.1)
        ax.grid(True, axis="y", alpha=0.3)
    else:
        _no_data(ax)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    return _save(fig, path, show)


def throughput_values(data):
    labels = _iid_labels(data) + ([STANDALONE] if (STANDALONE, False) in data else [])
    return [(k, throughput(data[(k, False)])) for k in labels]


def traffic_values(data):
    return [(k, traffic(data[(k, False)])) for k in _iid_labels(data)]


def draw_throughput(data, path, show=False):
    return _bar_chart(throughput_values(data), "Data throughput (IID)", "Samples / s",
                      path, show)


def draw_traffic(data, path, show=False):
    return _bar_chart(traffic_values(data), "Traffic load (IID)", "MB / s", path, show)


def computing_ratio_values(data):
    """({label: {(host, device): ratio}}, [(host, device)] in first-seen order)."""
    ratios = {k: computing_ratios(data[(k, False)]) for k in _iid_labels(data)}
    devices = []
    for per_dev in ratios.values():
        devices += [d for d in per_dev if d not in devices]
    return ratios, devices


def device_names(devices):
    """'host/device' labels, or just 'device' if all devices are on one host."""
    if len({h for h, _ in devices}) <= 1:
        return [d for _, d in devices]
    return [f"{h}/{d}" for h, d in devices]


def draw_computing_ratio(data, path, show=False):
    plt = pyplot(show)
    ratios, devices = computing_ratio_values(data)
    fig, ax = plt.subplots(figsize=(max(6.5, 1.2 * len(devices) + 2), 4.5))
    if devices:
        width = 0.8 / len(ratios)
        for i, (label, per_dev) in enumerate(ratios.items()):
            xs = [j + (i - (len(ratios) - 1) / 2) * width
                  for j, d in enumerate(devices) if d in per_dev]
            ax.bar(xs, [per_dev[d] for d in devices if d in per_dev], width, label=label)
        ax.set_xticks(range(len(devices)), device_names(devices),
                      rotation=30 if len(devices) > 4 else 0)
        ax.set_ylim(0, 1.05)
        ax.legend()
        ax.grid(True, axis="y", alpha=0.3)
    else:
        _no_data(ax)
    ax.set_title("Computing time ratio (IID)")
    ax.set_xlabel("Device")
    ax.set_ylabel("Computing time / wall-clock time")
    return _save(fig, path, show)


def device_groups(data):
    """[(mode's display name, [(device label, record)])]: the training devices of each
    loaded summary, in data's order."""
    groups = []
    for (label, niid), summary in data.items():
        recs = training_records(summary)
        names = device_names([(h, d) for h, d, _ in recs])
        devices = [(name, rec) for name, (_, _, rec) in zip(names, recs)]
        groups.append((_display(label, niid), devices))
    return groups


def draw_breakdown(data, path, show=False):
    """breakdown.png of data's devices with a breakdown; None (nothing written) if none
    has one."""
    rows = breakdown.breakdown_rows(device_groups(data), note)
    if not rows:
        return None
    fig, ax = pyplot(show).subplots(figsize=(8, breakdown.breakdown_height(rows)))
    breakdown.plot_breakdown(ax, rows)
    return _save(fig, path, show)


def draw_rates(data, path, show=False):
    """rates.png: each training device's samples per second over time, a panel a mode."""
    series = breakdown.rate_series(device_groups(data))
    nrows, ncols = breakdown.rates_grid(series)
    fig, axes = pyplot(show).subplots(nrows, ncols, squeeze=False,
                                      figsize=(7.5 * ncols, 2.8 * nrows + 0.6))
    panels = list(axes.flat)
    for ax, (mode, lines) in zip(panels, series):
        breakdown.plot_rates(ax, mode, lines)
    for ax in panels[len(series):]:
        ax.set_visible(False)
    if not series:
        panels[0].set_visible(True)
        _no_data(panels[0])
        panels[0].set_title("Samples per second per device")
    return _save(fig, path, show)


# ---------------------------------------------------------------- table

def _time_to(summary, target, metric):
    """time_to_target, None without a target or a summary."""
    if summary is None or target is None:
        return None
    return time_to_target(summary, target, metric)


def speedup_rows(data, target, metric=DEFAULT_METRIC):
    """One dict per present algorithm: IID rows, Standalone, then non-IID rows; the
    evaluations are metric's (final_<metric>, best_<metric>: final_accuracy, ...), the
    times None where target is None."""
    local = data.get((STANDALONE, False))
    standalone_best = best_value(local, metric) if local is not None else None
    rows = []
    for folder, label, niid in TABLE_ORDER:
        summary = data.get((label, niid))
        if summary is None:
            continue
        ev = evaluating_device(summary, metric)
        _, values = metric_curve(summary, metric)
        t = _time_to(summary, target, metric)
        t_base = _time_to(data.get((BASELINE, niid)), target, metric)
        final = values[-1] if values else None
        rows.append({
            "algorithm": _display(label, niid),
            "mode": folder,
            "data": "non-IID" if niid else "IID",
            "evaluating_device": f"{ev[0]}/{ev[1]}" if ev else None,
            "time_to_target_s": t,
            "speedup_vs_ssgd": t_base / t if t_base is not None and t else None,
            f"final_{metric}": final,
            f"best_{metric}": best_of(values, metric),
            "final_minus_standalone": (final - standalone_best
                                       if final is not None and standalone_best is not None
                                       else None),
        })
    return rows, standalone_best


def _fmt(v, spec, none="n/a"):
    return none if v is None else format(v, spec)


def speedup_markdown(rows, target, metric=DEFAULT_METRIC):
    """The table of speedup_rows; without a target (None) its times read n/a."""
    aim = f"{target:g} {metric}" if target is not None else f"{metric} target"
    lines = [f"| Algorithm | Time to {aim} (s) | Speedup vs {BASELINE} "
             f"| Final {metric} | Best {metric} | Final - standalone best |",
             "|---|---:|---:|---:|---:|---:|"]
    unreached = "n/a" if target is None else "not reached"
    for r in rows:
        lines.append("| " + " | ".join([
            r["algorithm"],
            _fmt(r["time_to_target_s"], ".2f", unreached),
            _fmt(r["speedup_vs_ssgd"], ".2f") + ("x" if r["speedup_vs_ssgd"] else ""),
            _fmt(r[f"final_{metric}"], ".4f"),
            _fmt(r[f"best_{metric}"], ".4f"),
            _fmt(r["final_minus_standalone"], "+.4f"),
        ]) + " |")
    if not rows:
        lines.append("| (no data) | | | | | |")
    return "\n".join(lines) + "\n"


def write_speedup(data, target, network, outdir, metric=DEFAULT_METRIC):
    """Write speedup.md and speedup.json; return the Markdown table. The evaluations are
    metric's; speedup.json names a metric other than accuracy ("metric": "val_loss")."""
    rows, standalone_best = speedup_rows(data, target, metric)
    table = speedup_markdown(rows, target, metric)
    with open(os.path.join(outdir, "speedup.md"), "w", encoding="utf-8") as f:
        f.write(f"# Speedup, {network}\n\n{table}")
    ratios, _ = computing_ratio_values(data)
    doc = {
        "network": network,
        **({} if metric == DEFAULT_METRIC else {"metric": metric}),
        "target": target,
        f"standalone_best_{metric}": standalone_best,
        "rows": rows,
        "throughput_samples_per_s": dict(throughput_values(data)),
        "traffic_MB_per_s": dict(traffic_values(data)),
        "computing_ratio": {k: {f"{h}/{d}": v for (h, d), v in per.items()}
                            for k, per in ratios.items()},
    }
    with open(os.path.join(outdir, "speedup.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    return table


# ---------------------------------------------------------------- main

def table_metric(data, target, target_loss, folder):
    """(metric, target) of the figures and the table: accuracy and target, or for runs
    that measured val_loss, val_loss and target_loss (noted when None: no time to
    target). UserError for a target_loss given for runs that measured accuracy."""
    found = metrics_of(data.values())
    metric = common_metric(data.values())
    if len(found) > 1:
        note(f"the summaries under {folder} measured both accuracy and val_loss; "
             f"drawing accuracy, the val_loss runs without a curve")
    if metric == DEFAULT_METRIC:
        if target_loss is not None and found:
            raise user_error(f"--target-loss: the summaries under {folder} measured "
                             f"accuracy, not val_loss; give --target")
        return metric, target
    if target_loss is None:
        note(f"the summaries under {folder} measured val_loss; no time to target "
             f"without --target-loss")
    return metric, target_loss


def draw(base, network, outdir=None, target=0.8, show=False, linear_time=False,
         target_loss=None):
    """Write OUTPUTS (six figures, speedup.md and speedup.json) of BASE/NETWORK into
    OUTDIR (default BASE/NETWORK), and breakdown.png where a summary has a breakdown;
    return the Markdown table. The accuracy figures have a log time axis unless
    linear_time. Runs that measured val_loss are drawn with it, timed to target_loss.
    UserError if there is no BASE/NETWORK or OUTDIR cannot be created, or for a
    target_loss given for runs that measured accuracy; a missing summary is only noted."""
    folder = os.path.join(base, network)
    if not os.path.isdir(folder):
        raise user_error(f"no such folder: {folder}")
    outdir = outdir or folder
    try:
        os.makedirs(outdir, exist_ok=True)
    except OSError as e:
        raise user_error(f"cannot create {outdir}: {e}") from None
    data = load_all(base, network)
    if not data:
        note(f"no usable summary under {folder}; writing empty figures")
    metric, target = table_metric(data, target, target_loss, folder)
    pyplot(show)
    out = lambda name: os.path.join(outdir, name)  # noqa: E731
    for niid, name in ((False, "accuracy_iid.png"), (True, "accuracy_noniid.png")):
        draw_accuracy(data, niid, out(name), network, show, linear_time, metric)
    draw_throughput(data, out("throughput.png"), show)
    draw_traffic(data, out("traffic.png"), show)
    draw_computing_ratio(data, out("computing_ratio.png"), show)
    if draw_breakdown(data, out(BREAKDOWN_OUTPUT), show) is None:
        note(f"no summary under {folder} has a breakdown (logs older than it); "
             f"{BREAKDOWN_OUTPUT} not written")
    draw_rates(data, out("rates.png"), show)
    return write_speedup(data, target, network, outdir, metric)


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The command's parser (also the manual's flag reference: docs/gen_reference.py)."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("-b", "--base", required=True, help="folder holding NETWORK/")
    p.add_argument("-n", "--network", required=True, help="network (model) folder name")
    p.add_argument("-o", "--outdir", help="output folder (default BASE/NETWORK)")
    p.add_argument("--target", type=float, default=0.8,
                   help="target accuracy of the speedup table (default 0.8)")
    p.add_argument("--target-loss", type=float, metavar="L",
                   help="target validation loss of the speedup table, for runs that "
                        "measured val_loss (--metric loss); reached at or below")
    p.add_argument("--linear-time", action="store_true",
                   help="linear time axis in the accuracy figures (default: log scale)")
    p.add_argument("--show", action="store_true", help="also open the figures in windows")
    return p


def parse_args(argv, prog=PROG):
    return build_parser(prog).parse_args(argv)


def main(argv=None, prog=None) -> int:
    """The `esync-draw` command (see the module's docstring)."""
    from esync.errors import command_main

    return command_main(_main, argv, prog, PROG)


def _main(argv, prog) -> int:
    args = parse_args(argv, prog)
    table = draw(args.base, args.network, args.outdir, args.target, args.show,
                 args.linear_time, args.target_loss)
    print(table, end="")
    if args.show:
        pyplot(True).show()
    return 0


def console_main() -> int:
    """The `esync-draw` command."""
    return main()


if __name__ == "__main__":
    sys.exit(main())
