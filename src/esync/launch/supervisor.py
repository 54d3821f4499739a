"""The one supervisor of child processes for every launcher (`esync/launch/local.py`,
`esync/launch/experiment.py` through local.py, `esync/launch/onray.py` on each Ray node) and the
benchmarks.

    with Supervisor(grace=5.0) as sup:
        scheduler = sup.start("scheduler", argv, env=env, log="scheduler.log", ready=True)
        port = sup.wait_ready(scheduler)            # the port it bound (port 0 + esync.infra.ready)
        sup.start("worker0", argv, env=env, log="w0/worker.log")
        while (outcome := sup.wait(timeout=0.5)) is None:
            refresh_progress()
        # outcome.failed: None (every essential child exited 0), or the child that failed
    # leaving the block stops whatever still runs (see stop)

    # a member the job can lose (its failure is not the job's), started again when it
    # dies, up to 3 times, while the job runs:
    sup.start("worker1", argv, env=env, log="w1/worker.log", fatal=False, restart=3)

What it guarantees, on Linux:

* **Each child in its own session and process group** (so a Ctrl-C at the terminal
  reaches only the launcher, and stopping a child reaches everything it started), with
  the **parent-death signal** SIGKILL (prctl PR_SET_PDEATHSIG): if the launcher is
  killed outright, its children die with it. (The signal follows the thread that
  started the child: start children from a thread that lives as long as they should.)
  SIGINT and SIGTERM are held while a child is forked and registered, so that a Ctrl-C
  then is not lost in CPython's after-fork hooks (see _signals_held).
* **Output** goes to a log file (`log=`, first line `# <the command>`), or is left to
  the launcher's own (without `log=`). A child's input is /dev/null.
* **Essential** children are the job: `wait` ends when all of them have exited 0. A
  non-essential child is a service (the ESync state server): it is not waited for, but
  its exit, with any status, ends the job as a failure.
* **Fatal or not**: the failure (non-zero status, or a signal) of an essential child
  ends the job, unless it was started with `fatal=False` (or a callable that says
  False when asked at its death): the job can lose it, e.g. a worker that the scheduler
  leaves behind; `wait` then goes on, says so (`say`), and counts it as exited, and the
  job's end is decided by the others.
* **Restarts** (`restart=N`): a child that fails while the job runs is started again
  (with `restart_errors=False`, only one killed by a signal: an error status is then the
  job's failure, a bug that would fail again)
  with the same argv, environment, folder, output and readiness, up to N times, with a
  note (`worker1 died (signal 9); restarting it (restart 1 of 3)`); whatever its dead
  process left in its process group is killed first, and its log file is appended to
  (a `# restart K: <the command>` line first). The job runs until a child that decides
  it has exited: a service, or an essential, fatal child without restarts (the
  scheduler, the evaluator). Only `wait` restarts (never a stop); `restart(child)`
  starts an exited child again at once, whatever its budget.
* **Readiness** (`ready=True`, esync.infra.ready): the child gets the write end of a pipe in
  ESYNC_READY_FD and writes the port it listens on as one line; `wait_ready` waits for
  that line with a deadline and learns of the child's death before it was ready from
  the pipe's end of file (the child's copy closes when it dies): event-driven, no
  polling and no connection attempts.
* **Waiting** is woken by child exits (a pidfd per child, os.pidfd_open, in a selector;
  on kernels without pidfds, a 50 ms poll) and by readiness; `wait(timeout)` returns None
  when the timeout passes first, so that a caller can refresh a progress bar. The
  outcome names the first child, in the order they exited, that failed (non-zero
  status of a fatal child, or a service that ended), and the children the job lost.
* **Stop** (`stop`, and leaving the `with` block): SIGTERM to each child's process
  group, then up to `grace` seconds (5) until no live process (zombies aside) is left
  in those groups (a /proc scan), then SIGKILL to every group still populated: a sweep,
  so that nothing a child started survives. A Ctrl-C (KeyboardInterrupt) or
  `Interrupted` during the grace skips to SIGKILL at once. Restarted children are
  stopped alike (their earlier processes' groups were emptied when they were restarted).

`free_port()` is for the rare case where a port must be known before the process that
binds it starts (e.g. a test that starts workers before their scheduler); otherwise
let the child bind port 0 and report it (readiness): a port found free and handed on
can be taken by someone else before the child binds it.

Standard library only; it imports nothing of esync but the name of the readiness
variable.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import selectors
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Union

from esync.infra.ready import ENV as READY_ENV

#: seconds from SIGTERM to SIGKILL when stopping
GRACE_S = 5.0
#: how often a stop looks for processes left in the children's groups, and how often
#: exits are looked for where the kernel has no pidfds
POLL_S = 0.05
#: seconds a child may take to report readiness
READY_TIMEOUT_S = 60.0

_PR_SET_PDEATHSIG = 1
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") \
        else None
except (OSError, AttributeError):  # no libc symbols to be found: no parent-death signal
    _prctl = None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free now (it may be taken before you bind it: prefer port 0
    and readiness where the process that binds it can report it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ChildFailed(Exception):
    """A child ended, or did not report readiness, before it was ready."""

    def __init__(self, child: "Child", message: str):
        super().__init__(message)
        self.child = child


class Interrupted(Exception):
    """A signal the launcher treats as Ctrl-C (see `interrupt_on`)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def interrupt_on(signals: Iterable[int],
                 raise_: Callable[[int], BaseException] = Interrupted) -> Iterator[None]:
    """While in the block, these signals raise `raise_(signum)` in the main thread (e.g.
    SIGTERM as KeyboardInterrupt); elsewhere than the main thread, nothing changes."""
    previous = {}
    if _in_main_thread():
        def handler(signum, frame):
            raise raise_(signum)
        for sig in signals:
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@dataclass
class Child:
    """One started child process (after a restart: its latest process)."""

    name: str
    argv: List[str]
    proc: subprocess.Popen
    essential: bool = True
    log: Optional[str] = None         # where its output goes (None: inherited)
    port: Optional[int] = None        # what it reported (ready=True)
    #: whether its failure ends the job: a bool, or asked (with the child) at its death
    fatal: Union[bool, Callable[["Child"], bool]] = True
    max_restarts: int = 0             # started again up to this many times (restart=)
    restarts: int = 0                 # times it was started again so far
    restart_errors: bool = True       # restarted after an error status too, not only a signal
    _spec: Dict[str, Any] = field(default_factory=dict, repr=False)  # how to start it
    _settled: bool = False            # its exit was looked at (restart, note, verdict)
    _tolerated: bool = False          # it failed and the job goes on without it
    _pidfd: Optional[int] = None
    _ready_fd: Optional[int] = None   # read end of its readiness pipe
    _ready_buf: bytes = b""

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> Optional[int]:
        return self.proc.returncode

    def running(self) -> bool:
        return self.proc.poll() is None

    def how(self) -> str:
        """How its process ended: `signal 9`, `exit status 1` (or `running`)."""
        return ended_how(self.returncode)


