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
processes' (esync.live; stateserver/budgets/live.py).

The scheduler and the state server bind free ports themselves and report them
(esync.ready); servers and workers are then given those ports. While the job runs, a
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
import glob
import json
import os
import re
import secrets
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import IO, Callable, ClassVar, Dict, List, Mapping, Optional, Sequence

from tqdm import tqdm

from esync import config
from esync import registry
from esync.data import METRIC_LINE
from esync.errors import UserError
from esync.live import JOB_ID_ENV, LiveReporter, page_url
from esync.live import URL_ENV as LIVE_URL_ENV
from esync.options import (ARGS_VARIABLE, Options, check_plugins,
                           flags_given, parse_options)
from esync.options import build_parser as options_parser
from esync.stateclient import TOKEN_ENV as STATE_TOKEN_ENV
from esync.transport.auth import KEY_ENV, KEY_FILE_ENV, job_key, new_key
from esync.launch.progress import Progress
from esync.launch.supervisor import (GRACE_S, Child, ChildFailed, Supervisor, ended_how,
                                    interrupt_on)

#: the checkout (main.py and the state server's Django project, stateserver/): three
#: folders above this file (src/esync/launch/)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PROG = "esync-launch"
#: an evaluation in a worker's or the evaluator's output (esync.data.METRIC_LINE's names)
ACCURACY = re.compile(r"round (\d+) .*(?:test accuracy|val_loss) ([0-9.]+)")
_ITER = re.compile(r"iter-(\d+)\.json$")
#: main.py's settings that go to every role, the scheduler and the servers too (the
#: workers and the evaluator get every passed-through flag): checkpoints, resuming, and
#: what the job does when a node dies or does not come
EVERY_ROLE = ("checkpoint_dir", "checkpoint_every", "keep_checkpoints", "resume",
              "on_worker_failure", "min_workers", "server_patience", "start_timeout")
#: the job's settings the launcher gives each worker itself (a user's are refused, or
#: come before the launcher's): its log folder and label (from --out and --slowdown),
#: and the state server's address (-m esync)
LAUNCHER_SETS = ("log_dir", "device_name", "state_server_ip", "state_server_port")
#: what gives the job its key and the state server its token (--no-auth: none of them)
AUTH_VARIABLES = (KEY_ENV, KEY_FILE_ENV, STATE_TOKEN_ENV)
#: --max-restarts's default
MAX_RESTARTS = 3
#: --ray-servers-on's default
RAY_SERVERS_ON = "head"
#: --ray-timeout's default: seconds to wait for the job's resources to become free
RAY_TIMEOUT_S = 60.0
#: placeholders in a role's command, variables and folder, filled where it starts (this
#: machine, or its Ray node): the Python that runs it, the checkout (main.py's folder),
#: the address others reach it at, the log folder (-ld), the host's name
PYTHON, CODE, ADDRESS = "<esync:python>", "<esync:code>", "<esync:address>"
LOGS, HOST = "<esync:logs>", "<esync:host>"
#: the state server's database, in its host's log folder
STATE_DB = "stateserver.sqlite3"


class LaunchError(Exception):
    """Bad launcher input: printed as one line, exit status 2."""


