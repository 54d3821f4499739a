"""Commands for a job on a real multi-host cluster, from a host file: printed (default)
for you to run on each host, or run over ssh (`--run`).

    python launch/hosts.py HOSTFILE [--port 9091] [--state-port 10010]
        [--remote-dir ~/esync] [--ssh "ssh -o BatchMode=yes"] [--ssh-form] [--run]
        [--grace 5] [--no-auth] -- [main.py flags, e.g. -m esync -n resnet18-v1 -dd data]

Everything after `--` is passed to every main.py (scheduler, servers and workers), the
flags of checkpoints and failures (--checkpoint-dir, --resume 1, ...) included.

Host file: one line per host; `#` starts a comment, blank lines are ignored; a value
with spaces is quoted as in a shell (dir="/data/my esync").

    HOST [key=value ...]

    # example: scheduler, server and state server on cloud1, four GPU workers
    cloud1 roles=scheduler,server,stateserver iface=eno2
    cloud2 workers=2 gpus=0,1
    cloud3 workers=2 gpus=0,1 slowdown=2 dir=/opt/esync python=/opt/venv/bin/python

  HOST          what ssh connects to (`user@host` allowed); the name without `user@`
                must be reachable from every other host: it becomes DMLC_PS_ROOT_URI
                (the scheduler's host) and -ip (the state server's host). A host may
                appear on one line only.
  roles=R,...   among scheduler, server, worker, stateserver (default: worker)
  workers=N     worker processes on this host (default 1; needs the worker role)
  gpus=G,...    worker k of this host gets `-g G[k % len]`; absent: `-c 1` (the CPU)
  slowdown=F    F >= 1, passed to this host's workers as `--slowdown F`
  dir=PATH      the repository's checkout on this host (default: --remote-dir);
                a leading `~` is left to the remote shell
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
        DMLC_NUM_SERVER=<servers> DMLC_NUM_WORKER=<workers> [DMLC_INTERFACE=...]
        PYTHON main.py <main.py flags> [worker flags]
    cd DIR/stateserver && PYTHON manage.py runserver 0.0.0.0:<state port>

The job's key and token: unless `--no-auth`, every process gets the job's key
(ESYNC_JOB_KEY_FILE: CurveZMQ for all ZeroMQ traffic) and the state server's token
(ESYNC_STATE_TOKEN), fresh for each job (the user's ESYNC_JOB_KEY, or the file
ESYNC_JOB_KEY_FILE names, read here, and ESYNC_STATE_TOKEN, where exported). Neither
is on any process's command line (ps shows those): each host keeps them in files of
mode 0600, DIR/.esync/jobs/<id>/job.key and state.token, and each command reads them:

    cd DIR && ESYNC_JOB_KEY_FILE="$PWD/.esync/jobs/<id>/job.key"
        ESYNC_STATE_TOKEN="$(cat .esync/jobs/<id>/state.token)" env DMLC_ROLE=...
        PYTHON main.py ...

Printed, the commands start with one per host that stores the two files, `# HOST:
the job's key and token (run first)`, which reads them from its input:

    printf '%s\\n' KEY TOKEN | sh -c 'cd DIR && umask 077 && mkdir -p .esync/jobs/<id> && ...'

(`--ssh-form`: `printf '%s\\n' KEY TOKEN | SSH -T HOST '...'`); remove the folder after
the job. `--run` stores them over ssh (the secrets on ssh's input) before it starts
anything, and removes them when the job ends.

Worker flags, after the main.py flags so that they win: `--device-name SHORT-wK` (SHORT:
the host's first name label, or the whole name when two hosts share it or it is an IP
address), `-g G` or `-c 1`, `--slowdown F` (when set), and `-ip <state server host>
-port <state port>` when there is a state server. Every argument is quoted for a POSIX
shell. With `--ssh-form`, each command line is instead the complete command to run from
here: `SSH -tt HOST 'command'`, exactly what `--run` runs.

`--run` starts every process as `SSH -tt HOST 'command'` (SSH: `--ssh` split like a
shell; `-tt` is added unless it already has -t/-tt/-T: the remote processes then get a
terminal, so that they die of SIGHUP when their ssh ends, and print line by line),
prints their output with each line prefixed by `[HOST ROLE]`, and waits (through
launch.supervisor). When every scheduler, server and worker has exited 0, the state
server is stopped and the exit status is 0. When one of them fails (or the state server
ends first), or on Ctrl-C (or SIGTERM/SIGHUP), every other one is stopped: SIGTERM to
each ssh's process group, SIGKILL after `--grace` seconds (a second Ctrl-C: at once);
each ssh is also killed if the launcher itself dies. Exit status then 1 (130 after
Ctrl-C). hosts.py restarts nothing (launch/local.py's --restart-failed is for one
machine): a server or worker process started again by hand with its printed command
rejoins the job (see main.py's --on-worker-failure, --server-patience).

The main.py flags are checked by main.py's own parser (esync.options) before anything
is printed or started: a bad one is one line, exit status 2. Which algorithm needs a
state server comes from esync.registry; the job key from esync.transport.auth. This
file imports nothing else of esync (and no torch): it only starts processes.
"""
from __future__ import annotations