def fails_job(child: Any) -> bool:
    """Whether a failed child's failure ends the job (its `fatal`, asked now if a
    callable). Children: a Supervisor's, or launch.onray's role handles."""
    return child.fatal(child) if callable(child.fatal) else bool(child.fatal)


def ended_how(code: Optional[int]) -> str:
    """A process's status in words: `signal 9`, `exit status 1` (None: `running`)."""
    if code is None:
        return "running"
    return f"signal {-code}" if code < 0 else f"exit status {code}"


@dataclass
class Outcome:
    """How the job ended: `failed` is None when every essential child exited 0 (or
    failed but was not fatal), else the first child (in the order they exited) that
    failed or, a service, ended. `lost`: the children that failed, not fatally, and were
    not started again (in the order they exited)."""

    failed: Optional[Child]
    lost: List[Child] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.failed is None

    @classmethod
    def of(cls, children: Sequence[Any], exited: Sequence[Any]) -> Optional["Outcome"]:
        """The outcome once `exited` (in the order they exited; not-fatal failures
        marked `_tolerated`) decide it, else None (the job runs on). Children: a
        Supervisor's, or anything with `essential`, `returncode` and `_tolerated`."""
        lost = [c for c in exited if c._tolerated]
        for child in exited:
            if not child.essential or (child.returncode != 0 and not child._tolerated):
                return cls(child, lost)
        if all(c in exited for c in children if c.essential):
            return cls(None, lost)
        return None


