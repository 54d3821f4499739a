"""The commands of a job on a real multi-host cluster, from a host file: for each process
of the job, the shell command that starts it on its host (DMLC_* variables and `python
main.py ...`), printed for you to run by hand or from your own scripts, or, with
`--slurm`, a Slurm batch script that starts and watches them all.

    esync-hosts HOSTFILE [--port 9091] [--state-port 10010]
        [--remote-dir ~/esync] [--ssh-form [--ssh "ssh -o BatchMode=yes"] | --slurm]
        [--no-auth] -- [main.py flags, e.g. -m esync -n resnet18-v1 -dd data]

Everything after `--` is passed to every main.py (scheduler, servers and workers), the
flags of checkpoints and failures (--checkpoint-dir, --resume 1, ...) included.

Host file: one line per host; `#` starts a comment, blank lines are ignored; a value
with spaces is quoted as in a shell (dir="/data/my esync").

    HOST [key=value ...]

    # example: scheduler, server and state server on cloud1, four GPU workers
    cloud1 roles=scheduler,server,stateserver iface=eno2
    cloud2 workers=2 gpus=0,1
    cloud3 workers=2 gpus=0,1 slowdown=2 dir=/opt/esync python=/opt/venv/bin/python

  HOST          the host (`user@host` allowed: what --ssh-form's ssh connects to); the
                name without `user@` must be reachable from every other host: it becomes
                DMLC_PS_ROOT_URI (the scheduler's host) and -ip (the state server's
                host). A host may appear on one line only.
  roles=R,...   among scheduler, server, worker, stateserver (default: worker)
  workers=N     worker processes on this host (default 1; needs the worker role)
  gpus=G,...    worker k of this host gets `-g G[k % len]`; absent: `-c 1` (the CPU)
  slowdown=F    F >= 1, passed to this host's workers as `--slowdown F`
  dir=PATH      the repository's checkout on this host (default: --remote-dir);
                a leading `~` is left to the host's shell
  python=PATH   the Python that runs main.py / manage.py (default: python)
  iface=NAME    DMLC_INTERFACE for this host's scheduler, server and workers

Exactly one host has `scheduler`; at least one has `server` (one server per such host)
and at least one has a worker; at most one has `stateserver`, and one must when `-m
esync` is among the main.py flags. A bad host file is one line naming FILE:LINE,
exit status 2.

Output: for each process, in the order state server, scheduler, servers, workers, a
comment line `# HOST: ROLE` (workers: `# HOST: worker K`, K their index on that host)
and the shell command to run ON that host:

    cd DIR && env DMLC_ROLE=... DMLC_PS_ROOT_URI=<scheduler host> DMLC_PS_ROOT_PORT=<port>
        DMLC_NUM_SERVER=<servers> DMLC_NUM_WORKER=<workers> [DMLC_WORKER_ID=<rank>]
        [DMLC_INTERFACE=...] PYTHON main.py <main.py flags> [worker flags]

(a worker's DMLC_WORKER_ID is its rank: the host file's workers in order, from 0, so
that each keeps its rank, its data and its name from run to run)
    cd DIR/stateserver && PYTHON manage.py runserver 0.0.0.0:<state port>

Worker flags, after the main.py flags so that they win: `--device-name SHORT-wK` (SHORT:
the host's first name label, or the whole name when two hosts share it or it is an IP
address), `-g G` or `-c 1`, `--slowdown F` (when set), and `-ip <state server host>
-port <state port>` when there is a state server. Every argument is quoted for a POSIX
shell. With `--ssh-form`, each command line is instead the complete command to run from
here: `SSH -tt HOST 'command'` (SSH: `--ssh` split like a shell; `-tt` is added unless
it already has -t/-tt/-T: the remote process then gets a terminal, so that it dies of
SIGHUP when its ssh ends).

The job's key and token (--slurm: see below): unless `--no-auth`, every process gets
the job's key (ESYNC_JOB_KEY_FILE: CurveZMQ for all ZeroMQ traffic) and the state
server's token (ESYNC_STATE_TOKEN), fresh for each job (the user's ESYNC_JOB_KEY, or
the file ESYNC_JOB_KEY_FILE names, read here, and ESYNC_STATE_TOKEN, where exported).
Neither is on any process's command line (ps shows those): each host keeps them in
files of mode 0600, DIR/.esync/jobs/<id>/job.key and state.token, and each command
reads them:

    cd DIR && ESYNC_JOB_KEY_FILE="$PWD/.esync/jobs/<id>/job.key"
        ESYNC_STATE_TOKEN="$(cat .esync/jobs/<id>/state.token)" env DMLC_ROLE=...
        PYTHON main.py ...

The commands start with one per host that stores the two files, `# HOST: the job's key
and token (run first)`, which reads them from its input:

    printf '%s\\n' KEY TOKEN | sh -c 'cd DIR && umask 077 && mkdir -p .esync/jobs/<id> && ...'

(`--ssh-form`: `printf '%s\\n' KEY TOKEN | SSH -T HOST '...'`); remove the folder after
the job.

`--slurm` prints, instead, a bash script for Slurm's `sbatch` (`hosts.py HOSTFILE
--slurm -- FLAGS > job.sh`, then `sbatch job.sh`) that runs the whole job:

  * `#SBATCH` lines: --job-name=esync, --nodes=<hosts>, --nodelist=<the hosts, without
    `user@`>, --ntasks-per-node=<the most processes on one host> (each host gets at
    least that many CPUs), and, when a host has gpus=, --gres=gpu:N (N: the highest GPU
    number given, plus one: Slurm numbers the GPUs it gives the job on a host from 0,
    and `-g G` counts among those). sbatch's other options (--time, --partition,
    --account, ...) go on its command line, which wins over the script's lines.
  * The job's key and token, unless --no-auth: the script exports ESYNC_JOB_KEY and
    ESYNC_STATE_TOKEN when it runs, fresh (the key drawn on the first host by its Python,
    `python -m esync.transport.auth`, in a step of its own; the token from
    /dev/urandom) unless exported when the job was submitted (sbatch passes the
    environment on; ESYNC_JOB_KEY_FILE too, then read on each host). Every step gets
    them in its environment (srun passes it on): on no command line, in no file. No key
    or token is written into the script. With --no-auth it unsets all three.
  * Each process is one job step, started in the background:
    `srun --nodes=1 --ntasks=1 --nodelist=HOST --overlap bash -c 'COMMAND' &`
    (--overlap: the steps on one host share the CPUs, memory and GPUs the job has there,
    as processes started by hand do; without it a step can wait for ever for resources
    another step holds.)
  * It then waits. When every scheduler, server and worker step has exited 0, it stops
    the state server's step and exits 0. When one fails (or the state server's ends
    first), it stops every other step (SIGTERM to its srun, which passes it on to the
    step's processes; SIGKILL after 10 s) and exits 1. On SIGINT, SIGTERM or SIGHUP it
    stops every step and exits 128 + the signal's number.
  * Every process writes to the job's output file (slurm-<job id>.out); the script's own
    lines there start with `esync:`. Needs Slurm 20.11 or later (srun --overlap) and
    bash; the host names must be Slurm's node names (`sinfo -N`), which the hosts also
    reach each other by.

hosts.py starts nothing itself. To start and supervise processes on other machines,
use `esync-launch --ray` (a Ray cluster) or `--slurm` here. Nothing is restarted
(esync-launch's --restart-failed is for one machine): a server or worker process started
again by hand with its printed command rejoins the job (see main.py's
--on-worker-failure, --server-patience).

The main.py flags are checked by main.py's own parser (esync.options) before anything
is printed: a bad one is one line, exit status 2. Which algorithm needs a state server
comes from esync.registry; the job key from esync.transport.auth; the roles, their
order and their DMLC_* variables from esync/launch/job.py, as for esync-launch (this
file is that job model's third backend: each role a printed command). It imports
nothing of the runtime (and no torch): it only writes commands.
"""
from __future__ import annotations

