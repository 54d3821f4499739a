"""The comparison in one command: ESync against SSGD, ASGD, DC-ASGD, PyTorch DDP,
speed-balanced DDP (`-m ddp --balance-batches 1`) and standalone training, each job
repeated with several seeds, on plain loopback and with the slow devices on emulated
slow links; then medians, spreads, figures and tables.

    esync-experiment --out runs              (or: esync-experiment ...)
    esync-experiment --out runs/lm --metric loss --targets 1.8,1.65 \
        -n examples.charlm:build_model --dataset examples.charlm:build_data \
        --loss examples.charlm:loss_fn examples/charlm_esync.py --seconds 900

With a training script (the first argument ending in .py, and everything after it is
the script's, as for esync-run), every job runs that script as its workers through
the library API instead of main.py's loop; `-n` and `--dataset` then name the script's
model and data as plug-ins, for the evaluator. `--metric loss` measures a validation
loss (--targets are losses, lower is better).

Every job runs through esync/launch/local.py with the same network, data, heterogeneity
(--slowdown, default 1,1,4,4), batch size and time budget, and an evaluator that
measures every mode on one clock (DMLC_ROLE=evaluator; standalone training evaluates by
the same clock in-process, the clock paused meanwhile). A job ends once the evaluator has
seen the highest target held for --hold seconds, or at its --time-limit. Jobs go seed by
seed, configuration by configuration, mode by mode, so that a slow spell of the machine
falls on every mode alike. Job logs go to OUT/<config>/seed<k>/<network>/<log folder>/;
each is summarised (logs_tools.summary) after it ends, and at the end logs_tools.compare
writes OUT/results.md (printed), OUT/results.json and the figures
(accuracy-<config>.png, time_to_target-<config>.png, traffic-<config>.png). Each job's
wall-clock seconds go to OUT/job_seconds.json as it ends, so that an experiment run in
several goes (--skip-done) still says how long it took.

Configurations: `plain` (loopback, no pacing) and `links` (each worker's link from
--links-bandwidth and --links-latency, default: the two slow devices on 100 Mbit/s and
5 ms; standalone training has no link and is left out). Flags not listed here are
passed to every worker (e.g. -b, -ll, --max-local-steps). On a terminal, a bar counts
the jobs and a second one follows the running job (tqdm).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

from tqdm import tqdm

from esync import config
from esync import registry
from esync.data import METRIC_RECORD
from esync.errors import UserError, command_main
from esync.launch import local
from esync.launch.run import split as split_script
from esync.logs_tools import compare, summary

PROG = "esync-experiment"
PLAIN, LINKS = "plain", "links"
CONFIGS = (PLAIN, LINKS)
DEFAULT_MODES = ",".join(a.folder for a, split in registry.all_folders() if not split)


def jobs() -> Dict[str, List[str]]:
    """{log folder: its main.py flags} of every run the experiment knows, in order."""
    return {algorithm.log_folder(split): [*algorithm.flags, *(["-s", "1"] if split else [])]
            for algorithm, split in registry.all_folders()}


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run ESync, SSGD, ASGD, DC-ASGD, DDP, balanced DDP and standalone "
                    "training with several seeds, on loopback and on emulated slow links, "
                    "then write "
                    "medians, spreads and figures. Flags not listed here are passed to "
                    "every worker's main.py.")
    parser.add_argument("-n", "--network", default=config.NETWORK,
                        help=f"network (default {config.NETWORK})")
    parser.add_argument("--dataset", default=config.DATASET,
                        help=f"data set (default {config.DATASET})")
    parser.add_argument("--out", default=config.RUNS_DIR,
                        help=f"base folder (default {config.RUNS_DIR})")
    parser.add_argument("--workers", type=int, default=4, help="workers per job (default 4)")
    parser.add_argument("--servers", type=int, default=1, help="servers per job (default 1)")
    parser.add_argument("--backend", choices=registry.BACKENDS, default=config.BACKEND,
                        help=f"how the modes that can all-reduce ("
                             f"{', '.join(a.key for a in registry.ALGORITHMS.values() if a.all_reduce)}"
                             f") aggregate: ps or allreduce (main.py's --backend; the others "
                             f"stay on the servers; default {config.BACKEND})")
    parser.add_argument("--slowdown", default="1,1,4,4",
                        help="one factor per worker (default 1,1,4,4); the standalone run "
                             "uses the first")
    parser.add_argument("--modes", default=DEFAULT_MODES,
                        help=f"which runs, comma-separated log folders (default "
                             f"{DEFAULT_MODES}; add e.g. esync-niid for split-by-class data)")
    parser.add_argument("--configs", default=",".join(CONFIGS),
                        help=f"which configurations (default {','.join(CONFIGS)})")
    parser.add_argument("--seeds", type=_count, default=3,
                        help="runs of each job, with seeds 0..N-1 (default 3)")
    parser.add_argument("--only-seed", type=int, default=None, metavar="K",
                        help="run seed K of 0..N-1 alone (the tables count the other "
                             "seeds' jobs where they are done), so that a caller can "
                             "alternate experiments seed by seed")
    parser.add_argument("--metric", choices=METRIC_RECORD, default="accuracy",
                        help="what the evaluator measures: accuracy (higher is better) or "
                             "loss (the validation loss of --loss, lower is better; "
                             "default accuracy); passed to every job")
    parser.add_argument("--targets",
                        help="targets of the tables, comma-separated: accuracies (default "
                             + ",".join(f"{t:g}" for t in compare.DEFAULT_TARGETS) +
                             "), or with --metric loss validation losses (no default); "
                             "a job ends once the hardest has held for --hold seconds")
    parser.add_argument("--skip-done", action="store_true",
                        help="leave out the jobs that already have a summary in --out (an "
                             "interrupted experiment goes on where it stopped)")
    parser.add_argument("--hold", type=float, default=1.0,
                        help="a job ends once the highest target has held this many "
                             "seconds (default 1)")
    parser.add_argument("--time-limit", type=float, default=25.0,
                        help="most seconds of training per job (default 25)")
    parser.add_argument("--eval-interval", type=float, default=config.EVAL_INTERVAL,
                        help=f"seconds between the evaluator's evaluations (default "
                             f"{config.EVAL_INTERVAL:g})")
    parser.add_argument("--links-bandwidth", default="none,none,100,100",
                        help="the links configuration: Mbit/s per worker (default "
                             "none,none,100,100)")
    parser.add_argument("--links-latency", default="0,0,5,5",
                        help="the links configuration: ms per worker (default 0,0,5,5)")
    parser.add_argument("--auth", action="store_true",
                        help="give each job a job key (CurveZMQ) and a state server token, "
                             "as esync-launch does by default; off: the jobs run "
                             "unauthenticated, as DDP's gloo traffic does, so that every "
                             "algorithm moves its bytes in clear")
    return parser


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _job_args(args, folder: str, flags: List[str], cfg: str, seed: int,
              extra: Sequence[str]) -> List[str]:
    algorithm = registry.from_folder(folder)[0]
    slowdown = args.slowdown if algorithm.distributed else args.slowdown.split(",")[0]
    links = ["--bandwidth", args.links_bandwidth, "--latency", args.links_latency] \
        if cfg == LINKS else []
    servers = ["--backend", "allreduce"] if args.backend == "allreduce" and \
        algorithm.all_reduce else ["--servers", str(args.servers)]
    return [*flags, "--workers", str(args.workers), *servers,
            "--slowdown", slowdown, *links,
            "--out", os.path.join(args.out, cfg, f"seed{seed}"), "-n", args.network,
            "--dataset", args.dataset, "--time-limit", f"{args.time_limit:g}",
            "--seed", str(seed), "--metric", args.metric, *_target_flag(args),
            "--target-hold", f"{args.hold:g}", "--eval-interval", f"{args.eval_interval:g}",
            *([] if args.auth else ["--no-auth"]), *extra]


def _target_flag(args) -> List[str]:
    """The job's stop criterion: the hardest of the targets."""
    if args.metric == "loss":
        return ["--target-loss", f"{min(args.targets):g}"]
    return ["--target-accuracy", f"{max(args.targets):g}"]


