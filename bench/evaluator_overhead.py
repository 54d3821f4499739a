"""Does the evaluator change a worker's round time?

    python bench/evaluator_overhead.py [--repeats 3] [--rounds N|Ns|MODE=N|Ns,...]
                                       [--modes sync,esync,async]
                                       [--out DIR] [--keep]

For each mode, the same job (4 workers, `--slowdown 1,1,4,4`, lenet on digits,
`--max-rounds N`; async and dcasgd `--time-limit S`, see ROUNDS) runs through
esync/launch/local.py three ways:
  (a) `--no-evaluator`: no evaluation at all, the baseline;
  (b) the evaluator process (DMLC_ROLE=evaluator) at the default `--eval-interval`;
  (c) the evaluator every 0.25 s.
The runs are interleaved (repeat 1: a b c of every mode, then repeat 2, ...), so that a
drift of the machine's load reaches all three alike. From the logs (esync/logs_tools/summary.py)
it takes, per run:
  - each worker's mean round time: the differences of `total_time` from round 1 to the
    last, over the rounds between (round 1 carries the first iteration's warm-up);
  - the fast workers' (slowdown 1) computing time per local iteration from round 2 on:
    with no simulated slowdown, this is where CPU taken by the evaluator shows directly;
  - the evaluator's busy share: the seconds of its evaluations (`pull` + `evaluate`)
    made during training over the seconds of training (one core = 1.0). An upper bound
    of its CPU: a pull also waits for its answer (under ddp, for rank 0's next step).
It prints, per mode, the median and [min-max] over the repeats of each figure for (a),
(b), (c), and the ratios (b)/(a) and (c)/(a) taken within each repeat (median, [min-max]).
Timings, not test material: they vary with the machine's load.
"""
from __future__ import annotations

import argparse
import glob
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Dict, List, Sequence

from esync import config
from esync import registry
from esync.launch import local  # the jobs run through the launcher
from nodes import length_flags, parse_rounds
from esync.logs_tools.summary import summarize  # and are read by summary.py

SLOWDOWNS = "1,1,4,4"
#: each mode's default length (--rounds): N rounds (--max-rounds N), or Ns seconds
#: (--time-limit N), about 3 to 5 s of training on the 2-core machine. The asynchronous
#: modes run for a time: with --max-rounds a job ends when rank 0 has done N rounds (it
#: tells the others), and the scheduler gives ranks in order of registration, so rank 0
#: is a fast worker (~15 ms a round) in some runs and a slow one (~90 ms) in others.
ROUNDS = {"sync": "25", "esync": "20", "async": "4s", "dcasgd": "4s", "ddp": "25"}
FAST_INTERVAL = 0.25
CONFIGS = ("a", "b", "c")


def config_title(cfg: str) -> str:
    return {"a": "(a) no evaluator",
            "b": f"(b) every {config.EVAL_INTERVAL:g} s",
            "c": f"(c) every {FAST_INTERVAL:g} s"}[cfg]


def job_args(mode: str, cfg: str, length: str, out: str) -> List[str]:
    evaluator = {"a": ["--no-evaluator"], "b": [],  # (b): the launcher's default interval
                 "c": ["--eval-interval", f"{FAST_INTERVAL:g}"]}[cfg]
    return [*registry.ALGORITHMS[mode].flags, "--workers", "4", "--servers", "1",
            "--slowdown", SLOWDOWNS, "-n", "lenet", *length_flags(length),
            "--out", out, "--no-progress", *evaluator]


def run_job(argv: Sequence[str]) -> Dict[str, dict]:
    """One job through esync/launch/local.py; {device label: summary record}, and the
    evaluator's iteration files under the key `evaluator` (raw records)."""
    said = io.StringIO()
    code = local.run(argv, progress=False, out=said)
    if code == 130:
        raise KeyboardInterrupt
    if code != 0:
        raise RuntimeError(f"job failed ({' '.join(argv)}):\n{said.getvalue().strip()}")
    plan = local.plan(argv)
    records = summarize(os.path.dirname(os.path.dirname(plan.folder)), plan.network,
                        os.path.basename(plan.folder))
    result = {}
    for host, devices in records.items():
        for device, record in devices.items():
            if device == registry.EVALUATOR:
                files = glob.glob(os.path.join(plan.folder, host, device, "iter-*.json"))
                result[device] = [_read_json(f) for f in files]
            else:
                result[device] = record
    return result


