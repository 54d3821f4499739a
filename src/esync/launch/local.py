"""Start a whole job on this machine with one command: the state server (ESync's
budgets, and every mode's live page), the scheduler, S servers, N workers and the
evaluator, as child processes on loopback, each configured by the DMLC_* variables as
on a real cluster (`-m ddp`: N ranks with torch.distributed's RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, rank 0 hosting the store on a free port it reports, and the
evaluator). Unless `-e` is given,
workers get `-e 0` and the evaluator measures accuracy (`-m local`: by the clock, in
process). `--bandwidth`/`--latency` give each worker its emulated link.

    esync-launch -m esync --workers 4 --servers 1 --slowdown 1,1,4,4 \\
        -n lenet --time-limit 60            (or: esync-launch ...)

Every flag the launcher does not know is passed to each worker's `main.py`; they are
checked first by main.py's own parser (esync.options), so a bad one stops the launcher
with one line and exit status 2 before anything starts. Those of checkpoints and
failures (EVERY_ROLE: --checkpoint-dir, --checkpoint-every, --keep-checkpoints,
--resume, --on-worker-failure, --min-workers, --server-patience, --start-timeout) go to
the scheduler and the servers too, so that `--checkpoint-dir D` checkpoints the job and, after it was
killed, the same command with `--resume 1` continues it from its latest checkpoint.

Every process gets the job's key (ESYNC_JOB_KEY: its ZeroMQ traffic is authenticated
and encrypted with CurveZMQ) and the state server's token (ESYNC_STATE_TOKEN), drawn
afresh for each job unless exported already (ESYNC_JOB_KEY or ESYNC_JOB_KEY_FILE, and
ESYNC_STATE_TOKEN: those are kept); `--no-auth` starts the job with neither.

The job's iteration logs go to OUT/<network>/<log folder>/<host>/<device>/iter-<n>.json,
the layout esync/logs_tools/summary.py reads (the log folder is the algorithm's, from
esync.registry); each process's output goes to a file beside them
(`<host>/scheduler.log`, `<host>/server<k>.log`, `<host>/stateserver.log`,
`<host>/<device>/worker.log`; a restarted process appends to its own). Worker k (in
launch order) is labelled `w<k>` (`w<k>-x<F>` with a slowdown F), so that no two
collide.

Every job has a live page on its state server: the launcher prints its address
(`live page: http://127.0.0.1:PORT/jobs/<job>/`) as the job starts, gives every process
that address (ESYNC_LIVE_URL) and the job's id (ESYNC_JOB_ID, which the scheduler takes
as its own), and reports there itself, every second or so, the job's state and its
processes' (esync.logs.live; stateserver/budgets/live.py).

The scheduler and the state server bind free ports themselves and report them
(esync.infra.ready); servers and workers are then given those ports. While the job runs, a
progress bar (tqdm; plain lines every 10 s when the output is not a terminal) shows the
round, the elapsed time and the latest test accuracy. Ctrl-C, SIGTERM, or a child
failing whose failure ends the job (below) stops every child (launch.supervisor:
SIGTERM to each child's process group, SIGKILL after 5 s); children, restarted ones
too, also die with the launcher if it is killed outright.

With a scheduler (sync, async, esync), the job can lose a server or a worker as it
would lose a machine: once training has begun (a round is logged), one killed by a
signal is left to the scheduler, which goes on without a worker (--on-worker-failure
continue), waits --server-patience for a server, or ends the job; the scheduler's exit
decides the job's end. A process that exits with an error status failed in its code
(an exception in the training script, bad input): that ends the job, exit status 1,
with its last line, as does any death before the first round (a node may never have
registered, and the scheduler would wait for it). `--restart-failed` starts a server or
a worker killed by a signal again, with the same command and variables (so it takes
its rank back and rejoins; a server restores its shard from --checkpoint-dir), up to
`--max-restarts` times each, while the scheduler runs. The last line says which workers
the job lost.

Exit status: 0 when the job ended well (the scheduler and the evaluator exited 0), 1
when a process whose failure ends the job failed, 130 on Ctrl-C or SIGTERM, 2 for bad
flags.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from typing import IO, List, Mapping, Optional, Sequence

from esync import config
from esync import registry
from esync.errors import UserError, command_main
from esync.algorithms.policy import check_aggregation
from esync.options import Options, flags_given, parse_options
from esync.runtime.startup import check_plugins
from esync.options import build_parser as options_parser
from esync.transport.auth import job_key
from esync.launch.job import AUTH_VARIABLES, Plan, RayPlan  # noqa: F401 (esync-launch's names)
from esync.launch.launcher import Launcher

PROG = "esync-launch"
#: main.py's settings that go to every role, the scheduler and the servers too (the
#: workers and the evaluator get every passed-through flag): checkpoints, resuming, and
#: what the job does when a node dies or does not come
EVERY_ROLE = ("checkpoint_dir", "checkpoint_every", "keep_checkpoints", "resume",
              "on_worker_failure", "min_workers", "server_patience", "start_timeout")
#: the job's settings the launcher gives each worker itself (a user's are refused, or
#: come before the launcher's): its log folder and label (from --out and --slowdown),
#: and the state server's address (-m esync)
LAUNCHER_SETS = ("log_dir", "device_name", "state_server_ip", "state_server_port")
#: --max-restarts's default
MAX_RESTARTS = 3
#: --ray-servers-on's default
RAY_SERVERS_ON = "head"
#: --ray-timeout's default: seconds to wait for the job's resources to become free
RAY_TIMEOUT_S = 60.0
#: bad launcher input (printed as one line, exit status 2): esync.errors' one type,
#: under the name this module's callers know
LaunchError = UserError


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, allow_abbrev=False,  # --max-r is main.py's --max-rounds, not ours
        description="Run a job (state server, scheduler, servers, workers) on this machine. "
                    "Flags not listed here are passed to every worker's main.py; those "
                    "of checkpoints and failures (--checkpoint-dir, --checkpoint-every, "
                    "--keep-checkpoints, --resume, --on-worker-failure, --min-workers, "
                    "--server-patience) to the scheduler and the servers too.",
        epilog="Resuming: a job run with --checkpoint-dir D and killed continues from its "
               "latest checkpoint with the same command and --resume 1. Every process "
               "gets the job's key (ESYNC_JOB_KEY: CurveZMQ) and the state server's "
               "token (ESYNC_STATE_TOKEN), fresh for each job unless exported already "
               "(ESYNC_JOB_KEY or ESYNC_JOB_KEY_FILE, ESYNC_STATE_TOKEN).")
    parser.add_argument("-m", "--mode", required=True, choices=registry.MODES,
                        help="training algorithm (as main.py's -m)")
    parser.add_argument("--workers", type=int, default=2, help="number of workers (default 2)")
    parser.add_argument("--servers", type=int, default=None,
                        help="number of servers (default 1; none with --backend allreduce)")
    parser.add_argument("--slowdown", default="1",
                        help="one --slowdown factor per worker, comma-separated, or one for "
                             "all (default 1)")
    parser.add_argument("--bandwidth", default="none",
                        help="Mbit/s of each worker's emulated link, comma-separated, or "
                             "one for all; none: not paced (default none)")
    parser.add_argument("--latency", default="0",
                        help="ms of one-way delay of each worker's emulated link, "
                             "comma-separated, or one for all (default 0)")
    parser.add_argument("--no-evaluator", action="store_true",
                        help="start no evaluator process (it is started unless -e is given: "
                             "with -e worker 0 evaluates, as the original did)")
    parser.add_argument("--out", default=config.RUNS_DIR,
                        help=f"base folder: logs go to OUT/<network>/<log folder>/ "
                             f"(default {config.RUNS_DIR})")
    parser.add_argument("--no-progress", action="store_true",
                        help="no live progress bar or lines")
    parser.add_argument("--restart-failed", action="store_true",
                        help="start a server or a worker killed by a signal (a lost "
                             "machine; an error status ends the job) again, with the same "
                             "command and variables, while "
                             "the scheduler runs: it takes its rank back (a server restores "
                             "its shard from --checkpoint-dir); sync, async and esync only")
    parser.add_argument("--max-restarts", metavar="N", default=None,
                        help=f"with --restart-failed: restarts of each server and worker "
                             f"(default {MAX_RESTARTS})")
    parser.add_argument("--devices", default=None, metavar="LIST",
                        help="each worker's device, comma-separated, or one for all: cpu, "
                             "gpu (a GPU of its own: locally the j-th GPU worker gets "
                             "cuda:j, on Ray the GPU Ray gives it) or gpu:N (cuda:N, not "
                             "with --ray); default: as main.py's -g/-c say, for all")
    parser.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                        help="start the job's processes as actors on a Ray cluster "
                             "(pip install -e '.[ray]'): ADDRESS as ray.init's (auto: the "
                             "cluster started on this machine by `ray start`; HOST:PORT; "
                             "ray://HOST:10001); without ADDRESS: the cluster RAY_ADDRESS "
                             "names, else a new local Ray instance for this job")
    parser.add_argument("--ray-servers-on", default=None, metavar="WHERE",
                        help=f"with --ray: where the scheduler, the servers, the state "
                             f"server and the evaluator run: head (the head node), any, "
                             f"resource:NAME (a node with the custom resource NAME) or "
                             f"label:KEY=VALUE (a node with that label) "
                             f"(default {RAY_SERVERS_ON})")
    parser.add_argument("--ray-timeout", default=None, metavar="S",
                        help=f"with --ray: seconds to wait for resources the cluster has "
                             f"but others hold (default {RAY_TIMEOUT_S:g})")
    parser.add_argument("--no-auth", action="store_true",
                        help="no job key and no state server token: ZeroMQ traffic "
                             "unauthenticated and unencrypted, state server writes open "
                             "(exported ESYNC_JOB_KEY, ESYNC_JOB_KEY_FILE and "
                             "ESYNC_STATE_TOKEN are not passed on either)")
    return parser


def _worker_options(mode: str, rest: Sequence[str]) -> tuple:
    """main.py's settings from the passed-through flags (with `-m MODE`), parsed by
    main.py's own parser, and the names of the settings those flags give."""
    argv = ["-m", mode, *rest]
    try:
        return parse_options(argv, prog="main.py"), flags_given(argv, prog="main.py")
    except UserError as e:
        raise UserError(f"{e} (a flag passed to main.py)") from None


