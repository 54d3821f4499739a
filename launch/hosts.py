"""Commands for a job on a real multi-host cluster, from a host file: printed (default)
for you to run on each host, or run over ssh (`--run`).

    python launch/hosts.py HOSTFILE [--port 9091] [--state-port 10010]
        [--remote-dir ~/esync] [--ssh "ssh -o BatchMode=yes"] [--ssh-form] [--run]
        [--grace 5] -- [main.py flags, e.g. -m esync -n resnet18-v1 -dd data]

Everything after `--` is passed to every main.py (scheduler, servers and workers).

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

Worker flags, after the main.py flags so that they win: `--device-name SHORT-wK` (SHORT:
the host's first name label, or the whole name when two hosts share it or it is an IP
address), `-g G` or `-c 1`, `--slowdown F` (when set), and `-ip <state server host>
-port <state port>` when there is a state server. Every argument is quoted for a POSIX
shell. With `--ssh-form`, each command line is instead the complete command to run from
here: `SSH -tt HOST 'command'`, exactly what `--run` runs.

`--run` starts every process as `SSH -tt HOST 'command'` (SSH: `--ssh` split like a
shell; `-tt` is added unless it already has -t/-tt/-T: the remote processes then get a
terminal, so that they die of SIGHUP when their ssh ends, and print line by line),
prints their output with each line prefixed by `[HOST ROLE]`, and waits. When every
scheduler, server and worker has exited 0, the state server is stopped and the exit
status is 0. When one of them fails (or the state server ends first), or on Ctrl-C
(or SIGTERM/SIGHUP), every other one is stopped: SIGTERM to each ssh's process group,
SIGKILL after `--grace` seconds (a second Ctrl-C: at once); each ssh also gets SIGTERM
if the launcher itself dies. Exit status then 1 (130 after Ctrl-C).

This file only starts processes: it does not import the esync package.
"""
from __future__ import annotations

import argparse
import ctypes
import ipaddress
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

ROLES = ("scheduler", "server", "worker", "stateserver")
KEYS = ("roles", "workers", "gpus", "slowdown", "dir", "python", "iface")
WORKER_KEYS = ("workers", "gpus", "slowdown")
DEFAULT_SSH = "ssh -o BatchMode=yes"
DEFAULT_REMOTE_DIR = "~/esync"
GRACE_S = 5.0
POLL_S = 0.05
PROG = "hosts.py"
_HOST = re.compile(r"^(?:[A-Za-z0-9_.+-]+@)?(?:[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\])$")
_TILDE = re.compile(r"^~[A-Za-z0-9._-]*(/|$)")


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
    a host given twice, no or two schedulers, no server, no worker, two state servers."""
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
    if not any("server" in h.roles for h in hosts):
        raise HostFileError(f"{path}: no host has the server role (roles=server,...)")
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


def mode_of(flags: Sequence[str]) -> Optional[str]:
    """The value of the last -m/--mode among main.py's flags (None: not given)."""
    mode = None
    i = 0
    while i < len(flags):
        flag = flags[i]
        if flag == "--":
            break
        if flag in ("-m", "--mode"):
            if i + 1 < len(flags):
                mode = flags[i + 1]
            i += 2
            continue
        if flag.startswith(("--mode=", "-m=")):
            mode = flag.split("=", 1)[1]
        elif flag.startswith("-m") and not flag.startswith("--") and len(flag) > 2 \
                and flag[2:] in ("local", "sync", "async", "esync"):
            mode = flag[2:]
        i += 1
    return mode


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


