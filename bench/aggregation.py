"""Time to target accuracy and final accuracy of whole jobs, by aggregation backend,
compression and ESync's aggregation options.

    python bench/aggregation.py [--part backends,options,codecs] [--rows NAME,...] [--seeds 3]
                                [--configs plain,links] [--quick] [--out DIR]
                                [--options-backend ps|allreduce] [main.py flags ...]

Prints, per part and configuration, one row per configuration of the jobs: time to
each target (s), the row's time over its baseline's, final accuracy, bytes sent and
received per worker per round, bytes sent per sample trained, samples/s (progress, one
line per job, on stderr).

Every job is lenet on digits with the experiment's settings (esync/launch/experiment.py's
defaults: 4 workers, --slowdown 1,1,4,4, --time-limit 25, --target-accuracy 0.97 held
--target-hold 1 s, the evaluator every --eval-interval s, --no-auth), run through
esync/launch/local.py into its own --out folder, OUT/<part>/<config>/<row>/seed<k>/, with
`--seed k`.

backends: `-m sync` and `-m esync`, each with
    ps (the baseline of its mode), allreduce, ps --compress fp16, ps --compress
    topk:0.01, allreduce --compress fp16.
options: `-m esync` on IID data, plain (the baseline) and --outer-momentum 0.9 (with
    -gl 1, and with -gl 0.1: the plain average's step size); on non-IID data (-s 1,
    split by class), plain (the baseline), --average normalized, and --outer-momentum
    0.9 (both -gl) (through --options-backend, default ps).
codecs: SINGA's ways of synchronising (esync.comm.compress), `-m sync` and `-m esync`, each
    with ps and allreduce uncompressed (the baselines of their backend) and, on both
    backends, --compress partial:4, topk:0.01, threshold:T (T = 0.05 for SSGD's
    pushed gradients, 0.01 for ESync's deltas: THRESHOLDS) and threshold:auto:0.01.

Configurations (--configs): `plain` (loopback) and `links` (the experiment's slow-link
configuration: the launcher's --bandwidth none,none,100,100 --latency 0,0,5,5, i.e. the
two slow workers on 100 Mbit/s and 5 ms; --links-bandwidth / --links-latency).

Jobs go seed by seed, configuration by configuration, row by row, so that a slow spell
of the machine falls on every row alike. Each job's iteration logs are read by
esync/logs_tools/summary.py (its summary JSON is written beside them), and measured with
logs_tools' functions: time to each target (drawer.time_to_target on the evaluator's
accuracy; compare.time_stats's censored median over the seeds: `median [min-max]`,
`(k/n)` where only k of n seeds reached it, `n/r`: not reached), the row's time over its
baseline's at the middle target, seed by seed (compare.speedup), final accuracy
(compare.final_accuracy), samples/s (drawer.throughput). Bytes per sample: all the
workers' bytes_sent over all their num_samples. Bytes per worker per round:
each worker's bytes_sent and bytes_received of its iteration records, summed over its
rounds and divided by them, the mean over the workers (with --backend allreduce these
are the ring all-reduce's estimate, 2(W-1)/W x the reduced bytes each way; gloo counts
nothing). A job that fails is reported (its launcher's last line) and left out; the
exit status is then 1.

Flags not listed here are passed to every job's main.py (e.g. -b 32); --quick is
--seeds 1 --time-limit 10 (unless those are given).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from esync.launch import experiment, local  # the experiment's settings; jobs run through the launcher
from esync.logs_tools import compare, drawer, summary  # and are read by the log tools
from esync import registry

PROG = "aggregation.py"
PARTS = ("backends", "options", "codecs")
#: threshold:T of the codecs part, by mode: what SSGD pushes is a gradient, what ESync
#: pushes a delta of its local steps (lr times gradients), about ten times smaller
THRESHOLDS = {"sync": 0.05, "esync": 0.01}
PLAIN, LINKS = experiment.PLAIN, experiment.LINKS
QUICK_SEEDS, QUICK_TIME_LIMIT = 1, 10.0
_ITER = re.compile(r"iter-([0-9]+)\.json")


@dataclass(frozen=True)
class Row:
    """One configuration of a part: its name (also its folder), main.py's flags, and
    the row whose times it is divided by (None: it is a baseline)."""

    name: str
    flags: Tuple[str, ...]
    baseline: Optional[str]

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9.]+", "-", self.name).strip("-")

    @property
    def all_reduce(self) -> bool:
        return "allreduce" in self.flags


def backend_rows() -> List[Row]:
    rows = []
    for mode in ("sync", "esync"):
        base = f"{mode} ps"
        for name, flags in ((base, ("--backend", "ps")),
                            (f"{mode} allreduce", ("--backend", "allreduce")),
                            (f"{mode} ps fp16", ("--backend", "ps", "--compress", "fp16")),
                            (f"{mode} ps topk:0.01", ("--backend", "ps", "--compress",
                                                      "topk:0.01")),
                            (f"{mode} allreduce fp16", ("--backend", "allreduce",
                                                        "--compress", "fp16"))):
            rows.append(Row(name, ("-m", mode, *flags), None if name == base else base))
    return rows


def codec_rows() -> List[Row]:
    rows = []
    for mode in ("sync", "esync"):
        for backend in ("ps", "allreduce"):
            base = f"{mode} {backend}"
            rows.append(Row(base, ("-m", mode, "--backend", backend), None))
            for codec in ("partial:4", "topk:0.01", f"threshold:{THRESHOLDS[mode]:g}",
                          "threshold:auto:0.01"):
                rows.append(Row(f"{base} {codec}", ("-m", mode, "--backend", backend,
                                                   "--compress", codec), base))
    return rows


def option_rows(backend: str) -> List[Row]:
    # the paper's plain average, against which the options were measured
    esync = ("-m", "esync", "--backend", backend, "--average", "mean")
    niid = (*esync, "-s", "1")
    # momentum M multiplies the outer step by about 1/(1-M): -gl 0.1 with M 0.9 takes
    # the plain average's step size (-gl 1), -gl 1 ten times it
    momentum = ("--outer-momentum", "0.9")
    return [Row("esync iid", esync, None),
            Row("esync iid outer-momentum 0.9", (*esync, *momentum), "esync iid"),
            Row("esync iid outer-momentum 0.9 -gl 0.1", (*esync, *momentum, "-gl", "0.1"),
                "esync iid"),
            Row("esync niid", niid, None),
            Row("esync niid normalized", (*niid, "--average", "normalized"),
                "esync niid"),
            Row("esync niid outer-momentum 0.9", (*niid, *momentum), "esync niid"),
            Row("esync niid outer-momentum 0.9 -gl 0.1", (*niid, *momentum, "-gl", "0.1"),
                "esync niid")]


# --- the command line -----------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """Bad input: one line, exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{PROG}: error: {message}\n")


