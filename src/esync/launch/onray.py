"""`esync-launch --ray [ADDRESS] ...`: the local launcher's job, each process a Ray actor.

    esync-launch --ray auto -m esync --workers 4 --devices gpu,gpu,cpu,cpu \\
        --slowdown 1,1,4,4 -n lenet --time-limit 60

The job is the one esync/launch/local.py describes (the same flags and checks); only where its
processes run differs. Ray places them, it does not carry tensors: each role (state
server, scheduler, servers, workers, evaluator) is one actor (`RoleActor`) that starts
the same `main.py` (or `manage.py runserver`) as a child process, with the same DMLC_*
variables (DMLC_NODE_HOST: the actor's node address), through launch.supervisor (its own
process group, killed with the actor), and the cluster's address, the job's namespace and
runtime environment (ESYNC_RAY_ADDRESS, ESYNC_RAY_NAMESPACE, ESYNC_RAY_RUNTIME_ENV), by
which a worker with --remote-prep joins the cluster to send its preprocessing to Ray tasks,
and the tasks that do it (ESYNC_RAY_TASKS: esync/launch/rayprep.py's; the runtime, esync.runtime.remoteprep
included, never imports ray).

Placement: one placement group for the whole job (all or nothing, strategy PACK), a
bundle per process: a worker asks for `--num-threads` CPUs (1 unless given) and, with
`--devices gpu`, one GPU (Ray sets its CUDA_VISIBLE_DEVICES; it trains on `-g 0`); the
scheduler, each server, the state server and the evaluator ask for one CPU each where
`--ray-servers-on` says (head: the head node; any; resource:NAME: a node with that
custom resource; label:KEY=VALUE: a node with that label). What the cluster cannot hold
at all (its alive nodes' totals, the largest node, the node that `--ray-servers-on`
names) fails at once, naming what is missing, e.g. `3 GPU workers asked, the cluster has
1 GPU`; what it holds but others use now is waited for `--ray-timeout` seconds.

Code: the checkout is shipped with the job (Ray's runtime_env working_dir, without what
.gitignore leaves out): every node runs this checkout's main.py (which puts the
checkout's src/ first) with its own Python, which needs esync installed (the actors
import esync.launch.onray) with its requirements (torch, ...). Paths given to main.py (--data-dir,
--checkpoint-dir) are paths on each node (relative ones: in the shipped folder).

Logs: each actor's process writes its iteration logs and output into a folder of its own
on its node; the launcher copies what is new from every actor while the job runs (and
at its end) into OUT/<network>/<log folder>/<node's host>/..., the layout of
esync/launch/local.py and esync/logs_tools/summary.py, whether or not the nodes share a file system.

Supervision: as esync/launch/local.py's (exit status 0, 1, 130; a server or worker lost once
training began is left to the scheduler); a dead actor counts as a dead process. At the
end, Ctrl-C or a failure, every actor's process is stopped (SIGTERM, SIGKILL after 5 s),
the actors are killed and the placement group removed; if the launcher itself dies, Ray
kills the actors it owns and their processes die with them. `--restart-failed` is not
for Ray.

Ray address: `--ray ADDRESS` as ray.init's (auto, HOST:PORT, ray://HOST:10001); `--ray`
alone: RAY_ADDRESS's cluster, else a new local Ray instance for the job, with as many
logical CPUs as the job asks (at least this machine's), shut down at the end.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from esync.runtime.remoteprep import ADDRESS_ENV, NAMESPACE_ENV, RUNTIME_ENV_ENV, TASKS_ENV
from esync.launch import rayprep
from esync.errors import UserError
from esync.launch.job import REPO, STATE_DB, Plan, filler, inherited, last_line
from esync.launch.launcher import Launcher
from esync.launch.supervisor import (GRACE_S, ChildFailed, Outcome, Supervisor, ended_how,
                                     fails_job)

#: the head node's resource in Ray (every cluster has it on its head)
HEAD_RESOURCE = "node:__internal_head__"
#: how much of a placement resource (resource:NAME, the head's) a bundle takes
PLACE_AMOUNT = 0.001
#: the roles that go where --ray-servers-on says
SERVICE_ROLES = ("stateserver", "scheduler", "evaluator", "server")
#: seconds for an actor's answer (its start, a stop, a copy of its logs)
ANSWER_S = 60.0
#: an actor's folder on its node: FOLDER_PREFIX<actor's pid>-<role>-<random>
FOLDER_PREFIX = "esync-ray-"
#: what the checkout ships without (beside .gitignore's; patterns as .gitignore's, `/`:
#: the checkout's top folder)
EXCLUDES = ["/.git", "/.venv", "/runs", "/logs", "/data", "*.sqlite3"]


# --- on the nodes ---------------------------------------------------------------------

class RoleActor:
    """One of the job's processes on a Ray node (made an actor by `RayJob.start`)."""

    def __init__(self, name: str):
        self.name = name
        _remove_orphans()
        self.root = tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-{name}-")
        self.logs = os.path.join(self.root, "logs")
        self.supervisor = Supervisor(grace=GRACE_S, say=lambda line: None)
        self.child = None
        self._sent: Dict[str, Tuple[int, int]] = {}  # file -> (size, mtime) copied

    def where(self) -> Dict[str, str]:
        """The node's address (others reach its process there) and host name."""
        return {"address": ray.util.get_node_ip_address(), "host": socket.gethostname()}

    def start(self, argv: Sequence[str], env: Mapping[str, str], log: str,
              cwd: Optional[str], ready: bool) -> Optional[int]:
        """Start the process; with `ready`, the port it reports (RuntimeError, with its
        last lines, if it dies first)."""
        where = self.where()
        # the checkout Ray shipped to this node: the actor's folder (its working_dir)
        fill = filler(sys.executable, os.getcwd(), where["address"], self.logs, where["host"])

        # the node's own key or token never count: the job's come in `env`
        full = dict(inherited(os.environ, auth=False), **{k: fill(v) for k, v in env.items()},
                    DMLC_NODE_HOST=where["address"], **cluster_variables())
        path = os.path.join(self.logs, where["host"], log)
        self.child = self.supervisor.start(self.name, [fill(a) for a in argv], env=full,
                                           cwd=fill(cwd) if cwd else None, log=path,
                                           ready=ready)
        if not ready:
            return None
        try:
            return self.supervisor.wait_ready(self.child)
        except ChildFailed as e:
            last = last_line(path)
            raise RuntimeError(f"{e}{f': {last}' if last else ''}") from None

    def wait(self) -> int:
        """Until the process exits: its status."""
        return self.child.proc.wait()

    def collect(self) -> List[Tuple[str, int, bytes]]:
        """What is new in its log folder since the last call: (file relative to the
        folder, offset, bytes); offset 0: the whole file, else bytes appended there."""
        new = []
        for folder, _, files in os.walk(self.logs):
            for name in files:
                if STATE_DB in name:
                    continue
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, self.logs)
                try:
                    st = os.stat(path)
                    seen = self._sent.get(rel)
                    if seen == (st.st_size, st.st_mtime_ns):
                        continue
                    with open(path, "rb") as f:
                        offset = seen[0] if seen and name.endswith(".log") \
                            and st.st_size >= seen[0] else 0
                        f.seek(offset)
                        data = f.read(st.st_size - offset)
                except OSError:
                    continue
                self._sent[rel] = (offset + len(data), st.st_mtime_ns)
                new.append((rel, offset, data))
        return new

    def stop(self) -> Optional[int]:
        """Stop the process (SIGTERM, SIGKILL after the grace); its status."""
        self.supervisor.stop()
        return None if self.child is None else self.child.returncode

    def remove(self) -> None:
        """Remove its folder (after its logs were copied)."""
        self.supervisor.close()
        shutil.rmtree(self.root, ignore_errors=True)


