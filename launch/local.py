"""Start a whole job on this machine with one command: the ESync state server (for
`-m esync`), the scheduler, S servers and N workers, as child processes on free
loopback ports, each configured by the DMLC_* variables as on a real cluster.

    python launch/local.py -m esync --workers 4 --servers 1 --slowdown 1,1,4,4 \\
        -n lenet --time-limit 60

Every flag the launcher does not know is passed to each worker's `main.py`. The job's
iteration logs go to OUT/<network>/<mode folder>/<host>/<device>/iter-<n>.json, the
layout logs_tools/summary.py reads (mode folder: esync, sync, async, dcasgd or local,
with `-niid` for split-by-class runs); each process's output goes to a file beside them
(`<host>/scheduler.log`, `<host>/server<k>.log`, `<host>/stateserver.log`,
`<host>/<device>/worker.log`). Worker k (in launch order) is labelled `w<k>` (`w<k>-x<F>`
with a slowdown F), so that no two collide.

While the job runs, a progress line shows the round, the elapsed time and the latest
test accuracy. Ctrl-C, or any child failing, stops every child (SIGINT, then SIGKILL
after a grace period); children are also told to die with the launcher if it is killed
outright (Linux's parent-death signal). Exit status: 0 when every process exited 0,
else non-zero (130 on Ctrl-C).
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("local", "sync", "async", "esync")
GRACE_S = 5.0
POLL_S = 0.25
ACCURACY = re.compile(r"round (\d+) .*test accuracy ([0-9.]+)")


class LaunchError(Exception):
    """Bad launcher input: printed as one line, exit status 2."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the launcher dies (Linux)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _switch(text: Optional[str]) -> bool:
    return str(text).strip().lower() in ("1", "true", "yes", "on")


@dataclass
class Plan:
    """What to start, decided from the command line before anything starts."""

    mode: str
    workers: int
    servers: int
    slowdowns: List[float]
    worker_args: List[str]
    network: str
    folder: str  # OUT/<network>/<mode folder>
    threads: int
    stop_rounds: Optional[int] = None
    stop_seconds: Optional[float] = None

    @property
    def host_dir(self) -> str:
        return os.path.join(self.folder, socket.gethostname())

    def label(self, k: int) -> str:
        factor = self.slowdowns[k]
        return f"w{k}" if factor == 1 else f"w{k}-x{factor:g}"


def mode_folder(mode: str, dcasgd: bool, split_by_class: bool) -> str:
    name = "dcasgd" if mode == "async" and dcasgd else mode
    return name + ("-niid" if split_by_class else "")


def _peek(args: Sequence[str]) -> argparse.Namespace:
    """The passed-through main.py flags the launcher needs to know about."""
    import config  # the defaults, from the top-level config.py

    peek = argparse.ArgumentParser(add_help=False)
    peek.add_argument("-n", "--network", default=config.NETWORK)
    peek.add_argument("-s", "--split-by-class", default=str(config.SPLIT_BY_CLASS))
    peek.add_argument("-dcasgd", "--use-dcasgd", default=str(config.DCASGD))
    peek.add_argument("-ld", "--log-dir")
    peek.add_argument("--device-name")
    peek.add_argument("--slowdown")
    peek.add_argument("--num-threads")
    peek.add_argument("--max-rounds", type=float)
    peek.add_argument("--time-limit", type=float)
    return peek.parse_known_args(list(args))[0]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="launch/local.py",
        description="Run a job (state server, scheduler, servers, workers) on this machine. "
                    "Flags not listed here are passed to every worker's main.py.")
    parser.add_argument("-m", "--mode", required=True, choices=MODES,
                        help="training algorithm (as main.py's -m)")
    parser.add_argument("--workers", type=int, default=2, help="number of workers (default 2)")
    parser.add_argument("--servers", type=int, default=1, help="number of servers (default 1)")
    parser.add_argument("--slowdown", default="1",
                        help="one --slowdown factor per worker, comma-separated, or one for "
                             "all (default 1)")
    parser.add_argument("--out", default="runs",
                        help="base folder: logs go to OUT/<network>/<mode folder>/ "
                             "(default runs)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no live progress line")
    return parser


