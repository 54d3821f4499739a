"""The paper's experiment in one command: ESync, SSGD, ASGD and DC-ASGD on IID and on
split-by-class data, plus one standalone run, with the same network, data,
heterogeneity and time budget; then the summaries, figures and speedup table.

    python launch/experiment.py -n lenet --dataset digits --time-limit 60 --out runs
                                                         (or: esync-experiment ...)

Jobs run one after the other on this machine through launch/local.py, into
OUT/<network>/<log folder>/ (the algorithms and their folders come from esync.registry:
esync, sync, async, dcasgd; the same with -niid for split-by-class data; local).
Every job's flags are checked before the first one starts. After each job its logs are
summarised (logs_tools.summary), and at the end the figures and the speedup table are
drawn into OUT/<network>/ (logs_tools.drawer), both in this process. Flags not listed
here are passed to every worker (e.g. -dd, -b, -ll). Each algorithm evaluates at its
own pace in rounds (its registry entry's `eval_every`: a round is one iteration in SSGD
and ASGD, a budget of iterations in ESync), chosen so that every curve has tens of
points; `-e N` sets one value for all. On a terminal, a bar counts the jobs and a second
one follows the running job (tqdm).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

from tqdm import tqdm

import config
from esync import registry
from launch import local
from logs_tools import drawer, summary

PROG = "launch/experiment.py"


def jobs() -> Dict[str, Tuple[List[str], int]]:
    """{log folder: (main.py flags, evaluate every N rounds)}, in the experiment's order."""
    return {algorithm.log_folder(split): ([*algorithm.flags, *(["-s", "1"] if split else [])],
                                          algorithm.eval_every)
            for algorithm, split in registry.all_folders()}


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run ESync, SSGD, ASGD, DC-ASGD (IID and split by class) and standalone "
                    "training with one time budget, then summarise and draw. Flags not "
                    "listed here are passed to every worker's main.py.")
    parser.add_argument("-n", "--network", default=config.NETWORK,
                        help=f"network (default {config.NETWORK})")
    parser.add_argument("--dataset", default=config.DATASET,
                        help=f"data set (default {config.DATASET})")
    parser.add_argument("--time-limit", type=float, default=60.0,
                        help="seconds of training per job (default 60)")
    parser.add_argument("--out", default=config.RUNS_DIR,
                        help=f"base folder (default {config.RUNS_DIR})")
    parser.add_argument("--workers", type=int, default=4, help="workers per job (default 4)")
    parser.add_argument("--servers", type=int, default=1, help="servers per job (default 1)")
    parser.add_argument("--slowdown", default="1,1,4,4",
                        help="one factor per worker (default 1,1,4,4); the standalone run "
                             "uses the first")
    parser.add_argument("--modes", default=",".join(jobs()),
                        help="which of the jobs to run, comma-separated (default: all)")
    parser.add_argument("--target", type=float, default=0.8,
                        help="accuracy for the time-to-accuracy table (default 0.8)")
    parser.add_argument("-e", "--eval-duration", type=int,
                        help="evaluate every N rounds in every mode (default: per mode)")
    return parser


def _job_args(args, folder: str, flags: List[str], eval_every: int,
              extra: Sequence[str]) -> List[str]:
    distributed = registry.from_folder(folder)[0].distributed
    slowdown = args.slowdown if distributed else args.slowdown.split(",")[0]
    return [*flags, "--workers", str(args.workers), "--servers", str(args.servers),
            "--slowdown", slowdown, "--out", args.out, "-n", args.network,
            "--dataset", args.dataset, "--time-limit", f"{args.time_limit:g}",
            "-e", str(args.eval_duration or eval_every), *extra]


class _Jobs:
    """The experiment's own output: a bar over the jobs on a terminal, else lines."""

    def __init__(self, total: int):
        self.bar = tqdm(total=total, desc="experiment", unit="job", file=sys.stderr,
                        position=0, dynamic_ncols=True,
                        bar_format="{desc}: {n}/{total} jobs |{bar:20}| {elapsed}") \
            if sys.stderr.isatty() else None

    def say(self, line: str, file=None) -> None:
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, file=file or sys.stderr, flush=True)

    def done_one(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def main(argv: Optional[Sequence[str]] = None, prog: str = PROG) -> int:
    args, extra = build_parser(prog).parse_known_args(sys.argv[1:] if argv is None else argv)
    known = jobs()
    chosen = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in known]
    if unknown or not chosen:
        print(f"{prog}: error: --modes: unknown {', '.join(unknown) or 'none'} "
              f"(choose from {', '.join(known)})", file=sys.stderr)
        return 2
    argvs = {folder: _job_args(args, folder, *known[folder], extra) for folder in chosen}
    try:
        for job_argv in argvs.values():  # every job's flags, before anything starts
            local.plan(job_argv)
    except local.LaunchError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    failed = []
    start = time.monotonic()
    progress = _Jobs(len(chosen))
    try:
        for i, folder in enumerate(chosen, 1):
            progress.say(f"experiment: job {i} of {len(chosen)}: {folder}")
            code = local.run(argvs[folder], position=1, nested=progress.bar is not None)
            progress.done_one()
            if code == 130:
                progress.say("experiment: interrupted")
                return 130
            if code != 0:
                failed.append(folder)
                continue
            try:
                out, result = summary.write_summary(args.out, args.network, folder)
                progress.say(summary.wrote_line(out, result), file=sys.stdout)
            except summary.SummaryError as e:
                progress.say(f"{summary.PROG}: error: {e}")
            except OSError as e:
                progress.say(f"{summary.PROG}: error: cannot write: {e.strerror or e}")
    finally:
        progress.close()
    drawn = True
    try:
        print(drawer.draw(args.out, args.network, target=args.target), end="")
    except drawer.DrawError as e:
        print(f"{drawer.PROG}: error: {e}", file=sys.stderr)
        drawn = False
    minutes = (time.monotonic() - start) / 60
    print(f"experiment: {len(chosen) - len(failed)} of {len(chosen)} jobs done in "
          f"{minutes:.1f} min; figures and speedup table in "
          f"{os.path.join(args.out, args.network)}"
          + (f"; failed: {', '.join(failed)}" if failed else ""), file=sys.stderr)
    return 1 if failed or not drawn else 0


def console_main() -> int:
    """The `esync-experiment` command."""
    return main(prog="esync-experiment")


if __name__ == "__main__":
    sys.exit(main())