def _experiment_default(dest: str):
    return experiment.build_parser().get_default(dest)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, allow_abbrev=False,
                     description=__doc__.split("\n\n")[0],
                     epilog="Flags not listed here are passed to every job's main.py. See "
                            "the module docstring for the rows and how they are measured.")
    parser.add_argument("--part", default=",".join(PARTS),
                        help=f"which sets of rows, comma-separated: {', '.join(PARTS)} "
                             f"(default all)")
    parser.add_argument("--configs", default=PLAIN,
                        help=f"{PLAIN} (loopback) and/or {LINKS} (the slow devices on "
                             f"emulated slow links), comma-separated (default {PLAIN})")
    parser.add_argument("--seeds", type=int, default=None,
                        help="runs of each row, with seeds 0..N-1 (default 3)")
    parser.add_argument("--quick", action="store_true",
                        help=f"a check that the jobs run: --seeds {QUICK_SEEDS} "
                             f"--time-limit {QUICK_TIME_LIMIT:g} unless given")
    parser.add_argument("--rows", default="",
                        help="only these rows, comma-separated, by name or folder "
                             "(e.g. 'sync ps,sync-allreduce'; default all of each part)")
    parser.add_argument("--options-backend", default="ps", choices=registry.BACKENDS,
                        help="options: the backend of the ESync rows (default ps)")
    parser.add_argument("-n", "--network", default=_experiment_default("network"),
                        help="network (default: the experiment's, %(default)s)")
    parser.add_argument("--dataset", default=_experiment_default("dataset"),
                        help="data set (default: the experiment's, %(default)s)")
    parser.add_argument("--workers", type=int, default=_experiment_default("workers"),
                        help="workers per job (default: the experiment's, %(default)s)")
    parser.add_argument("--slowdown", default=_experiment_default("slowdown"),
                        help="one factor per worker (default: the experiment's, "
                             "%(default)s)")
    parser.add_argument("--targets", default=",".join(
                            f"{t:g}" for t in compare.DEFAULT_TARGETS),
                        help="accuracy targets, comma-separated; a job ends once the "
                             "highest has held --hold s (default: the experiment's, "
                             "%(default)s)")
    parser.add_argument("--hold", type=float, default=_experiment_default("hold"),
                        help="seconds the highest target must hold (default: the "
                             "experiment's, %(default)s)")
    parser.add_argument("--time-limit", type=float, default=None,
                        help=f"most seconds of training per job (default: the "
                             f"experiment's, {_experiment_default('time_limit'):g})")
    parser.add_argument("--eval-interval", type=float,
                        default=_experiment_default("eval_interval"),
                        help="seconds between the evaluator's evaluations (default: the "
                             "experiment's, %(default)s)")
    parser.add_argument("--links-bandwidth", default=_experiment_default("links_bandwidth"),
                        help="links: Mbit/s per worker (default: the experiment's, "
                             "%(default)s)")
    parser.add_argument("--links-latency", default=_experiment_default("links_latency"),
                        help="links: ms per worker (default: the experiment's, "
                             "%(default)s)")
    parser.add_argument("--out", help="base folder of the jobs' logs, kept (default: a "
                                      "temp folder, removed at the end)")
    return parser