def plan(argv: Sequence[str]) -> Plan:
    parser = build_parser()
    args, rest = parser.parse_known_args(list(argv))
    peek = _peek(rest)
    for flag, value in (("-ld/--log-dir", peek.log_dir), ("--device-name", peek.device_name),
                        ("--slowdown", peek.slowdown)):
        if value is not None:
            raise LaunchError(f"{flag} is set by the launcher (see --out, --slowdown)")
    if args.workers < 1 or args.servers < 1:
        raise LaunchError("--workers and --servers must be at least 1")
    workers = 1 if args.mode == "local" else args.workers
    try:
        slowdowns = [float(f) for f in args.slowdown.split(",")]
    except ValueError:
        raise LaunchError(f"--slowdown {args.slowdown!r}: expected numbers >= 1, "
                          f"comma-separated") from None
    if len(slowdowns) == 1:
        slowdowns *= workers
    if len(slowdowns) != workers or any(not f >= 1 for f in slowdowns):
        raise LaunchError(f"--slowdown {args.slowdown!r}: expected {workers} factor(s) >= 1 "
                          f"(one per worker) or one for all")
    folder = os.path.join(args.out, peek.network,
                          mode_folder(args.mode, _switch(peek.use_dcasgd),
                                      _switch(peek.split_by_class)))
    threads = int(peek.num_threads) if peek.num_threads else \
        max(1, (os.cpu_count() or 1) // workers)
    extra = [] if peek.num_threads else ["--num-threads", str(threads)]
    return Plan(args.mode, workers, args.servers, slowdowns, [*rest, *extra], peek.network,
                folder, threads, int(peek.max_rounds) if peek.max_rounds else None,
                peek.time_limit)


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    log: str
    essential: bool = True  # the job fails if it fails (the state server is a service)


@dataclass
class Launcher:
    plan: Plan
    progress: bool = True
    children: List[Child] = field(default_factory=list)
    out = sys.stderr
    _read_up_to: Dict[str, int] = field(default_factory=dict)  # bytes of each log read
    _accuracy: Optional[str] = None

    def _start(self, name: str, command: List[str], log: str, env: Dict[str, str],
               cwd: str = REPO, essential: bool = True) -> Child:
        os.makedirs(os.path.dirname(log), exist_ok=True)
        with open(log, "w") as f:
            f.write(f"# {shlex.join(command)}\n")
            f.flush()
            proc = subprocess.Popen(command, cwd=cwd, stdout=f, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True, preexec_fn=_die_with_parent)
        child = Child(name, proc, log, essential)
        self.children.append(child)
        return child

    def _env(self, **extra: str) -> Dict[str, str]:
        threads = str(self.plan.threads)
        return dict(os.environ, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads,
                    PYTHONUNBUFFERED="1", **extra)

    def start_all(self) -> None:
        p = self.plan
        main = [sys.executable, os.path.join(REPO, "main.py")]
        host = p.host_dir
        if p.mode == "local":
            self._start("worker0", [*main, "-m", "local", *p.worker_args, "--slowdown",
                                    f"{p.slowdowns[0]:g}", "--device-name", p.label(0),
                                    "-ld", p.folder],
                        os.path.join(host, p.label(0), "worker.log"), self._env())
            return
        cluster = {"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(free_port()),
                   "DMLC_NUM_SERVER": str(p.servers), "DMLC_NUM_WORKER": str(p.workers)}
        state_args: List[str] = []
        if p.mode == "esync":
            port = free_port()
            self._start("stateserver", [sys.executable, "manage.py", "runserver", "--noreload",
                                        f"127.0.0.1:{port}"],
                        os.path.join(host, "stateserver.log"),
                        self._env(ESYNC_STATE_DB=os.path.abspath(
                            os.path.join(host, "stateserver.sqlite3"))),
                        cwd=os.path.join(REPO, "stateserver"), essential=False)
            state_args = ["-ip", "127.0.0.1", "-port", str(port)]
            self._wait_for_port(port)
        self._start("scheduler", [*main, "-m", p.mode],
                    os.path.join(host, "scheduler.log"), self._env(DMLC_ROLE="scheduler",
                                                                   **cluster))
        for s in range(p.servers):
            self._start(f"server{s}", [*main, "-m", p.mode, "-c", "1"],
                        os.path.join(host, f"server{s}.log"),
                        self._env(DMLC_ROLE="server", **cluster))
        for k in range(p.workers):
            label = p.label(k)
            self._start(f"worker{k}", [*main, "-m", p.mode, *p.worker_args, *state_args,
                                       "--slowdown", f"{p.slowdowns[k]:g}",
                                       "--device-name", label, "-ld", p.folder],
                        os.path.join(host, label, "worker.log"),
                        self._env(DMLC_ROLE="worker", **cluster))

    def _wait_for_port(self, port: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            failed = self._failed()
            if failed:
                raise RuntimeError(self._describe(failed))
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"the state server did not listen on port {port} within "
                           f"{timeout:g} s; see {self.children[-1].log}")

    # --- watching ---------------------------------------------------------------------
    def _failed(self) -> Optional[Child]:
        for child in self.children:
            code = child.proc.poll()
            if code is not None and (code != 0 or not child.essential):
                return child
        return None

    def _describe(self, child: Child) -> str:
        try:
            with open(child.log) as f:
                tail = [line.rstrip() for line in f.readlines()[-3:] if line.strip()]
        except OSError:
            tail = []
        last = f": {tail[-1]}" if tail else ""
        return (f"{child.name} exited with status {child.proc.returncode}{last} "
                f"(log: {child.log})")

    def _essential_running(self) -> bool:
        return any(c.proc.poll() is None for c in self.children if c.essential)

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

    def status_line(self, start: float) -> str:
        rounds = 0
        for folder in glob.glob(os.path.join(self.plan.host_dir, "*", "")):
            numbers = [int(m.group(1)) for m in
                       (re.search(r"iter-(\d+)\.json$", f)
                        for f in os.listdir(folder)) if m]
            rounds = max([rounds, *numbers])
        for child in self.children:
            if child.name.startswith("worker"):
                self._read_accuracy(child)
        accuracy = self._accuracy
        elapsed = time.monotonic() - start
        p = self.plan
        fraction = None
        if p.stop_rounds:
            fraction = rounds / p.stop_rounds
        if p.stop_seconds:
            fraction = max(fraction or 0.0, elapsed / p.stop_seconds)
        bar = ""
        if fraction is not None:
            filled = int(20 * min(1.0, fraction))
            bar = f"[{'#' * filled}{'.' * (20 - filled)}] "
        return (f"{bar}{os.path.basename(p.folder)}: round {rounds}, {elapsed:.0f} s, "
                f"test accuracy {accuracy or 'n/a'}")

    def watch(self) -> int:
        """Until the job ends or a child fails; returns the exit status."""
        start = time.monotonic()
        shown = 0.0
        tty = self.progress and self.out.isatty()
        while True:
            failed = self._failed()
            if failed is not None:
                if tty:
                    self.out.write("\n")
                self.out.write(f"launch: error: {self._describe(failed)}; stopping the job\n")
                return 1
            if not self._essential_running():
                prefix = "\r" if tty else ""
                self.out.write(f"{prefix}{self.status_line(start)}\033[K\n" if tty else
                               f"launch: done: {self.status_line(start)}\n")
                return 0
            now = time.monotonic()
            if self.progress and (tty or now - shown >= 10):
                line = self.status_line(start)
                self.out.write(f"\r{line}\033[K" if tty else f"{line}\n")
                self.out.flush()
                shown = now
            time.sleep(POLL_S)

    def stop_all(self) -> None:
        """SIGINT to every child still running, then SIGKILL after the grace period."""
        for child in reversed(self.children):
            if child.proc.poll() is None:
                try:
                    os.killpg(child.proc.pid, signal.SIGINT)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + GRACE_S
        for child in self.children:
            try:
                child.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(child.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                child.proc.wait()


def run(argv: Sequence[str], progress: bool = True) -> int:
    """Launch one job and wait for it; the exit status (raises LaunchError on bad input)."""
    launcher = Launcher(plan(argv), progress=progress)
    p = launcher.plan
    launcher.out.write(f"launch: {p.mode} with {p.workers} worker(s) (slowdown "
                       f"{','.join(f'{f:g}' for f in p.slowdowns)})"
                       + ("" if p.mode == "local" else f" and {p.servers} server(s)")
                       + f"; logs in {p.folder}\n")
    code = 1
    try:
        launcher.start_all()
        code = launcher.watch()
    except KeyboardInterrupt:
        launcher.out.write("\nlaunch: interrupted; stopping the job\n")
        code = 130
    except RuntimeError as e:
        launcher.out.write(f"launch: error: {e}\n")
        code = 1
    finally:
        launcher.stop_all()
    return code


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the job as Ctrl-C does


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    progress = "--no-progress" not in argv
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return run(argv, progress)
    except LaunchError as e:
        print(f"launch/local.py: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.path.insert(0, REPO)  # config.py
    sys.exit(main())