def commands(hosts: Sequence[Host], args) -> List[Tuple[str, str, str]]:
    """(host, role, shell command to run on that host) for every process of the job, in
    the order state server, scheduler, servers, workers. `args` needs `port`,
    `state_port`, `remote_dir` and `flags` (main.py's flags), as main()'s parser gives.
    Raises HostFileError when `-m esync` has no state server."""
    path = getattr(args, "hostfile", "host file")
    flags = list(getattr(args, "flags", []) or [])
    port = getattr(args, "port", 9091)
    state_port = getattr(args, "state_port", 10010)
    remote_dir = getattr(args, "remote_dir", DEFAULT_REMOTE_DIR)
    scheduler = next(h for h in hosts if "scheduler" in h.roles)
    state = next((h for h in hosts if "stateserver" in h.roles), None)
    if state is None and mode_of(flags) == "esync":
        raise HostFileError(f"{path}: -m esync needs a host with the stateserver role "
                            f"(roles=...,stateserver)")
    num_servers = sum("server" in h.roles for h in hosts)
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
        return f"cd {_quote_path(host.dir or remote_dir)} && env " + " ".join(words)

    if state is not None:
        out.append((state.name, "stateserver",
                    f"cd {_quote_path(_join_path(state.dir or remote_dir, 'stateserver'))} && "
                    f"{_quote_path(state.python)} manage.py runserver "
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


def ssh_argv(ssh: str, host: str, command: str) -> List[str]:
    """The local command that runs `command` on `host`: --ssh, `-tt` unless it has a -t/-T
    option already, the host, the command."""
    argv = shlex.split(ssh)
    if not any(a in ("-t", "-tt", "-T") for a in argv[1:]):
        argv.append("-tt")
    return [*argv, host, command]


# --- running --------------------------------------------------------------------------

class _Stop(Exception):
    """SIGTERM or SIGHUP to the launcher: stop as on Ctrl-C."""


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the launcher dies (Linux only)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _live_groups() -> Optional[set]:
    """The process groups with a process that is not a zombie, from /proc (Linux); None
    where there is no /proc."""
    if not os.path.isdir("/proc/self"):
        return None
    groups = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[0] != b"Z":
            groups.add(int(fields[2]))
    return groups


class _Runner:
    def __init__(self, cmds, ssh: str, grace: float):
        self.cmds = list(cmds)
        self.labels = labels(self.cmds)
        self.ssh = ssh
        self.grace = grace
        self.procs: List[subprocess.Popen] = []
        self.threads: List[threading.Thread] = []
        self.lock = threading.Lock()

    def say(self, line: str) -> None:
        with self.lock:
            sys.stderr.write(f"{PROG}: {line}\n")
            sys.stderr.flush()

    def _pump(self, proc: subprocess.Popen, label: str) -> None:
        for raw in iter(proc.stdout.readline, b""):
            text = raw.decode("utf-8", "replace").rstrip("\r\n")
            with self.lock:
                sys.stdout.write(f"[{label}] {text}\n")
                sys.stdout.flush()
        proc.stdout.close()

    def start(self) -> None:
        for (host, role, cmd), label in zip(self.cmds, self.labels):
            argv = ssh_argv(self.ssh, host, cmd)
            with self.lock:
                sys.stdout.write(f"[{label}] $ {shlex.join(argv)}\n")
                sys.stdout.flush()
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=_die_with_parent)
            self.procs.append(proc)
        for proc, label in zip(self.procs, self.labels):
            thread = threading.Thread(target=self._pump, args=(proc, label), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _signal_groups(self, indices, sig) -> None:
        for i in indices:
            try:
                os.killpg(self.procs[i].pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def _running(self, indices) -> List[int]:
        """Those of the indices whose ssh, or anything in its process group, still runs
        (zombies left to init do not count: some inits reap slowly)."""
        for i in indices:
            self.procs[i].poll()  # reap the ssh itself
        groups = _live_groups()
        result = []
        for i in indices:
            pgid = self.procs[i].pid
            if groups is not None:
                if pgid in groups:
                    result.append(i)
                continue
            try:
                os.killpg(pgid, 0)
            except (ProcessLookupError, PermissionError):
                continue
            result.append(i)
        return result

    def stop(self, indices) -> None:
        """SIGTERM to these processes' groups, SIGKILL to what is left after the grace
        period (at once on a second Ctrl-C); the groups are swept with SIGKILL at the end
        so that nothing a child started survives it."""
        indices = list(indices)
        self._signal_groups(self._running(indices), signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        try:
            while time.monotonic() < deadline and self._running(indices):
                time.sleep(POLL_S)
        except (KeyboardInterrupt, _Stop):
            self.say("stopping now (SIGKILL)")
        self._signal_groups(indices, signal.SIGKILL)
        for i in indices:
            try:
                self.procs[i].wait(5)
            except subprocess.TimeoutExpired:
                self.say(f"{self.labels[i]}: still running after SIGKILL")
            if self.procs[i].stdin:
                try:
                    self.procs[i].stdin.close()
                except OSError:
                    pass

    def wait(self) -> int:
        """Wait for the job; 0 if every scheduler/server/worker exited 0, else 1."""
        training = [i for i, c in enumerate(self.cmds) if c[1] != "stateserver"]
        services = [i for i, c in enumerate(self.cmds) if c[1] == "stateserver"]
        while True:
            for i, proc in enumerate(self.procs):
                code = proc.poll()
                if code is None:
                    continue
                if i in training and code != 0:
                    self.say(f"{self.labels[i]} exited with status {code}; stopping the others")
                    self.stop(range(len(self.procs)))
                    return 1
                if i in services:
                    self.say(f"{self.labels[i]} ended (status {code}) before the job; "
                             f"stopping the others")
                    self.stop(range(len(self.procs)))
                    return 1
            if all(self.procs[i].poll() == 0 for i in training):
                if services:
                    self.stop(services)
                return 0
            time.sleep(POLL_S)

    def join(self) -> None:
        for thread in self.threads:
            thread.join(2.0)


def run(cmds, ssh: str = DEFAULT_SSH, grace: float = GRACE_S) -> int:
    """Run every command over ssh, stream the outputs, stop all if one fails (module doc)."""
    runner = _Runner(cmds, ssh, grace)
    previous = {}

    def on_signal(signum, frame):
        raise _Stop()

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, on_signal)
    try:
        try:
            runner.start()
            code = runner.wait()
        except OSError as e:  # the ssh command cannot be started
            runner.say(f"error: cannot start {shlex.split(ssh)[0]!r}: {e.strerror or e}")
            runner.stop(range(len(runner.procs)))
            return 2
        except (KeyboardInterrupt, _Stop) as e:
            runner.say("interrupted; stopping every process")
            runner.stop(range(len(runner.procs)))
            code = 130 if isinstance(e, KeyboardInterrupt) else 1
        runner.join()
        return code
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter,
                     usage="%(prog)s HOSTFILE [options] -- [main.py flags]")
    parser.add_argument("hostfile", metavar="HOSTFILE", help="the host file (format above)")
    parser.add_argument("--port", type=_port, default=9091,
                        help="the scheduler's port, DMLC_PS_ROOT_PORT (default: 9091)")
    parser.add_argument("--state-port", type=_port, default=10010,
                        help="the state server's port (default: 10010)")
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
                        help="--run: seconds from SIGTERM to SIGKILL when stopping "
                             "(default: 5)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        cut = argv.index("--")
        own, flags = argv[:cut], argv[cut + 1:]
    else:
        own, flags = argv, []
    parser = build_parser()
    args = parser.parse_args(own)
    args.flags = flags
    try:
        if not shlex.split(args.ssh):
            raise ValueError("empty")
    except ValueError as e:
        parser.error(f"argument --ssh: expected a command such as {DEFAULT_SSH!r} ({e})")
    try:
        hosts = parse_hostfile(args.hostfile)
        cmds = commands(hosts, args)
    except HostFileError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    if args.run:
        return run(cmds, args.ssh, args.grace)
    try:
        for (host, role, cmd), label in zip(cmds, labels(cmds)):
            print(f"# {host}: {label.split(' ', 1)[1]}")
            print(shlex.join(ssh_argv(args.ssh, host, cmd)) if args.ssh_form else cmd)
        sys.stdout.flush()
    except BrokenPipeError:  # `hosts.py FILE | head`: the reader left
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
