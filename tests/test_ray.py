"""`esync-launch --ray ADDRESS ...` (esync/launch/onray.py) on a real Ray cluster: a head
started for this file on this machine (`ray start --head`, every port the OS's, its own
temporary folder and authentication token, stopped at the end with everything it
started). Jobs placed there reach the target accuracy and leave their logs in the
layout esync/logs_tools/summary.py reads; a killed worker actor, a killed launcher and Ctrl-C
stop the whole job (no actor of its namespace, no process left); a job the cluster can
never hold fails at once, naming what is missing. Bad flags need no cluster, and nothing
of esync but esync/launch/onray.py imports ray."""
from __future__ import annotations

import contextlib
import glob
import importlib.util
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Sequence

import pytest

from esync.infra.stateclient import TOKEN_ENV as STATE_TOKEN_ENV
from esync.transport.auth import KEY_ENV, new_key
from esync.launch import local
from esync.launch.supervisor import free_port
from tests.helpers import CLUSTER_VARIABLES, REPO, alive, evaluator_accuracy, wait_until

LAUNCH = os.path.join(REPO, "src", "esync", "launch", "local.py")
SUMMARY = os.path.join(REPO, "src", "esync", "logs_tools", "summary.py")
#: what the head offers: 10 CPUs, 1 (pretend) GPU, a custom resource and a label for
#: --ray-servers-on
CPUS, GPUS = 10, 1
PS_RESOURCE = "esync_ps"
LABEL = ("esync-tier", "ps")
#: `ray start` flags of ports with a fixed default (or bound by the head): each gets a
#: free port, so that two runs of this file at once do not collide
PORT_FLAGS = ("--port", "--dashboard-port", "--ray-client-server-port",
              "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
              "--metrics-export-port", "--runtime-env-agent-port", "--node-manager-port",
              "--object-manager-port")
#: the length of a job that reaches 0.90 on digits (as the local launcher's tests)
TO_TARGET = ["-n", "lenet", "--num-threads", "1", "--target-accuracy", "0.9",
             "--time-limit", "90"]
#: a job that runs until it is stopped
LONG = ["-n", "lenet", "--num-threads", "1", "--time-limit", "300"]


def _proc_fields(pid: int) -> Optional[List[str]]:
    """/proc/PID/stat's fields after the command name (state, ppid, pgrp, session, ...)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _pids() -> List[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _cmdline(pid: int) -> List[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _cwd(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


# --- the cluster ---------------------------------------------------------------------

@dataclass
class Head:
    """The Ray head of this file's tests."""

    address: str          # HOST:PORT, as `ray start` printed it
    env: Dict[str, str]   # the head's, the launcher's and every Ray client's variables
    root: str             # its temporary folder: sessions, sockets, actors' files
    session: int          # the session id of everything `ray start` started

    def cluster_pids(self) -> List[int]:
        """Every live process of the cluster: its session's (Ray's daemons and workers)
        and whatever runs from its folder (the jobs' main.py, started in sessions of
        their own)."""
        found = []
        for pid in _pids():
            fields = _proc_fields(pid)
            if fields is None or fields[0] == "Z" or pid == os.getpid():
                continue
            if int(fields[3]) == self.session or any(self.root in a for a in _cmdline(pid)) \
                    or _cwd(pid).startswith(self.root + os.sep):
                found.append(pid)
        return found

    def job_pids(self) -> List[int]:
        """The live processes of the jobs placed on this cluster (one job at a time in this
        file): main.py (shipped into the cluster's folder) and the state server
        (manage.py, run from there)."""
        found = []
        for pid in _pids():
            argv = _cmdline(pid)
            if not any(os.path.basename(a) in ("main.py", "manage.py") for a in argv[1:3]):
                continue
            if (any(self.root in a for a in argv) or _cwd(pid).startswith(self.root + os.sep)) \
                    and alive(pid):
                found.append(pid)
        return found

    def ray(self, action: str, namespace: str, timeout: float = 60) -> object:
        """RAY_CLIENT's answer (JSON) to `action` on this cluster, in a process of its own
        (the test process never imports ray)."""
        result = subprocess.run([sys.executable, "-c", RAY_CLIENT, self.address, namespace,
                                 action], env=self.env, cwd=REPO, capture_output=True,
                                text=True, timeout=timeout)
        assert result.returncode == 0, result.stderr[-3000:]
        return json.loads(result.stdout.strip().splitlines()[-1])