def parse_targets(args) -> None:
    """args.targets (the parser's text) as numbers of args.metric, the easiest first
    (bench/mixed.py reads them as the jobs will); ValueError (one line) on bad input."""
    metric = METRIC_RECORD[args.metric]
    if args.targets is None:
        if metric != "accuracy":
            raise ValueError("--metric loss needs --targets (validation losses, e.g. 1.8,1.65)")
        args.targets = list(compare.DEFAULT_TARGETS)
        return
    try:
        args.targets = compare.parse_targets(args.targets, metric)
    except ValueError as e:
        raise ValueError(f"--targets: {e}") from None


def plan(args, extra: Sequence[str]) -> List[Tuple[str, str, int, List[str]]]:
    """(config, log folder, seed, launcher argv) of every job, in the order they run;
    ValueError (one line) on bad input."""
    if not isinstance(args.targets, list):
        parse_targets(args)
    known = jobs()
    chosen = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in known]
    if unknown or not chosen:
        raise ValueError(f"--modes: unknown {', '.join(unknown) or 'none'} "
                         f"(choose from {', '.join(known)})")
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if not configs or any(c not in CONFIGS for c in configs):
        raise ValueError(f"--configs {args.configs!r}: choose from {', '.join(CONFIGS)}")
    if not args.hold >= 0 or not args.time_limit > 0 or not args.eval_interval > 0:
        raise ValueError("--hold must be >= 0, --time-limit and --eval-interval > 0")
    if args.only_seed is not None and not 0 <= args.only_seed < args.seeds:
        raise ValueError(f"--only-seed {args.only_seed}: expected 0..{args.seeds - 1} "
                         f"(--seeds {args.seeds})")
    planned = []
    for seed in range(args.seeds) if args.only_seed is None else [args.only_seed]:
        for cfg in configs:
            for folder in chosen:
                if cfg == LINKS and not registry.from_folder(folder)[0].distributed:
                    continue  # training alone has no link to emulate
                planned.append((cfg, folder, seed,
                                _job_args(args, folder, known[folder], cfg, seed, extra)))
    return planned


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