import argparse
import ipaddress
import os
import re
import secrets
import shlex
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from esync import config
from esync import registry
from esync.errors import OneLineParser, UserError, command_main
from esync.algorithms.policy import check_aggregation
from esync.options import parse_options
from esync.transport.auth import KEY_ENV, KEY_FILE_ENV, job_key, new_key
from esync.logs.live import JOB_ID, JOB_ID_ENV, JOB_ID_FORM, page_url
from esync.logs.live import URL_ENV as LIVE_URL_ENV
from esync.infra.stateclient import TOKEN_ENV as STATE_TOKEN_ENV
from esync.launch.job import (SCHEDULER, STATESERVER, WORKER, Endpoint, Role, launch,
                              new_token, roles)

ROLES = ("scheduler", "server", "worker", "stateserver")
KEYS = ("roles", "workers", "gpus", "slowdown", "dir", "python", "iface")
WORKER_KEYS = ("workers", "gpus", "slowdown")
DEFAULT_SSH = "ssh -o BatchMode=yes"
DEFAULT_REMOTE_DIR = "~/esync"
PROG = "hosts.py"
_HOST = re.compile(r"^(?:[A-Za-z0-9_.+-]+@)?(?:[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\])$")
_TILDE = re.compile(r"^~[A-Za-z0-9._-]*(/|$)")
#: where each host keeps a job's key and token: DIR/SECRETS_DIR/<id>/, mode 0700
SECRETS_DIR = ".esync/jobs"
KEY_FILE = "job.key"
TOKEN_FILE = "state.token"
#: --slurm: seconds from SIGTERM to SIGKILL when the script stops the job's steps
SLURM_GRACE_S = 10