#: a Ray client: `alive` (the names of the live actors of NAMESPACE), `kill:NAME`
#: (kills that actor of NAMESPACE; the live ones before it), `gone:S` (waits up to S
#: seconds until NAMESPACE has no live actor; those still alive)
RAY_CLIENT = r"""
import json, sys, time
import ray
address, namespace, action = sys.argv[1:4]
ray.init(address=address, namespace=namespace, logging_level="ERROR", log_to_driver=False)

def live():
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a["namespace"] == namespace)

if action == "alive":
    answer = live()
elif action.startswith("kill:"):
    answer = live()
    ray.kill(ray.get_actor(action[5:], namespace=namespace), no_restart=True)
elif action.startswith("gone:"):
    deadline = time.monotonic() + float(action[5:])
    while live() and time.monotonic() < deadline:
        time.sleep(0.2)
    answer = live()
else:
    raise SystemExit(f"unknown action {action!r}")
ray.shutdown()
print(json.dumps(answer))
"""


def _stop_processes(pids: Sequence[int], grace: float = 5.0) -> List[int]:
    """SIGTERM, SIGKILL after `grace`; those still alive 10 s later."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + wait
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
    return [p for p in pids if alive(p)]


def _ray_command() -> str:
    beside = os.path.join(os.path.dirname(sys.executable), "ray")
    return beside if os.path.exists(beside) else (shutil.which("ray") or beside)


def _free_ports(count: int) -> List[int]:
    ports: List[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


@pytest.fixture(scope="module")
def head():
    """A Ray head on this machine for the file's tests (10 CPUs, 1 pretend GPU, the
    resource esync_ps, the label esync-tier=ps), with its own token; stopped at the end,
    with every process it started (checked in /proc)."""
    with ray_head(CPUS, [f"--num-gpus={GPUS}", f"--resources={json.dumps({PS_RESOURCE: 4})}",
                         f"--labels={LABEL[0]}={LABEL[1]}"]) as cluster:
        yield cluster


@contextlib.contextmanager
def ray_head(cpus: int, flags: Sequence[str] = ()) -> Iterator[Head]:
    """A Ray head on this machine of `cpus` logical CPUs (and `ray start`'s `flags`), with
    its own token, folder and ports; stopped at the end, with every process it started
    (checked in /proc). Skips the test where Ray is not installed."""
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed (pip install -e '.[ray]')")
    # short: Ray's socket paths (under ROOT/session_.../sockets/) must stay under ~100
    root = tempfile.mkdtemp(prefix="esray-", dir="/tmp" if os.path.isdir("/tmp") else None)
    scratch = os.path.join(root, "tmp")  # TMPDIR of Ray's workers, so of the actors' folders
    os.makedirs(scratch)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("RAY_") and k not in CLUSTER_VARIABLES
           and k not in local.AUTH_VARIABLES}  # each job draws its own key and token
    # token authentication (Ray's default for a new cluster), with a token of our own:
    # neither ~/.ray/auth_token nor another cluster's matters
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32),
               RAY_USAGE_STATS_ENABLED="0", TMPDIR=scratch)
    ports = dict(zip(PORT_FLAGS, _free_ports(len(PORT_FLAGS))))
    argv = [_ray_command(), "start", "--head", f"--num-cpus={cpus}", *flags,
            f"--temp-dir={root}", "--min-worker-port=0", "--max-worker-port=0",
            "--disable-usage-stats", "--log-style=record", "--log-color=false",
            "--include-dashboard=false",  # the tests ask the GCS, not the dashboard: less load
            *(f"{flag}={port}" for flag, port in ports.items())]
    starter = subprocess.Popen(argv, env=env, cwd=root, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    cluster = Head("", env, root, starter.pid)
    try:
        try:
            out, _ = starter.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            starter.kill()
            out, _ = starter.communicate()
        assert starter.returncode == 0, f"ray start failed:\n{out}"
        found = re.search(r"ray start --address='([^']+)'", out)
        assert found, f"no address in ray start's output:\n{out}"
        cluster.address = found.group(1)
        yield cluster
    finally:
        left = _stop_processes(cluster.cluster_pids(), grace=2.0)
        shutil.rmtree(root, ignore_errors=True)
        assert not left, f"Ray processes left: {[(p, _cmdline(p)[:3]) for p in left]}"


# --- a job -------------------------------------------------------------------------

class Launch:
    """`esync/launch/local.py --ray ADDRESS ARGS --no-progress --out OUT` as a child, its output
    read as it comes. As a context manager: at the end the launcher is killed if it still
    runs (Ray then kills its actors) and whatever of the job is left is killed."""

    def __init__(self, head: Head, args: Sequence[str], out: str,
                 env: Optional[Dict[str, str]] = None, program: str = LAUNCH,
                 script: Sequence[str] = ()):
        self.head = head
        self.out = out
        self.lines: List[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, program, "--ray", head.address, *args, "--no-progress",
             "--out", out, *script], env=dict(head.env, **(env or {})), cwd=REPO, text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait(self, timeout: float) -> int:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the launcher still runs after {timeout:g} s:\n"
                                 f"{self.output[-3000:]}") from None
        self._reader.join(timeout=10)
        return self.proc.returncode

    def until(self, predicate: Callable[[], object], what: str, timeout: float):
        """As wait_until, failing at once (with the output) if the launcher exits."""
        def check():
            value = predicate()
            if not value and self.proc.poll() is not None:
                self._reader.join(timeout=10)
                raise AssertionError(f"the launcher exited ({self.proc.returncode}) before "
                                     f"{what}:\n{self.output[-3000:]}")
            return value
        return wait_until(check, what, timeout, poll=0.1)

    def namespace(self, timeout: float = 90) -> str:
        return self.until(lambda: (re.findall(r"actors named by role in namespace "
                                              r"(esync-[0-9a-f]+)", self.output) or [""])[0],
                          "the job's placement", timeout)

    def training(self, mode_folder: str, timeout: float = 120) -> None:
        """Until a worker's iteration log was copied into OUT."""
        pattern = os.path.join(self.out, "lenet", mode_folder, "*", "w*", "iter-*.json")
        self.until(lambda: glob.glob(pattern), "a worker's iteration log", timeout)

    def __enter__(self) -> "Launch":
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=10)
        if not self._reader.is_alive():
            self.proc.stdout.close()
        if self.head.job_pids():  # Ray kills the actors of a dead driver; what it did not, we do
            try:
                wait_until(lambda: not self.head.job_pids(), "the job's end", 20, poll=0.1)
            except AssertionError:
                _stop_processes(self.head.job_pids(), grace=1.0)