@dataclass
class Job:
    part: str
    config: str
    row: Row
    seed: int
    out: str
    argv: List[str]


def _choices(flag: str, text: str, known: Sequence[str]) -> List[str]:
    chosen = list(dict.fromkeys(c.strip() for c in text.split(",") if c.strip()))
    if not chosen or any(c not in known for c in chosen):
        raise ValueError(f"{flag} {text!r}: choose from {', '.join(known)}")
    return chosen


def job_argv(args, row: Row, config: str, seed: int, out: str, target: float,
             extra: Sequence[str]) -> List[str]:
    links = ["--bandwidth", args.links_bandwidth, "--latency", args.links_latency] \
        if config == LINKS else []
    return [*row.flags, "--workers", str(args.workers),
            *([] if row.all_reduce else ["--servers", "1"]),
            "--slowdown", args.slowdown, *links, "--out", out, "-n", args.network,
            "--dataset", args.dataset, "--time-limit", f"{args.time_limit:g}",
            "--seed", str(seed), "--target-accuracy", f"{target:g}",
            "--target-hold", f"{args.hold:g}", "--eval-interval", f"{args.eval_interval:g}",
            "--no-auth", "--no-progress", *extra]


def plan(args, extra: Sequence[str], base: str) -> Tuple[List[Job], Dict[str, List[Row]],
                                                          List[float]]:
    """Every job in the order they run, the rows of each part, the targets; ValueError
    (one line) on bad input, before anything starts."""
    parts = _choices("--part", args.part, PARTS)
    configs = _choices("--configs", args.configs, (PLAIN, LINKS))
    if args.seeds is None:
        args.seeds = QUICK_SEEDS if args.quick else 3
    if args.time_limit is None:
        args.time_limit = QUICK_TIME_LIMIT if args.quick else \
            _experiment_default("time_limit")
    if args.seeds < 1:
        raise ValueError(f"--seeds {args.seeds}: expected at least 1")
    if not 0 < args.time_limit < float("inf") or not args.hold >= 0 \
            or not 0 < args.eval_interval < float("inf"):
        raise ValueError("--time-limit and --eval-interval must be > 0, --hold >= 0")
    targets = compare.parse_targets(args.targets)
    rows = {"backends": backend_rows(), "options": option_rows(args.options_backend),
            "codecs": codec_rows()}
    rows = {part: rows[part] for part in parts}
    wanted = [r.strip() for r in args.rows.split(",") if r.strip()]
    if wanted:
        known = [r for part in parts for r in rows[part]]
        unknown = [w for w in wanted if not any(w in (r.name, r.slug) for r in known)]
        if unknown:
            raise ValueError(f"--rows: unknown {', '.join(map(repr, unknown))} (choose "
                             f"from {', '.join(r.name for r in known)})")
        rows = {part: [r for r in rs if r.name in wanted or r.slug in wanted]
                for part, rs in rows.items()}
        rows = {part: rs for part, rs in rows.items() if rs}
        parts = list(rows)
    jobs = []
    for seed in range(args.seeds):
        for config in configs:
            for part in parts:
                for row in rows[part]:
                    out = os.path.join(base, part, config, row.slug, f"seed{seed}")
                    argv = job_argv(args, row, config, seed, out, max(targets), extra)
                    jobs.append(Job(part, config, row, seed, out, argv))
    for job in jobs:  # every job's flags, checked by the launcher and main.py
        try:
            folder = local.plan(job.argv).folder
        except local.LaunchError as e:
            raise ValueError(f"{job.row.name} ({job.config}): {e}") from None
        if os.path.exists(folder):  # its logs would mix with an earlier run's
            raise ValueError(f"{folder} exists (an earlier run's logs): choose another "
                             f"--out")
    return jobs, rows, targets