def _every_role_args(opts: Options, given) -> List[str]:
    """The flags of EVERY_ROLE's settings that the user gave, from their parsed values
    (long forms, whatever form was typed)."""
    flags = {action.dest: action.option_strings for action in options_parser()._actions}
    args: List[str] = []
    for dest in EVERY_ROLE:
        if dest in given:
            value = getattr(opts, dest)
            flag = next(f for f in flags[dest] if f.startswith("--"))
            args += [flag, ("1" if value else "0") if isinstance(value, bool) else str(value)]
    return args


def _restarts(args, algorithm: registry.Algorithm) -> int:
    """Restarts of each server and worker: --max-restarts with --restart-failed, else 0."""
    if not args.restart_failed:
        if args.max_restarts is not None:
            raise UserError("--max-restarts needs --restart-failed")
        return 0
    if not algorithm.parameter_server:
        raise UserError(f"--restart-failed: -m {algorithm.mode} has no scheduler to take "
                          f"a restarted process back (sync, async and esync have)")
    if args.max_restarts is None:
        return MAX_RESTARTS
    text = args.max_restarts.strip()
    if not text.isdigit():
        raise UserError(f"--max-restarts {args.max_restarts!r}: expected a number of "
                          f"restarts >= 0")
    return int(text)


def plan(argv: Sequence[str], prog: str = PROG,
         environ: Mapping[str, str] = os.environ, script: Sequence[str] = ()) -> Plan:
    """The job that `argv` (and, for its key, `environ`) describes; UserError (one
    line) on bad input. With `script` (esync-run: a training script and its arguments)
    the workers run it instead of main.py; the evaluator then needs the script's model
    and test data as plug-ins (-n, --dataset), and there is none without -n."""
    args, rest = build_parser(prog).parse_known_args(list(argv))
    opts, given = _worker_options(args.mode, rest)
    for dest in LAUNCHER_SETS[:2]:
        if dest in given:
            flag = "-ld/--log-dir" if dest == "log_dir" else "--device-name"
            raise UserError(f"{flag} is set by the launcher (see --out, --slowdown)")
    all_reduce = opts.backend == "allreduce"
    if args.servers is None:
        args.servers = 0 if all_reduce else 1
    elif all_reduce and args.servers:
        raise UserError(f"--servers {args.servers}: --backend allreduce runs without "
                          f"servers")
    if args.workers < 1 or (args.servers < 1 and not all_reduce):
        raise UserError("--workers and --servers must be at least 1")
    algorithm = opts.algorithm
    # refused here, before any process starts
    check_aggregation(opts, args.servers if algorithm.parameter_server else None)
    check_plugins(opts)
    workers = args.workers if algorithm.distributed else 1
    slowdowns = _per_worker("--slowdown", args.slowdown, workers, low=1.0, noun="factor")
    bandwidths = _per_worker("--bandwidth", args.bandwidth, workers, none_ok=True)
    latencies = _per_worker("--latency", args.latency, workers, low=0.0)
    if not algorithm.distributed and (any(b is not None for b in bandwidths) or any(latencies)):
        raise UserError(f"--bandwidth/--latency: -m {algorithm.mode} trains alone, with "
                          f"no link to emulate")
    for dest in ("bandwidth", "latency"):
        if dest in given:
            raise UserError(f"--{dest} is per worker here: give the launcher's "
                              f"--{dest} a comma-separated list")
    links = [[*(["--bandwidth", f"{b:g}"] if b is not None else []),
              *(["--latency", f"{lat:g}"] if lat else [])]
             for b, lat in zip(bandwidths, latencies)]
    evaluate_by_worker = "eval_every" in given
    evaluator = algorithm.distributed and not evaluate_by_worker and not args.no_evaluator \
        and (not script or "network" in given)
    if not evaluate_by_worker:  # the evaluator (or, alone, the clock) does it
        rest = [*rest, "-e", "0"]
    if script:
        if not os.path.isfile(script[0]):
            raise UserError(f"{script[0]}: no such training script")
        script = [os.path.abspath(script[0]), *script[1:]]
    name = os.path.splitext(os.path.basename(script[0]))[0] if script else opts.network
    folder = os.path.join(args.out, name, algorithm.log_folder(opts.split_by_class))
    ray = _ray_plan(args)
    if ray is None and opts.remote_prep is not None:
        raise UserError("--remote-prep sends preprocessing to Ray tasks: it needs --ray")
    if "num_threads" in given:
        threads, extra = opts.num_threads, []
    else:  # on Ray, a CPU worker asks for as many CPUs as it has threads: 1 unless given
        threads = 1 if ray else max(1, (os.cpu_count() or 1) // workers)
        extra = ["--num-threads", str(threads)]
    restarts = _restarts(args, algorithm)
    if ray is not None and restarts:
        raise UserError("--restart-failed is for this machine's processes, not --ray's "
                          "actors")
    if not args.no_auth:  # an exported job key must be one
        job_key(environ, warn=False)
    return Plan(algorithm, workers, args.servers, slowdowns, links, evaluator,
                [*rest, *extra], opts, folder, threads, _every_role_args(opts, given),
                restarts, not args.no_auth, _devices(args.devices, given, workers, ray),
                ray, list(script))


def _devices(text: Optional[str], given, workers: int,
             ray: Optional[RayPlan]) -> List[Optional[str]]:
    """Each worker's device from --devices (None each: main.py's -g/-c decide)."""
    if text is None:
        if ray is not None and "gpu" in given:
            raise UserError("-g: on Ray each GPU worker gets the GPU Ray gives it: say "
                              "which workers want one with --devices (gpu, or a list such "
                              "as gpu,gpu,cpu,cpu)")
        return [None] * workers
    if given & {"gpu", "cpu"}:
        raise UserError("--devices and main.py's -g/-c both say where workers train: "
                          "give one of them")
    items = [item.strip().lower() for item in text.split(",")]
    for item in items:
        if not re.fullmatch(r"cpu|gpu(:[0-9]+)?", item):
            raise UserError(f"--devices {text!r}: expected cpu, gpu or gpu:N for each "
                              f"worker, got {item!r}")
        if ray is not None and ":" in item:
            raise UserError(f"--devices {text!r}: {item} names a GPU, but on Ray each GPU "
                              f"worker gets the GPU Ray gives it: say gpu")
    return _one_each("--devices", text, items, workers, "device")


def _ray_plan(args) -> Optional[RayPlan]:
    """--ray's settings, checked (None without --ray)."""
    if args.ray is None:
        for flag, value in (("--ray-servers-on", args.ray_servers_on),
                            ("--ray-timeout", args.ray_timeout)):
            if value is not None:
                raise UserError(f"{flag} needs --ray")
        return None
    where = args.ray_servers_on or RAY_SERVERS_ON
    if not (where in ("head", "any") or re.fullmatch(r"resource:[^\s:=]+", where)
            or re.fullmatch(r"label:[^\s=]+=[^\s=]+", where)):
        raise UserError(f"--ray-servers-on {where!r}: expected head, any, resource:NAME "
                          f"or label:KEY=VALUE")
    timeout = RAY_TIMEOUT_S
    if args.ray_timeout is not None:
        try:
            timeout = float(args.ray_timeout)
        except ValueError:
            timeout = float("nan")
        if not 0 < timeout < float("inf"):
            raise UserError(f"--ray-timeout {args.ray_timeout!r}: expected seconds > 0")
    return RayPlan(args.ray.strip() or None, where, timeout)


def _per_worker(flag: str, text: str, workers: int, none_ok: bool = False,
                low: float = 0.0, noun: str = "value") -> List[Optional[float]]:
    """One value per worker from `a,b,...` or one for all; `none` (if allowed): unset."""
    values: List[Optional[float]] = []
    for item in text.split(","):
        item = item.strip().lower()
        if none_ok and item in ("none", ""):
            values.append(None)
            continue
        try:
            value = float(item)
        except ValueError:
            value = float("nan")
        if not value >= low or value == float("inf") or (none_ok and value <= 0):
            raise UserError(f"{flag} {text!r}: expected {workers} {noun}(s) "
                              f"{'> 0 or none' if none_ok else f'>= {low:g}'} "
                              f"(one per worker) or one for all")
        values.append(value)
    return _one_each(flag, text, values, workers, noun)


def _one_each(flag: str, text: str, items: list, workers: int, noun: str) -> list:
    """`items` (a flag's comma-separated values) as one per worker: one is for all."""
    if len(items) == 1:
        return items * workers
    if len(items) != workers:
        raise UserError(f"{flag} {text!r}: expected {workers} {noun}(s) (one per worker) "
                          f"or one for all")
    return items


def run(argv: Sequence[str], progress: bool = True, *, out: Optional[IO[str]] = None,
        position: int = 0, nested: bool = False, prog: str = PROG,
        script: Sequence[str] = ()) -> int:
    """Launch one job and wait for it; the exit status (raises UserError on bad input,
    before anything starts). `script`: esync-run's training script and its arguments."""
    planned = plan(argv, prog, script=script)
    progress = progress and "--no-progress" not in argv
    if planned.ray is not None:
        try:
            from esync.launch import onray  # ray: an optional extra
        except ImportError as e:
            raise UserError(f"--ray needs Ray: pip install -e '.[ray]' ({e})") from None
        return onray.run(planned, progress, out, position, nested)
    launcher = Launcher(planned, progress=progress, position=position, nested=nested)
    if out is not None:
        launcher.out = out
    return launcher.run()


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    """The `esync-launch` command (see the module's docstring)."""
    return command_main(lambda args, name: run(args, prog=name), argv, prog, PROG)


def console_main() -> int:
    """The `esync-launch` command."""
    return main()


if __name__ == "__main__":
    sys.exit(main())
