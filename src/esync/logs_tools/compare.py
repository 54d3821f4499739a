#!/usr/bin/env python3
"""Medians and spreads over many runs: every algorithm, several seeds, several
configurations.

One training run is noisy (a seed, a slow start, a busy host), so the experiment runs
every job with several seeds and in several *configurations* (``plain``: no link
emulation; ``links``: the slow devices on emulated slow links; ...) and lays them out as

    OUT/<config>/seed<k>/<network>/<mode folder>/<Summary name>.json

(``summary.py``'s output; mode folders and summary names come from ``esync.registry``).
This tool reads only those summaries (never the iteration files, never torch) and writes
into OUT:

* ``results.md``: per configuration, a table with one row per algorithm (IID runs,
  Standalone, non-IID runs, the registry's order): time to each target accuracy as
  ``median [min-max]`` seconds over the seeds, ESync's speedup over the row at the middle
  target, the samples the workers trained on until the middle target (thousands), the
  final accuracy, traffic in bytes per training sample and throughput in samples/s;
  under each table one line with each row's number of seeds and the targets;
* ``results.json``: the same numbers, machine-readable (see ``results``);
* ``accuracy-<config>.png`` (each mode's median curve over the seeds, their range drawn
  as a band; log time axis),
  ``time_to_target-<config>.png`` (median time per target and algorithm, min-max error
  bars) and ``traffic-<config>.png`` (bytes per sample, min-max error bars).

How the numbers are made (per configuration, per algorithm, over the seeds that have a
usable summary of it):

* time to a target: drawer.py's ``time_to_target`` of each seed (the evaluator's
  accuracy when the run has one, else the device that evaluated most). A seed that never
  reached the target counts as slower than every seed that did; the median is over all
  seeds (with an even number, the mean of the two middle times, or the lower one when
  the upper one was not reached), so it exists when at least half of the seeds reached
  the target. Cells: ``2.31 [1.90-3.02]`` (all reached), ``4.10 [3.20-n/r] (2/3)`` (one
  of three did not), ``not reached (1/3)`` (fewer than half did);
* ESync's speedup over a row: for each seed where both reached the middle target,
  t_row / t_ESync (ESync on the same data: non-IID rows against ESync (non-IID)); the
  median and min-max of those ratios;
* samples to a target: the workers' training samples of the rounds that ended by the
  time the evaluator first saw it (one clock), per seed; the median of the seeds that
  reached it (results.json has every target's);
* final accuracy: each seed's last evaluation; median [min-max];
* traffic: the workers' bytes (sent + received) / the workers' training samples, the
  evaluator left out; throughput: the workers' samples / the job's duration (the largest
  last elapsed time among the workers); the median over the seeds.

Runs whose evaluations measured a validation loss (``--metric loss``, lower is better)
are compared with ``--target-loss L [L ...]`` in place of ``--targets``: a time to target
is the first evaluation at or below it, the final value is the last val_loss, and the
tables and figures say val_loss / "Validation loss" where they say accuracy (same file
names; ``results.json`` has ``"metric": "val_loss"`` and ``final_val_loss``). A job
measures one metric: targets of the other one than the runs measured (which
``drawer.metric_of`` tells) are an error naming the flag.

Missing or invalid summaries are left out with one ``compare.py: note: ...`` line each
(an algorithm that no seed of a configuration ran is silently absent).

Usage: ``esync-compare --out OUT -n NETWORK [--targets 0.90,0.95,0.97 |
--target-loss L [L ...]] [--configs plain,links]`` (``esync-compare``). Bad input (a
target outside (0, 1], a loss target below 0, targets of the other metric than the runs
measured, a missing OUT, nothing usable in OUT) is one ``compare.py: error: ...`` line
and exit status 2.

Library use (the experiment, tests): ``compare(out, network, targets, configs=None,
metric="accuracy") -> markdown`` (raises UserError), ``collect``, ``results``,
``time_to_target``, ``markdown``, ``draw_figures``, ``parse_targets``. Standard library,
matplotlib, esync.registry and the other log tools (drawer.py's metrics, summary.py's
file names).
"""

import argparse
import os
import re
import statistics
import sys

