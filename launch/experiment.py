"""The paper's experiment in one command: ESync, SSGD, ASGD and DC-ASGD on IID and on
split-by-class data, plus one standalone run, with the same network, data,
heterogeneity and time budget; then logs_tools/summary.py and drawer.py.

    python launch/experiment.py -n lenet --dataset digits --time-limit 60 --out runs

Jobs run one after the other on this machine through launch/local.py, into
OUT/<network>/<mode folder>/ (esync, sync, async, dcasgd; the same with -niid for
split-by-class data; local). Figures and the speedup table land in OUT/<network>/.
Flags not listed here are passed to every worker (e.g. -dd, -b, -ll). Each mode
evaluates at its own pace in rounds (a round is one iteration in SSGD and ASGD, a
budget of iterations in ESync), chosen so that every curve has tens of points; `-e N`
sets one value for all.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from typing import List, Optional, Sequence, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from launch import local  # noqa: E402  (after the path set-up, for `python launch/...`)

#: (mode folder, main.py flags, evaluate every N rounds)
JOBS: List[Tuple[str, List[str], int]] = [
    ("esync", ["-m", "esync"], 3),
    ("sync", ["-m", "sync"], 6),
    ("async", ["-m", "async"], 25),
    ("dcasgd", ["-m", "async", "-dcasgd", "1"], 25),
    ("esync-niid", ["-m", "esync", "-s", "1"], 3),
    ("sync-niid", ["-m", "sync", "-s", "1"], 6),
    ("async-niid", ["-m", "async", "-s", "1"], 25),
    ("dcasgd-niid", ["-m", "async", "-dcasgd", "1", "-s", "1"], 25),
    ("local", ["-m", "local"], 25),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="launch/experiment.py",
        description="Run ESync, SSGD, ASGD, DC-ASGD (IID and split by class) and standalone "
                    "training with one time budget, then summarise and draw. Flags not "
                    "listed here are passed to every worker's main.py.")
    parser.add_argument("-n", "--network", default="lenet", help="network (default lenet)")
    parser.add_argument("--dataset", default="digits", help="data set (default digits)")
    parser.add_argument("--time-limit", type=float, default=60.0,
                        help="seconds of training per job (default 60)")
    parser.add_argument("--out", default="runs", help="base folder (default runs)")
    parser.add_argument("--workers", type=int, default=4, help="workers per job (default 4)")
    parser.add_argument("--servers", type=int, default=1, help="servers per job (default 1)")
    parser.add_argument("--slowdown", default="1,1,4,4",
                        help="one factor per worker (default 1,1,4,4); the standalone run "
                             "uses the first")
    parser.add_argument("--modes", default=",".join(job[0] for job in JOBS),
                        help="which of the jobs to run, comma-separated (default: all)")
    parser.add_argument("--target", type=float, default=0.8,
                        help="accuracy for the time-to-accuracy table (default 0.8)")
    parser.add_argument("-e", "--eval-duration", type=int,
                        help="evaluate every N rounds in every mode (default: per mode)")
    return parser


def _job_args(args, folder: str, flags: List[str], eval_every: int,
              extra: Sequence[str]) -> List[str]:
    slowdown = args.slowdown.split(",")[0] if folder == "local" else args.slowdown
    return [*flags, "--workers", str(args.workers), "--servers", str(args.servers),
            "--slowdown", slowdown, "--out", args.out, "-n", args.network,
            "--dataset", args.dataset, "--time-limit", f"{args.time_limit:g}",
            "-e", str(args.eval_duration or eval_every), *extra]


def _tool(script: str, args: List[str]) -> int:
    return subprocess.call([sys.executable, os.path.join(REPO, "logs_tools", script), *args],
                           cwd=REPO)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args, extra = build_parser().parse_known_args(sys.argv[1:] if argv is None else argv)
    known = {job[0]: job for job in JOBS}
    chosen = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in known]
    if unknown or not chosen:
        print(f"launch/experiment.py: error: --modes: unknown {', '.join(unknown) or 'none'} "
              f"(choose from {', '.join(known)})", file=sys.stderr)
        return 2
    failed = []
    start = time.monotonic()
    for i, folder in enumerate(chosen, 1):
        _, flags, eval_every = known[folder]
        print(f"experiment: job {i} of {len(chosen)}: {folder}", file=sys.stderr, flush=True)
        try:
            code = local.run(_job_args(args, folder, flags, eval_every, extra))
        except local.LaunchError as e:
            print(f"launch/experiment.py: error: {e}", file=sys.stderr)
            return 2
        if code == 130:
            print("experiment: interrupted", file=sys.stderr)
            return 130
        if code != 0:
            failed.append(folder)
            continue
        _tool("summary.py", ["-b", args.out, "-n", args.network, "-m", folder])
    drawn = _tool("drawer.py", ["-b", args.out, "-n", args.network, "--target",
                                f"{args.target:g}"])
    minutes = (time.monotonic() - start) / 60
    print(f"experiment: {len(chosen) - len(failed)} of {len(chosen)} jobs done in "
          f"{minutes:.1f} min; figures and speedup table in "
          f"{os.path.join(args.out, args.network)}"
          + (f"; failed: {', '.join(failed)}" if failed else ""), file=sys.stderr)
    return 1 if failed or drawn != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