def _script(argv: Sequence[str]) -> Tuple[List[str], List[str]]:
    """(the experiment's arguments, the training script and its arguments, or [])."""
    try:
        return split_script(argv)
    except UserError:
        return list(argv), []


#: OUT/JOB_SECONDS: {job: its wall-clock seconds, start-up and clean-up included}, the
#: jobs this experiment ran (over interrupted runs too: how long the whole took)
JOB_SECONDS = "job_seconds.json"


def record_job_seconds(out: str, job: str, seconds: float) -> None:
    """Add a job's wall-clock seconds to OUT/job_seconds.json (a bookkeeping file: one
    that cannot be read or written is started afresh or left, not an error)."""
    path = os.path.join(out, JOB_SECONDS)
    try:
        with open(path, encoding="utf-8") as f:
            known = json.load(f)
        if not isinstance(known, dict):
            known = {}
    except (OSError, ValueError):
        known = {}
    known[job] = round(seconds, 1)
    try:
        os.makedirs(out, exist_ok=True)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(known, f, indent=1, sort_keys=True)
        os.replace(path + ".tmp", path)
    except OSError:
        pass


def _done(base: str, name: str, folder: str) -> bool:
    """Whether a job's summary is already written (BASE/NAME/FOLDER/<Name>.json)."""
    return os.path.isfile(summary.output_path(base, name, folder))


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    """The `esync-experiment` command (see the module's docstring)."""
    return command_main(_main, argv, prog, PROG)


def _main(argv: List[str], prog: str) -> int:
    ours, script = _script(argv)
    args, extra = build_parser(prog).parse_known_args(ours)
    try:
        planned = plan(args, extra)
    except ValueError as e:
        raise UserError(str(e)) from None
    for *_, job_argv in planned:  # every job's flags, before anything starts
        # OUT/<network, or the script's name>/<log folder>
        name = os.path.basename(os.path.dirname(local.plan(job_argv, script=script).folder))
    failed = []
    start = time.monotonic()
    progress = _Jobs(len(planned))
    try:
        for i, (cfg, folder, seed, job_argv) in enumerate(planned, 1):
            base = os.path.join(args.out, cfg, f"seed{seed}")
            job = f"{cfg}/seed{seed}/{folder}"
            if args.skip_done and _done(base, name, folder):
                progress.say(f"experiment: job {i} of {len(planned)}: {job} done before")
                progress.done_one()
                continue
            progress.say(f"experiment: job {i} of {len(planned)}: {job}")
            began = time.monotonic()
            code = local.run(job_argv, position=1, nested=progress.bar is not None,
                             script=script)
            progress.done_one()
            record_job_seconds(args.out, job, time.monotonic() - began)
            if code == 130:
                progress.say("experiment: interrupted")
                return 130
            if code != 0:
                failed.append(job)
                continue
            try:
                out, result = summary.write_summary(base, name, folder)
                progress.say(summary.wrote_line(out, result), file=sys.stdout)
            except UserError as e:
                progress.say(f"{summary.PROG}: error: {e}")
            except OSError as e:
                progress.say(f"{summary.PROG}: error: cannot write: {e.strerror or e}")
    finally:
        progress.close()
    compared = True
    try:
        print(compare.compare(args.out, name, args.targets,
                              [c.strip() for c in args.configs.split(",") if c.strip()],
                              metric=METRIC_RECORD[args.metric]), end="")
    except UserError as e:
        print(f"{compare.PROG}: error: {e}", file=sys.stderr)
        compared = False
    minutes = (time.monotonic() - start) / 60
    print(f"experiment: {len(planned) - len(failed)} of {len(planned)} jobs done in "
          f"{minutes:.1f} min; tables and figures in {args.out}"
          + (f"; failed: {', '.join(failed)}" if failed else ""), file=sys.stderr)
    return 1 if failed or not compared else 0


def console_main() -> int:
    """The `esync-experiment` command."""
    return main()


if __name__ == "__main__":
    sys.exit(main())