#: a bad host file (or host file and flags that do not fit): one line, exit 2 (esync.errors'
#: one type, under the name this module's callers know)
HostFileError = UserError


@dataclass
class Host:
    name: str                      # as written (`user@` included)
    line: int                      # its line in the host file
    roles: Tuple[str, ...] = ("worker",)
    workers: int = 1               # worker processes (0 without the worker role)
    gpus: Optional[Tuple[int, ...]] = None
    slowdown: Optional[str] = None  # as written, checked to be a number >= 1
    dir: Optional[str] = None      # None: --remote-dir
    python: str = "python"
    iface: Optional[str] = None

    @property
    def address(self) -> str:
        """The name other hosts reach it by: without `user@` and IPv6 brackets."""
        return self.name.rsplit("@", 1)[-1].strip("[]")


@dataclass(frozen=True)
class JobSecrets:
    """A job's key and the state server's token, and the folder, relative to each
    host's checkout, where the hosts keep them."""

    key: str
    token: str
    folder: str

    @classmethod
    def for_job(cls, environ=os.environ) -> "JobSecrets":
        """The user's key (ESYNC_JOB_KEY, or the file ESYNC_JOB_KEY_FILE names, read
        here) and token (ESYNC_STATE_TOKEN), else fresh ones; UserError naming the
        variable if one is bad."""
        found = job_key(environ, warn=False)
        token = environ.get(STATE_TOKEN_ENV) or new_token()
        if any(c in token for c in "\r\n\0"):
            raise UserError(f"{STATE_TOKEN_ENV}: expected one line")
        return cls(found.secret.decode() if found else new_key(), token,
                   f"{SECRETS_DIR}/{secrets.token_hex(6)}")

    @property
    def input(self) -> str:
        """What the store command reads: the key and the token, a line each."""
        return f"{self.key}\n{self.token}\n"

    def assignments(self, up: str = "") -> str:
        """Shell assignments, before a command run in the checkout (`up`: `../` from
        its stateserver/ folder), that give it the key's file and the token: read on
        the host, on no command line."""
        path = f"{up}{self.folder}"
        return (f'{KEY_FILE_ENV}="$PWD/{path}/{KEY_FILE}" '
                f'{STATE_TOKEN_ENV}="$(cat {path}/{TOKEN_FILE})" ')

    def store(self, checkout: str) -> str:
        """The command, run on a host, that stores the key and the token it reads (a
        line each) in files of mode 0600 under `checkout`."""
        f = self.folder
        return (f"cd {_quote_path(checkout)} && umask 077 && mkdir -p {f} && "
                f"IFS= read -r key && IFS= read -r token && "
                f'printf "%s\\n" "$key" > {f}/{KEY_FILE} && '
                f'printf "%s\\n" "$token" > {f}/{TOKEN_FILE}')

    def remove(self, checkout: str) -> str:
        """The command, run on a host, that removes them."""
        return f"cd {_quote_path(checkout)} && rm -rf {self.folder}"

    def printed(self) -> str:
        """`printf '%s\\n' KEY TOKEN`: a shell builtin, so they are on no command line."""
        return f"printf '%s\\n' {shlex.quote(self.key)} {shlex.quote(self.token)}"


# --- host file ------------------------------------------------------------------------

def _line_error(path: str, line: int, message: str) -> UserError:
    return UserError(f"{path}:{line}: {message}")


