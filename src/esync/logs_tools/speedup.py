"""The speed-up over the fastest device alone, and the share of the ideal a job reached.

A heterogeneous job is worth running only if it reaches its target sooner than its
fastest device would alone. This module measures that from summaries (summary.py's
`{host: {device: record}}`), pure arithmetic, no files:

* each device's throughput `v_i`: the samples it trained on per second of computing
  (its rounds' `compute_time_list`: fetching the batch, forward and backward, the local
  update and the emulated slowdown), as it ran in the job (`device_rates`);
* the ideal speed-up `sum(v_i) / v_max` (`ideal`): what the job would gain if every
  device computed all the time and every sample counted as much as the fastest's;
* the fastest device alone at its best learning rate (`best_learning_rate`): for each
  target, the learning rate of a small grid whose median time is lowest, so that no
  method wins by a step size its baseline was denied;
* the speed-up `t_alone / t_job` of median times (`speedup`), and the fraction of the
  ideal reached, in time to target (speed-up / ideal) and in throughput (the job's
  samples per second over the fast device alone's, divided by the ideal; `fraction`);
* the devices' computing against the fast device alone's (`sum(v_i)` in the job over
  `v` alone): near the ideal where the devices compute as fast together as apart,
  lower where they slow each other down (shared cores: an emulation to distrust);
* the paired speed-up (`paired`): seed by seed, the alone's time (at its best learning
  rate) over the job's of the same seed, the two run one after the other; and the same
  with each time interpolated between the evaluation short of the target and the one at
  it (`crossing`), finer than the evaluation interval. Where a job is its fast device
  alone, a median of three seeds' first evaluations at the target falls either side of
  1.0x by an interval's chance; the paired, interpolated ratio shows it near 1.0x.

Medians over seeds are compare.py's: a seed that did not reach a target counts as slower
than every seed that did (never as the time limit), and the median is None ("not
reached") when fewer than half reached it; a speed-up or fraction of a median that is
None is None.
"""
from __future__ import annotations

from typing import Dict, Iterable, Mapping, Optional, Sequence, Tuple

from esync.logs_tools import compare, drawer


def crossing(summary: dict, target: float, metric: Optional[str] = None) -> Optional[float]:
    """When the job's evaluated metric crossed target: linear between the last evaluation
    short of it and the first at it (that one's time if it is the first evaluation);
    None if never reached."""
    metric = metric or drawer.metric_of(summary)
    times, values = drawer.metric_curve(summary, metric)
    for k, (t, v) in enumerate(zip(times, values)):
        if drawer.reached(v, target, metric):
            if k == 0:
                return t
            return times[k - 1] + (t - times[k - 1]) * (target - values[k - 1]) \
                / (v - values[k - 1])
    return None


def crossings(summaries: Mapping[str, dict], target: float,
              metric: Optional[str] = None) -> Dict[str, Optional[float]]:
    """{seed: crossing} (None: not reached)."""
    return {seed: crossing(s, target, metric) for seed, s in summaries.items()}


def by_seed(summaries: Mapping[str, dict], stats: dict) -> Dict[str, Optional[float]]:
    """{seed: time} of the time_stats of summaries' times (compare.time_to_target, the
    seeds in the dict's order)."""
    return dict(zip(summaries, stats["per_seed"]))


def paired(alone_times: Mapping[str, Optional[float]],
           job_times: Mapping[str, Optional[float]]) -> dict:
    """compare.spread of the job's seeds' speed-ups over the alone's same seed: t_alone /
    t_job; 0 where the alone reached the target and the job did not; None where the alone
    did not (or has no such seed) or the job's time is 0."""
    def one(seed: str, job_time: Optional[float]) -> Optional[float]:
        alone_time = alone_times.get(seed)
        if alone_time is None:
            return None
        return 0.0 if job_time is None else ratio(alone_time, job_time)
    return compare.spread([one(seed, t) for seed, t in job_times.items()])


def device_rate(record: dict) -> Optional[float]:
    """A device's samples per second of computing (None if it never computed)."""
    seconds = sum(t for t in record["compute_time_list"] if t is not None)
    samples = sum(n for n in record["num_samples_list"] if n is not None)
    return samples / seconds if seconds > 0 else None


def device_rates(summary: dict) -> Dict[str, float]:
    """{device: samples per second of computing} of a job's training devices (the
    evaluator left out, and any device that never computed)."""
    rates = {device: device_rate(record)
             for _, device, record in drawer.training_records(summary)}
    return {device: rate for device, rate in rates.items() if rate is not None}


def ideal(rates: Iterable[Optional[float]]) -> Optional[float]:
    """The ideal speed-up over the fastest device alone, sum(v_i) / v_max (None without
    a positive rate)."""
    rates = [v for v in rates if v is not None and v > 0]
    return sum(rates) / max(rates) if rates else None