@dataclass
class Plan:
    """What to start, decided from the command line before anything starts."""

    algorithm: registry.Algorithm
    workers: int
    servers: int
    slowdowns: List[float]
    links: List[List[str]]  # per worker: its --bandwidth/--latency flags (may be empty)
    evaluator: bool         # start an evaluator (DMLC_ROLE=evaluator)
    worker_args: List[str]
    options: Options  # the workers' settings, as main.py will parse them
    folder: str       # OUT/<network>/<log folder>
    threads: int
    role_args: List[str] = field(default_factory=list)  # EVERY_ROLE's flags, as given
    restarts: int = 0  # --restart-failed: restarts of each server and worker (0: none)
    auth: bool = True  # a job key and a state server token (not --no-auth)
    #: per worker: None (main.py's flags decide), "cpu", "gpu" (a GPU of its own) or
    #: "gpu:N" (cuda:N; on this machine only)
    devices: List[Optional[str]] = field(default_factory=list)
    ray: Optional["RayPlan"] = None  # --ray: where and how to place the job on Ray
    #: esync-run: the user's script and its arguments, run as each worker in place of
    #: main.py, with main.py's flags in ESYNC_ARGS (esync.api.init reads them)
    script: List[str] = field(default_factory=list)

    def scheduler_argv(self, main: Sequence[str]) -> List[str]:
        return [*main, "-m", self.mode, *self.role_args]

    def server_argv(self, main: Sequence[str]) -> List[str]:
        return [*main, "-m", self.mode, "-c", "1", *self.role_args]

    @property
    def mode(self) -> str:
        return self.algorithm.mode

    @property
    def network(self) -> str:
        return self.options.network

    @property
    def stop_rounds(self) -> Optional[int]:
        return self.options.max_rounds

    @property
    def stop_seconds(self) -> Optional[float]:
        return self.options.time_limit

    @property
    def host_dir(self) -> str:
        return os.path.join(self.folder, socket.gethostname())

    def label(self, k: int) -> str:
        """Worker k's device folder: `w<k>`, `-gpu` for a GPU worker, `-x<F>` with a
        slowdown F."""
        factor = self.slowdowns[k]
        gpu = "-gpu" if (self.devices[k] or "").startswith("gpu") else ""
        return f"w{k}{gpu}" + ("" if factor == 1 else f"-x{factor:g}")

    def device_args(self, k: int) -> List[str]:
        """Worker k's device flags: `-g N` for a GPU worker (on Ray, `-g 0`: the one GPU
        Ray made visible to it), `-c 1` for a CPU one, none where main.py's flags
        decide."""
        device = self.devices[k]
        if device is None:
            return []
        if device == "cpu":
            return ["-c", "1"]
        if ":" in device:
            return ["-g", device.split(":", 1)[1]]
        if self.ray is not None:
            return ["-g", "0"]
        return ["-g", str(sum(d == "gpu" for d in self.devices[:k]))]


@dataclass
class RayPlan:
    """--ray's settings (esync/launch/onray.py acts on them)."""

    address: Optional[str]  # ray.init's address; None: RAY_ADDRESS, else a new local instance
    servers_on: str         # where the scheduler, servers, state server and evaluator go
    timeout: float          # seconds to wait for the cluster to free the job's resources


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
        raise LaunchError(f"{e} (a flag passed to main.py)") from None


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
            raise LaunchError("--max-restarts needs --restart-failed")
        return 0
    if not algorithm.parameter_server:
        raise LaunchError(f"--restart-failed: -m {algorithm.mode} has no scheduler to take "
                          f"a restarted process back (sync, async and esync have)")
    if args.max_restarts is None:
        return MAX_RESTARTS
    text = args.max_restarts.strip()
    if not text.isdigit():
        raise LaunchError(f"--max-restarts {args.max_restarts!r}: expected a number of "
                          f"restarts >= 0")
    return int(text)


def _check_auth(environ: Mapping[str, str]) -> None:
    """An exported job key must be one (LaunchError naming the variable)."""
    try:
        job_key(environ, warn=False)
    except UserError as e:
        raise LaunchError(str(e)) from None