def _parse_line(path: str, number: int, fields: List[str]) -> Host:
    name = fields[0]
    if "=" in name or not _HOST.match(name) or name.startswith("-"):
        raise _line_error(path, number, f"expected a host name first, got {name!r}")
    host = Host(name=name, line=number)
    seen = set()
    for item in fields[1:]:
        key, eq, value = item.partition("=")
        if not eq:
            raise _line_error(path, number, f"expected key=value, got {item!r}")
        if key not in KEYS:
            raise _line_error(path, number, f"unknown key {key!r} (known: {', '.join(KEYS)})")
        if key in seen:
            raise _line_error(path, number, f"{key}= given twice")
        seen.add(key)
        if not value:
            raise _line_error(path, number, f"{key}= needs a value")
        if key == "roles":
            roles = value.split(",")
            for role in roles:
                if role not in ROLES:
                    raise _line_error(path, number, f"unknown role {role!r} in roles= "
                                                    f"(known: {', '.join(ROLES)})")
            if len(set(roles)) != len(roles):
                raise _line_error(path, number, f"a role repeated in roles={value}")
            host.roles = tuple(roles)
        elif key == "workers":
            if not re.fullmatch(r"[0-9]+", value) or int(value) < 1:
                raise _line_error(path, number, f"workers= expects a positive integer, "
                                                f"got {value!r}")
            host.workers = int(value)
        elif key == "gpus":
            if not re.fullmatch(r"[0-9]+(,[0-9]+)*", value):
                raise _line_error(path, number, f"gpus= expects GPU numbers such as 0,1, "
                                                f"got {value!r}")
            host.gpus = tuple(int(g) for g in value.split(","))
        elif key == "slowdown":
            try:
                factor = float(value)
            except ValueError:
                factor = float("nan")
            if not (1.0 <= factor < float("inf")):
                raise _line_error(path, number, f"slowdown= expects a number >= 1, "
                                                f"got {value!r}")
            host.slowdown = value
        elif key == "dir":
            host.dir = value
        elif key == "python":
            host.python = value
        elif key == "iface":
            host.iface = value
    if "worker" not in host.roles:
        extra = [k for k in WORKER_KEYS if k in seen]
        if extra:
            raise _line_error(path, number, f"{'= and '.join(extra)}= given, but the host "
                                            f"has no worker role (roles={','.join(host.roles)})")
        host.workers = 0
    return host


def parse_hostfile(path: str) -> List[Host]:
    """The hosts of a host file, in file order (see the module's docstring for the format).

    Raises UserError (message `PATH:LINE: problem` or `PATH: problem`) on a bad line,
    a host given twice, no or two schedulers, no worker, two state servers. (Whether the
    job needs a server depends on main.py's --backend: `commands` checks it.)"""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read the host file: "
                        f"{getattr(e, 'strerror', None) or e}") from None
    hosts: List[Host] = []
    by_name: Dict[str, Host] = {}
    first: Dict[str, Host] = {}
    for number, raw in enumerate(lines, 1):
        try:
            fields = shlex.split(raw, comments=True)
        except ValueError as e:
            raise _line_error(path, number, f"{e} (values are quoted as in a shell)") from None
        if not fields:
            continue
        host = _parse_line(path, number, fields)
        if host.address in by_name:
            raise _line_error(path, number, f"host {host.address} is already on line "
                                            f"{by_name[host.address].line}")
        by_name[host.address] = host
        for role in ("scheduler", "stateserver"):
            if role in host.roles:
                if role in first:
                    raise _line_error(path, number, f"a second {role} (the first is "
                                                    f"{first[role].name}, line {first[role].line})")
                first[role] = host
        hosts.append(host)
    if "scheduler" not in first:
        raise UserError(f"{path}: no host has the scheduler role (roles=scheduler,...)")
    if not any("worker" in h.roles for h in hosts):
        raise UserError(f"{path}: no host has a worker")
    return hosts


# --- commands -------------------------------------------------------------------------

def _quote_path(path: str) -> str:
    """shlex.quote, but a leading `~/` or `~user/` stays unquoted: the remote shell
    expands it only so."""
    match = _TILDE.match(path)
    if not match:
        return shlex.quote(path)
    rest = path[match.end():]
    return match.group(0) + (shlex.quote(rest) if rest else "")


