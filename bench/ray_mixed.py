"""GPU and CPU workers in one job on Ray: time to target accuracy and each device's pace.

    python bench/ray_mixed.py [--ray ADDRESS] [--devices gpu,cpu,cpu,cpu] [--repeats 3]
                              [--time-limit 40] [--targets 0.9,0.95] [--out DIR]
                              [main.py flags ...]

Needs Ray (pip install -e '.[ray]') and, for its point, a GPU. Runs, through
`esync-launch --ray` (esync/launch/onray.py), each configuration --repeats times, the
configurations interleaved repeat by repeat so that a slow spell falls on all alike:

    esync-mixed   -m esync with --devices (default gpu,cpu,cpu,cpu)
    sync-mixed    -m sync with the same devices (SSGD: every round waits for the slowest)
    esync-cpu     -m esync with every worker on the CPU (the baseline: the same job
                  without a GPU)

and prints, per configuration: time to each target (compare.time_stats: `median
[min-max]`, `(k/n)` where only k of n repeats reached it), its time over esync-cpu's at
the last target repeat by repeat (compare.speedup), final accuracy, and per device the
median of its local iterations per second (drawer.throughput's samples/s over the batch
size) and of its local iterations per round. Every job: lenet on digits unless the
flags say otherwise, --time-limit, --num-threads 2 (unless given), its own folder
under --out (default: a new temporary folder, named on stderr). One Ray connection (or
local instance) serves every job.
"""
from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
from typing import Dict, List, Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import ray  # noqa: E402

from esync.launch import local, onray  # noqa: E402
from esync.logs_tools import compare, drawer, summary  # noqa: E402

CONFIGS = ("esync-mixed", "sync-mixed", "esync-cpu")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ray", default="", help="the Ray address (default: RAY_ADDRESS, "
                                                  "else a local instance per job)")
    parser.add_argument("--devices", default="gpu,cpu,cpu,cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--time-limit", type=float, default=40.0)
    parser.add_argument("--targets", default="0.9,0.95")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--out", default=None, help="keep the logs here (default: a "
                                                    "new temporary folder, named on stderr)")
    return parser


def job_argv(config: str, devices: str, args, extra: Sequence[str], out: str) -> List[str]:
    mode, kind = config.split("-")
    workers = len(devices.split(","))
    argv = ["--ray", *([args.ray] if args.ray else []), "-m", mode, "--workers",
            str(workers), "--devices", devices if kind == "mixed" else "cpu", "--out", out,
            "--no-progress", "--time-limit", f"{args.time_limit:g}", *extra]
    if "--num-threads" not in extra:
        argv += ["--num-threads", "2"]
    if "-n" not in extra and "--network" not in extra:
        argv += ["-n", "lenet"]
    return argv


def run_job(argv: List[str]) -> dict:
    said = io.StringIO()
    code = local.run(argv, progress=False, out=said)
    if code != 0:
        lines = [line for line in said.getvalue().splitlines() if line.strip()]
        raise RuntimeError(lines[-1] if lines else f"exit status {code}")
    folder = local.plan(argv).folder
    network = os.path.basename(os.path.dirname(folder))
    base = os.path.dirname(os.path.dirname(folder))
    _, result = summary.write_summary(base, network, os.path.basename(folder),
                                      warn=lambda line: print(line, file=sys.stderr))
    return result


def pace(result: dict, batch: int) -> Dict[str, tuple]:
    """Per worker device: (local iterations per second, local iterations per round)."""
    out = {}
    for host, devices in result.items():
        for device, d in devices.items():
            if device == "evaluator" or not d["self_iters_list"]:
                continue
            rate = drawer.throughput({host: {device: d}})
            out[device] = (rate / batch if rate else None,
                           statistics.median(d["self_iters_list"]))
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    args, extra = build_parser().parse_known_args(argv)
    configs = [c for c in args.configs.split(",") if c]
    targets = [float(t) for t in args.targets.split(",")]
    base = args.out or tempfile.mkdtemp(prefix="esync-ray-mixed-")
    print(f"# logs in {base}", file=sys.stderr)
    results: Dict[str, Dict[int, dict]] = {c: {} for c in configs}
    # one connection (or local instance) for every job: starting and stopping a local
    # Ray instance per job in one process is not reliable
    onray.connect(local.plan(job_argv(configs[0], args.devices, args, extra, base)))
    try:
        for k in range(args.repeats):  # the table so far after each repeat
            run_repeat(k, args, configs, extra, base, results)
            report(args, configs, targets, extra, base, results)
            sys.stdout.flush()
    finally:
        ray.shutdown()
    return 0


def run_repeat(k: int, args, configs, extra, base, results) -> None:
    for config in configs:
        argv_k = job_argv(config, args.devices, args, [*extra, "--seed", str(k)],
                          os.path.join(base, config, f"run{k}"))
        try:
            results[config][k] = run_job(argv_k)
            print(f"{config} run {k}: done", file=sys.stderr)
        except RuntimeError as e:
            print(f"{config} run {k}: failed: {e}", file=sys.stderr)


def report(args, configs, targets, extra, base, results) -> None:
    batch = local.plan(job_argv(configs[0], args.devices, args, extra, base)).options.batch_size
    done = max(len(r) for r in results.values())
    print(f"# {done} of {args.repeats} repeat(s), devices {args.devices}, --time-limit "
          f"{args.time_limit:g}; time to target (s): median [min-max]")
    reference = results.get("esync-cpu", {})
    for config in configs:
        runs = results[config]
        if not runs:
            print(f"{config}: no run finished")
            continue
        times = "; ".join(f"{t:g}: {compare.time_cell(compare.time_to_target(runs, t))}"
                          for t in targets)
        ratio = "-" if config == "esync-cpu" else compare.spread_cell(
            compare.speedup(runs, reference, targets[-1]), ".2f", "x")
        final = compare.spread_cell(compare.spread(
            [compare.final_accuracy(s) for s in runs.values()]), ".4f")
        print(f"{config}: {times}; time over esync-cpu's at {targets[-1]:g}: {ratio}; "
              f"final accuracy {final}")
        per = [pace(s, batch) for s in runs.values()]
        for device in sorted({d for p in per for d in p}):
            rates = [p[device][0] for p in per if device in p and p[device][0]]
            iters = [p[device][1] for p in per if device in p]
            print(f"    {device}: {statistics.median(rates):.1f} it/s, "
                  f"{statistics.median(iters):g} it/round" if rates else f"    {device}: -")


if __name__ == "__main__":
    sys.exit(main())