from esync import registry
from esync.logs_tools import error_type, user_error
from esync.logs_tools import drawer
from esync.logs_tools.summary import output_path, write_json

PROG = "compare.py"
DEFAULT_TARGETS = (0.90, 0.95, 0.97)
#: the algorithm whose speedup over every row is shown
PROPOSED = "esync"
OUTPUTS = ("results.md", "results.json")
FIGURES = ("accuracy-{}.png", "time_to_target-{}.png", "traffic-{}.png")
#: the flag that gives the targets of each metric
TARGET_FLAG = {"accuracy": "--targets", "val_loss": "--target-loss"}

_SEED = re.compile(r"seed([0-9]+)")


def __getattr__(name: str) -> type:
    """CompareError: bad input (esync.errors.UserError, by the name this module's callers
    know; loaded on first use)."""
    return error_type(__name__, name, "CompareError")


def note(msg):
    print(f"{PROG}: note: {msg}", file=sys.stderr)


# ---------------------------------------------------------------- names

def _algorithm(mode):
    """(registry entry, non-IID?) of a drawer mode tuple (folder, label, niid)."""
    return registry.from_folder(mode[0])


def display(mode):
    """'ESync', 'DDP (non-IID)', ... of a drawer mode tuple."""
    algorithm, niid = _algorithm(mode)
    return algorithm.display_name(niid)


def reference_mode(mode):
    """The mode ESync's speedup over `mode` is measured against: ESync on the same data."""
    proposed = registry.ALGORITHMS[PROPOSED]
    return next(m for m in drawer.TABLE_ORDER
                if m[0] == proposed.log_folder(mode[2] and proposed.distributed))


def target_label(target):
    """'0.90', '0.95', '0.975': two decimals at least, more where the target has them."""
    label = f"{target:.2f}"
    return label if float(label) == target else f"{target:g}"


def _target_value(part, metric):
    """One target of metric: an accuracy in (0, 1], or a val_loss, a number >= 0 (as
    training's --target-loss); ValueError naming it otherwise."""
    what = "target" if metric == "accuracy" else "target loss"
    try:
        value = float(part)
    except ValueError:
        raise ValueError(f"{what} {part!r} is not a number") from None
    if metric == "accuracy" and not 0 < value <= 1:  # also rejects nan
        raise ValueError(f"{what} {part} is not in (0, 1]")
    if metric != "accuracy" and not 0 <= value < float("inf"):  # also rejects nan
        raise ValueError(f"{what} {part} is not a finite number >= 0")
    return value


def parse_targets(text, metric="accuracy"):
    """Distinct targets of '0.90,0.95,0.97', the easiest first: accuracies ascending,
    each in (0, 1]; val_loss targets (metric 'val_loss') descending, each >= 0.
    ValueError otherwise."""
    targets = {_target_value(part.strip(), metric) for part in str(text).split(",")}
    return sorted(targets, reverse=metric in drawer.LOWER_IS_BETTER)


def _check_targets(targets, metric="accuracy"):
    if isinstance(targets, str):
        return parse_targets(targets, metric)
    targets = list(targets)
    if not targets:
        raise ValueError(f"no target {'accuracy' if metric == 'accuracy' else 'loss'}")
    return parse_targets(",".join(repr(float(t)) for t in targets), metric)