def the_host(out: str, mode_folder: str) -> str:
    hosts = os.listdir(os.path.join(out, "lenet", mode_folder))
    hosts = [h for h in hosts if os.path.isdir(os.path.join(out, "lenet", mode_folder, h))]
    assert len(hosts) == 1, hosts  # one node
    return os.path.join(out, "lenet", mode_folder, hosts[0])


# --- jobs to the target ----------------------------------------------------------------

@pytest.mark.slow
def test_sync_on_ray_reaches_90_percent_and_summarizes(head, tmp_path):
    out = str(tmp_path / "out")
    with Launch(head, ["-m", "sync", "--workers", "2", *TO_TARGET,
                       "--ray-servers-on", f"resource:{PS_RESOURCE}"], out) as job:
        assert job.wait(timeout=150) == 0, job.output[-3000:]
    # state server (every job's live page), scheduler, server, evaluator, 2 workers
    assert "launch: placed on the Ray cluster: 6 process(es)" in job.output
    assert re.search(r"launch: live page: http://[0-9.]+:[0-9]+/jobs/sync-", job.output)
    assert "launch: done:" in job.output
    assert evaluator_accuracy(out, "sync") >= 0.90
    host = the_host(out, "sync")
    assert sorted(d for d in os.listdir(host) if os.path.isdir(os.path.join(host, d))) == \
        ["evaluator", "w0", "w1"]
    for device in ("w0", "w1"):
        assert glob.glob(os.path.join(host, device, "iter-*.json"))
        assert "--device-name" in open(os.path.join(host, device, "worker.log")).read()
    assert "all 2 workers finished" in open(os.path.join(host, "scheduler.log")).read()
    assert os.path.exists(os.path.join(host, "server0.log"))

    result = subprocess.run([sys.executable, SUMMARY, "-b", out, "-n", "lenet", "-m", "sync"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "1 host(s), 3 device(s)" in result.stderr + result.stdout
    summary = json.load(open(os.path.join(out, "lenet", "sync", "Sync.json")))
    (devices,) = summary.values()
    assert {"w0", "w1", "evaluator"} == set(devices)
    assert max(a for a in devices["evaluator"]["accuracy_list"] if a is not None) >= 0.90
    assert not head.job_pids()


@pytest.mark.slow
def test_esync_run_starts_a_users_script_as_the_workers_on_ray(head, tmp_path):
    """esync-run --ray: tests/api_script.py (its own model, data, AdamW and loop) as two
    SSGD workers, each an actor; both end with the same weights and BatchNorm
    statistics."""
    out, seen = str(tmp_path / "out"), tmp_path / "seen"
    seen.mkdir()
    with Launch(head, ["-m", "sync", "--workers", "2", "-s", "1",
                       "--ray-servers-on", f"resource:{PS_RESOURCE}"], out,
                program=os.path.join(REPO, "src", "esync", "launch", "run.py"),
                script=[os.path.join(REPO, "tests", "api_script.py"), str(seen)]) as job:
        assert job.wait(timeout=150) == 0, job.output[-3000:]
    assert "launch: placed on the Ray cluster: 5 process(es)" in job.output  # no evaluator
    w0, w1 = (json.load(open(seen / f"{device}.json")) for device in ("w0", "w1"))
    assert w0["rounds"] == w1["rounds"] > 10
    assert w0["weights"] == pytest.approx(w1["weights"], rel=1e-6, abs=1e-7)
    assert w0["buffers"]["1.running_mean"] == pytest.approx(w1["buffers"]["1.running_mean"])
    assert glob.glob(os.path.join(out, "api_script", "sync-niid", "*", "w1", "iter-*.json"))
    assert not head.job_pids()


@pytest.mark.slow
def test_esync_with_slow_workers_on_ray_reaches_90_percent(head, tmp_path):
    out = str(tmp_path / "out")
    # the user's exported key and token reach every process on the nodes (which do not
    # inherit the launcher's environment)
    exported = {KEY_ENV: new_key(), STATE_TOKEN_ENV: secrets.token_urlsafe(16)}
    with Launch(head, ["-m", "esync", "--workers", "4", "--slowdown", "1,1,4,4", *TO_TARGET,
                       "--ray-servers-on", f"label:{LABEL[0]}={LABEL[1]}"], out,
                env=exported) as job:
        assert job.wait(timeout=150) == 0, job.output[-3000:]
    # the state server too: 8 processes
    assert "launch: placed on the Ray cluster: 8 process(es)" in job.output
    assert evaluator_accuracy(out, "esync") >= 0.90
    host = the_host(out, "esync")
    assert sorted(d for d in os.listdir(host) if os.path.isdir(os.path.join(host, d))) == \
        ["evaluator", "w0", "w1", "w2-x4", "w3-x4"]
    for device in ("w0", "w1", "w2-x4", "w3-x4"):
        assert glob.glob(os.path.join(host, device, "iter-*.json")), device
    assert os.path.exists(os.path.join(host, "stateserver.log"))
    assert "CurveZMQ: job key required" in open(os.path.join(host, "scheduler.log")).read()
    for log in glob.glob(os.path.join(host, "*.log")) + glob.glob(os.path.join(host, "*",
                                                                              "*.log")):
        text = open(log).read()
        assert "no job key" not in text and f"{STATE_TOKEN_ENV} is not set" not in text, log
    assert not head.job_pids()


# --- a job stopped -----------------------------------------------------------------

@pytest.mark.slow
def test_a_killed_worker_actor_ends_the_job_and_nothing_is_left(head, tmp_path):
    out = str(tmp_path / "out")
    with Launch(head, ["-m", "sync", "--workers", "3", "--on-worker-failure", "abort", *LONG],
                out) as job:
        namespace = job.namespace()
        job.training("sync")
        pids = head.job_pids()
        assert len(pids) == 7, pids  # state server, scheduler, server, evaluator, 3 workers
        # worker1's main.py: its own device name (the scheduler numbers workers by
        # registration, so its "worker N" need not be the launcher's worker1)
        (worker1,) = [p for p in pids
                      if "\0--device-name\0w1\0" in "\0".join(["", *_cmdline(p), ""])]
        before = head.ray("kill:worker1", namespace)
        assert before == sorted(["scheduler", "server0", "evaluator", "stateserver", "worker0",
                                 "worker1", "worker2"]), before
        killed = time.monotonic()
        code = job.wait(timeout=60)
        took = time.monotonic() - killed
        output = job.output
    assert code == 1, output[-3000:]
    assert "launch: worker1 died (its Ray actor died)" in output, output[-3000:]
    assert "launch: error: scheduler exited with status 1" in output, output[-3000:]
    reason = output.split("launch: error:", 1)[1]  # the scheduler's: worker1's process
    assert f"(pid {worker1} on " in reason, reason
    # the scheduler gives up on it after its heartbeat timeout (10 s)
    assert took < 30, took
    assert head.ray("gone:15", namespace) == []
    wait_until(lambda: not any(alive(p) for p in pids) and not head.job_pids(),
               "no process of the job", 15, poll=0.1)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["launcher killed", "ctrl-c"])
def test_the_launchers_end_stops_every_actor_and_process(head, tmp_path, how):
    out = str(tmp_path / "out")
    mode = "esync" if how == "launcher killed" else "sync"  # the state server too
    with Launch(head, ["-m", mode, "--workers", "2", *LONG], out) as job:
        namespace = job.namespace()
        job.training(mode)
        pids = head.job_pids()
        roles = ["evaluator", "scheduler", "server0", "stateserver", "worker0", "worker1"]
        assert len(pids) == len(roles), pids
        assert head.ray("alive", namespace) == sorted(roles)
        start = time.monotonic()
        if how == "launcher killed":
            job.proc.kill()  # SIGKILL: no stop of its own; Ray kills a dead driver's actors
            job.wait(timeout=10)
        else:
            job.proc.send_signal(signal.SIGINT)
            assert job.wait(timeout=40) == 130, job.output[-3000:]
            assert "launch: interrupted; stopping the job" in job.output
        wait_until(lambda: not any(alive(p) for p in pids) and not head.job_pids(),
                   "no process of the job", 20, poll=0.1)
        assert time.monotonic() - start < 30
        assert head.ray("gone:15", namespace) == []


# --- what the cluster cannot hold ------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (["--workers", "3", "--devices", "gpu"],
     "3 GPU worker(s) asked, the cluster has 1 GPU(s)"),
    (["--ray-servers-on", "resource:nowhere"],
     "--ray-servers-on resource:nowhere: no alive node is given the resource 'nowhere'"),
    (["--workers", "12"], "16 CPUs asked (12 for 12 worker(s) of 1 thread(s), 4 for the "
                          "scheduler, servers, state server and evaluator), the cluster has 10"),
    (["--ray-servers-on", f"label:{LABEL[0]}=other"],
     f"--ray-servers-on label:{LABEL[0]}=other: no alive node is labelled {LABEL[0]}=other"),
], ids=["gpus", "resource", "cpus", "label"])
def test_a_job_the_cluster_cannot_hold_fails_at_once(head, tmp_path, args, message):
    out = str(tmp_path / "out")
    start = time.monotonic()
    with Launch(head, ["-m", "sync", *args, "-n", "lenet"], out) as job:
        code = job.wait(timeout=60)
    assert time.monotonic() - start < 20  # not the --ray-timeout (60 s) wait
    assert code == 1, job.output
    assert f"launch: error: cannot place the job on the Ray cluster: {message}\n" in \
        job.output, job.output
    assert not os.path.exists(out)  # nothing started


