"""A job, as every launcher sees it: what to start (`Plan`, decided from esync-launch's
command line before anything starts) and its role topology (`roles`: which processes,
in which order, with which cluster variables, and whom each must reach), built once.

Three backends start the same roles (`Backend`: `endpoint` and `start`):

- esync/launch/launcher.py's `Launcher`: each role a child process on this machine
  (esync/launch/supervisor.py), on loopback;
- esync/launch/onray.py's `RayLauncher`: each role a Ray actor that runs that process;
- esync/launch/hosts.py: each role a shell command printed for its host (or a Slurm
  step).

A role that others reach (the state server, the scheduler, DDP's rank 0) is named in
their variables and flags by placeholders, `address_of(name)` and `port_of(name)`,
which a backend fills where it starts them (`Role.resolved`): a host file gives fixed
addresses and ports; on this machine and on Ray the role binds a free port (its own
endpoint, before it runs, is `ADDRESS:0`) and reports it (esync.infra.ready), and the
launcher waits for that report before it starts a role that needs it.

Also the placeholders of a process's command filled where it starts (`filler`), the
job's key and token (`job_secrets`), what a process keeps of the launcher's environment
(`inherited`) and why it ended (`last_line`). Imports no ray and no torch.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import socket
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple

import esync
from esync import registry
from esync.logs.live import JOB_ID_ENV
from esync.logs.live import URL_ENV as LIVE_URL_ENV
from esync.options import ARGS_VARIABLE, Options
from esync.infra.stateclient import TOKEN_ENV as STATE_TOKEN_ENV
from esync.transport.auth import KEY_ENV, KEY_FILE_ENV, job_key, new_key

#: the checkout (main.py and the state server's Django project, stateserver/): the
#: folder above the package's src/ (computed here only)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(esync.__file__))))
#: placeholders in a role's command, variables and folder, filled where it starts (this
#: machine, or its Ray node): the Python that runs it, the checkout (main.py's folder),
#: the address others reach it at, the log folder (-ld), the host's name
PYTHON, CODE, ADDRESS = "<esync:python>", "<esync:code>", "<esync:address>"
LOGS, HOST = "<esync:logs>", "<esync:host>"
#: the state server's database, in its host's log folder
STATE_DB = "stateserver.sqlite3"
#: what gives the job its key and the state server its token (--no-auth: none of them)
AUTH_VARIABLES = (KEY_ENV, KEY_FILE_ENV, STATE_TOKEN_ENV)
#: the roles of a job's processes (DMLC_ROLE's values, and the state server)
STATESERVER, SCHEDULER, SERVER, WORKER, EVALUATOR = (
    "stateserver", "scheduler", "server", "worker", "evaluator")
_ENDPOINT = re.compile(r"<esync:(address|port):([a-z]+[0-9]*)>")

Endpoint = Tuple[str, str]  # (address, port) where the others reach a role


def address_of(name: str) -> str:
    """The placeholder of the address at which the others reach role `name`."""
    return f"<esync:address:{name}>"


def port_of(name: str) -> str:
    """The placeholder of the port at which the others reach role `name`."""
    return f"<esync:port:{name}>"


# --- the role topology ----------------------------------------------------------------

@dataclass(frozen=True)
class Role:
    """One process of a job, as far as the topology decides it."""

    name: str    # stateserver, scheduler, evaluator, server<s>, worker<k>
    kind: str    # STATESERVER, SCHEDULER, SERVER, WORKER or EVALUATOR
    index: int = 0  # a server's number, a worker's rank
    #: its cluster variables (DMLC_*, or torch.distributed's), in their order
    env: Dict[str, str] = field(default_factory=dict)
    #: main.py flags the topology gives it: a worker's state server (-ip, -port)
    flags: Tuple[str, ...] = ()
    listens: bool = False  # the others reach it: it reports the port it binds

    def resolved(self, endpoint: Callable[[str], Endpoint]) -> "Role":
        """The role with its endpoint placeholders filled by `endpoint(name)`."""
        def fill(text: str) -> str:
            return _ENDPOINT.sub(lambda m: endpoint(m.group(2))[m.group(1) == "port"], text)

        return replace(self, env={k: fill(v) for k, v in self.env.items()},
                       flags=tuple(fill(f) for f in self.flags))


def cluster_variables(kind: str, servers: int, workers: int,
                      rank: Optional[int] = None) -> Dict[str, str]:
    """A parameter-server job's DMLC_* variables for a process of role `kind` (a worker:
    with its rank, DMLC_WORKER_ID, which it keeps from run to run)."""
    env = {"DMLC_ROLE": kind, "DMLC_PS_ROOT_URI": address_of(SCHEDULER),
           "DMLC_PS_ROOT_PORT": port_of(SCHEDULER), "DMLC_NUM_SERVER": str(servers),
           "DMLC_NUM_WORKER": str(workers)}
    if rank is not None:
        env["DMLC_WORKER_ID"] = str(rank)
    return env


def roles(shape: str, servers: int, workers: int, *, evaluator: bool = False,
          state_server: bool = True, state_flags: bool = False) -> List[Role]:
    """A job's processes in the order they start. `shape`: "alone" (one worker, no
    cluster: -m local), "ddp" (torch.distributed's rendezvous at rank 0) or "ps" (a
    scheduler; `servers` servers, none with the all-reduce backend). `state_flags`: the
    workers are given the state server's address (-ip, -port)."""
    out = [Role(STATESERVER, STATESERVER, listens=True)] if state_server else []
    if shape == "alone":
        return out + [Role("worker0", WORKER)]
    if shape == "ddp":
        master = {"WORLD_SIZE": str(workers), "MASTER_ADDR": address_of("worker0"),
                  "MASTER_PORT": port_of("worker0")}
        out += [Role(f"worker{k}", WORKER, k, dict(master, RANK=str(k)), listens=k == 0)
                for k in range(workers)]
        if evaluator:
            out.append(Role(EVALUATOR, EVALUATOR, env=dict(master, DMLC_ROLE=EVALUATOR)))
        return out
    out.append(Role(SCHEDULER, SCHEDULER, env=cluster_variables(SCHEDULER, servers, workers),
                    listens=True))
    if evaluator:
        out.append(Role(EVALUATOR, EVALUATOR,
                        env=cluster_variables(EVALUATOR, servers, workers)))
    out += [Role(f"server{s}", SERVER, s, cluster_variables(SERVER, servers, workers))
            for s in range(servers)]
    state = ("-ip", address_of(STATESERVER), "-port", port_of(STATESERVER)) \
        if state_flags else ()
    out += [Role(f"worker{k}", WORKER, k, cluster_variables(WORKER, servers, workers, k),
                 state) for k in range(workers)]  # worker k is rank k, in every run
    return out