def plan(argv: Sequence[str], prog: str = PROG,
         environ: Mapping[str, str] = os.environ, script: Sequence[str] = ()) -> Plan:
    """The job that `argv` (and, for its key, `environ`) describes; LaunchError (one
    line) on bad input. With `script` (esync-run: a training script and its arguments)
    the workers run it instead of main.py; the evaluator then needs the script's model
    and test data as plug-ins (-n, --dataset), and there is none without -n."""
    args, rest = build_parser(prog).parse_known_args(list(argv))
    opts, given = _worker_options(args.mode, rest)
    for dest in LAUNCHER_SETS[:2]:
        if dest in given:
            flag = "-ld/--log-dir" if dest == "log_dir" else "--device-name"
            raise LaunchError(f"{flag} is set by the launcher (see --out, --slowdown)")
    all_reduce = opts.backend == "allreduce"
    if args.servers is None:
        args.servers = 0 if all_reduce else 1
    elif all_reduce and args.servers:
        raise LaunchError(f"--servers {args.servers}: --backend allreduce runs without "
                          f"servers")
    if args.workers < 1 or (args.servers < 1 and not all_reduce):
        raise LaunchError("--workers and --servers must be at least 1")
    algorithm = opts.algorithm
    try:  # refused here, before any process starts
        registry.check_aggregation(opts, args.servers if algorithm.parameter_server else None)
        check_plugins(opts)
    except UserError as e:
        raise LaunchError(str(e)) from None
    workers = args.workers if algorithm.distributed else 1
    slowdowns = _per_worker("--slowdown", args.slowdown, workers, low=1.0, noun="factor")
    bandwidths = _per_worker("--bandwidth", args.bandwidth, workers, none_ok=True)
    latencies = _per_worker("--latency", args.latency, workers, low=0.0)
    if not algorithm.distributed and (any(b is not None for b in bandwidths) or any(latencies)):
        raise LaunchError(f"--bandwidth/--latency: -m {algorithm.mode} trains alone, with "
                          f"no link to emulate")
    for dest in ("bandwidth", "latency"):
        if dest in given:
            raise LaunchError(f"--{dest} is per worker here: give the launcher's "
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
            raise LaunchError(f"{script[0]}: no such training script")
        script = [os.path.abspath(script[0]), *script[1:]]
    name = os.path.splitext(os.path.basename(script[0]))[0] if script else opts.network
    folder = os.path.join(args.out, name, algorithm.log_folder(opts.split_by_class))
    ray = _ray_plan(args)
    if ray is None and opts.remote_prep is not None:
        raise LaunchError("--remote-prep sends preprocessing to Ray tasks: it needs --ray")
    if "num_threads" in given:
        threads, extra = opts.num_threads, []
    else:  # on Ray, a CPU worker asks for as many CPUs as it has threads: 1 unless given
        threads = 1 if ray else max(1, (os.cpu_count() or 1) // workers)
        extra = ["--num-threads", str(threads)]
    restarts = _restarts(args, algorithm)
    if ray is not None and restarts:
        raise LaunchError("--restart-failed is for this machine's processes, not --ray's "
                          "actors")
    if not args.no_auth:
        _check_auth(environ)
    return Plan(algorithm, workers, args.servers, slowdowns, links, evaluator,
                [*rest, *extra], opts, folder, threads, _every_role_args(opts, given),
                restarts, not args.no_auth, _devices(args.devices, given, workers, ray),
                ray, list(script))


def _devices(text: Optional[str], given, workers: int,
             ray: Optional[RayPlan]) -> List[Optional[str]]:
    """Each worker's device from --devices (None each: main.py's -g/-c decide)."""
    if text is None:
        if ray is not None and "gpu" in given:
            raise LaunchError("-g: on Ray each GPU worker gets the GPU Ray gives it: say "
                              "which workers want one with --devices (gpu, or a list such "
                              "as gpu,gpu,cpu,cpu)")
        return [None] * workers
    if given & {"gpu", "cpu"}:
        raise LaunchError("--devices and main.py's -g/-c both say where workers train: "
                          "give one of them")
    items = [item.strip().lower() for item in text.split(",")]
    for item in items:
        if not re.fullmatch(r"cpu|gpu(:[0-9]+)?", item):
            raise LaunchError(f"--devices {text!r}: expected cpu, gpu or gpu:N for each "
                              f"worker, got {item!r}")
        if ray is not None and ":" in item:
            raise LaunchError(f"--devices {text!r}: {item} names a GPU, but on Ray each GPU "
                              f"worker gets the GPU Ray gives it: say gpu")
    return _one_each("--devices", text, items, workers, "device")


def _ray_plan(args) -> Optional[RayPlan]:
    """--ray's settings, checked (None without --ray)."""
    if args.ray is None:
        for flag, value in (("--ray-servers-on", args.ray_servers_on),
                            ("--ray-timeout", args.ray_timeout)):
            if value is not None:
                raise LaunchError(f"{flag} needs --ray")
        return None
    where = args.ray_servers_on or RAY_SERVERS_ON
    if not (where in ("head", "any") or re.fullmatch(r"resource:[^\s:=]+", where)
            or re.fullmatch(r"label:[^\s=]+=[^\s=]+", where)):
        raise LaunchError(f"--ray-servers-on {where!r}: expected head, any, resource:NAME "
                          f"or label:KEY=VALUE")
    timeout = RAY_TIMEOUT_S
    if args.ray_timeout is not None:
        try:
            timeout = float(args.ray_timeout)
        except ValueError:
            timeout = float("nan")
        if not 0 < timeout < float("inf"):
            raise LaunchError(f"--ray-timeout {args.ray_timeout!r}: expected seconds > 0")
    return RayPlan(args.ray.strip() or None, where, timeout)


def job_secrets(environ: Mapping[str, str] = os.environ,
                exported: bool = False) -> Dict[str, str]:
    """The variables to add for a job's processes: a fresh job key unless the user
    exported one (ESYNC_JOB_KEY or ESYNC_JOB_KEY_FILE), a fresh state server token
    unless exported (ESYNC_STATE_TOKEN). With `exported` (for processes that do not
    inherit `environ`: Ray's), the exported ones too, the key read from its file."""
    added = {}
    if not (environ.get(KEY_ENV) or environ.get(KEY_FILE_ENV)):
        added[KEY_ENV] = new_key()
    elif exported:
        added[KEY_ENV] = job_key(environ, warn=False).secret.decode()
    if not environ.get(STATE_TOKEN_ENV):
        added[STATE_TOKEN_ENV] = new_token()
    elif exported:
        added[STATE_TOKEN_ENV] = environ[STATE_TOKEN_ENV]
    return added


def new_token() -> str:
    """A fresh state server token."""
    return secrets.token_urlsafe(32)


def filler(python: str, code: str, address: str, logs: str,
           host: str) -> Callable[[str], str]:
    """What fills the placeholders (PYTHON, CODE, ADDRESS, LOGS, HOST) of a role's command,
    variables and folder with their values where it starts."""
    marks = {PYTHON: python, CODE: code, ADDRESS: address, LOGS: logs, HOST: host}

    def fill(text: str) -> str:
        for mark, value in marks.items():
            text = text.replace(mark, value)
        return text

    return fill


def process_state(child) -> str:
    """A child's state on the live page: running, finished, exited N or killed by signal
    N (a Supervisor's child, or launch.onray's role handle)."""
    code = child.returncode
    if code is None:
        return "running" if not getattr(child, "restarts", 0) else \
            f"running, restarted {child.restarts}"
    if code == 0:
        return "finished"
    return f"killed by signal {-code}" if code < 0 else f"exited {code}"


def lost_note(lost: Sequence) -> str:
    """What the job's end line adds when it went on without some of its processes:
    `; without worker1 (signal 9), which the job lost` (the others trained its share
    of the data from then on, or nobody did, with static partitions)."""
    if not lost:
        return ""
    names = ", ".join(f"{child.name} ({ended_how(child.returncode)})" for child in lost)
    return f"; without {names}, which the job lost"


def last_line(path: Optional[str]) -> str:
    """What a process's log says last of why it ended: among its last lines, the last
    that names an error (a traceback's exception, `error: ...`), else its last line with
    text ("" if none, or no log). A scheduler that aborted says why, then that it stays to
    tell late nodes."""
    try:
        with open(path, errors="replace") as f:
            tail = [line.rstrip() for line in f.readlines()[-12:] if line.strip()]
    except (OSError, TypeError):
        return ""
    errors = [line for line in tail if re.search(r"\b(error|[A-Za-z]*Error)\b", line)]
    return (errors or tail or [""])[-1]


def inherited(environ: Mapping[str, str], auth: bool) -> Dict[str, str]:
    """What a job's process keeps of the environment it is started from: not the cluster
    variables of another job (DMLC_*, torch.distributed's), nor, without `auth`, a key
    or token."""
    return {k: v for k, v in environ.items() if not k.startswith("DMLC_")
            and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK",
                          LIVE_URL_ENV, JOB_ID_ENV)
            and (auth or k not in AUTH_VARIABLES)}


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
            raise LaunchError(f"{flag} {text!r}: expected {workers} {noun}(s) "
                              f"{'> 0 or none' if none_ok else f'>= {low:g}'} "
                              f"(one per worker) or one for all")
        values.append(value)
    return _one_each(flag, text, values, workers, noun)


def _one_each(flag: str, text: str, items: list, workers: int, noun: str) -> list:
    """`items` (a flag's comma-separated values) as one per worker: one is for all."""
    if len(items) == 1:
        return items * workers
    if len(items) != workers:
        raise LaunchError(f"{flag} {text!r}: expected {workers} {noun}(s) (one per worker) "
                          f"or one for all")
    return items


@dataclass
class Launcher:
    plan: Plan
    progress: bool = True
    out: IO[str] = field(default_factory=lambda: sys.stderr)
    position: int = 0     # of the progress bar (the experiment's job bar sits below its own)
    nested: bool = False  # inside the experiment: the bar is cleared at the end
    supervisor: Supervisor = field(init=False)
    _read_up_to: Dict[str, int] = field(default_factory=dict)  # bytes of each log read
    _accuracy: Optional[str] = None
    _start: float = 0.0
    _started_at: float = 0.0  # wall clock (file times), a little before the first child
    _training: bool = False   # a round of this run was logged
    _secrets: Dict[str, str] = field(default_factory=dict)  # the job's key and token
    #: the job's id and, once its state server listens, its live page (ESYNC_JOB_ID,
    #: ESYNC_LIVE_URL): every process's
    _job_vars: Dict[str, str] = field(default_factory=dict)
    live: Optional[LiveReporter] = None  # this launcher's reports to the live page
    #: whether its processes inherit this process's variables (the exported key and
    #: token among them); RayLauncher's actors do not (their nodes' own apply)
    inherits: ClassVar[bool] = True

    def __post_init__(self) -> None:
        self.supervisor = Supervisor(grace=GRACE_S, say=lambda line: self.say(line))
        if self.plan.auth:  # drawn once: a restarted process gets the same
            self._secrets = job_secrets(os.environ, exported=not self.inherits)
        self.job_id = (f"{os.path.basename(self.plan.folder)}-"
                       f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}")
        self._job_vars = {JOB_ID_ENV: self.job_id}

    def say(self, line: str) -> None:
        """A line of its own (above any progress bar on the same stream)."""
        tqdm.write(f"launch: {line}", file=self.out)
        self.out.flush()

    @property
    def children(self) -> List[Child]:
        return self.supervisor.children

    def _env(self, **extra: str) -> Dict[str, str]:
        """A process's variables: this launcher's where they are inherited (see
        `inherits`), and the job's: its key and token, threads, unbuffered output, and
        `extra` (its role's)."""
        threads = str(self.plan.threads)
        return dict(inherited(os.environ, self.plan.auth) if self.inherits else {},
                    **self._secrets, **self._job_vars, OMP_NUM_THREADS=threads,
                    MKL_NUM_THREADS=threads,
                    PYTHONUNBUFFERED="1", **extra)

    def _fatal(self, child: Child) -> bool:
        """Whether a server or worker that died ends the job: one that exited with an
        error status (its code failed, or its input: a restart would fail the same way,
        and it has told the scheduler, which ends the job), and any before training has
        begun (it may never have registered: the scheduler would wait for it). One killed
        by a signal once training runs is a lost machine: the scheduler decides."""
        code = child.returncode
        return (code is not None and code > 0) or not self._training_began()

    def _training_began(self) -> bool:
        if not self._training:
            self._training = self._rounds() > 0
        return self._training

    def _start_role(self, name: str, argv: Sequence[str], env: Dict[str, str], log: str,
               **options) -> Child:
        """Start one of the job's processes here: its command and variables with the
        placeholders (PYTHON, CODE, ADDRESS, LOGS) filled in, its output in `log` (relative
        to the host's folder); `options` as Supervisor.start's. (RayLauncher starts it as
        an actor instead.)"""
        p = self.plan
        fill = filler(sys.executable, REPO, "127.0.0.1", os.path.abspath(p.folder),
                      socket.gethostname())
        if options.get("cwd"):
            options["cwd"] = fill(options["cwd"])
        return self.supervisor.start(name, [fill(a) for a in argv],
                                     env=self._env(**{k: fill(v) for k, v in env.items()}),
                                     log=os.path.join(p.host_dir, log),
                                     append=p.options.resume, **options)

    def _address(self, child: Child) -> str:
        """The address the others reach `child` at."""
        return "127.0.0.1"

    def start_all(self) -> None:
        """Start the job's processes; ChildFailed if the scheduler or the state server
        dies (or stays silent) before it listens."""
        p = self.plan
        sup = self.supervisor
        main = [PYTHON, os.path.join(CODE, "main.py")]

        # with a scheduler, the job can lose (and restart) a server or a worker
        # (one that exits with an error status failed in its code: not restarted)
        member = dict(fatal=self._fatal, restart=p.restarts, restart_errors=False) \
            if p.algorithm.parameter_server else {}

        def worker(k: int, env: Dict[str, str], extra: Sequence[str] = (),
                   ready: bool = False) -> Child:
            label = p.label(k)
            flags = ["-m", p.mode, *p.worker_args, *extra, *p.device_args(k), *p.links[k],
                     "--slowdown", f"{p.slowdowns[k]:g}", "--device-name", label, "-ld", LOGS]
            argv = [*main, *flags]
            if p.script:  # the user's script, its flags for esync.init in ESYNC_ARGS
                argv = [PYTHON, *p.script]
                env = dict(env, **{ARGS_VARIABLE: json.dumps(flags)})
            return self._start_role(f"worker{k}", argv, env, os.path.join(label, "worker.log"),
                                    ready=ready, **member)

        def evaluator(env: Dict[str, str]) -> None:
            self._start_role("evaluator", [*main, "-m", p.mode, *p.worker_args, "-ld", LOGS],
                             env, f"{registry.EVALUATOR}.log")

        # every mode's live page; ESync's budgets too
        state = self._start_role(
            "stateserver", [PYTHON, "manage.py", "runserver", "--noreload", f"{ADDRESS}:0"],
            {"ESYNC_STATE_DB": os.path.join(LOGS, HOST, STATE_DB)}, "stateserver.log",
            cwd=os.path.join(CODE, "stateserver"), essential=False, ready=True)
        scheduler = None
        cluster = {"DMLC_NUM_SERVER": str(p.servers), "DMLC_NUM_WORKER": str(p.workers)}
        if p.algorithm.parameter_server:  # starts while the state server does
            scheduler = self._start_role("scheduler", p.scheduler_argv(main),
                                         dict(cluster, DMLC_ROLE="scheduler",
                                              DMLC_PS_ROOT_URI=ADDRESS, DMLC_PS_ROOT_PORT="0"),
                                         "scheduler.log", ready=True)
        state_address = (self._address(state), sup.wait_ready(state))
        self._job_vars[LIVE_URL_ENV] = page_url(*state_address, self.job_id)
        self._report_live()
        if not p.algorithm.distributed:
            worker(0, {})
            return
        if not p.algorithm.parameter_server:  # DDP: torch.distributed's rendezvous
            ddp = {"WORLD_SIZE": str(p.workers)}
            rank0 = worker(0, dict(ddp, RANK="0", MASTER_ADDR=ADDRESS, MASTER_PORT="0"),
                           ready=True)
            ddp.update(MASTER_ADDR=self._address(rank0), MASTER_PORT=str(sup.wait_ready(rank0)))
            for k in range(1, p.workers):
                worker(k, dict(ddp, RANK=str(k)))
            if p.evaluator:
                evaluator(dict(ddp, DMLC_ROLE="evaluator"))
            return
        state_args: List[str] = []
        if p.algorithm.state_server:
            state_args = ["-ip", state_address[0], "-port", str(state_address[1])]
        cluster.update(DMLC_PS_ROOT_URI=self._address(scheduler),
                       DMLC_PS_ROOT_PORT=str(sup.wait_ready(scheduler)))
        if p.evaluator:
            evaluator(dict(cluster, DMLC_ROLE="evaluator"))
        for s in range(p.servers):
            self._start_role(f"server{s}", p.server_argv(main),
                             dict(cluster, DMLC_ROLE="server"), f"server{s}.log", **member)
        for k in range(p.workers):  # worker k is rank k, whatever order they register in
            worker(k, dict(cluster, DMLC_ROLE="worker", DMLC_WORKER_ID=str(k)), state_args)

    # --- the live page -----------------------------------------------------------------
    def _report_live(self) -> None:
        """Say where the job's live page is, and report there from now on."""
        url = self._job_vars[LIVE_URL_ENV]
        self.say(f"live page: {url}")
        self.live = LiveReporter(url, {"role": "launcher", "mode": self.plan.algorithm.key,
                                       "workers": self.plan.workers, "state": "running"},
                                 token=self._env().get(STATE_TOKEN_ENV))
        self._update_live()

    def _update_live(self) -> None:
        """The processes' states for the next report (the state server's own aside)."""
        if self.live is not None:
            self.live.update(processes={c.name: process_state(c) for c in self.children
                                        if c.name != "stateserver"})

    def _close_live(self, code: int) -> None:
        """The last report: how the job ended (before the state server stops)."""
        if self.live is not None:
            self._update_live()
            self.live.close({0: "finished", 130: "interrupted"}.get(code, "failed"))
            self.live = None

    # --- watching ---------------------------------------------------------------------
    def describe(self, child: Child) -> str:
        last = last_line(child.log)
        return (f"{child.name} exited with status {child.returncode}"
                f"{f': {last}' if last else ''} (log: {child.log})")

    def _read_accuracy(self, child: Child) -> None:
        """The latest test accuracy in what `child` logged since the last look."""
        offset = self._read_up_to.get(child.name, 0)
        try:
            with open(child.log, "rb") as f:
                f.seek(offset)
                new = f.read()
        except OSError:
            return
        whole = new[:new.rfind(b"\n") + 1]  # a line still being written: next time
        self._read_up_to[child.name] = offset + len(whole)
        found = ACCURACY.findall(whole.decode(errors="replace"))
        if found:
            self._accuracy = found[-1][1]

    def _rounds(self) -> int:
        """The latest round any device of this run logged (files left by an earlier run
        in the same folder, until the new run replaces them, do not count)."""
        rounds = 0
        try:  # every host's (on Ray, the job's nodes')
            devices = [d.path for h in os.scandir(self.plan.folder) if h.is_dir()
                       for d in os.scandir(h.path)
                       if d.is_dir() and d.name != registry.EVALUATOR]
        except OSError:
            return 0
        for folder in devices:
            try:
                latest = max((int(m.group(1)) for m in map(_ITER.search, os.listdir(folder))
                              if m), default=0)
                if latest > rounds and os.stat(os.path.join(
                        folder, f"iter-{latest}.json")).st_mtime >= self._started_at:
                    rounds = latest
            except OSError:
                continue
        return rounds

    def status(self) -> tuple:
        """(fraction done or None, `round R, E s, test accuracy A`)."""
        rounds = self._rounds()
        for child in self.children:
            if child.name.startswith("worker") or child.name == "evaluator":
                self._read_accuracy(child)
        elapsed = time.monotonic() - self._start
        p = self.plan
        fraction = None
        if p.stop_rounds:
            fraction = rounds / p.stop_rounds
        if p.stop_seconds:
            fraction = max(fraction or 0.0, elapsed / p.stop_seconds)
        return fraction, (f"round {rounds}, {elapsed:.0f} s, "
                          f"{METRIC_LINE[p.options.metric]} {self._accuracy or 'n/a'}")

    def status_line(self, status: Optional[tuple] = None) -> str:
        """The plain form of `status` (default: now): `[####....] esync: round 12, 31 s,
        test accuracy 0.91`."""
        fraction, text = status or self.status()
        bar = ""
        if fraction is not None:
            filled = int(20 * min(1.0, fraction))
            bar = f"[{'#' * filled}{'.' * (20 - filled)}] "
        return f"{bar}{os.path.basename(self.plan.folder)}: {text}"

    def _model_note(self) -> str:
        """`; the job's model: PATH` where rank 0 wrote it in this run (esync.join's
        MODEL_FILE, in its log folder)."""
        from esync.recorder import MODEL_FILE  # (not for esync-hosts, which imports this)

        for path in glob.glob(os.path.join(self.plan.folder, "*", "*", MODEL_FILE)):
            try:
                if os.stat(path).st_mtime >= self._started_at:
                    return f"; the job's model: {path}"
            except OSError:
                continue
        return ""

    def watch(self, bar: Progress) -> int:
        """Until the job ends or a child fails; returns the exit status."""
        while True:
            outcome = self.supervisor.wait(timeout=bar.refresh_s)
            self._update_live()
            if outcome is None:
                status = self.status()
                bar.show(*status, self.status_line(status))
                continue
            if outcome.failed is not None:
                bar.close()
                self.say(f"error: {self.describe(outcome.failed)}; stopping the job")
                return 1
            status = self.status()
            line = self.status_line(status) + lost_note(outcome.lost) + self._model_note()
            if bar.terminal:
                bar.show(*status, line)
                if self.nested:
                    bar.write(f"launch: done: {line}")
            else:
                self.say(f"done: {line}")
            bar.close()
            return 0

    def run(self) -> int:
        """Start the job and wait for it; the exit status. Stops every child at the end."""
        p = self.plan
        self.say(f"{p.algorithm.key} with {p.workers} worker(s) (slowdown "
                 f"{','.join(f'{f:g}' for f in p.slowdowns)})"
                 + (f" and {p.servers} server(s)" if p.algorithm.parameter_server else "")
                 + f"; logs in {p.folder}")
        bar = Progress(self.out, os.path.basename(p.folder), live=self.progress,
                       bounded=bool(p.stop_rounds or p.stop_seconds),
                       position=self.position, leave=not self.nested)
        self._start = time.monotonic()
        self._started_at = time.time() - 1.0  # file systems with coarse times
        code = 1
        try:
            with interrupt_on([signal.SIGTERM], raise_=lambda signum: KeyboardInterrupt()):
                try:
                    self.start_all()
                    code = self.watch(bar)
                except KeyboardInterrupt:
                    bar.close()
                    self.out.write("\n")
                    self.say("interrupted; stopping the job")
                    code = 130
                except ChildFailed as e:
                    bar.close()
                    self.say(f"error: {self.describe(e.child)}" if e.child.returncode is not None
                             else f"error: {e}" + (f" (log: {e.child.log})" if e.child.log
                                                   else ""))
                    code = 1
                finally:
                    bar.close()
                    self._close_live(code)
                    self.supervisor.close()
        except KeyboardInterrupt:  # a second one while stopping: the stop went on
            code = 130
        return code


def run(argv: Sequence[str], progress: bool = True, *, out: Optional[IO[str]] = None,
        position: int = 0, nested: bool = False, prog: str = PROG,
        script: Sequence[str] = ()) -> int:
    """Launch one job and wait for it; the exit status (raises LaunchError on bad input,
    before anything starts). `script`: esync-run's training script and its arguments."""
    planned = plan(argv, prog, script=script)
    progress = progress and "--no-progress" not in argv
    if planned.ray is not None:
        try:
            from esync.launch import onray  # ray: an optional extra
        except ImportError as e:
            raise LaunchError(f"--ray needs Ray: pip install -e '.[ray]' ({e})") from None
        return onray.run(planned, progress, out, position, nested)
    launcher = Launcher(planned, progress=progress, position=position, nested=nested)
    if out is not None:
        launcher.out = out
    return launcher.run()


def main(argv: Optional[Sequence[str]] = None, prog: str = PROG) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return run(argv, prog=prog)
    except LaunchError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2


def console_main() -> int:
    """The `esync-launch` command."""
    return main(prog="esync-launch")


if __name__ == "__main__":
    sys.exit(main())