# --- no cluster needed -----------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--ray", "--ray-servers-on", "nowhere"],
     "--ray-servers-on 'nowhere': expected head, any, resource:NAME or label:KEY=VALUE"),
    (["--ray", "--ray-servers-on", "label:a=b=c"], "--ray-servers-on 'label:a=b=c'"),
    (["--ray", "--ray-timeout", "0"], "--ray-timeout '0': expected seconds > 0"),
    (["--ray", "--ray-timeout", "nan"], "--ray-timeout 'nan': expected seconds > 0"),
    (["--ray-servers-on", "head"], "--ray-servers-on needs --ray"),
    (["--ray-servers-on", "any"], "--ray-servers-on needs --ray"),
    (["--ray-timeout", "5"], "--ray-timeout needs --ray"),
    (["--remote-prep", "0.3"], "--remote-prep sends preprocessing to Ray tasks: it needs --ray"),
    (["--devices", "tpu"], "--devices 'tpu': expected cpu, gpu or gpu:N for each worker"),
    (["--ray", "--devices", "gpu:1"], "gpu:1 names a GPU, but on Ray each GPU worker gets "
                                      "the GPU Ray gives it: say gpu"),
    (["--ray", "-g", "0"], "-g: on Ray each GPU worker gets the GPU Ray gives it"),
    (["--ray", "--restart-failed"], "--restart-failed is for this machine's processes, "
                                    "not --ray's actors"),
    (["--devices", "cpu,cpu,cpu"], "--devices 'cpu,cpu,cpu': expected 2 device(s)"),
    (["--ray", "--devices", "gpu", "-c", "1"], "--devices and main.py's -g/-c both say"),
], ids=["servers-on", "label", "timeout-0", "timeout-nan", "servers-on-head-alone",
        "servers-on-any-alone", "timeout-alone", "remote-prep-alone", "tpu", "gpu-index", "g-on-ray",
        "restart-failed", "three-devices", "devices-and-c"])