def _read_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def mean_round(record: dict) -> float:
    t = record["elapsed_time_list"]
    return (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else t[-1]


def compute_per_iteration(record: dict) -> float:
    iters = sum(record["self_iters_list"][1:]) or 1
    return sum(record["compute_time_list"][1:]) / iters


def measure(result: Dict[str, dict], labels: Sequence[str], fast: Sequence[str]) -> Dict:
    """The figures of one run: {row: value}."""
    figures = {f"{label} ms/round": 1e3 * mean_round(result[label]) for label in labels}
    figures["fast ms/iteration"] = 1e3 * statistics.mean(
        compute_per_iteration(result[label]) for label in fast)
    training = max(result[label]["elapsed_time_list"][-1] for label in labels)
    figures["training s"] = training
    evaluations = [e for e in result.get(registry.EVALUATOR, [])
                   if 0 < e["total_time"] <= training]
    if registry.EVALUATOR in result:
        busy = sum(phases.get("pull", 0) + phases.get("evaluate", 0)
                   for e in evaluations for phases in e["time"].values())
        figures["evaluations"] = len(evaluations)
        figures["evaluator share"] = busy / training
        if evaluations:
            figures["ms/evaluation"] = 1e3 * busy / len(evaluations)
    return figures


def spread(values: Sequence[float], digits: int) -> str:
    if not values:
        return "-"
    return (f"{statistics.median(values):.{digits}f} "
            f"[{min(values):.{digits}f}-{max(values):.{digits}f}]")


def describe(length: str) -> str:
    return f"{length[:-1]} s" if length.endswith("s") else f"{length} rounds"


def report(mode: str, runs: Dict[str, List[Dict]], length: str, repeats: int) -> None:
    print(f"\n{mode}: 4 workers, slowdown {SLOWDOWNS}, {describe(length)}, lenet on "
          f"digits; median [min-max] of {repeats} interleaved runs")
    width = 22
    print(f"{'':<20}" + "".join(f"{config_title(c):>{width}}" for c in CONFIGS)
          + f"{'(b)/(a)':>{width}}{'(c)/(a)':>{width}}")
    rows = list(dict.fromkeys(row for cfg in CONFIGS for run in runs[cfg] for row in run))
    for row in rows:
        digits = 0 if row == "evaluations" else 3 if "share" in row else 2 \
            if row == "training s" else 1
        cells = [spread([run[row] for run in runs[cfg] if row in run], digits)
                 for cfg in CONFIGS]
        ratios = []
        for cfg in ("b", "c"):
            pairs = [(base[row], run[row]) for base, run in zip(runs["a"], runs[cfg])
                     if row in base and row in run and base[row]]
            ratios.append(spread([r / b for b, r in pairs], 3))
        print(f"{row:<20}" + "".join(f"{c:>{width}}" for c in cells + ratios))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of each (mode, configuration), interleaved (default 3)")
    parser.add_argument("--rounds", default="",
                        help="each job's length: N rounds (--max-rounds N) or Ns "
                             "seconds (--time-limit N), for every mode or MODE=...,... "
                             "(default "
                             f"{','.join(f'{m}={n}' for m, n in ROUNDS.items())}: 3 to 5 s "
                             "of training each on a 2-core machine)")
    parser.add_argument("--modes", default="sync,esync,async",
                        help="comma-separated, as registry keys: sync, esync, async, "
                             "dcasgd, ddp (default sync,esync,async)")
    parser.add_argument("--out",
                        help="base folder of the jobs' logs (default: a temp folder)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the jobs' logs (default: removed at the end)")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for mode in modes:
        algorithm = registry.ALGORITHMS.get(mode)
        if algorithm is None or not algorithm.distributed:
            parser.error(f"--modes: {mode!r} is not a distributed mode")
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    try:
        rounds = parse_rounds(args.rounds, modes, ROUNDS, "25")
    except ValueError as e:
        parser.error(f"--rounds {args.rounds!r}: {e}")
    made_base = args.out is None
    base = tempfile.mkdtemp(prefix="esync-evaluator-") if made_base else args.out
    job_dirs: List[str] = []
    runs = {mode: {cfg: [] for cfg in CONFIGS} for mode in modes}
    started = time.monotonic()
    total = args.repeats * len(modes) * len(CONFIGS)
    try:
        for rep in range(args.repeats):
            for mode in modes:
                for cfg in CONFIGS:
                    out = os.path.join(base, f"{mode}-{cfg}-{rep + 1}")
                    job_dirs.append(out)
                    argv = job_args(mode, cfg, rounds[mode], out)
                    plan = local.plan(argv)
                    labels = [plan.label(k) for k in range(plan.workers)]
                    fast = [plan.label(k) for k, f in enumerate(plan.slowdowns) if f == 1]
                    t0 = time.monotonic()
                    figures = measure(run_job(argv), labels, fast)
                    runs[mode][cfg].append(figures)
                    print(f"[{len(job_dirs)}/{total}] {mode} {config_title(cfg)} repeat "
                          f"{rep + 1}: {time.monotonic() - t0:.1f} s, training "
                          f"{figures['training s']:.2f} s", file=sys.stderr, flush=True)
    finally:
        if not args.keep:
            for folder in job_dirs:
                shutil.rmtree(folder, ignore_errors=True)
            if made_base:
                shutil.rmtree(base, ignore_errors=True)
    for mode in modes:
        report(mode, runs[mode], rounds[mode], args.repeats)
    print(f"\n{total} jobs in {time.monotonic() - started:.0f} s"
          + (f"; logs kept in {base}" if args.keep else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