import argparse
import ipaddress
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import config
from esync import registry
from esync.errors import UserError
from esync.options import check_aggregation, parse_options
from esync.transport.auth import KEY_FILE_ENV, job_key, new_key
from launch.local import STATE_TOKEN_ENV, new_token
from launch.supervisor import GRACE_S, Interrupted, Supervisor, interrupt_on

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
#: seconds for storing (or removing) the secrets on every host over ssh
SECRETS_TIMEOUT_S = 60.0


class HostFileError(ValueError):
    """A bad host file (or host file and flags that do not fit): one line, exit 2."""


@dataclass
class Host:
    name: str                      # as written: what ssh connects to
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

def _line_error(path: str, line: int, message: str) -> HostFileError:
    return HostFileError(f"{path}:{line}: {message}")


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

    Raises HostFileError (message `PATH:LINE: problem` or `PATH: problem`) on a bad line,
    a host given twice, no or two schedulers, no worker, two state servers. (Whether the
    job needs a server depends on main.py's --backend: `commands` checks it.)"""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise HostFileError(f"{path}: cannot read the host file: "
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
        raise HostFileError(f"{path}: no host has the scheduler role (roles=scheduler,...)")
    if not any("worker" in h.roles for h in hosts):
        raise HostFileError(f"{path}: no host has a worker")
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
    return registry.of_options(options_of(flags))


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
    `secret_commands`). Raises HostFileError when the algorithm needs a state server and
    no host has one, UserError when a main.py flag is bad."""
    path = getattr(args, "hostfile", "host file")
    flags = list(getattr(args, "flags", []) or [])
    port = getattr(args, "port", config.SCHEDULER_PORT)
    state_port = getattr(args, "state_port", config.STATE_SERVER_PORT)
    remote_dir = getattr(args, "remote_dir", DEFAULT_REMOTE_DIR)
    scheduler = next(h for h in hosts if "scheduler" in h.roles)
    state = next((h for h in hosts if "stateserver" in h.roles), None)
    opts = options_of(flags)
    algorithm = registry.of_options(opts)
    if state is None and algorithm.state_server:
        raise HostFileError(f"{path}: {' '.join(algorithm.flags)} needs a host with the "
                            f"stateserver role (roles=...,stateserver)")
    num_servers = sum("server" in h.roles for h in hosts)
    all_reduce = opts.backend == "allreduce"
    if not num_servers and not all_reduce:
        raise HostFileError(f"{path}: no host has the server role (roles=server,...)")
    if all_reduce and num_servers:
        raise HostFileError(f"{path}: --backend allreduce runs without servers: no host "
                            f"takes the server role")
    try:
        check_aggregation(opts, num_servers if algorithm.parameter_server else None)
    except UserError as e:
        raise UserError(f"{e} (a main.py flag after --)") from None
    num_workers = sum(h.workers for h in hosts)
    shorts = _short_names(hosts)
    out: List[Tuple[str, str, str]] = []

    def node(host: Host, role: str, extra: Sequence[str] = ()) -> str:
        env = [f"DMLC_ROLE={role}", f"DMLC_PS_ROOT_URI={scheduler.address}",
               f"DMLC_PS_ROOT_PORT={port}", f"DMLC_NUM_SERVER={num_servers}",
               f"DMLC_NUM_WORKER={num_workers}"]
        if host.iface:
            env.append(f"DMLC_INTERFACE={host.iface}")
        words = [shlex.quote(w) for w in env]
        words.append(_quote_path(host.python))
        words += [shlex.quote(w) for w in ["main.py", *flags, *extra]]
        return (f"cd {_quote_path(host.dir or remote_dir)} && {auth()}env "
                + " ".join(words))

    def auth(up: str = "") -> str:
        return job.assignments(up) if job is not None else ""

    if state is not None:
        out.append((state.name, "stateserver",
                    f"cd {_quote_path(_join_path(state.dir or remote_dir, 'stateserver'))} && "
                    f"{auth('../')}{_quote_path(state.python)} manage.py runserver "
                    f"{shlex.quote(f'0.0.0.0:{state_port}')}"))
    out.append((scheduler.name, "scheduler", node(scheduler, "scheduler")))
    for host in hosts:
        if "server" in host.roles:
            out.append((host.name, "server", node(host, "server")))
    for host in hosts:
        for k in range(host.workers):
            extra = ["--device-name", f"{shorts[host.address]}-w{k}"]
            extra += ["-g", str(host.gpus[k % len(host.gpus)])] if host.gpus else ["-c", "1"]
            if host.slowdown is not None:
                extra += ["--slowdown", host.slowdown]
            if state is not None:
                extra += ["-ip", state.address, "-port", str(state_port)]
            out.append((host.name, "worker", node(host, "worker", extra)))
    return out


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


# --- running --------------------------------------------------------------------------

def _say(line: str) -> None:
    sys.stderr.write(f"{PROG}: {line}\n")
    sys.stderr.flush()


def _raise_interrupted(signum: int) -> BaseException:
    return Interrupted(signum)


def _on_every_host(ssh: str, scripts: Sequence[Tuple[str, str]], data: str = "",
                   timeout: float = SECRETS_TIMEOUT_S) -> List[str]:
    """Run each (host, command) over ssh at once, `data` on its input; the problems,
    one line each (none: all exited 0 within `timeout`)."""
    procs = []
    problems = []
    try:
        for host, script in scripts:
            procs.append((host, subprocess.Popen(
                ssh_argv(ssh, host, script, tty=False), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
        deadline = time.monotonic() + timeout
        for host, proc in procs:
            try:
                out, _ = proc.communicate(data, timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                problems.append(f"{host}: no answer within {timeout:g} s")
                continue
            if proc.returncode != 0:
                last = (out or "").strip().splitlines()[-1:] or [""]
                problems.append(f"{host}: status {proc.returncode}"
                                + (f": {last[0]}" if last[0] else ""))
    except OSError as e:
        problems.append(f"cannot start {shlex.split(ssh)[0]!r}: {e.strerror or e}")
    finally:
        for _, proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return problems


def run(cmds, ssh: str = DEFAULT_SSH, grace: float = GRACE_S,
        stores: Sequence[Tuple[str, str, str]] = (), secret_input: str = "") -> int:
    """Run every command over ssh, stream the outputs, stop all if one fails (module doc).
    `stores`: (host, store command, remove command) of the job's secrets
    (secret_commands), run before the job (`secret_input` on their input) and after."""
    sup = Supervisor(grace=grace, say=_say)
    names = labels(cmds)
    stored = False
    try:
        with interrupt_on([signal.SIGTERM, signal.SIGHUP], _raise_interrupted):
            try:
                if stores:
                    stored = True
                    problems = _on_every_host(ssh, [(h, c) for h, c, _ in stores],
                                              secret_input)
                    if problems:
                        _say(f"error: cannot store the job's key and token: "
                             f"{'; '.join(problems)}")
                        return 1
                for (host, role, cmd), label in zip(cmds, names):
                    argv = ssh_argv(ssh, host, cmd)
                    sys.stdout.write(f"[{label}] $ {shlex.join(argv)}\n")
                    sys.stdout.flush()
                    # stdin stays open (a pipe): with -tt, ssh would pass its end on
                    sup.start(label, argv, prefix=f"[{label}] ", stdin=subprocess.PIPE,
                              essential=role != "stateserver")
                outcome = sup.wait()
            except OSError as e:  # the ssh command cannot be started
                _say(f"error: cannot start {shlex.split(ssh)[0]!r}: {e.strerror or e}")
                sup.stop()
                return 2
            except (KeyboardInterrupt, Interrupted) as e:
                _say("interrupted; stopping every process")
                sup.stop()
                return 130 if isinstance(e, KeyboardInterrupt) else 1
            failed = outcome.failed
            if failed is None:
                sup.stop([c for c in sup.children if not c.essential])
                return 0
            if failed.essential:
                _say(f"{failed.name} exited with status {failed.returncode}; "
                     f"stopping the others")
            else:
                _say(f"{failed.name} ended (status {failed.returncode}) before the job; "
                     f"stopping the others")
            sup.stop()
            return 1
    finally:
        sup.close()
        if stored:
            _remove_secrets(ssh, stores)


def _remove_secrets(ssh: str, stores: Sequence[Tuple[str, str, str]]) -> None:
    try:
        with interrupt_on([signal.SIGTERM, signal.SIGHUP], _raise_interrupted):
            problems = _on_every_host(ssh, [(h, c) for h, _, c in stores],
                                      timeout=SECRETS_TIMEOUT_S / 4)
    except (KeyboardInterrupt, Interrupted):
        problems = ["interrupted"]
    if problems:
        _say(f"could not remove the job's key and token ({SECRETS_DIR}/...): "
             f"{'; '.join(problems)}")


# --- command line ---------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}")
    return value


def _grace(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}")
    return value


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description=__doc__,
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
                        help=f"the ssh command, split like a shell; -tt is added unless it "
                             f"has -t/-tt/-T (default: {DEFAULT_SSH})")
    parser.add_argument("--ssh-form", action="store_true",
                        help="print each command as `SSH -tt HOST 'command'` to run from here")
    parser.add_argument("--run", action="store_true",
                        help="run every command over ssh, stream their outputs, wait")
    parser.add_argument("--grace", type=_grace, default=GRACE_S,
                        help=f"--run: seconds from SIGTERM to SIGKILL when stopping "
                             f"(default: {GRACE_S:g})")
    parser.add_argument("--no-auth", action="store_true",
                        help="no job key and no state server token (ZeroMQ traffic "
                             "unauthenticated and unencrypted, state server writes open)")
    return parser


def main(argv: Optional[Sequence[str]] = None, prog: str = PROG) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
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
    try:
        hosts = parse_hostfile(args.hostfile)
        job = None if args.no_auth else JobSecrets.for_job(os.environ)
        cmds = commands(hosts, args, job)
    except (HostFileError, UserError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    stores = secret_commands(hosts, args, job) if job is not None else []
    if args.run:
        return run(cmds, args.ssh, args.grace, stores, job.input if job else "")
    try:
        for host, store, _ in stores:
            print(f"# {host}: the job's key and token (run first)")
            print(f"{job.printed()} | "
                  + (shlex.join(ssh_argv(args.ssh, host, store, tty=False)) if args.ssh_form
                     else f"sh -c {shlex.quote(store)}"))
        for (host, role, cmd), label in zip(cmds, labels(cmds)):
            print(f"# {host}: {label.split(' ', 1)[1]}")
            print(shlex.join(ssh_argv(args.ssh, host, cmd)) if args.ssh_form else cmd)
        sys.stdout.flush()
    except BrokenPipeError:  # `hosts.py FILE | head`: the reader left
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def console_main() -> int:
    """The `esync-hosts` command."""
    return main(prog="esync-hosts")


if __name__ == "__main__":
    sys.exit(main())
