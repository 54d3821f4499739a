"""How much of their time fast devices spend computing, under ESync and under SSGD.

Runs one job per mode on this machine through esync/launch/local.py, each with a scheduler,
one server (and for ESync the state server) and four workers: two fast (`--slowdown 1`) and two four times slower
(`--slowdown 4`), all training lenet on digits for the same time. From the workers'
iteration logs, read by esync/logs_tools/summary.py, it prints each device's computing-time share: the seconds spent in
local iterations (get_batch, forward and backward, local update, and the simulated
slowdown) over the wall-clock time of training. The rest is waiting: at the aggregation
(`global aggregate` / `global update`, which includes waiting for slower devices), for
the state server, and for worker 0's evaluations. It also prints each device's time per
local iteration under ESync (slowdown included) and the budgets ESync gave.

    python bench/esync_shares.py [--time-limit 60] [--slowdowns 1,1,4,4] [--keep DIR]
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from typing import Dict, List

from esync import registry
from esync.launch import local  # the jobs run through the launcher
from esync.logs_tools.summary import summarize  # and are read by summary.py


def job_args(mode: str, slowdowns: List[float], args, base: str) -> List[str]:
    return ["-m", mode, "--workers", str(len(slowdowns)), "--servers", "1",
            "--slowdown", ",".join(f"{f:g}" for f in slowdowns), "--out", base,
            "--no-progress", "--time-limit", str(args.time_limit),
            "-e", str(args.eval_duration), "-b", str(args.batch_size), "--num-threads", "1"]


def run_job(mode: str, slowdowns: List[float], args, base: str) -> Dict[str, dict]:
    """One job through esync/launch/local.py; each device's summary record, by device label."""
    if local.run(job_args(mode, slowdowns, args, base), progress=False) != 0:
        raise RuntimeError(f"the {mode} job failed; see {base}")
    records = summarize(base, "lenet", registry.resolve(mode).log_folder())
    return {device: record for host in records.values() for device, record in host.items()}


def computing_share(record: dict) -> float:
    return sum(record["compute_time_list"]) / record["elapsed_time_list"][-1]


def time_per_iteration(record: dict) -> float:
    return sum(record["compute_time_list"]) / sum(record["self_iters_list"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--time-limit", type=float, default=60.0,
                        help="seconds of training per job (default: 60)")
    parser.add_argument("--slowdowns", default="1,1,4,4",
                        help="one --slowdown per worker (default: 1,1,4,4)")
    parser.add_argument("--eval-duration", type=int, default=10,
                        help="worker 0 evaluates every N rounds (default: 10)")
    parser.add_argument("--batch-size", type=int, default=64, help="(default: 64)")
    parser.add_argument("--keep", help="keep the jobs' logs in this folder")
    args = parser.parse_args()
    slowdowns = [float(s) for s in args.slowdowns.split(",")]
    base = args.keep or tempfile.mkdtemp(prefix="esync-shares-")
    try:
        results = {mode: run_job(mode, slowdowns, args, base) for mode in ("sync", "esync")}
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    print(f"{len(slowdowns)} workers, slowdowns {args.slowdowns}, {args.time_limit:g} s each, "
          f"lenet on digits, batch {args.batch_size}")
    budgets_title = "esync budget (median from round 5)"
    print(f"{'device':<10} {'sync share':>11} {'esync share':>12} {'ms/iteration':>13} "
          f"{budgets_title:>36}")
    labels = local.plan(job_args("esync", slowdowns, args, base)).label
    fast = {labels(k) for k, f in enumerate(slowdowns) if f == min(slowdowns)}
    summary = {"sync": [], "esync": []}
    for device, record in results["esync"].items():
        shares = {mode: computing_share(results[mode][device]) for mode in results}
        budgets = record["self_iters_list"][4:] or [1]  # a round's iterations: its budget
        print(f"{device:<10} {shares['sync']:>11.2f} {shares['esync']:>12.2f} "
              f"{1000 * time_per_iteration(record):>13.1f} "
              f"{statistics.median(budgets):>36g}")
        if device in fast:
            for mode in summary:
                summary[mode].append(shares[mode])
    print(f"fast devices' mean computing share: sync {statistics.mean(summary['sync']):.2f}, "
          f"esync {statistics.mean(summary['esync']):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