def cluster_variables() -> Dict[str, str]:
    """The variables by which a process of the job joins this Ray cluster itself
    (esync.runtime.remoteprep, for --remote-prep): its address, the job's namespace and runtime
    environment (the shipped checkout), and the tasks that make its batches there
    (esync/launch/rayprep.py's)."""
    context = ray.get_runtime_context()
    return {ADDRESS_ENV: context.gcs_address, NAMESPACE_ENV: context.namespace or "",
            RUNTIME_ENV_ENV: json.dumps(dict(context.runtime_env or {})),
            TASKS_ENV: f"{rayprep.__name__}:{rayprep.RayTasks.__name__}"}


def _remove_orphans() -> None:
    """Remove the folders that actors of this node left when they died without removing
    them (killed, or their launcher was): those whose actor's process is gone."""
    base = tempfile.gettempdir()
    for entry in os.listdir(base):
        if not entry.startswith(FOLDER_PREFIX):
            continue
        pid = entry[len(FOLDER_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(os.path.join(base, entry), ignore_errors=True)


# --- placement ------------------------------------------------------------------------

def bundles(plan: Plan) -> Dict[str, Dict[str, float]]:
    """Each process's resources, by its name (as Plan.roles names them)."""
    service: Dict[str, float] = {"CPU": 1.0}
    where = plan.ray.servers_on
    if where == "head":
        service[HEAD_RESOURCE] = PLACE_AMOUNT
    elif where.startswith("resource:"):
        service[where.split(":", 1)[1]] = PLACE_AMOUNT
    names = ["stateserver"]  # every mode's live page; ESync's budgets too
    if plan.algorithm.parameter_server:
        names += ["scheduler", *(f"server{s}" for s in range(plan.servers))]
    if plan.evaluator:
        names.append("evaluator")
    out = {name: dict(service) for name in names}
    for k in range(plan.workers):
        gpu = (plan.devices[k] or "").startswith("gpu")
        out[f"worker{k}"] = dict({"CPU": float(plan.threads)}, **({"GPU": 1.0} if gpu else {}))
    return out


def label_of(plan: Plan) -> Optional[Tuple[str, str]]:
    """--ray-servers-on label:KEY=VALUE's (KEY, VALUE)."""
    where = plan.ray.servers_on
    if not where.startswith("label:"):
        return None
    key, _, value = where.split(":", 1)[1].partition("=")
    return key, value


def check_placeable(plan: Plan, nodes: Sequence[Mapping[str, Any]]) -> None:
    """UserError (one line, naming what is missing) if the alive `nodes` (ray.nodes())
    can never hold the job."""
    alive = [n for n in nodes if n.get("Alive")]
    wanted = bundles(plan)
    have = lambda key: sum(n["Resources"].get(key, 0.0) for n in alive)  # noqa: E731
    gpus = sum(1 for b in wanted.values() if "GPU" in b)
    if gpus > have("GPU"):
        raise UserError(f"{gpus} GPU worker(s) asked, the cluster has "
                        f"{have('GPU'):g} GPU(s)")
    cpus = sum(b["CPU"] for b in wanted.values())
    workers_cpus = sum(b["CPU"] for n, b in wanted.items() if n.startswith("worker"))
    if cpus > have("CPU"):
        raise UserError(
            f"{cpus:g} CPUs asked ({workers_cpus:g} for {plan.workers} worker(s) of "
            f"{plan.threads} thread(s), {cpus - workers_cpus:g} for the scheduler, servers, "
            f"state server and evaluator), the cluster has {have('CPU'):g}")
    largest = max((n["Resources"].get("CPU", 0.0) for n in alive), default=0.0)
    if plan.threads > largest:
        raise UserError(f"a worker of {plan.threads} threads needs {plan.threads} CPUs "
                        f"on one node; the largest node has {largest:g}")
    for name, bundle in wanted.items():
        if "GPU" in bundle and not any(n["Resources"].get("GPU", 0) >= 1 and
                                       n["Resources"].get("CPU", 0) >= bundle["CPU"]
                                       for n in alive):
            raise UserError(f"a GPU worker needs a node with a GPU and "
                            f"{bundle['CPU']:g} CPU(s); none has both")
    services = [b for n, b in wanted.items() if not n.startswith("worker")]
    if not services:
        return
    where = plan.ray.servers_on
    label = label_of(plan)
    placed = [n for n in alive
              if all(n["Resources"].get(k, 0.0) >= v for k, v in services[0].items()
                     if k != "CPU")
              and (label is None or (n.get("Labels") or {}).get(label[0]) == label[1])]
    if not placed:
        raise UserError(f"--ray-servers-on {where}: no alive node is "
                        + ("the head" if where == "head" else
                           f"labelled {label[0]}={label[1]}" if label else
                           f"given the resource {where.split(':', 1)[1]!r}"))
    room = max(n["Resources"].get("CPU", 0.0) for n in placed) if where != "any" else \
        have("CPU")
    if len(services) > room:
        raise UserError(f"the scheduler, servers, state server and evaluator ask for "
                        f"{len(services)} CPUs on {where}, which has {room:g}")


# --- in the launcher ------------------------------------------------------------------

@dataclass
class RoleHandle:
    """The launcher's view of one role's actor (what Launcher reads of a Child)."""

    name: str
    actor: Any
    essential: bool
    fatal: Union[bool, Callable[["RoleHandle"], bool]]
    log: str                 # the copy of its output, here
    address: str             # of its node
    host: str
    port: Optional[int] = None
    returncode: Optional[int] = None
    actor_died: bool = False
    _tolerated: bool = False

    def how(self) -> str:
        return "its Ray actor died" if self.actor_died else ended_how(self.returncode)


@dataclass
class RayJob:
    """Starts the job's actors in its placement group, watches and stops them: what
    launch.supervisor.Supervisor is to RayLauncher (start, wait_ready, wait, close)."""

    plan: Plan
    group: Any                      # the placement group
    index: Dict[str, int]           # process name -> bundle index
    resources: Dict[str, Dict[str, float]]
    namespace: str                  # the job's: its actors are named by role in it
    say: Callable[[str], None]
    children: List[RoleHandle] = field(default_factory=list)
    _exits: Dict[Any, RoleHandle] = field(default_factory=dict)  # wait() ref -> role
    _exited: List[RoleHandle] = field(default_factory=list)
    _actors: Dict[str, Any] = field(default_factory=dict)  # process name -> its actor
    _where: Dict[str, Any] = field(default_factory=dict)   # -> ref of its where()

    def __post_init__(self) -> None:
        # every actor at once: Ray starts their worker processes side by side
        self._actors = {name: ray.remote(RoleActor).options(
            name=name, namespace=self.namespace, max_concurrency=4,
            num_cpus=self.resources[name]["CPU"],
            num_gpus=self.resources[name].get("GPU", 0), max_restarts=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                self.group, placement_group_bundle_index=index))
            .remote(name) for name, index in self.index.items()}
        self._where = {name: actor.where.remote() for name, actor in self._actors.items()}

    def start(self, name: str, argv: Sequence[str], *, env: Dict[str, str], log: str,
              cwd: Optional[str] = None, essential: bool = True, ready: bool = False,
              fatal: Union[bool, Callable[[RoleHandle], bool]] = True,
              restart: int = 0, restart_errors: bool = True) -> RoleHandle:
        """Start process `name` in its actor; with `ready`, wait for its port
        (ChildFailed if it dies first). (No restarts on Ray: `restart` and
        `restart_errors` are Supervisor.start's, and refused by the plan.)"""
        actor = self._actors[name]
        handle = RoleHandle(name, actor, essential, fatal, "", "", "")
        self.children.append(handle)
        try:
            where = ray.get(self._where[name], timeout=ANSWER_S)
            handle.address, handle.host = where["address"], where["host"]
            handle.log = os.path.join(self.plan.folder, handle.host, log)
            started = actor.start.remote(list(argv), env, log, cwd, ready)
            handle.port = ray.get(started, timeout=ANSWER_S + 60.0)
        except (RayError, GetTimeoutError) as e:
            self._copy([handle])
            raise ChildFailed(handle, f"{name} did not start on Ray: {_reason(e)}") from None
        self._exits[actor.wait.remote()] = handle
        return handle

    def wait_ready(self, handle: RoleHandle, timeout: float = 0.0) -> int:
        return handle.port

    def wait(self, timeout: Optional[float] = None) -> Optional[Outcome]:
        """As Supervisor.wait (no restarts): until a role fails fatally or every
        essential one has exited; None after `timeout`. Copies the logs meanwhile."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._copy(self.children)
            outcome = Outcome.of(self.children, self._exited)
            if outcome is not None:
                return outcome
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            done, _ = ray.wait(list(self._exits), num_returns=1,
                               timeout=1.0 if remaining is None else min(remaining, 1.0))
            for ref in done:
                self._exit(self._exits.pop(ref), ref)

    def _exit(self, handle: RoleHandle, ref) -> None:
        try:
            handle.returncode = ray.get(ref)
        except RayError:
            handle.actor_died = True
            handle.returncode = -9
        self._copy([handle])
        self._exited.append(handle)
        if handle.returncode == 0 or not handle.essential:
            return
        if not fails_job(handle):
            handle._tolerated = True
            self.say(f"{handle.name} died ({handle.how()}); the job goes on without it")

    def _copy(self, handles: Sequence[RoleHandle]) -> None:
        """Copy what is new in these roles' log folders into the job's folder here."""
        live = [h for h in handles if not h.actor_died and h.host]
        refs = [h.actor.collect.remote() for h in live]
        for handle, ref in zip(live, refs):
            try:
                files = ray.get(ref, timeout=ANSWER_S)
            except RayActorError:
                handle.actor_died = True
                continue
            except (RayError, GetTimeoutError):
                continue
            for rel, offset, data in files:
                _write(os.path.join(self.plan.folder, rel), offset, data)

    def close(self) -> None:
        """Stop every role's process, copy the last of the logs, kill the actors and
        remove the placement group."""
        live = [h for h in self.children if not h.actor_died]
        stops = [h.actor.stop.remote() for h in live]
        try:
            ray.wait(stops, num_returns=len(stops), timeout=GRACE_S + ANSWER_S)
        except RayError:
            pass
        self._copy(live)
        removes = [h.actor.remove.remote() for h in self.children if not h.actor_died]
        try:
            ray.wait(removes, num_returns=len(removes), timeout=ANSWER_S)
        except RayError:
            pass
        for actor in self._actors.values():
            ray.kill(actor, no_restart=True)
        remove_placement_group(self.group)


def _write(path: str, offset: int, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if offset == 0:
        with open(path, "wb") as f:
            f.write(data)
        return
    with open(path, "r+b" if os.path.exists(path) else "wb") as f:
        f.seek(offset)
        f.write(data)


def _reason(error: BaseException) -> str:
    """The last line of a Ray error (its cause's message)."""
    cause = getattr(error, "cause", None)
    text = str(cause if cause is not None else error).strip()
    return text.splitlines()[-1] if text else type(error).__name__


class RayLauncher(Launcher):
    """esync/launch/launcher.py's Launcher, its processes started as Ray actors."""

    inherits = False  # the exported key and token are passed on too

    def _start_role(self, name: str, argv: Sequence[str], env: Dict[str, str], log: str,
                    **options) -> RoleHandle:
        return self.supervisor.start(name, argv, env=self._env(**env), log=log, **options)

    def _address(self, child: RoleHandle) -> str:
        return child.address

    def run(self) -> int:
        """Connect to (or start) Ray unless this process is connected already, place the
        job, run it; the exit status."""
        self.namespace = f"esync-{secrets.token_hex(4)}"
        if ray.is_initialized():
            return self._run_placed()
        try:
            connect(self.plan)
        except (ConnectionError, RuntimeError, ValueError) as e:
            self.say(f"error: cannot reach the Ray cluster "
                     f"{self.plan.ray.address or os.environ.get('RAY_ADDRESS', '')}: "
                     f"{_reason(e)} (if Ray said its authentication token is missing or "
                     f"wrong: export RAY_AUTH_MODE=token, and RAY_AUTH_TOKEN unless "
                     f"~/.ray/auth_token holds the cluster's)")
            return 1
        try:
            return self._run_placed()
        finally:
            ray.shutdown()

    def _run_placed(self) -> int:
        p = self.plan
        wanted = bundles(p)
        try:
            check_placeable(p, ray.nodes())
        except UserError as e:
            self.say(f"error: cannot place the job on the Ray cluster: {e}")
            return 1
        names = list(wanted)
        label = label_of(p)
        selectors = [({label[0]: label[1]} if label and not n.startswith("worker") else {})
                     for n in names]
        group = placement_group([wanted[n] for n in names], strategy="PACK",
                                bundle_label_selector=selectors if label else None)
        try:
            ray.get(group.ready(), timeout=p.ray.timeout)
        except GetTimeoutError:
            remove_placement_group(group)
            free = ray.available_resources()
            self.say(f"error: cannot place the job on the Ray cluster: its resources did "
                     f"not become free within {p.ray.timeout:g} s (free now: "
                     f"{free.get('CPU', 0):g} CPU(s), {free.get('GPU', 0):g} GPU(s))")
            return 1
        self.supervisor.close()  # the local one, unused
        self.supervisor = RayJob(p, group, {n: i for i, n in enumerate(names)}, wanted,
                                 self.namespace, say=self.say)
        self.say(f"placed on the Ray cluster: {len(names)} process(es) as actors named by "
                 f"role in namespace {self.namespace}")
        return super().run()


def connect(plan: Plan) -> None:
    """ray.init for a --ray plan: its address (None: RAY_ADDRESS's cluster, else a new
    local instance with as many logical CPUs as the job asks, at least this machine's),
    this checkout shipped as the working folder of every actor."""
    options: Dict[str, Any] = dict(
        runtime_env={"working_dir": REPO, "excludes": EXCLUDES},
        logging_level=logging.WARNING, log_to_driver=False)
    if plan.ray.address is None and not os.environ.get("RAY_ADDRESS"):
        cpus = sum(b["CPU"] for b in bundles(plan).values())
        options.update(address="local", include_dashboard=False,
                       num_cpus=max(os.cpu_count() or 1, int(cpus + 0.999)))
    elif plan.ray.address:
        options["address"] = plan.ray.address
    ray.init(**options)


def run(plan: Plan, progress: bool, out=None, position: int = 0, nested: bool = False) -> int:
    """esync/launch/local.py's run for a --ray plan."""
    launcher = RayLauncher(plan, progress=progress, position=position, nested=nested)
    if out is not None:
        launcher.out = out
    return launcher.run()
