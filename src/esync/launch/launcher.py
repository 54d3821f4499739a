"""The job on this machine: `Launcher` starts a plan's roles (esync/launch/job.py) as
child processes (esync/launch/supervisor.py), on loopback, then watches them: a
progress bar, the live page's reports, the end's line and exit status (0 done, 1 a
process whose failure ends the job failed, 130 interrupted). esync/launch/onray.py's
RayLauncher is the same with each role a Ray actor. What the job is, its flags and
its exit statuses: esync/launch/local.py (esync-launch)."""
from __future__ import annotations

import os
import secrets
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import IO, ClassVar, Dict, List, Optional, Sequence

from tqdm import tqdm

from esync.logs.live import JOB_ID_ENV, LiveReporter, page_url
from esync.logs.live import URL_ENV as LIVE_URL_ENV
from esync.infra.stateclient import TOKEN_ENV as STATE_TOKEN_ENV
from esync.launch.job import (ADDRESS, CODE, REPO, SCHEDULER, SERVER, STATESERVER, WORKER,
                              Endpoint, Plan, Role, filler, inherited, job_secrets,
                              last_line, launch)
from esync.launch.progress import JobLogs, Progress
from esync.launch.supervisor import (GRACE_S, Child, ChildFailed, Supervisor, ended_how,
                                     interrupt_on)



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


@dataclass
class Launcher:
    plan: Plan
    progress: bool = True
    out: IO[str] = field(default_factory=lambda: sys.stderr)
    position: int = 0     # of the progress bar (the experiment's job bar sits below its own)
    nested: bool = False  # inside the experiment: the bar is cleared at the end
    supervisor: Supervisor = field(init=False)
    logs: JobLogs = field(init=False)  # what the job's logs say so far
    _training: bool = False   # a round of this run was logged
    _secrets: Dict[str, str] = field(default_factory=dict)  # the job's key and token
    #: the job's id and, once its state server listens, its live page (ESYNC_JOB_ID,
    #: ESYNC_LIVE_URL): every process's
    _job_vars: Dict[str, str] = field(default_factory=dict)
    live: Optional[LiveReporter] = None  # this launcher's reports to the live page
    _started: Dict[str, Child] = field(default_factory=dict)  # each role's process
    _endpoints: Dict[str, Endpoint] = field(default_factory=dict)  # where others reach it
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
        self.logs = JobLogs(self.plan.folder, self.plan.stop_rounds, self.plan.stop_seconds,
                            self.plan.options.metric)

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
            self._training = self.logs.rounds() > 0
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
        """Start the job's processes (its plan's roles, in order); ChildFailed if the
        scheduler or the state server dies (or stays silent) before it listens."""
        launch(self.plan.roles(), self)

    def endpoint(self, name: str) -> Endpoint:
        """(Backend) Where the others reach role `name`: once it reported its port
        (waited for here); before it starts, where it binds: any free port here."""
        child = self._started.get(name)
        if child is None:
            return ADDRESS, "0"
        if name not in self._endpoints:
            self._endpoints[name] = (self._address(child),
                                     str(self.supervisor.wait_ready(child)))
        return self._endpoints[name]

    def start(self, role: Role) -> None:
        """(Backend) Start one role: the state server and the scheduler at once, every
        other once the live page is open (which waits for the state server), each once
        the roles it reaches listen. With a scheduler, the job can lose (and restart) a
        server or a worker (one that exits with an error status failed in its code: not
        restarted)."""
        if role.kind not in (STATESERVER, SCHEDULER):
            self._open_live()
        role = role.resolved(self.endpoint)
        argv, env, log = self.plan.command(role)
        options = dict(fatal=self._fatal, restart=self.plan.restarts, restart_errors=False) \
            if self.plan.algorithm.parameter_server and role.kind in (SERVER, WORKER) else {}
        if role.kind == STATESERVER:
            options.update(cwd=os.path.join(CODE, "stateserver"), essential=False)
        self._started[role.name] = self._start_role(role.name, argv, {**role.env, **env},
                                                    log, ready=role.listens, **options)

    # --- the live page -----------------------------------------------------------------
    def _open_live(self) -> None:
        """Once: wait for the state server, give every process started from now on the
        job's live page (ESYNC_LIVE_URL), say where it is and report there."""
        if LIVE_URL_ENV in self._job_vars:
            return
        self._job_vars[LIVE_URL_ENV] = page_url(*self.endpoint(STATESERVER), self.job_id)
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

    def status(self) -> tuple:
        """(fraction done or None, `round R, E s, test accuracy A`)."""
        return self.logs.status([c for c in self.children if c.name.startswith("worker")
                                 or c.name == "evaluator"])

    def status_line(self, status: Optional[tuple] = None) -> str:
        """The plain form of `status` (default: now)."""
        return self.logs.line(status or self.status())

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
            line = self.status_line(status) + lost_note(outcome.lost) + self.logs.model_note()
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
        self.logs.begin()
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