# --- one job ----------------------------------------------------------------------------
class Traffic(NamedTuple):
    sent: Optional[float]        # bytes sent per worker per round
    received: Optional[float]    # bytes received per worker per round
    per_sample: Optional[float]  # bytes sent per sample trained, all workers together


def traffic_per_round(folder: str) -> Traffic:
    """Bytes sent and received per worker per round: each worker's sums over its
    iteration records divided by its rounds, the mean over the workers (the evaluator
    left out); and bytes sent per sample trained, of all workers together (sent only:
    logs_tools.compare.bytes_per_sample counts both ways, and pulls are never
    compressed); None where no record could be read."""
    sent, received, all_sent, samples = [], [], 0, 0
    for host in os.scandir(folder):
        if not host.is_dir():
            continue
        for device in os.scandir(host.path):
            if not device.is_dir() or drawer.is_evaluator(device.name):
                continue
            totals, rounds = [0, 0], 0
            for entry in os.scandir(device.path):
                if not _ITER.fullmatch(entry.name):
                    continue
                try:
                    with open(entry.path) as f:
                        record = json.load(f)
                    totals[0] += record["bytes_sent"]
                    totals[1] += record["bytes_received"]
                    samples += record.get("num_samples") or 0
                except (OSError, ValueError, KeyError, TypeError):
                    continue  # summary.py reports broken files
                rounds += 1
            if rounds:
                sent.append(totals[0] / rounds)
                received.append(totals[1] / rounds)
                all_sent += totals[0]
    if not sent:
        return Traffic(None, None, None)
    return Traffic(statistics.mean(sent), statistics.mean(received),
                   all_sent / samples if samples else None)


def run_job(job: Job) -> dict:
    """Run one job through esync/launch/local.py and measure it: {"summary", "sent",
    "received"}; RuntimeError (the launcher's last line) if it failed."""
    said = io.StringIO()
    code = local.run(job.argv, progress=False, out=said)
    if code == 130:
        raise KeyboardInterrupt
    if code != 0:
        lines = [line for line in said.getvalue().splitlines() if line.strip()]
        raise RuntimeError(lines[-1] if lines else f"exit status {code}")
    folder = local.plan(job.argv).folder
    network = os.path.basename(os.path.dirname(folder))
    base = os.path.dirname(os.path.dirname(folder))
    notes: List[str] = []
    try:
        _, result = summary.write_summary(base, network, os.path.basename(folder),
                                          warn=notes.append)
    except OSError:  # could not write it beside the logs: measure it anyway
        result = summary.summarize(base, network, os.path.basename(folder), warn=notes.append)
    for line in notes:
        print(line, file=sys.stderr)
    return {"summary": result, **traffic_per_round(folder)._asdict()}