@dataclass
class Supervisor:
    """Starts, watches and stops child processes (see the module's docstring)."""

    grace: float = GRACE_S
    say: Optional[Callable[[str], None]] = None  # its own notes (default: stderr)
    children: List[Child] = field(default_factory=list)
    _exited: List[Child] = field(default_factory=list)  # in the order they exited
    _selector: selectors.BaseSelector = field(default_factory=selectors.DefaultSelector)
    _pidfds: bool = hasattr(os, "pidfd_open")

    # --- starting ---------------------------------------------------------------------
    def start(self, name: str, argv: Sequence[str], *, env: Optional[Dict[str, str]] = None,
              cwd: Optional[str] = None, log: Optional[str] = None,
              essential: bool = True, ready: bool = False,
              fatal: Union[bool, Callable[[Child], bool]] = True,
              restart: int = 0, restart_errors: bool = True,
              append: bool = False) -> Child:
        """Start one child (OSError if it cannot be started). `log`: a file for its
        output (without: it writes where the launcher does); `append`: added to the
        file rather than replacing it (a resumed job keeps what its killed run said).
        `ready`: it reports its port (wait_ready).
        `fatal`: whether its failure ends the job (a callable: asked at its death);
        `restart`: how many times it is started again when it fails while the job runs
        (`restart_errors` False: only when killed by a signal)."""
        if restart < 0:
            raise ValueError(f"restart={restart}: expected a number of restarts >= 0")
        argv = list(argv)
        spec = dict(env=dict(os.environ if env is None else env), cwd=cwd, ready=ready)
        with _signals_held():
            proc, ready_r = self._popen(argv, spec, log, f"# {shlex.join(argv)}\n",
                                        "a" if append else "w")
            child = Child(name, argv, proc, essential, log, fatal=fatal,
                          max_restarts=restart, restart_errors=restart_errors, _spec=spec)
            self._watch(child, ready_r)
            self.children.append(child)
        return child

    def restart(self, child: Child) -> Child:
        """Start `child`, which has exited, again now: the same argv, environment,
        folder, output (its log appended to) and readiness; whatever its process left in
        its process group is killed first. OSError if it cannot be started (it then stays
        exited). Counts as one of its restarts."""
        if child not in self.children:
            raise ValueError(f"{child.name} is not a child of this supervisor")
        if child.running():
            raise ValueError(f"{child.name} is running")
        self._reap()
        self._forget(child)
        child.restarts += 1
        with _signals_held():
            proc, ready_r = self._popen(
                child.argv, child._spec, child.log,
                f"# restart {child.restarts}: {shlex.join(child.argv)}\n", "a")
            child.proc = proc
            child.port = None
            child._settled = child._tolerated = False
            child._ready_buf = b""
            self._watch(child, ready_r)
        self._exited = [c for c in self._exited if c is not child]
        return child

    def _popen(self, argv: List[str], spec: Dict[str, Any], log: Optional[str],
               header: str, mode: str) -> tuple:
        """The started process and the read end of its readiness pipe (or None)."""
        env = dict(spec["env"])
        pass_fds: tuple = ()
        ready_r = ready_w = None
        if spec["ready"]:
            ready_r, ready_w = os.pipe()
            env[READY_ENV] = str(ready_w)
            pass_fds = (ready_w,)
        else:
            env.pop(READY_ENV, None)
        stdout = stderr = None
        log_file = None
        try:
            if log is not None:
                folder = os.path.dirname(log)
                if folder:
                    os.makedirs(folder, exist_ok=True)
                log_file = open(log, mode)
                log_file.write(header)
                log_file.flush()
                stdout, stderr = log_file, subprocess.STDOUT
            parent = os.getpid()
            proc = subprocess.Popen(argv, cwd=spec["cwd"], env=env, stdin=subprocess.DEVNULL,
                                    stdout=stdout, stderr=stderr, pass_fds=pass_fds,
                                    start_new_session=True,
                                    preexec_fn=lambda: _die_with_parent(parent))
        except BaseException:
            for fd in (ready_r, ready_w):
                if fd is not None:
                    os.close(fd)
            raise
        finally:
            if log_file is not None:
                log_file.close()
        if ready_w is not None:
            os.close(ready_w)  # the child's copy is the only one: its death is our EOF
        return proc, ready_r

    def _watch(self, child: Child, ready_r: Optional[int]) -> None:
        """Register the child's readiness and exit with the selector."""
        proc = child.proc
        if ready_r is not None:
            child._ready_fd = ready_r
            self._selector.register(ready_r, selectors.EVENT_READ, ("ready", child))
        if self._pidfds:
            try:
                child._pidfd = os.pidfd_open(proc.pid)
                self._selector.register(child._pidfd, selectors.EVENT_READ, ("exit", child))
            except OSError:  # a kernel without pidfds (Linux < 5.3): poll instead
                self._pidfds = False

    def _forget(self, child: Child) -> None:
        """Before a restart: close its descriptors, and kill what is left in its process
        group."""
        self._close_ready(child)
        if child._pidfd is not None:
            self._selector.unregister(child._pidfd)
            os.close(child._pidfd)
            child._pidfd = None
        if self._populated([child]):
            _signal_groups([child], signal.SIGKILL)

    # --- waiting ----------------------------------------------------------------------
    def wait_ready(self, child: Child, timeout: float = READY_TIMEOUT_S) -> int:
        """The port `child` (started with ready=True) reports. ChildFailed if it dies
        first (noticed at once: its end of the pipe closes) or is silent for `timeout`
        seconds."""
        if child.port is not None:
            return child.port
        if child._ready_fd is None:
            raise ValueError(f"{child.name} was not started with ready=True")
        deadline = time.monotonic() + timeout
        while child._ready_fd is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._close_ready(child)
                raise ChildFailed(child, f"{child.name} did not report that it is ready "
                                         f"within {timeout:g} s")
            self._select(remaining)
        if child.port is None:
            try:  # it closed the pipe: it is ending; its status says why
                child.proc.wait(2.0)
            except subprocess.TimeoutExpired:
                pass
            self._reap()
            status = (f"exited with status {child.returncode}" if child.returncode is not None
                      else "closed its readiness pipe without a port")
            raise ChildFailed(child, f"{child.name} {status} before it was ready")
        return child.port

    def wait(self, timeout: Optional[float] = None) -> Optional[Outcome]:
        """Until a child fails fatally (non-zero status, or a service ends) or every
        essential child has exited (0, or a failure the job goes on without); None if
        `timeout` seconds pass first. Children that fail while the job runs are started
        again here (restart=)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._reap()
            self._settle()
            outcome = self._outcome()
            if outcome is not None:
                return outcome
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            self._select(remaining)

    def _job_runs(self) -> bool:
        """Whether no child that decides the job has exited: a service, or an essential,
        fatal child without restarts."""
        return not any(not c.essential or (c.max_restarts == 0 and not callable(c.fatal)
                                           and c.fatal) for c in self._exited)

    def _settle(self) -> None:
        """Look at each child that exited since the last look: start it again (restart=,
        while the job runs), or note that the job goes on without it (fatal=False)."""
        for child in list(self._exited):
            if child._settled:
                continue
            child._settled = True
            if child.returncode == 0 or not child.essential:
                continue
            runs = self._job_runs()
            # with restart_errors=False, an error status is the job's failure (a bug
            # would fail again): only a signal (a lost machine) is restarted
            erred = child.returncode > 0 and not child.restart_errors
            if runs and child.restarts < child.max_restarts and not erred:
                self._note(f"{child.name} died ({child.how()}); restarting it (restart "
                           f"{child.restarts + 1} of {child.max_restarts})")
                try:
                    self.restart(child)
                except OSError as e:
                    self._note(f"{child.name}: cannot start it again: {e.strerror or e}")
                else:
                    continue
            if fails_job(child):
                continue  # the job's failure: the outcome names it
            child._tolerated = True
            after = f" after {child.restarts} restart(s)" if child.restarts else ""
            self._note(f"{child.name} died ({child.how()}){after}; the job goes on without it"
                       if runs else f"{child.name} died ({child.how()}) as the job ended")

    def _outcome(self) -> Optional[Outcome]:
        # only what _reap saw: a child reaped here would skip the failure check
        return Outcome.of(self.children, self._exited)

    def _reap(self) -> None:
        for child in self.children:
            if child not in self._exited and child.proc.poll() is not None:
                self._exited.append(child)
                if child._pidfd is not None:
                    self._selector.unregister(child._pidfd)
                    os.close(child._pidfd)
                    child._pidfd = None

    def _select(self, timeout: Optional[float]) -> None:
        """Wait up to `timeout` for an exit or readiness, and handle what came."""
        if not self._pidfds:
            timeout = POLL_S if timeout is None else min(timeout, POLL_S)
        if not self._selector.get_map():
            if timeout is None:
                raise RuntimeError("nothing to wait for")
            time.sleep(timeout)
            return
        for key, _ in self._selector.select(timeout):
            kind, child = key.data
            if kind == "ready":
                self._read_ready(child)
            else:
                self._reap()

    def _read_ready(self, child: Child) -> None:
        if child._ready_fd is None:
            return
        try:
            data = os.read(child._ready_fd, 64)
        except BlockingIOError:
            return
        child._ready_buf += data
        if b"\n" in child._ready_buf:
            line = child._ready_buf.split(b"\n", 1)[0].strip()
            try:
                child.port = int(line)
            except ValueError:
                child.port = None
            self._close_ready(child)
        elif not data:
            self._close_ready(child)

    def _close_ready(self, child: Child) -> None:
        if child._ready_fd is not None:
            self._selector.unregister(child._ready_fd)
            os.close(child._ready_fd)
            child._ready_fd = None

    # --- stopping ---------------------------------------------------------------------
    def stop(self, children: Optional[Iterable[Child]] = None) -> None:
        """Stop these children (default: all) and everything in their process groups:
        SIGTERM, up to `grace` seconds, then SIGKILL to every group still populated.
        Returns once the children are reaped."""
        targets = list(self.children if children is None else children)
        _signal_groups(self._populated(targets), signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        try:
            while self._populated(targets):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._select(min(POLL_S, remaining))
        except (KeyboardInterrupt, Interrupted):
            self._note("stopping now (SIGKILL)")
        _signal_groups(self._populated(targets), signal.SIGKILL)
        for child in targets:
            try:
                child.proc.wait(5)
            except subprocess.TimeoutExpired:
                self._note(f"{child.name}: still running after SIGKILL")
        self._reap()
        for child in targets:
            self._close_ready(child)

    def _populated(self, targets: Sequence[Child]) -> List[Child]:
        """Those of targets with a live process (not a zombie) in their process group."""
        for child in targets:
            child.proc.poll()  # reap the child itself
        groups = _live_groups()
        result = []
        for child in targets:
            if groups is not None:
                if child.pid in groups:
                    result.append(child)
            elif child.running():
                result.append(child)
        return result

    def close(self) -> None:
        """Stop every child still running and release the supervisor's descriptors."""
        self.stop()
        self._reap()
        self._selector.close()

    def _note(self, line: str) -> None:
        if self.say is not None:
            self.say(line)
        else:
            sys.stderr.write(f"supervisor: {line}\n")
            sys.stderr.flush()

    def __enter__(self) -> "Supervisor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --- helpers ------------------------------------------------------------------------------

#: the signals held while a child is forked (_signals_held)
HELD_SIGNALS = {signal.SIGINT, signal.SIGTERM}


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM while a child is forked and registered. One that comes
    while CPython runs its after-fork hooks in the parent (logging's lock) is raised in
    a hook, where it is only reported ("Exception ignored") and lost, and the launcher
    went on as if never interrupted (seen in CI: a Ctrl-C as the last child started).
    Held, it is raised here once the child is known, and so stopped with the rest."""
    if not _in_main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _die_with_parent(parent: int) -> None:
    """In the child, before exec: the signals the launcher held while forking are the
    child's again; SIGKILL when the launcher dies (Linux), and exit now if it already
    died between fork and here."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD_SIGNALS)
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)


def _signal_groups(children: Iterable[Child], sig: int) -> None:
    for child in children:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, sig)


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
