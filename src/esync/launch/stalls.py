"""`esync-stalls`: where each device of a job loses time to its data and its link, and
what would remove it: DS-Analyzer's differential what-if analysis on esync's own loop.

    esync-stalls -m esync --workers 4 --slowdown 1,1,4,4 --bandwidth none,none,100,100 \\
        -n lenet --dataset shards:DIR -b 64 --loader-workers 1 [--seconds 3] [--json F]

The job is given as esync-launch takes it (its --workers, --slowdown, --bandwidth,
--latency, --devices; esync/launch/local.py parses them) with main.py's flags (esync.options:
a bad flag is one line, exit status 2). Nothing of the job starts: each distinct
device (slowdown, link, device) is measured here, in short runs alone in this process
(esync.stalls.stallprobe: synthetic batches, the shards in the page cache, the shards evicted),
and its stalls and what-ifs (DataLoader workers 0..cores, a memory cache of X% of the
samples, a link of X Mbit/s) are predicted by the model of esync.stalls.stallmodel, whose
equations its docstring gives. Printed: a table per device, then one recommendation
line per device; `--json FILE` writes the numbers.

Each device is measured as if it had this machine to itself (its cores, its storage);
the devices of a job that esync-launch starts on one machine share them, which the
figures do not show. Without a script and without -n, the built-in network and data
(main.py's defaults) are measured, which it says in one line.

A training script of your own, as esync-run takes it (its flags before the script, the
first argument ending in `.py`, esync.launch.run's `split`; the script's own after it):

    esync-stalls -m esync --workers 2 --slowdown 1,3 [--seconds 10] train.py --lr 3e-4

Its workers cannot be measured alone in this process (its model, data, DataLoader and
loop are its own): the job is run once as esync-run starts it (esync.launch.local.run
with the script), for --seconds of training, its logs in a temporary folder (or --out),
and each worker's rounds after the warm-up (esync.stalls.stallprobe.steady) say where its
time went: fetch, prep, compute, communication, wait, state_server, other, with one
line per worker naming its largest stall and what would cut it. The what-ifs, which
need the built-in loop's runs alone, are not predicted: one line says so.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from typing import Dict, List, Optional, Sequence, Tuple

from esync.errors import UserError, command_main

PROG = "esync-stalls"
FRACTIONS = (0.0, 0.25, 0.5, 0.75, 0.9, 1.0)
LINKS = (10.0, 100.0, 1000.0, 10000.0)


def _raise(message: str):
    raise UserError(message)


def _list(kind, name: str, low: float):
    def parse(text: str):
        try:
            values = [kind(v) for v in text.split(",")]
        except ValueError:
            values = []
        if not values or any(not (v >= low) for v in values):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {name}, "
                                             f"got {text!r}")
        return values
    return parse


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, allow_abbrev=False,
        usage=f"{prog} [-h] [--seconds S] [--json FILE] [--cache-fractions LIST] "
              f"[--links LIST] [launcher flags] [job flags] [SCRIPT.py [script args]]",
        description="Measure each device of a job in short runs alone and predict its "
                    "stalls and what would remove them. The job's flags are esync-launch's "
                    "(-m, --workers, --slowdown, --bandwidth, --latency, --devices) and "
                    "main.py's (-n, --dataset, -b, --loader-workers, --cache-fraction, "
                    "--disk-bandwidth, ...). Given a training script (the first argument "
                    "ending in .py; its own flags after it), its job is run once as "
                    "esync-run starts it, for --seconds of training, and each worker's "
                    "logged rounds say where its time went.")
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="seconds of each measuring run (default 3; 4 or 5 runs a "
                             "device: synthetic, cached with 0, 1 and the job's DataLoader "
                             "workers, cold); with a script: the seconds of training of "
                             "its one run (its --time-limit)")
    parser.add_argument("--json", metavar="FILE", help="also write the numbers to FILE")
    parser.add_argument("--cache-fractions", type=_list(float, "fractions in [0, 1]", 0.0),
                        default=list(FRACTIONS), metavar="LIST",
                        help="what-if cache fractions (default 0,0.25,0.5,0.75,0.9,1)")
    parser.add_argument("--links", type=_list(float, "Mbit/s > 0", 1e-9),
                        default=list(LINKS), metavar="LIST",
                        help="what-if link bandwidths, Mbit/s (default 10,100,1000,10000)")
    parser.error = _raise  # one line, exit status 2
    return parser


@dataclass
class Device:
    """A distinct device of the job: the workers that share its settings."""

    label: str
    members: List[str]
    slowdown: float
    bandwidth: Optional[float]
    latency: float
    device_args: List[str]


def _split(argv: Sequence[str]) -> Tuple[List[str], List[str]]:
    """(our and the job's arguments, the training script and its own: [] if none), as
    esync-run splits its command line."""
    from esync.launch.run import split

    try:
        return split(argv)
    except UserError:  # no script: the built-in loop, measured here
        return list(argv), []


def _plan(argv: Sequence[str]):
    """(our args, the launcher's plan of the job, torch threads, the settings the job's
    flags give, the job's flags); UserError on bad input."""
    from esync.options import flags_given
    from esync.launch import local

    ours, script = _split(argv)
    args, rest = build_parser().parse_known_args(ours)
    if not (0 < args.seconds < 3600) or any(x > 1 for x in args.cache_fractions):
        raise UserError("--seconds must lie in (0, 3600) and --cache-fractions in [0, 1]")
    check = local.build_parser(PROG)
    check.error = _raise  # the launcher's own flags, checked in one line
    _, main_flags = check.parse_known_args(rest)
    plan = local.plan(rest, PROG, script=script)
    given = flags_given(main_flags, PROG)
    # one torch thread a run, unless the job gives its workers a number
    threads = plan.options.num_threads if "num_threads" in given else 1
    return args, plan, threads, given, rest


def built_in_note(plan, given) -> Optional[str]:
    """The line that says which network and data are measured where the command line
    named neither a script nor a network (None where it named one)."""
    if plan.script or "network" in given:
        return None
    opts = plan.options
    data = "" if "dataset" in given else " (main.py's default)"
    return (f"{PROG}: no script and no -n: measuring the built-in network {opts.network} "
            f"(main.py's default) on --dataset {opts.dataset}{data}; give -n and "
            f"--dataset, or a SCRIPT.py, to measure yours")


def devices_of(plan) -> List[Device]:
    out: Dict[tuple, Device] = {}
    for k in range(plan.workers):
        flags = plan.links[k]
        bandwidth = float(flags[flags.index("--bandwidth") + 1]) if "--bandwidth" in flags else None
        latency = float(flags[flags.index("--latency") + 1]) if "--latency" in flags else 0.0
        args = plan.device_args(k)
        key = (plan.slowdowns[k], bandwidth, latency, tuple(args))
        if key not in out:
            out[key] = Device(plan.label(k), [], plan.slowdowns[k], bandwidth, latency, args)
        out[key].members.append(plan.label(k))
    return list(out.values())


def job_of(plan, model_bytes: int):
    from esync.comm.compress import compression
    from esync.stalls.stallmodel import Job

    algorithm, opts = plan.algorithm, plan.options
    if not algorithm.distributed:
        backend = "none"
    elif algorithm.backend == "ddp" or opts.backend == "allreduce":
        backend = "allreduce"
    else:
        backend = "ps"
    codec = compression(opts)
    push = {"none": 1.0, "fp16": 0.5}.get(codec.kind, 2.0 * codec.ratio)
    return Job(backend, plan.workers, model_bytes, push,
               opts.max_local_steps if algorithm.state_server else None)


def _device_options(opts, device: Device):
    if "-c" in device.device_args:
        return replace(opts, cpu=True)
    if "-g" in device.device_args:
        return replace(opts, cpu=False, gpu=int(device.device_args[-1]))
    return opts


def analyse(args, plan, threads: int = 1) -> dict:
    """Measure every device and predict; the report as a dict."""
    from esync.stalls.stallmodel import batch_seconds
    from esync.stalls.stallprobe import costs, measure, model_bytes

    opts = plan.options
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    job = job_of(plan, model_bytes(opts))
    found = []
    with tempfile.TemporaryDirectory(prefix="esync-stalls-") as work:
        devices = devices_of(plan)
        for device in devices:
            print(f"{PROG}: measuring device {device.label} ({len(devices)} in all) ...",
                  file=sys.stderr, flush=True)
            runs = measure(_device_options(opts, device), device.label, device.slowdown,
                           work, args.seconds, threads)
            found.append((device, runs, costs(runs, opts.batch_size, device.slowdown, cores)))
    K, x = opts.loader_workers, opts.cache_fraction
    seconds = [batch_seconds(c, K, x) for _, _, c in found]
    return {"job": {"mode": plan.mode, "workers": plan.workers, "backend": job.backend,
                    "network": opts.network, "dataset": opts.dataset,
                    "model_bytes": job.model_bytes, "loader_workers": K, "cache_fraction": x,
                    "disk_bandwidth": opts.disk_bandwidth, "cores": cores,
                    "seconds_per_run": args.seconds},
            "devices": [_device_report(args, device, runs, c, job, K, x,
                                       seconds[:i] + seconds[i + 1:])
                        for i, (device, runs, c) in enumerate(found)]}


def _device_report(args, device: Device, runs, c, job, K: int, x: float,
                   others: Sequence[float]) -> dict:
    """One device's measurements, stall shares, what-ifs and recommendation."""
    from esync.stalls import stallmodel as model

    link = model.Link(device.bandwidth, device.latency)
    steps = model.steps(c, K, x, job, others)
    comm = model.communication_seconds(job, link)
    share = model.shares(*(run.per_batch(run.seconds) for run in (
        runs.synthetic, runs.cached, runs.cold)), comm / steps, x)
    return {
        "label": device.label, "workers": device.members, "slowdown": device.slowdown,
        "link": asdict(link), "eviction": runs.eviction,
        "runs": {"synthetic": _run_dict(runs.synthetic),
                 **{f"cached, --loader-workers {k}": _run_dict(run)
                    for k, run in runs.cached_by_workers.items()},
                 f"cold, --loader-workers {K}": _run_dict(runs.cold)},
        "rates": {"synthetic": runs.synthetic.rate, "cached": runs.cached.rate,
                  "cold": runs.cold.rate},
        "costs": asdict(c), "fit": _fit(c, runs, K),
        "steps_per_round": steps, "communication_seconds": comm, "shares": share,
        "predicted": {"as_configured": model.rate(c, K, x, job, link, others),
                      **model.what_ifs(c, K, x, job, link, others, args.cache_fractions,
                                       [*args.links, None])},
        "recommendation": model.recommend(device.label, share, c, K, x, job, link, others)}


def _fit(c, runs, workers: int) -> List[dict]:
    """The model's samples/s at the runs it was measured from, beside theirs."""
    from esync.stalls.stallmodel import batch_seconds

    points = [(f"cached, --loader-workers {k}", k, False, run)
              for k, run in runs.cached_by_workers.items()]
    points.append((f"cold, --loader-workers {workers}", workers, True, runs.cold))
    return [{"run": name, "measured": run.rate,
             "model": c.batch / batch_seconds(c, k, 0.0, cold)} for name, k, cold, run in points]


def _run_dict(run) -> dict:
    return {"rate": run.rate, "seconds_per_batch": run.per_batch(run.seconds),
            "batches": run.batches,
            "breakdown_per_batch": {k: run.per_batch(v) for k, v in run.breakdown.items()},
            "prep_seconds_per_batch": run.per_batch(run.prep_seconds),
            "read_seconds_per_batch": run.per_batch(run.read_seconds),
            "read_bytes_per_batch": run.per_batch(run.read_bytes)}


def _pct(value: float) -> str:
    return f"{100 * value:.0f}%"


def print_report(report: dict, out=sys.stdout) -> None:
    job = report["job"]
    say = lambda line="": print(line, file=out)  # noqa: E731
    say(f"job: -m {job['mode']}, -n {job['network']} --dataset {job['dataset']}, "
        f"{job['workers']} worker(s), --loader-workers "
        f"{job['loader_workers']}, --cache-fraction {job['cache_fraction']:g}, "
        f"--disk-bandwidth {job['disk_bandwidth'] or 'none'}; a round moves "
        f"{job['model_bytes'] / 1e6:.2f} MB ({job['backend']}); {job['cores']} cores here")
    for d in report["devices"]:
        say()
        link = d["link"]
        wire = "unpaced" if link["bandwidth"] is None else f"{link['bandwidth']:g} Mbit/s"
        say(f"device {d['label']} (--slowdown {d['slowdown']:g}, link {wire} "
            f"{link['latency']:g} ms; {', '.join(d['workers'])})")
        say(f"  {'run':<34}{'samples/s':>10}{'ms/batch':>10}{'fetch':>7}{'prep':>7}"
            f"{'compute':>9}{'other':>7}")
        for name, run in d["runs"].items():
            shown = "synthetic (one batch, no loader)" if name == "synthetic" else name
            total = run["seconds_per_batch"] or 1.0
            b = run["breakdown_per_batch"]
            rest = total - b.get("fetch", 0) - b.get("prep", 0) - b.get("compute", 0)
            say(f"  {shown:<34}{run['rate']:>10.0f}{1e3 * run['seconds_per_batch']:>10.1f}"
                f"{_pct(b.get('fetch', 0) / total):>7}{_pct(b.get('prep', 0) / total):>7}"
                f"{_pct(b.get('compute', 0) / total):>9}{_pct(rest / total):>7}")
        s = d["shares"]
        spared = f" (--cache-fraction {job['cache_fraction']:g} spares that share of the " \
            f"reads)" if job["cache_fraction"] else ""
        say(f"  stalls{spared}: fetch {_pct(s['fetch'])}, prep {_pct(s['prep'])}, communication "
            f"{_pct(s['communication'])} ({1e3 * d['communication_seconds']:.1f} ms a round "
            f"of {d['steps_per_round']} iteration(s)), compute {_pct(s['compute'])}; "
            f"cold: {d['eviction']}")
        say("  the model at those runs (samples/s, model/measured): " + ", ".join(
            f"{f['run']} {f['model']:.0f}/{f['measured']:.0f}" for f in d["fit"]))
        p = d["predicted"]
        say(f"  predicted samples/s as configured: {p['as_configured']:.0f}")
        say("  what-if --loader-workers: " + "  ".join(
            f"{w['workers']}: {w['rate']:.0f}" for w in p["loader_workers"]))
        if p["cache_fraction"]:
            say("  what-if --cache-fraction: " + "  ".join(
                f"{w['fraction']:g}: {w['rate']:.0f}" for w in p["cache_fraction"]))
        if p["link"]:
            say("  what-if link Mbit/s:      " + "  ".join(
                f"{'unpaced' if w['bandwidth'] is None else format(w['bandwidth'], 'g')}: "
                f"{w['rate']:.0f}" for w in p["link"]))
    say()
    for d in report["devices"]:
        say(d["recommendation"])


# --- a training script of the user's: one run of its job ------------------------------
#: the breakdown's categories (esync.logs.breakdown), stalls first
PHASES = ("fetch", "prep", "communication", "wait", "state_server", "compute", "other")
#: below this share of a worker's time no stall is worth naming: it is compute-bound
NAMED_STALL = 0.10
#: what cuts each stall of a script's worker (its loop and DataLoader are its own)
REMEDIES = {
    "fetch": "fetch-stalled (block reads of shards): a memory cache (--cache-fraction) "
             "or faster storage would cut it",
    "prep": "prep-stalled (decoding, its transform and collation): more worker processes "
            "in the script's DataLoader (num_workers) would cut it",
    "communication": "communication-stalled: --compress (fp16, topk:R), fewer, longer "
                     "rounds (-m esync --round-time) or a faster link would cut it",
    "wait": "waiting for the other workers: -m esync's budgets (or -m async) would let "
            "it train meanwhile",
    "state_server": "waiting for the state server's budgets: longer rounds (--round-time) "
                    "would cut it",
    "other": "in neither the loader, computing nor the job's traffic (the script's own "
             "code between steps, the round's bookkeeping)",
}
#: the table's headings of the longer categories
SHORT = {"communication": "comm", "state_server": "state"}
NOT_PREDICTED = ("{script}: measured in one run of its job as esync-run starts it ({seconds:g} "
                 "s of training); the what-ifs (--loader-workers, --cache-fraction, link "
                 "bandwidths) need the built-in loop's runs alone, on its own data and "
                 "DataLoader, so none is predicted for a script")


def _job_argv(rest: Sequence[str], out: Optional[str], seconds: float) -> List[str]:
    """The job's flags as esync-run takes them, its logs in `out` (None: the user's
    --out), its training cut to `seconds` (its own stop criteria may end it earlier)."""
    argv = [*rest, "--time-limit", f"{seconds:g}", "--no-progress"]
    return argv if out is None else [*argv, "--out", out]


def _gave_out(rest: Sequence[str]) -> bool:
    return any(arg == "--out" or arg.startswith("--out=") for arg in rest)


def profile_script(args, plan, rest: Sequence[str]) -> dict:
    """Run the script's job once, as esync-run would, and read where each worker's time
    went from its logged rounds; the report as a dict. RuntimeError if the job failed
    (its logs are kept) or a worker logged no round."""
    from esync.launch import local

    keep = _gave_out(rest)
    work = None if keep else tempfile.mkdtemp(prefix="esync-stalls-")
    argv = _job_argv(rest, work, args.seconds)
    job = local.plan(argv, PROG, script=plan.script)
    print(f"{PROG}: running {os.path.basename(plan.script[0])} as esync-run would, for "
          f"{args.seconds:g} s of training ...", file=sys.stderr, flush=True)
    started = time.time() - 1.0  # file systems with coarse times
    code = local.run(argv, progress=False, out=sys.stderr, prog=PROG, script=plan.script)
    if code != 0:
        raise RuntimeError(f"the job ended with exit status {code}; its logs are in "
                           f"{job.folder}")
    devices = [_worker_report(job, k, started) for k in range(job.workers)]
    if work is not None:
        shutil.rmtree(work, ignore_errors=True)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"job": {"mode": job.mode, "workers": job.workers, "script": job.script,
                    "seconds_of_training": args.seconds, "cores": cores,
                    "logs": job.folder if keep else None},
            "not_predicted": NOT_PREDICTED.format(script=os.path.basename(job.script[0]),
                                                  seconds=args.seconds),
            "devices": devices}


def _worker_report(job, k: int, since: float) -> dict:
    """Worker k's rounds after the warm-up: its rate, breakdown, shares and line."""
    from esync.stalls.stallprobe import steady

    label = job.label(k)
    records = []
    for path in glob.glob(os.path.join(job.folder, "*", label, "iter-*.json")):
        if os.stat(path).st_mtime >= since:
            with open(path) as f:
                records.append(json.load(f))
    if not records:
        raise RuntimeError(f"worker {label} logged no round in {job.folder}: give it more "
                           f"--seconds")
    run = steady(records)
    total = sum(run.breakdown.values()) or 1.0
    share = {phase: run.breakdown.get(phase, 0.0) / total for phase in PHASES}
    link = job.links[k]
    return {"label": label, "slowdown": job.slowdowns[k], "link": " ".join(link) or "unpaced",
            "rounds": len(records), "run": _run_dict(run), "shares": share,
            "recommendation": script_recommendation(label, share)}


def script_recommendation(label: str, share: Dict[str, float]) -> str:
    """One line: the worker's largest stall and what would cut it, or that it computes."""
    stall = max((p for p in PHASES if p != "compute"), key=lambda p: share.get(p, 0.0))
    if share.get(stall, 0.0) < NAMED_STALL:
        return (f"device {label}: compute-bound ({_pct(share.get('compute', 0.0))} "
                f"computing): a faster accelerator is what helps")
    return f"device {label}: {_pct(share[stall])} {REMEDIES[stall]}"


def print_script_report(report: dict, out=sys.stdout) -> None:
    job = report["job"]
    say = lambda line="": print(line, file=out)  # noqa: E731
    say(f"job: -m {job['mode']}, {job['workers']} worker(s) running "
        f"{' '.join(job['script'])}; {job['cores']} cores here")
    say(report["not_predicted"])
    say()
    say(f"{'device':<12}{'rounds':>7}{'samples/s':>10}{'ms/iter':>9}"
        + "".join(f"{SHORT.get(p, p):>8}" for p in PHASES))
    for d in report["devices"]:
        run = d["run"]
        say(f"{d['label']:<12}{d['rounds']:>7}{run['rate']:>10.0f}"
            f"{1e3 * run['seconds_per_batch']:>9.1f}"
            + "".join(f"{_pct(d['shares'][p]):>8}" for p in PHASES))
    say()
    for d in report["devices"]:
        say(d["recommendation"])


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    """The `esync-stalls` command (see the module's docstring)."""
    return command_main(_main, argv, prog, PROG)


def _main(argv: List[str], prog: str) -> int:
    from esync.infra.console import configure_logging

    try:
        args, plan, threads, given, rest = _plan(argv)
        configure_logging()
        if plan.script:
            report = profile_script(args, plan, rest)
            print_script_report(report)
        else:
            note = built_in_note(plan, given)
            if note:
                print(note, file=sys.stderr, flush=True)
            report = analyse(args, plan, threads)
            print_report(report)
    except RuntimeError as e:  # a measuring run that logged nothing, a job that failed
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    if args.json:
        try:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1)
        except OSError as e:
            raise UserError(f"--json {args.json}: {e.strerror or e}") from None
    return 0


def console_main() -> int:
    """The `esync-stalls` command."""
    return main()


if __name__ == "__main__":
    sys.exit(main())