def test_bad_ray_flags_are_one_line_and_exit_2(tmp_path, capsys, args, message):
    argv = ["-m", "sync", *args, "--out", str(tmp_path / "out")]
    with pytest.raises(local.LaunchError, match=re.escape(message)):
        local.plan(argv)  # before main(): a plan that passed would start a job
    assert local.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("esync-launch: error: ") and err.count("\n") == 1, err
    assert message in err
    assert not (tmp_path / "out").exists()


NO_RAY = r"""
import importlib, pkgutil, sys
import esync, esync.cli, main
# esync.__main__ would run the command line; the Ray launcher and its tasks import ray
for module in pkgutil.walk_packages(esync.__path__, "esync."):
    if not module.name.endswith((".__main__", ".launch.onray", ".launch.rayprep")):
        importlib.import_module(module.name)
print(sorted(m for m in sys.modules if m == "ray" or m.startswith("ray.")))
"""


#: the modules that import ray: the Ray launcher and its tasks for --remote-prep
RAY_MODULES = {os.path.join("src", "esync", "launch", "onray.py"),
               os.path.join("src", "esync", "launch", "rayprep.py")}


def test_only_the_ray_launcher_and_its_tasks_import_ray(tmp_path):
    """Importing every module of esync (and the launchers but esync/launch/onray.py) imports no
    ray; no source of esync names it (--remote-prep's Ray tasks are esync/launch/rayprep.py's,
    named to the worker by esync/launch/onray.py), and of launch's only onray.py and rayprep.py."""
    env = {k: v for k, v in os.environ.items() if k not in CLUSTER_VARIABLES}
    env["PYTHONPATH"] = REPO
    result = subprocess.run([sys.executable, "-c", NO_RAY], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]", result.stdout
    assert not os.listdir(tmp_path)  # nothing ran
    importing = re.compile(r"^\s*(import ray\b|from ray[. ])", re.MULTILINE)
    found = set()
    for folder in ("src", "stateserver"):
        for path in glob.glob(os.path.join(REPO, folder, "**", "*.py"), recursive=True):
            with open(path, encoding="utf-8") as f:
                if importing.search(f.read()):
                    found.add(os.path.relpath(path, REPO))
    assert found == RAY_MODULES, sorted(found)