def middle_target(targets):
    """The target the speedup is measured at: the middle one (the easier of two: the
    lower accuracy, the higher loss)."""
    return targets[(len(targets) - 1) // 2]


# ---------------------------------------------------------------- reading

def _subdirs(path):
    try:
        with os.scandir(path) as it:
            return sorted(e.name for e in it
                          if not e.name.startswith(".") and e.is_dir(follow_symlinks=True))
    except OSError:
        return []


def seed_folders(out, config, network):
    """The seed<k> folders of OUT/<config> that have a <network>/ folder, by k."""
    root = os.path.join(out, config)
    found = [(int(m.group(1)), name) for name in _subdirs(root)
             for m in [_SEED.fullmatch(name)]
             if m and os.path.isdir(os.path.join(root, name, network))]
    return [name for _, name in sorted(found)]


def find_configs(out, network):
    """The sorted names of OUT's folders that have a seed<k>/<network>/ folder."""
    return [c for c in _subdirs(out) if seed_folders(out, c, network)]


def collect(out, network, configs=None, warn=None):
    """{config: {"seeds": [seed folders], "runs": {mode: {seed: summary}}}}, modes being
    drawer.TABLE_ORDER's tuples (folder, label, niid) in that order, only those with a
    usable summary; configs in the order given (default: find_configs). A summary that
    is invalid, or missing where the algorithm ran (its mode folder exists, or another
    seed has its summary), is noted through warn (default: a note on stderr); a
    configuration without any usable summary is noted and left out."""
    warn = warn or note
    configs = find_configs(out, network) if configs is None else list(configs)
    data = {}
    for config in configs:
        root = os.path.join(out, config)
        seeds = seed_folders(out, config, network)
        if not seeds:
            warn(f"no seed<k>/{network}/ folder in {root}; {config} left out")
            continue
        runs = {}
        for mode in drawer.TABLE_ORDER:
            found, missing = {}, []
            for seed in seeds:
                path = output_path(os.path.join(root, seed), network, mode[0])
                what = f"{display(mode)} of {config}/{seed}"
                if not os.path.isfile(path):
                    missing.append((path, what, os.path.isdir(os.path.dirname(path))))
                    continue
                try:
                    found[seed] = drawer.read_summary(path)
                except (OSError, ValueError) as e:
                    warn(f"cannot use {path} ({e}); {what} left out")
                    found[seed] = None
            ran = bool(found)
            for path, what, folder in missing:
                if ran or folder:
                    warn(f"no {path}; {what} left out")
            usable = {s: v for s, v in found.items() if v is not None}
            if usable:
                runs[mode] = usable
        if not runs:
            warn(f"no usable summary in {root}/seed<k>/{network}/; {config} left out")
            continue
        data[config] = {"seeds": seeds, "runs": runs}
    return data


def check_metric(data, metric):
    """UserError, one line naming the flag, if a run of collect's data measured
    another metric than the targets': accuracy targets (--targets) for runs that
    measured val_loss, or --target-loss for runs that measured accuracy. A summary
    that never evaluated fits either."""
    for config, entry in data.items():
        for mode, summaries in entry["runs"].items():
            for seed, summary in summaries.items():
                measured = drawer.metric_of(summary, None)
                if measured not in (None, metric):
                    raise user_error(
                        f"{TARGET_FLAG[metric]} gives {metric} targets, but "
                        f"{display(mode)} of {config}/{seed} measured {measured}; give "
                        f"{TARGET_FLAG[measured]}")


# ---------------------------------------------------------------- numbers

def final_value(summary, metric=None):
    """The last evaluation of the evaluating device (of metric, default the one summary
    measured: accuracy or val_loss), or None if it never evaluated."""
    _, values = drawer.metric_curve(summary, metric)
    return values[-1] if values else None


def final_accuracy(summary):
    """The last accuracy of the evaluating device, or None if it never evaluated."""
    return final_value(summary, "accuracy")


def bytes_per_sample(summary):
    """The workers' bytes sent + received per training sample (evaluator left out);
    None if they trained on no sample."""
    samples = drawer.total(summary, "num_samples_list")
    return drawer.total(summary, "bytes_list") / samples if samples > 0 else None


def spread(values):
    """{"per_seed": values, "median", "min", "max"} over the values that are not None
    (all None where there is none)."""
    present = [v for v in values if v is not None]
    return {"per_seed": list(values),
            "median": statistics.median(present) if present else None,
            "min": min(present) if present else None,
            "max": max(present) if present else None}


def censored_median(times):
    """The median of times where None means 'not reached' (slower than any time): None
    when fewer than half reached; with an even count, the mean of the two middle times,
    or the lower one when the upper one was not reached."""
    n = len(times)
    reached = sorted(t for t in times if t is not None)
    if not n or 2 * len(reached) < n:
        return None
    if n % 2:
        return reached[n // 2]
    if n // 2 < len(reached):
        return (reached[n // 2 - 1] + reached[n // 2]) / 2
    return reached[n // 2 - 1]


def time_stats(times):
    """{"per_seed", "reached", "median", "min", "max"} of per-seed times to a target
    (None: not reached): the censored median, the fastest seed's time, and the slowest
    seed's (None if a seed did not reach it)."""
    reached = [t for t in times if t is not None]
    return {"per_seed": list(times),
            "reached": len(reached),
            "median": censored_median(times),
            "min": min(reached) if reached else None,
            "max": max(reached) if reached and len(reached) == len(times) else None}


def time_to_target(summaries, target, metric=None):
    """time_stats of {seed: summary}'s times to target, seeds in the dict's order (the
    target an accuracy or a val_loss: metric, default each summary's own)."""
    return time_stats([drawer.time_to_target(s, target, metric)
                       for s in summaries.values()])


def samples_to_target(summary, target, metric=None):
    """The samples the training devices had trained on when the evaluator first saw
    target (their rounds that ended by then, on the job's one clock), or None if it was
    not reached: how much data a mode needs, apart from how fast it goes through it."""
    t = drawer.time_to_target(summary, target, metric)
    if t is None:
        return None
    return sum(n for _, _, rec in drawer.training_records(summary)
               for at, n in zip(rec["elapsed_time_list"], rec["num_samples_list"])
               if at is not None and n is not None and at <= t)


def speedup(summaries, reference, target, metric=None):
    """ESync's speedup over a row: spread of t_row / t_reference per seed of summaries,
    None where the reference has no such seed or either did not reach target."""
    ratios = []
    for seed, summary in summaries.items():
        t = drawer.time_to_target(summary, target, metric)
        ref = reference.get(seed)
        t_ref = drawer.time_to_target(ref, target, metric) if ref is not None else None
        ratios.append(t / t_ref if t is not None and t_ref else None)
    return spread(ratios)


def algorithm_results(summaries, reference, targets, metric="accuracy"):
    """The results.json entry of one algorithm in one configuration (final_accuracy, or
    final_val_loss for runs that measured val_loss)."""
    sp_target = middle_target(targets)
    per = list(summaries.values())
    return {
        "time_to_target": {target_label(t): time_to_target(summaries, t, metric)
                            for t in targets},
        "speedup": dict(target=sp_target,
                        **speedup(summaries, reference or {}, sp_target, metric)),
        "samples_to_target": {target_label(t): spread([samples_to_target(s, t, metric)
                                                       for s in per]) for t in targets},
        f"final_{metric}": spread([final_value(s, metric) for s in per]),
        "traffic_bytes_per_sample": spread([bytes_per_sample(s) for s in per]),
        "throughput_samples_per_s": spread([drawer.throughput(s) for s in per]),
    }


def results(data, network, targets, metric="accuracy"):
    """The results.json document of collect's data:

    {"network": NETWORK, "targets": [0.9, ...], "speedup_target": 0.95,
     "configs": {config: {"seeds": [seed folders],
                          "algorithms": {display name: {
                              "mode": folder, "data": "IID" | "non-IID",
                              "speedup_of": "ESync" | "ESync (non-IID)",
                              "seeds": [seeds with a usable summary],
                              "time_to_target": {"0.90": time_stats, ...},
                              "speedup": {"target": 0.95, **spread},
                              "samples_to_target": {"0.90": spread, ...},
                              "final_accuracy": spread,
                              "traffic_bytes_per_sample": spread,
                              "throughput_samples_per_s": spread}}}}}

    every per_seed list in the order of that algorithm's "seeds". For runs that
    measured val_loss (metric), "metric": "val_loss" follows "network", the targets are
    losses (the highest first) and "final_val_loss" replaces "final_accuracy".
    """
    doc = {"network": network, **({} if metric == "accuracy" else {"metric": metric}),
           "targets": list(targets), "speedup_target": middle_target(targets),
           "configs": {}}
    for config, entry in data.items():
        algorithms = {}
        for mode, summaries in entry["runs"].items():
            ref = reference_mode(mode)
            algorithms[display(mode)] = {
                "mode": mode[0],
                "data": "non-IID" if mode[2] else "IID",
                "speedup_of": display(ref),
                "seeds": list(summaries),
                **algorithm_results(summaries, entry["runs"].get(ref), targets, metric),
            }
        doc["configs"][config] = {"seeds": list(entry["seeds"]), "algorithms": algorithms}
    return doc


# ---------------------------------------------------------------- Markdown

def _count(k, n):
    return f" ({k}/{n})" if k < n else ""


def time_cell(stats):
    """'2.31 [1.90-3.02]', '4.10 [3.20-n/r] (2/3)', 'not reached (1/3)'."""
    n, k = len(stats["per_seed"]), stats["reached"]
    if stats["median"] is None:
        return f"not reached ({k}/{n})"
    top = "n/r" if stats["max"] is None else f"{stats['max']:.2f}"
    return f"{stats['median']:.2f} [{stats['min']:.2f}-{top}]{_count(k, n)}"


def spread_cell(stats, spec, unit=""):
    """'0.9712 [0.9700-0.9730]', with '(k/n)' if only k of n seeds have a value."""
    n = len(stats["per_seed"])
    k = sum(v is not None for v in stats["per_seed"])
    if not k:
        return "n/a"
    return (f"{stats['median']:{spec}}{unit} [{stats['min']:{spec}}-{stats['max']:{spec}}]"
            f"{_count(k, n)}")


def number(v):
    """A median for the table: whole numbers from 100 up, three significant digits below."""
    if v is None:
        return "n/a"
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


def doc_metric(doc):
    """The metric of a results document (accuracy unless it says otherwise)."""
    return doc.get("metric", "accuracy")


def _targets_phrase(targets, metric):
    """'Targets 0.90, 0.95' of the line under a table; loss targets say how they count."""
    listed = ", ".join(target_label(t) for t in targets)
    if metric == "accuracy":
        return f"Targets {listed}"
    return f"Targets ({metric} at or below) {listed}"


def config_markdown(config, entry, targets, metric="accuracy"):
    """The table of one configuration (results' entry) and its line of seeds."""
    proposed = registry.ALGORITHMS[PROPOSED].display
    sp = target_label(middle_target(targets))
    head = ([f"Time to {target_label(t)} (s)" for t in targets]
            + [f"{proposed} speedup at {sp}", f"Samples to {sp} (k)", f"Final {metric}",
               "Traffic (B/sample)",
               "Throughput (samples/s)"])
    lines = [f"## {config}", "",
             "| Algorithm | " + " | ".join(head) + " |",
             "|---|" + "---:|" * len(head)]
    for name, a in entry["algorithms"].items():
        cells = [time_cell(a["time_to_target"][target_label(t)]) for t in targets]
        samples = a.get("samples_to_target", {}).get(sp, {}).get("median")
        cells += [spread_cell(a["speedup"], ".2f", "x"),
                  "n/a" if samples is None else f"{samples / 1000:.1f}",
                  spread_cell(a[f"final_{metric}"], ".4f"),
                  number(a["traffic_bytes_per_sample"]["median"]),
                  number(a["throughput_samples_per_s"]["median"])]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    seeds = ", ".join(f"{name} {len(a['seeds'])}" for name, a in entry["algorithms"].items())
    lines += ["", f"Seeds per row (of {len(entry['seeds'])}): {seeds}. "
              f"{_targets_phrase(targets, metric)}: median [min-max] s over "
              f"the seeds, n/r: not reached; {proposed}'s speedup t_row / t_{proposed} "
              f"at {sp}; samples to {sp}: the workers' training samples when the "
              f"evaluator first saw it, median of the seeds that reached it; traffic and "
              f"throughput: medians.", ""]
    return "\n".join(lines)


def markdown(doc):
    """results.md of a results document."""
    targets = doc["targets"]
    parts = [f"# Results, {doc['network']}", ""]
    parts += [config_markdown(c, e, targets, doc_metric(doc))
              for c, e in doc["configs"].items()]
    return "\n".join(parts)


# ---------------------------------------------------------------- figures

def colour(mode):
    """One colour per algorithm (its registry position), the same on IID and non-IID
    data; non-IID curves are dashed."""
    return f"C{list(registry.ALGORITHMS).index(_algorithm(mode)[0].key) % 10}"


def bar_style(mode):
    """Bars of an algorithm: its colour, lighter and dotted on non-IID data."""
    if mode[2]:
        return {"facecolor": colour(mode), "alpha": 0.55, "hatch": "..", "edgecolor": "white"}
    return {"facecolor": colour(mode)}


def _legend_handles(modes):
    from matplotlib.patches import Patch
    return [Patch(label=display(m), **bar_style(m)) for m in modes]


def seed_band(curves, points=200):
    """(times, median, low, high) of several seeds' curves of one mode: each curve held
    at its last evaluation between evaluations, sampled at `points` times from the
    first evaluation to the last one any seed made; at each time only the seeds whose
    curve has begun and not yet ended count. curves: [(times, values)]; None if none
    has a point."""
    import numpy as np

    curves = [(np.asarray(xs, float), np.asarray(ys, float)) for xs, ys in curves if len(xs)]
    if not curves:
        return None
    start = min(xs[0] for xs, _ in curves)
    end = max(xs[-1] for xs, _ in curves)
    grid = np.linspace(start, end, points) if end > start else np.array([start])
    rows = []
    for xs, ys in curves:
        at = np.searchsorted(xs, grid, side="right") - 1  # the last evaluation at or before
        row = np.where((at >= 0) & (grid <= xs[-1]), ys[np.clip(at, 0, None)], np.nan)
        rows.append(row)
    stack = np.vstack(rows)
    keep = ~np.all(np.isnan(stack), axis=0)
    stack, grid = stack[:, keep], grid[keep]
    return (grid, np.nanmedian(stack, axis=0), np.nanmin(stack, axis=0),
            np.nanmax(stack, axis=0))


def draw_accuracy(entry, targets, path, title, linear_time=False, metric="accuracy"):
    """Each mode's median curve of metric (test accuracy, or validation loss) over its
    seeds, the seeds' range drawn as a band around it (seed_band); the targets as
    dotted lines."""
    plt = drawer.pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    bands = [(mode, seed_band([drawer.metric_curve(s, metric) for s in per.values()]))
             for mode, per in entry["runs"].items()]
    bands = [(mode, band) for mode, band in bands if band is not None]
    place = drawer.time_axis(ax, [t for _, band in bands for t in band[0]], linear_time,
                             "Time since training start (s)")
    for mode, (xs, median, low, high) in bands:
        xs = place(list(xs))
        ax.plot(xs, median, color=colour(mode), linewidth=1.0,
                linestyle="--" if mode[2] else "-",
                label=f"{display(mode)} (median of {len(entry['runs'][mode])})")
        ax.fill_between(xs, low, high, color=colour(mode), alpha=0.15, linewidth=0)
    for t in targets:
        ax.axhline(t, linestyle=":", color="gray", linewidth=0.8)
        ax.text(1.0, t, f" {target_label(t)}", transform=ax.get_yaxis_transform(),
                va="center", fontsize="x-small", color="gray")
    if bands:
        ax.legend(loc=drawer.legend_corner(metric), fontsize="small")
        ax.grid(True, alpha=0.3)
    else:
        drawer._no_data(ax)
    ax.set_title(f"{title}; band: the seeds' range")
    ax.set_ylabel(drawer.METRIC_LABEL[metric])
    return drawer._save(fig, path, False)


def _span_is_wide(values):
    values = [v for v in values if v is not None and v > 0]
    return bool(values) and max(values) > 10 * min(values)


def _unreached_handle():
    from matplotlib.patches import Patch
    return Patch(facecolor="none", edgecolor="gray", hatch="//",
                 label="reached by fewer than half the seeds (n/r)")


def draw_time_to_target(entry, doc_entry, targets, path, title, metric="accuracy"):
    plt = drawer.pyplot()
    modes = list(entry["runs"])
    fig, ax = plt.subplots(figsize=(max(7, 1.6 * len(targets) * max(1, len(modes)) / 3), 5))
    stats = {m: doc_entry["algorithms"][display(m)]["time_to_target"] for m in modes}
    finite = [v for m in modes for t in targets
              for v in (stats[m][target_label(t)][k] for k in ("median", "min", "max"))
              if v is not None]
    log = _span_is_wide(finite)
    top = (max(finite) * (2 if log else 1.15)) if finite else 1.0
    bottom = min(v for v in finite if v > 0) / 2 if log and any(v > 0 for v in finite) else 0
    width = 0.8 / max(1, len(modes))
    for i, mode in enumerate(modes):
        for j, t in enumerate(targets):
            s = stats[mode][target_label(t)]
            x = j + (i - (len(modes) - 1) / 2) * width
            n = len(s["per_seed"])
            if s["median"] is None:  # fewer than half reached it
                ax.bar(x, top - bottom, width, bottom=bottom, color="none",
                       edgecolor=colour(mode), hatch="//")
                ax.text(x, top, "n/r", ha="center", va="bottom", fontsize="small")
                continue
            upper = (s["max"] if s["max"] is not None else
                     max(v for v in s["per_seed"] if v is not None))
            median = max(s["median"], bottom)  # a time of 0 on a log axis: at its bottom
            ax.bar(x, median - bottom, width, bottom=bottom, **bar_style(mode),
                   yerr=[[median - max(s["min"], bottom)], [max(upper, bottom) - median]],
                   capsize=3)
            if s["reached"] < n:
                ax.text(x, upper, f"{s['reached']}/{n}", ha="center", va="bottom",
                        fontsize="small")
    ax.set_xticks(range(len(targets)), [f"{metric} {target_label(t)}" for t in targets])
    if log:
        ax.set_yscale("log")
        ax.set_ylim(bottom, top * 1.5)
    else:
        ax.set_ylim(0, top * 1.1)
    ax.set_ylabel("Time to target (s), median [min-max]" + (", log scale" if log else ""))
    ax.set_title(title)
    if modes:
        ax.legend(handles=_legend_handles(modes) + [_unreached_handle()], fontsize="small")
        ax.grid(True, axis="y", alpha=0.3)
    else:
        drawer._no_data(ax)
    return drawer._save(fig, path, False)


def draw_traffic(entry, doc_entry, path, title):
    plt = drawer.pyplot()
    rows = [(m, doc_entry["algorithms"][display(m)]["traffic_bytes_per_sample"])
            for m in entry["runs"]]
    rows = [(m, s) for m, s in rows if s["median"] is not None]
    fig, ax = plt.subplots(figsize=(max(6.5, 1.1 * len(rows) + 2), 4.5))
    if rows:
        xs = range(len(rows))
        for x, (m, s) in zip(xs, rows):
            bars = ax.bar(x, s["median"], **bar_style(m),
                          yerr=[[s["median"] - s["min"]], [s["max"] - s["median"]]],
                          capsize=3)
            ax.bar_label(bars, labels=[number(s["median"])], padding=3)
        ax.set_xticks(list(xs), [display(m) for m, _ in rows],
                      rotation=30 if len(rows) > 4 else 0)
        ax.margins(y=0.15)
        ax.grid(True, axis="y", alpha=0.3)
    else:
        drawer._no_data(ax)
    ax.set_title(title)
    ax.set_ylabel("Bytes per training sample, median [min-max]")
    return drawer._save(fig, path, False)


def draw_figures(out, network, data, doc, linear_time=False):
    """Write the three figures of every configuration into OUT; return their paths.
    The names are FIGURES' whatever the metric (accuracy-<config>.png shows the
    validation loss of runs that measured it)."""
    paths = []
    metric = doc_metric(doc)
    for config, entry in data.items():
        doc_entry = doc["configs"][config]
        name = lambda pattern: os.path.join(out, pattern.format(config))  # noqa: E731
        where = f"{network}, {config}, {len(entry['seeds'])} seed(s)"
        paths.append(draw_accuracy(entry, doc["targets"], name(FIGURES[0]),
                                   f"{drawer.METRIC_LABEL[metric]} ({where})",
                                   linear_time, metric))
        paths.append(draw_time_to_target(entry, doc_entry, doc["targets"],
                                         name(FIGURES[1]), f"Time to target ({where})",
                                         metric))
        paths.append(draw_traffic(entry, doc_entry, name(FIGURES[2]),
                                  f"Traffic ({where})"))
    return paths


# ---------------------------------------------------------------- main

def compare(out, network, targets=DEFAULT_TARGETS, configs=None, warn=None,
            linear_time=False, metric="accuracy"):
    """Read OUT/<config>/seed<k>/NETWORK/<mode>/<Name>.json, write results.md,
    results.json and the figures into OUT; return the Markdown. targets: numbers or
    '0.90,0.95', accuracies, or val_loss values with metric="val_loss" (runs of
    --metric loss); configs: names in the wanted order (default: every folder of OUT
    with a seed<k>/NETWORK/ folder, sorted). UserError if OUT is missing, a target is
    not in (0, 1] (a loss target below 0), a run measured the other metric, or no
    configuration has a usable summary; OSError if OUT cannot be written."""
    if metric not in drawer.METRICS:
        raise user_error(f"metric {metric!r} is not one of {', '.join(drawer.METRICS)}")
    try:
        targets = _check_targets(targets, metric)
    except ValueError as e:
        raise user_error(str(e)) from None
    if not os.path.isdir(out):
        raise user_error(f"no such folder: {out}")
    data = collect(out, network, configs, warn)
    if not data:
        raise user_error(f"no <config>/seed<k>/{network}/ with a usable summary in {out}")
    check_metric(data, metric)
    doc = results(data, network, targets, metric)
    text = markdown(doc)
    write_json(os.path.join(out, "results.json"), doc)
    with open(os.path.join(out, "results.md"), "w", encoding="utf-8") as f:
        f.write(text)
    draw_figures(out, network, data, doc, linear_time)
    return text


def _folder_names(text):
    names = [n.strip() for n in text.split(",")]
    for n in names:
        if not n or n in (".", "..") or "/" in n or os.sep in n:
            raise ValueError(f"--configs wants folder names, got {n!r}")
    return list(dict.fromkeys(names))


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The command's parser (also the manual's flag reference: docs/gen_reference.py)."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True,
                   help="the experiment's folder: OUT/<config>/seed<k>/NETWORK/<mode>/")
    p.add_argument("-n", "--network", required=True, help="network (model) folder name")
    default = ",".join(target_label(t) for t in DEFAULT_TARGETS)
    p.add_argument("--targets",
                   help=f"target accuracies, comma-separated (default: {default})")
    p.add_argument("--target-loss", nargs="+", metavar="L",
                   help="target validation losses, for runs that measured val_loss "
                        "(--metric loss), in place of --targets: reached at or below "
                        "(space- or comma-separated)")
    p.add_argument("--configs",
                   help="configurations, comma-separated, in table order (default: every "
                        "folder of OUT with seed<k>/NETWORK/, sorted)")
    p.add_argument("--linear-time", action="store_true",
                   help="linear time axis in the accuracy figures (default: log scale)")
    return p


def parse_args(argv, prog=PROG):
    return build_parser(prog).parse_args(argv)


def metric_and_targets(args):
    """(metric, targets) of the command line: --target-loss's val_loss targets, or
    --targets' accuracies (default DEFAULT_TARGETS); ValueError for both or a bad one."""
    if args.target_loss is None:
        if args.targets is None:
            return "accuracy", list(DEFAULT_TARGETS)
        return "accuracy", parse_targets(args.targets)
    if args.targets is not None:
        raise ValueError("give --targets (accuracy) or --target-loss (val_loss), "
                         "not both")
    return "val_loss", parse_targets(",".join(args.target_loss), "val_loss")


def main(argv=None, prog=None) -> int:
    """The `esync-compare` command (see the module's docstring)."""
    from esync.errors import command_main

    return command_main(_main, argv, prog, PROG)


def _main(argv, prog) -> int:
    args = parse_args(argv, prog)
    try:
        metric, targets = metric_and_targets(args)
        configs = _folder_names(args.configs) if args.configs is not None else None
        text = compare(args.out, args.network, targets, configs,
                       linear_time=args.linear_time, metric=metric)
    except ValueError as e:  # a bad --targets, --target-loss or --configs
        raise user_error(str(e)) from None
    except OSError as e:
        print(f"{prog}: error: cannot write into {args.out}: {e.strerror or e}",
              file=sys.stderr)
        return 1
    print(text, end="")
    return 0


def console_main() -> int:
    """The `esync-compare` command."""
    return main()


if __name__ == "__main__":
    sys.exit(main())