class Backend(Protocol):
    """Where a job's roles run: processes here, Ray actors, or printed commands."""

    def endpoint(self, name: str) -> Endpoint:
        """Where the others reach role `name` (address, port); before it starts, where
        it binds."""

    def start(self, role: Role) -> None:
        """Start one role (or write its command down), in the topology's order."""


def launch(job: Sequence[Role], backend: Backend) -> None:
    """Start the roles of a job on `backend`, in order."""
    for role in job:
        backend.start(role)


# --- the plan -------------------------------------------------------------------------

@dataclass
class RayPlan:
    """--ray's settings (esync/launch/onray.py acts on them)."""

    address: Optional[str]  # ray.init's address; None: RAY_ADDRESS, else a new local instance
    servers_on: str         # where the scheduler, servers, state server and evaluator go
    timeout: float          # seconds to wait for the cluster to free the job's resources


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
    ray: Optional[RayPlan] = None  # --ray: where and how to place the job on Ray
    #: esync-run: the user's script and its arguments, run as each worker in place of
    #: main.py, with main.py's flags in ESYNC_ARGS (esync.runtime.api.init reads them)
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

    def roles(self) -> List[Role]:
        """The job's processes, in the order they start: every mode's state server (the
        live page; ESync's budgets too), then the algorithm's cluster."""
        algorithm = self.algorithm
        shape = ("ps" if algorithm.parameter_server else "ddp") if algorithm.distributed \
            else "alone"
        return roles(shape, self.servers, self.workers, evaluator=self.evaluator,
                     state_flags=algorithm.state_server)

    def command(self, role: Role) -> Tuple[List[str], Dict[str, str], str]:
        """A role's command, its variables beyond the topology's, and its log file
        (relative to its host's folder), with placeholders (PYTHON, CODE, ADDRESS, LOGS,
        HOST) to fill where it starts."""
        main = [PYTHON, os.path.join(CODE, "main.py")]
        if role.kind == STATESERVER:
            return ([PYTHON, "manage.py", "runserver", "--noreload", f"{ADDRESS}:0"],
                    {"ESYNC_STATE_DB": os.path.join(LOGS, HOST, STATE_DB)}, "stateserver.log")
        if role.kind == SCHEDULER:
            return self.scheduler_argv(main), {}, "scheduler.log"
        if role.kind == SERVER:
            return self.server_argv(main), {}, f"server{role.index}.log"
        if role.kind == EVALUATOR:
            return ([*main, "-m", self.mode, *self.worker_args, "-ld", LOGS], {},
                    f"{registry.EVALUATOR}.log")
        k = role.index
        label = self.label(k)
        flags = ["-m", self.mode, *self.worker_args, *role.flags, *self.device_args(k),
                 *self.links[k], "--slowdown", f"{self.slowdowns[k]:g}", "--device-name",
                 label, "-ld", LOGS]
        log = os.path.join(label, "worker.log")
        if self.script:  # the user's script, its flags for esync.init in ESYNC_ARGS
            return [PYTHON, *self.script], {ARGS_VARIABLE: json.dumps(flags)}, log
        return [*main, *flags], {}, log


# --- where a process starts -----------------------------------------------------------

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


def inherited(environ: Mapping[str, str], auth: bool) -> Dict[str, str]:
    """What a job's process keeps of the environment it is started from: not the cluster
    variables of another job (DMLC_*, torch.distributed's), nor, without `auth`, a key
    or token."""
    return {k: v for k, v in environ.items() if not k.startswith("DMLC_")
            and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK",
                          LIVE_URL_ENV, JOB_ID_ENV)
            and (auth or k not in AUTH_VARIABLES)}


# --- how a process ended --------------------------------------------------------------

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