# --- the table ----------------------------------------------------------------------------
def size(n: Optional[float]) -> str:
    if n is None:
        return "n/a"
    for unit, scale in (("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def median_of(values: Sequence[Optional[float]]) -> Optional[float]:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def report(part: str, config: str, rows: List[Row], results: Dict[str, Dict[int, dict]],
           targets: List[float], seeds: int) -> None:
    middle = compare.middle_target(targets)
    head = ([f"time to {compare.target_label(t)} s" for t in targets]
            + [f"vs baseline at {compare.target_label(middle)}", "final accuracy",
               "sent/worker/round", "recv/worker/round", "sent/sample", "samples/s"])
    least = [22] * len(targets) + [22, 24, 17, 17, 11, 9]
    widths = [max(len(r.name) for r in rows)] + [max(w, len(h)) for w, h in zip(least, head)]
    print(f"\n{part}, {config}: {', '.join(f'{t:g}' for t in targets)} targets; median "
          f"[min-max] over {seeds} seed(s); vs baseline: t_row / t_baseline seed by seed")
    print("  ".join(h.rjust(w) if i else "row".ljust(w)
                    for i, (h, w) in enumerate(zip(["row", *head], widths))))
    for row in rows:
        runs = results.get(row.name, {})
        if not runs:
            print(f"{row.name:<{widths[0]}}  (no job finished)")
            continue
        summaries = {seed: r["summary"] for seed, r in runs.items()}
        cells = [compare.time_cell(compare.time_to_target(summaries, t)) for t in targets]
        if row.baseline is None:
            cells.append("(baseline)")
        else:
            base = {seed: r["summary"] for seed, r in results.get(row.baseline, {}).items()}
            cells.append(compare.spread_cell(compare.speedup(summaries, base, middle),
                                             ".2f", "x"))
        cells.append(compare.spread_cell(compare.spread(
            [compare.final_accuracy(s) for s in summaries.values()]), ".4f"))
        cells.append(size(median_of([r["sent"] for r in runs.values()])))
        cells.append(size(median_of([r["received"] for r in runs.values()])))
        cells.append(size(median_of([r.get("per_sample") for r in runs.values()])))
        rate = median_of([drawer.throughput(s) for s in summaries.values()])
        cells.append("n/a" if rate is None else f"{rate:.0f}")
        missing = seeds - len(runs)
        print("  ".join([row.name.ljust(widths[0])]
                        + [c.rjust(w) for c, w in zip(cells, widths[1:])])
              + (f"  ({missing} job(s) failed)" if missing else ""))


# --- main ---------------------------------------------------------------------------------
def main(argv: Optional[Sequence[str]] = None) -> int:
    args, extra = build_parser().parse_known_args(argv)
    made_base = args.out is None
    base = tempfile.mkdtemp(prefix="esync-aggregation-") if made_base else args.out
    try:
        return _run(args, extra, base)
    finally:
        if made_base:
            shutil.rmtree(base, ignore_errors=True)


def _run(args, extra: Sequence[str], base: str) -> int:
    try:
        jobs, rows, targets = plan(args, extra, base)
    except ValueError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    results: Dict[Tuple[str, str], Dict[str, Dict[int, dict]]] = {}
    failed = []
    started = time.monotonic()
    try:
        for i, job in enumerate(jobs, 1):
            name = f"{job.part}/{job.config}/{job.row.name}/seed{job.seed}"
            t0 = time.monotonic()
            try:
                measured = run_job(job)
            except (RuntimeError, summary.SummaryError) as e:
                failed.append(name)
                print(f"[{i}/{len(jobs)}] {name}: failed: {e}", file=sys.stderr, flush=True)
                continue
            results.setdefault((job.part, job.config), {}).setdefault(
                job.row.name, {})[job.seed] = measured
            s = measured["summary"]
            reached = drawer.time_to_target(s, max(targets))
            final = compare.final_accuracy(s)
            print(f"[{i}/{len(jobs)}] {name}: {time.monotonic() - t0:.0f} s; "
                  f"{max(targets):g} "
                  + (f"at {reached:.2f} s" if reached is not None else "not reached")
                  + f", final accuracy {'n/a' if final is None else f'{final:.4f}'}, "
                  f"sent {size(measured['sent'])}/worker/round", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    print(f"{args.network} on {args.dataset}, {args.workers} workers, slowdown "
          f"{args.slowdown}, --time-limit {args.time_limit:g}, target held {args.hold:g} s"
          + (f"; links: bandwidth {args.links_bandwidth} Mbit/s, latency "
             f"{args.links_latency} ms" if LINKS in args.configs else "")
          + (f"; main.py flags {' '.join(extra)}" if extra else ""))
    for part, config in dict.fromkeys((j.part, j.config) for j in jobs):
        report(part, config, rows[part], results.get((part, config), {}), targets,
               args.seeds)
    print(f"\n{len(jobs) - len(failed)} of {len(jobs)} jobs done in "
          f"{(time.monotonic() - started) / 60:.1f} min"
          + (f"; logs in {base}" if args.out else "")
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