def _join_path(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name if base.rstrip("/") else "/" + name


def options_of(flags: Sequence[str]):
    """main.py's settings from its flags, parsed by its own parser; UserError (one line
    naming the flag) if a flag is bad."""
    try:
        return parse_options(list(flags), prog="main.py")
    except UserError as e:
        raise UserError(f"{e} (a main.py flag after --)") from None


def algorithm_of(flags: Sequence[str]) -> registry.Algorithm:
    """The algorithm main.py's flags select (UserError as `options_of`)."""
    return options_of(flags).algorithm


def _short_names(hosts: Sequence[Host]) -> Dict[str, str]:
    """Per host: its first name label, or its whole address if that is an IP address or
    another host has the same first label."""
    def short(address: str) -> str:
        try:
            ipaddress.ip_address(address)
            return address
        except ValueError:
            return address.split(".", 1)[0] or address
    shorts = {h.address: short(h.address) for h in hosts}
    counts: Dict[str, int] = {}
    for s in shorts.values():
        counts[s] = counts.get(s, 0) + 1
    return {a: (s if counts[s] == 1 else a) for a, s in shorts.items()}


def checkout(host: Host, args) -> str:
    """The repository's checkout on `host`: its dir=, or --remote-dir."""
    return host.dir or getattr(args, "remote_dir", DEFAULT_REMOTE_DIR)


def commands(hosts: Sequence[Host], args,
             job: Optional[JobSecrets] = None) -> List[Tuple[str, str, str]]:
    """(host, role, shell command to run on that host) for every process of the job, in
    the order state server, scheduler, servers, workers. `args` needs `port`,
    `state_port`, `remote_dir` and `flags` (main.py's flags), as main()'s parser gives;
    with `job`, each command reads the job's key and token on its host (see
    `secret_commands`). Raises UserError when the algorithm needs a state server and
    no host has one, or a main.py flag is bad."""
    path = getattr(args, "hostfile", "host file")
    flags = list(getattr(args, "flags", []) or [])
    scheduler = next(h for h in hosts if "scheduler" in h.roles)
    state = next((h for h in hosts if "stateserver" in h.roles), None)
    opts = options_of(flags)
    algorithm = opts.algorithm
    if state is None and algorithm.state_server:
        raise UserError(f"{path}: {' '.join(algorithm.flags)} needs a host with the "
                        f"stateserver role (roles=...,stateserver)")
    num_servers = sum("server" in h.roles for h in hosts)
    all_reduce = opts.backend == "allreduce"
    if not num_servers and not all_reduce:
        raise UserError(f"{path}: no host has the server role (roles=server,...)")
    if all_reduce and num_servers:
        raise UserError(f"{path}: --backend allreduce runs without servers: no host "
                        f"takes the server role")
    try:
        check_aggregation(opts, num_servers if algorithm.parameter_server else None)
    except UserError as e:
        raise UserError(f"{e} (a main.py flag after --)") from None
    printed = _Commands(hosts, args, job, scheduler, state, flags)
    launch(roles("ps", num_servers, sum(h.workers for h in hosts),
                 state_server=state is not None, state_flags=state is not None), printed)
    return printed.out


@dataclass
class _Commands:
    """The job's roles as shell commands, each on its host (a job.Backend): the host
    file's scheduler and state server at their fixed ports."""

    hosts: Sequence[Host]
    args: object
    job: Optional[JobSecrets]
    scheduler: Host
    state: Optional[Host]
    flags: List[str]
    out: List[Tuple[str, str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.servers = [h for h in self.hosts if "server" in h.roles]
        #: worker k (its rank: the host file's workers in order) and its index on its host
        self.workers = [(h, k) for h in self.hosts for k in range(h.workers)]
        self.shorts = _short_names(self.hosts)
        self.live = live_url(self.hosts, self.args)
        self.remote_dir = getattr(self.args, "remote_dir", DEFAULT_REMOTE_DIR)
        self.endpoints = {SCHEDULER: (self.scheduler.address,
                                      str(getattr(self.args, "port", config.SCHEDULER_PORT)))}
        if self.state is not None:
            self.endpoints[STATESERVER] = (self.state.address, str(getattr(
                self.args, "state_port", config.STATE_SERVER_PORT)))

    def endpoint(self, name: str) -> Endpoint:
        """(Backend) The host file's host of role `name`, and its port (--port,
        --state-port)."""
        return self.endpoints[name]

    def _auth(self, up: str = "") -> str:
        return self.job.assignments(up) if self.job is not None else ""

    def start(self, role: Role) -> None:
        """(Backend) The role's command, on its host: the state server in its folder,
        listening on every interface; the others as `env VARIABLES PYTHON main.py
        FLAGS`, a worker's own flags after the job's."""
        if role.kind == STATESERVER:
            state, port = self.state, self.endpoints[STATESERVER][1]
            self.out.append((state.name, STATESERVER, (
                f"cd {_quote_path(_join_path(state.dir or self.remote_dir, 'stateserver'))} "
                f"&& {self._auth('../')}{_quote_path(state.python)} manage.py runserver "
                f"{shlex.quote(f'0.0.0.0:{port}')}")))
            return
        role = role.resolved(self.endpoint)
        extra: List[str] = []
        if role.kind == SCHEDULER:
            host = self.scheduler
        elif role.kind == WORKER:
            host, k = self.workers[role.index]
            extra = ["--device-name", f"{self.shorts[host.address]}-w{k}"]
            extra += ["-g", str(host.gpus[k % len(host.gpus)])] if host.gpus else ["-c", "1"]
            if host.slowdown is not None:
                extra += ["--slowdown", host.slowdown]
        else:
            host = self.servers[role.index]
        env = [f"{k}={v}" for k, v in role.env.items()]
        if host.iface:
            env.append(f"DMLC_INTERFACE={host.iface}")
        if self.live is not None:
            env += [f"{JOB_ID_ENV}={self.args.job_id}", f"{LIVE_URL_ENV}={self.live}"]
        words = [shlex.quote(w) for w in env]
        words.append(_quote_path(host.python))
        words += [shlex.quote(w) for w in ["main.py", *self.flags, *extra, *role.flags]]
        self.out.append((host.name, role.kind, f"cd {_quote_path(host.dir or self.remote_dir)} "
                                               f"&& {self._auth()}env " + " ".join(words)))


def secret_commands(hosts: Sequence[Host], args,
                    job: JobSecrets) -> List[Tuple[str, str, str]]:
    """(host, command that stores the job's key and token, command that removes them),
    to run on each host; the store command reads the two from its input (a line
    each: `job.input`)."""
    return [(h.name, job.store(checkout(h, args)), job.remove(checkout(h, args)))
            for h in hosts]


def labels(cmds: Sequence[Tuple[str, str, str]]) -> List[str]:
    """`HOST ROLE` per command; workers are `HOST worker K`, K their index on the host."""
    counts: Dict[str, int] = {}
    result = []
    for host, role, _ in cmds:
        if role == "worker":
            k = counts.get(host, 0)
            counts[host] = k + 1
            result.append(f"{host} worker {k}")
        else:
            result.append(f"{host} {role}")
    return result


def ssh_argv(ssh: str, host: str, command: str, tty: bool = True) -> List[str]:
    """The local command that runs `command` on `host`: --ssh, `-tt` unless it has a -t/-T
    option already (tty=False: `-T`, whatever it has: the input is passed on as is), the
    host, the command."""
    argv = shlex.split(ssh)
    if not tty:
        argv.append("-T")
    elif not any(a in ("-t", "-tt", "-T") for a in argv[1:]):
        argv.append("-tt")
    return [*argv, host, command]


# --- Slurm ----------------------------------------------------------------------------

#: the --slurm script's part that follows its steps: waiting for them, stopping them
_SLURM_WAIT = """\

# Wait: the job is done when every scheduler, server and worker step has exited 0; one
# that fails, or the state server's step ending first, ends it as a failure.
while [ "$left" -gt 0 ]; do
    sleep 1
    for pid in "${!label[@]}"; do
        kill -0 "$pid" 2>/dev/null && continue  # still running
        wait "$pid"
        status=$?
        name=${label[$pid]}
        unset "label[$pid]"
        if [ "$pid" = "$service" ]; then
            echo "esync: $name ended (status $status) before the job; stopping the others" >&2
        elif [ "$status" -ne 0 ]; then
            echo "esync: $name exited with status $status; stopping the others" >&2
        else
            left=$((left - 1))
            continue
        fi
        stop
        exit 1
    done
done
echo "esync: every scheduler, server and worker exited 0" >&2
stop  # the state server, if any
exit 0
"""

#: the --slurm script's functions: stopping the steps (bash, after `label=()`)
_SLURM_STOP = """\
running() {  # whether a step's srun still runs
    local pid
    for pid in "${!label[@]}"; do
        kill -0 "$pid" 2>/dev/null && return 0
    done
    return 1
}

stop() {  # stop every step still running: SIGTERM to its srun, which passes it on to
          # the step's processes; SIGKILL after @GRACE@ s
    local n=0
    trap '' INT TERM HUP
    [ "${#label[@]}" -gt 0 ] || return 0
    kill -TERM "${!label[@]}" 2>/dev/null
    while running && [ "$n" -lt @TENTHS@ ]; do
        sleep 0.1
        n=$((n + 1))
    done
    kill -KILL "${!label[@]}" 2>/dev/null
    wait
}

on_signal() {  # on_signal NAME STATUS
    echo "esync: $1; stopping every step" >&2
    stop
    exit "$2"
}
trap 'on_signal SIGINT 130' INT
trap 'on_signal SIGTERM 143' TERM
trap 'on_signal SIGHUP 129' HUP
"""


def _srun(host: Host, command: str) -> List[str]:
    """The srun command that runs `command` as a job step of one task on `host`."""
    return ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={host.address}", "--overlap",
            "bash", "-c", command]


def slurm_script(hosts: Sequence[Host], args, cmds: Sequence[Tuple[str, str, str]],
                 auth: bool = True, generated_by: str = "hosts.py --slurm") -> str:
    """The bash script for `sbatch` that runs `cmds` (as `commands(hosts, args)` gives
    them: without `job`), each as a job step on its host, and waits for them (see the
    module's docstring). `auth`: export the job's key and token (else unset them)."""
    by_name = {h.name: h for h in hosts}
    per_host: Dict[str, int] = {}
    for host, _, _ in cmds:
        per_host[host] = per_host.get(host, 0) + 1
    gpus = max((max(h.gpus) + 1 for h in hosts if h.gpus), default=0)
    out = [
        "#!/bin/bash",
        "# An esync job as a Slurm batch job, written by",
        f"#   {' '.join(generated_by.splitlines())}",
        *([f"# live page: {live_url(hosts, args)}"] if live_url(hosts, args) else []),
        "# Submit it with `sbatch job.sh` (sbatch's options on its command line win over the",
        "# #SBATCH lines: sbatch --time=2:00:00 --partition=NAME job.sh). It starts each",
        "# process of the job as a job step on its host, then waits: exit status 0 once the",
        "# scheduler, the servers and the workers have all exited 0 (the state server is",
        "# then stopped); when one fails, or the state server ends first, it stops the",
        "# others and exits 1. Needs Slurm 20.11 or later (srun --overlap).",
        "#SBATCH --job-name=esync",
        f"#SBATCH --nodes={len(hosts)}",
        f"#SBATCH --nodelist={','.join(h.address for h in hosts)}",
        f"#SBATCH --ntasks-per-node={max(per_host.values())}",
    ]
    if gpus:
        out.append(f"#SBATCH --gres=gpu:{gpus}")
    out += ["", "label=()     # each step's srun pid: `HOST ROLE`",
            "service=     # the state server step's: stopped when the job is done",
            "left=0       # the scheduler, server and worker steps still running", ""]
    out += _SLURM_STOP.replace("@GRACE@", f"{SLURM_GRACE_S:g}").replace(
        "@TENTHS@", str(int(SLURM_GRACE_S * 10))).split("\n")
    if auth:
        first = hosts[0]
        draw = shlex.join(_srun(first, f"cd {_quote_path(checkout(first, args))} && "
                                       f"{_quote_path(first.python)} -m esync.transport.auth"))
        out += [
            "# The job's key (CurveZMQ: all its ZeroMQ traffic) and the state server's token:",
            "# those exported when the job was submitted, else fresh ones. Exported: every",
            "# step gets them in its environment (srun passes it on), on no command line and",
            "# in no file.",
            f'if [ -z "${{{KEY_ENV}:-}}" ] && [ -z "${{{KEY_FILE_ENV}:-}}" ]; then',
            f'    if ! {KEY_ENV}=$({draw}) || [ -z "${KEY_ENV}" ]; then',
            f'        echo "esync: cannot draw the job\'s key on {first.address}" >&2',
            "        exit 1",
            "    fi",
            f"    export {KEY_ENV}",
            "fi",
            f'if [ -z "${{{STATE_TOKEN_ENV}:-}}" ]; then',
            f"    {STATE_TOKEN_ENV}=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \\n')",
            "fi",
            f"export {STATE_TOKEN_ENV}",
        ]
    else:
        out += ["# --no-auth: no job key, no state server token (ZeroMQ traffic unauthenticated",
                "# and unencrypted, state server writes open)",
                f"unset {KEY_ENV} {KEY_FILE_ENV} {STATE_TOKEN_ENV}"]
    out += ["", "# The job's processes, one step each"]
    for (name, role, cmd), label in zip(cmds, labels(cmds)):
        out.append(f"# {name}: {label.split(' ', 1)[1]}")
        out.append(shlex.join(_srun(by_name[name], cmd)) + " &")
        out.append(f"label[$!]={shlex.quote(label)}")
        out.append("service=$!" if role == "stateserver" else "left=$((left + 1))")
    return "\n".join(out) + "\n" + _SLURM_WAIT


# --- command line ---------------------------------------------------------------------

def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}")
    return value


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = OneLineParser(prog=prog, description=__doc__,
                             formatter_class=argparse.RawDescriptionHelpFormatter,
                             usage="%(prog)s HOSTFILE [options] -- [main.py flags]")
    parser.add_argument("hostfile", metavar="HOSTFILE", help="the host file (format above)")
    parser.add_argument("--port", type=_port, default=config.SCHEDULER_PORT,
                        help=f"the scheduler's port, DMLC_PS_ROOT_PORT "
                             f"(default: {config.SCHEDULER_PORT})")
    parser.add_argument("--state-port", type=_port, default=config.STATE_SERVER_PORT,
                        help=f"the state server's port (default: {config.STATE_SERVER_PORT})")
    parser.add_argument("--remote-dir", default=DEFAULT_REMOTE_DIR,
                        help="the checkout on hosts without dir= (default: ~/esync)")
    parser.add_argument("--ssh", default=DEFAULT_SSH,
                        help=f"--ssh-form's ssh command, split like a shell; -tt is added "
                             f"unless it has -t/-tt/-T (default: {DEFAULT_SSH})")
    form = parser.add_mutually_exclusive_group()
    form.add_argument("--ssh-form", action="store_true",
                      help="print each command as `SSH -tt HOST 'command'` to run from here")
    form.add_argument("--slurm", action="store_true",
                      help="print a bash script for sbatch instead, that runs every process "
                           "as a job step on its host and waits for them (see above)")
    parser.add_argument("--no-auth", action="store_true",
                        help="no job key and no state server token (ZeroMQ traffic "
                             "unauthenticated and unencrypted, state server writes open)")
    parser.add_argument("--job-id", type=_job_id, default=None,
                        help="the job's id, its name on the state server: with a stateserver "
                             "host every process gets ESYNC_JOB_ID and its live page's "
                             "address, ESYNC_LIVE_URL, printed first (default: drawn, "
                             "job-DATE-TIME-HEX)")
    return parser


def _job_id(text: str) -> str:
    if not JOB_ID.fullmatch(text):
        raise argparse.ArgumentTypeError(f"expected {JOB_ID_FORM}, got {text!r}")
    return text


def live_url(hosts: Sequence[Host], args) -> Optional[str]:
    """The job's live page (with a stateserver host and a --job-id), else None."""
    state = next((h for h in hosts if "stateserver" in h.roles), None)
    job_id = getattr(args, "job_id", None)
    if state is None or not job_id:
        return None
    return page_url(state.address, getattr(args, "state_port", config.STATE_SERVER_PORT),
                    job_id)


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    """The `esync-hosts` command (see the module's docstring)."""
    return command_main(_main, argv, prog, PROG)


def _main(argv: List[str], prog: str) -> int:
    if "--" in argv:
        cut = argv.index("--")
        own, flags = argv[:cut], argv[cut + 1:]
    else:
        own, flags = argv, []
    parser = build_parser(prog)
    args = parser.parse_args(own)
    args.flags = flags
    try:
        if not shlex.split(args.ssh):
            raise ValueError("empty")
    except ValueError as e:
        parser.error(f"argument --ssh: expected a command such as {DEFAULT_SSH!r} ({e})")
    args.job_id = args.job_id or (f"job-{time.strftime('%Y%m%d-%H%M%S')}-"
                                  f"{secrets.token_hex(2)}")
    hosts = parse_hostfile(args.hostfile)
    job = None if args.no_auth or args.slurm else JobSecrets.for_job(os.environ)
    cmds = commands(hosts, args, job)
    if args.slurm:
        sys.stdout.write(slurm_script(hosts, args, cmds, auth=not args.no_auth,
                                      generated_by=shlex.join([prog, *argv])))
    else:
        _print_commands(args, cmds, job, hosts)
    sys.stdout.flush()  # `hosts.py FILE | head`: a reader that left ends it quietly
    return 0


def _print_commands(args, cmds: Sequence[Tuple[str, str, str]], job: Optional[JobSecrets],
                    hosts: Sequence[Host]) -> None:
    """The commands, `# HOST: ROLE` before each; first the live page's address and the
    job's key and token's commands."""
    live = live_url(hosts, args)
    if live is not None:
        print(f"# live page: {live}")
    for host, store, _ in (secret_commands(hosts, args, job) if job is not None else []):
        print(f"# {host}: the job's key and token (run first)")
        print(f"{job.printed()} | "
              + (shlex.join(ssh_argv(args.ssh, host, store, tty=False)) if args.ssh_form
                 else f"sh -c {shlex.quote(store)}"))
    for (host, role, cmd), label in zip(cmds, labels(cmds)):
        print(f"# {host}: {label.split(' ', 1)[1]}")
        print(shlex.join(ssh_argv(args.ssh, host, cmd)) if args.ssh_form else cmd)


def console_main() -> int:
    """The `esync-hosts` command."""
    return main()


if __name__ == "__main__":
    sys.exit(main())