def median(values: Sequence[Optional[float]]) -> Optional[float]:
    """The median of the values that are not None (None if none is)."""
    return compare.spread(values)["median"]


def ratio(numerator: Optional[float], denominator: Optional[float]) -> Optional[float]:
    """numerator / denominator, None where either is None or the denominator is 0."""
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def speedup(alone_seconds: Optional[float], job_seconds: Optional[float]) -> Optional[float]:
    """The speed-up of a job over the fastest device alone: t_alone / t_job (medians)."""
    return ratio(alone_seconds, job_seconds)


def fraction(reached: Optional[float], ideal_speedup: Optional[float]) -> Optional[float]:
    """The fraction of the ideal speed-up a job reached."""
    return ratio(reached, ideal_speedup)


def best_learning_rate(times: Mapping[float, dict]) -> Optional[Tuple[float, dict]]:
    """(learning-rate multiplier, its time_stats) with the lowest median time to one
    target among {multiplier: time_stats}; ties go to the smaller multiplier; None if no
    multiplier's median reached the target."""
    reached = [(stats["median"], lr, stats) for lr, stats in times.items()
               if stats["median"] is not None]
    if not reached:
        return None
    _, lr, stats = min(reached, key=lambda item: (item[0], item[1]))
    return lr, stats


def alone(runs: Mapping[float, Mapping[str, dict]], targets: Sequence[float],
          metric: Optional[str] = None) -> dict:
    """The fastest device alone, from its runs {learning-rate multiplier: {seed:
    summary}}: {"samples_per_s": median over every run, "device_rates": every run's
    (multipliers in order, then seeds), "computing_samples_per_s": the median of its
    device's rate, "targets": {label: {"lr": the
    best multiplier (None: no multiplier reached it), "time": its time_stats,
    "by_lr": {multiplier: time_stats}, "by_seed" and "crossing_by_seed": its seeds'
    times and crossings at the best multiplier (None without one)}}}."""
    by_target = {}
    for target in targets:
        by_lr = {lr: compare.time_to_target(seeds, target, metric)
                 for lr, seeds in runs.items()}
        best = best_learning_rate(by_lr)
        lr, stats = best or (None, None)
        by_target[compare.target_label(target)] = {
            "lr": lr, "time": stats,
            "by_lr": {f"{m:g}": at for m, at in by_lr.items()},
            "by_seed": by_seed(runs[lr], stats) if best else None,
            "crossing_by_seed": crossings(runs[lr], target, metric) if best else None}
    every = [s for seeds in runs.values() for s in seeds.values()]
    rates = [device_rates(s) for s in every]
    return {"samples_per_s": median([drawer.throughput(s) for s in every]),
            "device_rates": rates,
            "computing_samples_per_s": median([max(r.values(), default=None) for r in rates]),
            "targets": by_target}


def job(summaries: Mapping[str, dict], baseline: dict, targets: Sequence[float],
        metric: Optional[str] = None) -> dict:
    """One method's measure over its seeds {seed: summary}, against `alone`'s result:
    {"ideal": spread of each seed's ideal, "device_rates": each seed's,
    "computing_over_alone": spread of each seed's sum(v_i) / the alone's v,
    "samples_per_s": spread, "throughput_fraction": (median samples/s / the alone's) /
    median ideal, "targets": {label: {"time": time_stats, "speedup", "fraction",
    "paired" and "paired_crossing": the spreads of `paired`}}}."""
    rates = [device_rates(s) for s in summaries.values()]
    ideals = compare.spread([ideal(list(r.values())) for r in rates])
    throughput = compare.spread([drawer.throughput(s) for s in summaries.values()])
    by_target = {}
    for target in targets:
        label = compare.target_label(target)
        stats = compare.time_to_target(summaries, target, metric)
        at = baseline["targets"][label]
        gain = speedup(at["time"]["median"] if at["time"] else None, stats["median"])
        by_target[label] = {
            "time": stats, "speedup": gain, "fraction": fraction(gain, ideals["median"]),
            "paired": paired(at["by_seed"] or {}, by_seed(summaries, stats)),
            "paired_crossing": paired(at["crossing_by_seed"] or {},
                                      crossings(summaries, target, metric))}
    return {"ideal": ideals, "device_rates": rates,
            "computing_over_alone": compare.spread(
                [ratio(sum(r.values()) if r else None, baseline["computing_samples_per_s"])
                 for r in rates]),
            "samples_per_s": throughput,
            "throughput_fraction": fraction(ratio(throughput["median"],
                                                  baseline["samples_per_s"]), ideals["median"]),
            "targets": by_target}
