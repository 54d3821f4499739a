"""Restarts and keys, with real processes: the supervisor starts a child that dies again
(up to its limit, leaving nothing behind); the launchers hand every process the job's
key and the state server's token (not with --no-auth); the flags of checkpoints and
failures reach the scheduler and the servers; `esync-launch --restart-failed` brings a
killed worker or server back into a live job; `--resume 1` continues a killed job."""
from __future__ import annotations

import glob
import os
import re
import shlex
import signal
import stat
import subprocess
import sys
import threading
import time

import pytest

from esync.transport.auth import new_key
from esync.launch import local
from esync.launch.supervisor import Supervisor
from tests.helpers import CLUSTER_VARIABLES, REPO, alive, wait_until
from tests.test_hosts import HOSTS_PY, _env as hosts_env, _write

PY = sys.executable
LAUNCH = os.path.join(REPO, "src", "esync", "launch", "local.py")
AUTH = ("ESYNC_JOB_KEY", "ESYNC_JOB_KEY_FILE", "ESYNC_STATE_TOKEN")


def read_pids(path):
    try:
        return [int(p) for p in open(path).read().split()]
    except OSError:
        return []


# --- the supervisor ---------------------------------------------------------------------

#: exits 1 the first time, 0 the second (the file is its memory); its pid, and that of a
#: process it leaves in its group, go to PIDS
FLAKY = """\
import os, subprocess, sys
memory, pids = sys.argv[1], sys.argv[2]
left = subprocess.Popen(["sleep", "60"])  # in the child's process group
with open(pids, "a") as f:
    f.write(f"{os.getpid()} {left.pid}\\n")
runs = int(open(memory).read()) if os.path.exists(memory) else 0
open(memory, "w").write(str(runs + 1))
print(f"run {runs + 1}", flush=True)
os._exit(1 if runs == 0 else 0)
"""


def test_a_child_that_fails_is_started_again_and_leaves_nothing_behind(tmp_path):
    notes = []
    memory, pids, log = tmp_path / "runs", tmp_path / "pids", tmp_path / "flaky.log"
    with Supervisor(say=notes.append) as sup:
        child = sup.start("flaky", [PY, "-c", FLAKY, str(memory), str(pids)], log=str(log),
                          restart=3)
        outcome = sup.wait(timeout=60)
        assert outcome is not None and outcome.ok and outcome.lost == []
        assert child.restarts == 1 and child.returncode == 0
    assert notes == ["flaky died (exit status 1); restarting it (restart 1 of 3)"]
    text = log.read_text()  # both runs, the restart marked
    assert text.index("\nrun 1\n") < text.index("\n# restart 1: ") < text.index("\nrun 2\n")
    first, second = read_pids(pids)[:2], read_pids(pids)[2:]
    assert first[0] != second[0]
    # what the dead run left in its group was killed at the restart, the rest at the end
    wait_until(lambda: not any(alive(p) for p in first + second), "no process left")


def test_restarts_stop_at_the_limit_and_the_failure_is_the_jobs(tmp_path):
    notes = []
    pids = tmp_path / "pids"
    script = f"sleep 60 & echo $$ $! >> {pids}; exit 3"
    with Supervisor(say=notes.append) as sup:
        child = sup.start("doomed", ["sh", "-c", script], restart=2)
        outcome = sup.wait(timeout=60)
        assert outcome.failed is child and child.returncode == 3 and child.restarts == 2
        assert len(read_pids(pids)) == 6  # three runs, each with a sleep left behind
        # the first two runs' groups were emptied when they were started again
        assert not any(alive(p) for p in read_pids(pids)[:4])
    assert notes == [f"doomed died (exit status 3); restarting it (restart {k} of 2)"
                     for k in (1, 2)]
    wait_until(lambda: not any(alive(p) for p in read_pids(pids)), "no process left")


def test_a_killed_child_is_restarted_and_a_stop_reaches_its_new_process(tmp_path):
    notes = []
    pids = tmp_path / "pids"
    with Supervisor(say=notes.append) as sup:
        child = sup.start("sleeper", ["sh", "-c", f"echo $$ >> {pids}; exec sleep 60"],
                          restart=1)
        wait_until(lambda: len(read_pids(pids)) == 1, "the first run")
        first = child.pid
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: sup.wait(timeout=0.1) is None and len(read_pids(pids)) == 2,
                   "the restart")
        assert child.pid != first and child.running() and child.restarts == 1
        assert notes == ["sleeper died (signal 9); restarting it (restart 1 of 1)"]
        start = time.monotonic()
    assert time.monotonic() - start < 4  # the stop (SIGTERM) reached the new process
    assert not any(alive(p) for p in read_pids(pids))


RESTARTING_LAUNCHER = """\
import os, signal
from esync.launch.supervisor import Supervisor
sup = Supervisor(say=lambda line: None)
child = sup.start("sleeper", ["sleep", "60"], restart=1)
first = child.pid
os.kill(first, signal.SIGKILL)
while child.restarts == 0:
    sup.wait(timeout=0.1)
print(first, child.pid, flush=True)
sup.wait()
"""


def test_the_launchers_death_takes_a_restarted_child_with_it():
    launcher = subprocess.Popen([PY, "-c", RESTARTING_LAUNCHER], stdout=subprocess.PIPE,
                                text=True, cwd=REPO)
    try:
        first, second = (int(p) for p in launcher.stdout.readline().split())
        assert first != second and alive(second)
        launcher.kill()  # SIGKILL: the parent-death signal of the restarted child too
        launcher.wait()
        wait_until(lambda: not alive(second), "the restarted child's death")
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def test_a_member_that_is_not_fatal_is_left_behind(tmp_path):
    notes = []
    go = tmp_path / "go"
    with Supervisor(say=notes.append) as sup:
        # the job's anchor ends once the member is gone
        anchor = sup.start("anchor", ["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done"])
        member = sup.start("member", ["sh", "-c", "exit 5"], fatal=False)
        asked = []
        judged = sup.start("judged", ["sh", "-c", "exit 6"],
                           fatal=lambda c: asked.append(c.name) or False)
        wait_until(lambda: sup.wait(timeout=0.05) is None and len(notes) == 2, "the notes")
        assert anchor.running() and asked == ["judged"]
        go.touch()
        outcome = sup.wait(timeout=30)
    assert outcome.ok and outcome.lost == [member, judged]
    assert sorted(notes) == ["judged died (exit status 6); the job goes on without it",
                             "member died (exit status 5); the job goes on without it"]


def test_no_restart_once_the_job_has_ended(tmp_path):
    """The anchor (an essential, fatal child without restarts) decides the job: a member
    that dies after it exited is not started again."""
    notes = []
    go = tmp_path / "go"
    with Supervisor(say=notes.append) as sup:
        anchor = sup.start("anchor", ["true"])
        member = sup.start("member", ["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; "
                                                  f"done; exit 1"], fatal=False, restart=3)
        wait_until(lambda: sup.wait(timeout=0.05) is None and anchor.returncode == 0,
                   "the anchor's exit")
        go.touch()
        outcome = sup.wait(timeout=30)
    assert outcome.ok and outcome.lost == [member] and member.restarts == 0
    assert notes == ["member died (exit status 1) as the job ended"]


READY_TWICE = """\
import os, sys
from esync.infra import ready
memory = sys.argv[1]
runs = int(open(memory).read()) if os.path.exists(memory) else 0
open(memory, "w").write(str(runs + 1))
ready.announce(1000 + runs)
if runs == 0:
    sys.exit(1)
import time; time.sleep(60)
"""


def test_a_restarted_child_reports_readiness_again_and_restart_by_hand(tmp_path):
    with Supervisor(say=lambda line: None) as sup:
        child = sup.start("twice", [PY, "-c", READY_TWICE, str(tmp_path / "m")], ready=True,
                          restart=1, cwd=REPO)
        assert sup.wait_ready(child, timeout=30) == 1000
        wait_until(lambda: sup.wait(timeout=0.05) is None and child.restarts == 1,
                   "the restart")
        assert sup.wait_ready(child, timeout=30) == 1001
        with pytest.raises(ValueError, match="twice is running"):
            sup.restart(child)
        one = sup.start("one", ["true"])
        wait_until(lambda: sup.wait(timeout=0.05) is None and one.returncode == 0, "one")
        sup.restart(one)  # by hand, whatever its budget
        assert one.restarts == 1
    with pytest.raises(ValueError, match="restart=-1"):
        Supervisor().start("bad", ["true"], restart=-1)


# --- the launcher: plan, keys, flags ------------------------------------------------------

def test_the_flags_of_checkpoints_and_failures_go_to_every_role(tmp_path):
    p = local.plan(["-m", "esync", "--out", str(tmp_path), "-l", "0.1",
                    "--checkpoint-dir=ck", "--checkpoint-every", "30S", "--keep-c", "2",
                    "--resume", "yes", "--on-worker-failure", "abort", "--min-workers", "2",
                    "--server-patience", "7", "--time-limit", "9", "--start-timeout", "40"])
    role = ["--checkpoint-dir", "ck", "--checkpoint-every", "30s", "--keep-checkpoints", "2",
            "--resume", "1", "--on-worker-failure", "abort", "--min-workers", "2",
            "--server-patience", "7.0", "--start-timeout", "40.0"]
    assert p.role_args == role  # long forms, main.py's values, in EVERY_ROLE's order
    assert p.scheduler_argv(["main"]) == ["main", "-m", "esync", *role]
    assert p.server_argv(["main"]) == ["main", "-m", "esync", "-c", "1", *role]
    assert "-l" in p.worker_args and "--resume" in p.worker_args  # workers: every flag
    assert len(local.EVERY_ROLE) == 8
    p = local.plan(["-m", "sync", "--out", str(tmp_path), "--resume", "0", "-n", "lenet"])
    assert p.role_args == ["--resume", "0"]
    assert local.plan(["-m", "sync", "--out", str(tmp_path)]).role_args == []
    assert not os.listdir(tmp_path)


def test_restart_flags_in_the_plan(tmp_path):
    out = ["--out", str(tmp_path)]
    assert local.plan(["-m", "sync", *out]).restarts == 0
    assert local.plan(["-m", "sync", "--restart-failed", *out]).restarts == local.MAX_RESTARTS
    assert local.plan(["-m", "esync", "--restart-failed", "--max-restarts", "5",
                       *out]).restarts == 5


def _launch(args, env=None, **kw):
    full = {k: v for k, v in os.environ.items() if k not in CLUSTER_VARIABLES
            and k not in AUTH}
    full.update(env or {})
    return subprocess.Popen([PY, LAUNCH, *args], cwd=REPO, text=True, env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kw)


@pytest.mark.parametrize("args, env, message", [
    (["-m", "sync", "--max-restarts", "2"], {}, "--max-restarts needs --restart-failed"),
    (["-m", "sync", "--restart-failed", "--max-restarts", "many"], {},
     "--max-restarts 'many': expected a number of restarts >= 0"),
    (["-m", "ddp", "--restart-failed"], {}, "--restart-failed: -m ddp has no scheduler"),
    (["-m", "local", "--restart-failed"], {}, "--restart-failed: -m local has no scheduler"),
    (["-m", "sync"], {"ESYNC_JOB_KEY": "not-a-key"}, "ESYNC_JOB_KEY: not a job key"),
    (["-m", "sync"], {"ESYNC_JOB_KEY_FILE": "/no/such/key"},
     "ESYNC_JOB_KEY_FILE=/no/such/key: cannot read it"),
])
def test_bad_restart_and_key_input_is_one_line(tmp_path, args, env, message):
    proc = _launch([*args, "--out", str(tmp_path)], env)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and out.startswith("esync-launch: error: "), out
    assert message in out and len(out.splitlines()) == 1, out
    assert not os.listdir(tmp_path)


def _children_env(launcher_pid):
    """{pid: (argv, environ)} of the launcher's children that run main.py/manage.py."""
    found = {}
    for stat_path in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat_path) as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) != launcher_pid:
                    continue
            pid = int(stat_path.split("/")[2])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [a.decode() for a in f.read().split(b"\0")[:-1]]
            if not any(a.endswith(("main.py", "manage.py")) for a in argv):
                continue  # forked, not yet the child's program
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = dict(e.decode().split("=", 1) for e in f.read().split(b"\0") if e)
        except (OSError, ValueError, IndexError):
            continue
        found[pid] = (argv, environ)
    return found


def _role(argv, environ):
    if "manage.py" in argv:
        return "stateserver"
    return environ.get("DMLC_ROLE", "?")


def _stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    return out


@pytest.mark.slow
def test_every_process_gets_the_key_the_token_and_the_flags_of_every_role(tmp_path):
    token = "the-users-token"
    proc = _launch(["-m", "esync", "--workers", "2", "--out", str(tmp_path), "--no-progress",
                    "--time-limit", "300", "--checkpoint-dir", str(tmp_path / "ck"),
                    "--on-worker-failure", "continue", "--min-workers", "1"],
                   {"ESYNC_STATE_TOKEN": token})
    try:
        kids = {}

        def all_six():
            kids.update(_children_env(proc.pid))
            return proc.poll() is not None or len(kids) >= 6
        wait_until(all_six, "six children", timeout=120)
        assert proc.poll() is None, proc.communicate()[0]
        roles = sorted(_role(*kid) for kid in kids.values())
        assert roles == ["evaluator", "scheduler", "server", "stateserver", "worker", "worker"]
        keys = {environ.get("ESYNC_JOB_KEY") for _, environ in kids.values()}
        assert len(keys) == 1 and len(keys.pop() or "") == 40  # one job key, drawn for all
        assert {environ.get("ESYNC_STATE_TOKEN") for _, environ in kids.values()} == {token}
        flags = ["--checkpoint-dir", str(tmp_path / "ck"), "--on-worker-failure", "continue",
                 "--min-workers", "1"]
        for argv, environ in kids.values():
            if _role(argv, environ) in ("scheduler", "server"):
                assert argv[-len(flags):] == flags, argv
        host = glob.glob(str(tmp_path / "lenet" / "esync" / "*"))[0]
        wait_until(lambda: "CurveZMQ: job key required" in
                   open(os.path.join(host, "scheduler.log")).read(), "the scheduler's line")
    finally:
        out = _stop(proc)
    assert proc.returncode == 130, out


@pytest.mark.slow
def test_no_auth_hands_on_no_key_and_no_token(tmp_path):
    proc = _launch(["-m", "sync", "--workers", "1", "--out", str(tmp_path), "--no-progress",
                    "--time-limit", "300", "--no-auth"],
                   {"ESYNC_JOB_KEY": new_key(), "ESYNC_STATE_TOKEN": "exported"})
    try:
        kids = {}

        def started():
            kids.update(_children_env(proc.pid))
            return proc.poll() is not None or len(kids) >= 4
        wait_until(started, "the children", timeout=120)
        assert proc.poll() is None, proc.communicate()[0]
        for argv, environ in kids.values():
            assert not set(AUTH) & set(environ), (argv, environ.keys() & set(AUTH))
    finally:
        out = _stop(proc)
    assert proc.returncode == 130, out


def test_the_launchers_environment_for_its_children(monkeypatch, tmp_path):
    for name in AUTH:
        monkeypatch.delenv(name, raising=False)
    launcher = local.Launcher(local.plan(["-m", "sync", "--out", str(tmp_path)]))
    env = launcher._env(DMLC_ROLE="worker")
    assert len(env["ESYNC_JOB_KEY"]) == 40 and len(env["ESYNC_STATE_TOKEN"]) >= 32
    assert launcher._env() == {k: v for k, v in env.items() if k != "DMLC_ROLE"}  # one job
    other = local.Launcher(local.plan(["-m", "sync", "--out", str(tmp_path)]))
    assert other._env()["ESYNC_JOB_KEY"] != env["ESYNC_JOB_KEY"]  # fresh for each job
    key_file = tmp_path / "key"
    key_file.write_text(new_key())
    monkeypatch.setenv("ESYNC_JOB_KEY_FILE", str(key_file))
    monkeypatch.setenv("ESYNC_STATE_TOKEN", "mine")
    env = local.Launcher(local.plan(["-m", "ddp", "--out", str(tmp_path)]))._env(RANK="0")
    assert env["ESYNC_JOB_KEY_FILE"] == str(key_file) and "ESYNC_JOB_KEY" not in env
    assert env["ESYNC_STATE_TOKEN"] == "mine"
    env = local.Launcher(local.plan(["-m", "sync", "--no-auth", "--out", str(tmp_path)]))._env()
    assert not set(AUTH) & set(env)
    for launcher in (launcher, other):
        launcher.supervisor.close()


# --- hosts.py: the key and the token on each host -----------------------------------------

def _hosts(*args, env=None):
    return subprocess.run([PY, HOSTS_PY, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env=env or {k: v for k, v in hosts_env().items()
                                                  if k not in AUTH})


def test_printed_commands_read_the_key_and_token_from_files_on_each_host(tmp_path):
    work = tmp_path / "work"
    (work / "stateserver").mkdir(parents=True)
    hostfile = _write(tmp_path / "hosts", f"head roles=scheduler,server,stateserver "
                                          f"dir={work}\nnode workers=2 dir={work}\n")
    key, token = new_key(), "s3cr3t-T0ken"
    env = dict({k: v for k, v in hosts_env().items() if k not in AUTH},
               ESYNC_JOB_KEY=key, ESYNC_STATE_TOKEN=token)
    result = _hosts(hostfile, "--", "-m", "esync", env=env)
    assert result.returncode == 0, result.stderr
    live, *lines = result.stdout.splitlines()
    assert re.fullmatch(r"# live page: http://head:10010/jobs/job-[0-9-]+-[0-9a-f]{4}/", live)
    assert lines[0::2][:2] == ["# head: the job's key and token (run first)",
                               "# node: the job's key and token (run first)"]
    stores, commands = lines[1:4:2], lines[5::2]
    assert len(commands) == 5
    # the secrets only on the lines that store them (printf: a shell builtin)
    assert all(key not in c and token not in c for c in commands)
    folder = re.search(r"\.esync/jobs/[0-9a-f]+", stores[0]).group(0)
    for command in commands[1:]:
        assert command.startswith(f'cd {work} && ESYNC_JOB_KEY_FILE="$PWD/{folder}/job.key" '
                                  f'ESYNC_STATE_TOKEN="$(cat {folder}/state.token)" env ')
    assert f'ESYNC_STATE_TOKEN="$(cat ../{folder}/state.token)"' in commands[0]
    # run here: the store line keeps them in files of mode 0600; a command reads them
    subprocess.run(["sh", "-c", stores[0]], check=True, timeout=30)
    for name, value in (("job.key", key), ("state.token", token)):
        path = work / folder / name
        assert path.read_text() == value + "\n"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((work / folder).stat().st_mode) == 0o700
    probe = commands[1].split(" env ")[0] + ' sh -c \'cat "$ESYNC_JOB_KEY_FILE"; ' \
                                            'echo "$ESYNC_STATE_TOKEN"\''
    shown = subprocess.run(["sh", "-c", probe], capture_output=True, text=True, timeout=30)
    assert shown.stdout == f"{key}\n{token}\n", shown
    # --ssh-form: the store line feeds ssh -T
    result = _hosts(hostfile, "--ssh-form", "--", "-m", "sync", env=env)
    store = result.stdout.splitlines()[2]  # after the live page and the first comment
    assert store.startswith(f"printf '%s\\n' {shlex.quote(key)} {token} | ssh -o BatchMode=yes "
                            f"-T head "), store
    # --no-auth: none of it
    result = _hosts(hostfile, "--no-auth", "--", "-m", "esync")
    assert "ESYNC_JOB_KEY" not in result.stdout and "ESYNC_STATE_TOKEN" not in \
        result.stdout and "key and token" not in result.stdout


def test_bad_key_for_hosts_is_one_line(tmp_path):
    hostfile = _write(tmp_path / "hosts", "a roles=scheduler,server,worker\n")
    env = dict({k: v for k, v in hosts_env().items() if k not in AUTH}, ESYNC_JOB_KEY="x")
    result = _hosts(hostfile, "--", "-m", "sync", env=env)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == ["hosts.py: error: ESYNC_JOB_KEY: not a job key (40 "
                                          "characters of Z85, as `python -m "
                                          "esync.transport.auth` prints)"]


# --- whole jobs: a worker or a server killed and restarted; a job resumed ---------------

class Launched:
    """esync-launch as a process, its output collected line by line by a thread."""

    def __init__(self, args, env=None):
        self.proc = _launch(args, dict({"PS_HEARTBEAT_INTERVAL": "0.5",
                                        "PS_HEARTBEAT_TIMEOUT": "3"}, **(env or {})))
        self.lines = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def output(self):
        return "\n".join(self.lines)

    def wait_line(self, text, timeout=120):
        wait_until(lambda: any(text in line for line in self.lines)
                   or (self.proc.poll() is not None and not self._reader.is_alive()),
                   f"{text!r} from the launcher", timeout)
        assert any(text in line for line in self.lines), self.output()

    def wait_running(self, condition, what, timeout=120):
        """Until `condition()` holds, which the launcher must still be running to see
        (an ended job fails at once, with its output); its children: pid -> (argv, env)."""
        wait_until(lambda: condition() or self.proc.poll() is not None, what, timeout)
        assert self.proc.poll() is None, self.output()
        return _children_env(self.proc.pid)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=60)
        self._reader.join(timeout=10)
        return self.proc.returncode


def _device_pid(kids, name):
    return next(pid for pid, (argv, _) in kids.items()
                if "--device-name" in argv and argv[argv.index("--device-name") + 1] == name)


def _rounds(folder, device):
    return [int(m.group(1)) for p in glob.glob(os.path.join(folder, "*", device, "iter-*.json"))
            if (m := re.search(r"iter-(\d+)\.json$", p))]


def _all_gone(pids):
    wait_until(lambda: not any(alive(p) for p in pids), "no process left", timeout=20)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "esync"])
def test_a_killed_worker_is_restarted_and_rejoins(tmp_path, mode):
    folder = str(tmp_path / "lenet" / mode)
    job = Launched(["-m", mode, "--workers", "2", "--out", str(tmp_path), "--no-progress",
                    "--time-limit", "300", "--restart-failed", "--max-restarts", "2"])
    seen = set()
    try:
        kids = job.wait_running(lambda: len(_rounds(folder, "w1")) >= 3, "3 rounds of w1",
                                timeout=180)
        seen.update(kids)
        victim = _device_pid(kids, "w1")
        before = max(_rounds(folder, "w1"))
        os.kill(victim, signal.SIGKILL)
        job.wait_line("launch: worker1 died (signal 9); restarting it (restart 1 of 2)")
        host = glob.glob(os.path.join(folder, "*"))[0]
        job.wait_running(lambda: "rejoins as worker"
                         in open(os.path.join(host, "scheduler.log")).read(), "w1 to rejoin")
        kids = job.wait_running(lambda: max(_rounds(folder, "w1")) >= before + 3,
                                "w1 to train again")
        seen.update(kids)
        assert _device_pid(kids, "w1") != victim
        assert "# restart 1: " in open(os.path.join(host, "w1", "worker.log")).read()
    finally:
        code = job.stop()
    assert code == 130, job.output()
    _all_gone(seen)


@pytest.mark.slow
def test_a_killed_server_is_restarted_from_its_checkpoint(tmp_path):
    folder = str(tmp_path / "lenet" / "sync")
    ck = tmp_path / "ck"
    job = Launched(["-m", "sync", "--workers", "2", "--out", str(tmp_path), "--no-progress",
                    "--time-limit", "300", "--restart-failed", "--checkpoint-dir", str(ck),
                    "--checkpoint-every", "2"])
    seen = set()
    try:
        kids = job.wait_running(lambda: glob.glob(str(ck / "shard0" / "round-*")),
                                "a checkpoint", timeout=180)
        seen.update(kids)
        server = next(pid for pid, kid in kids.items() if _role(*kid) == "server")
        before = max(_rounds(folder, "w0"), default=0)
        os.kill(server, signal.SIGKILL)
        job.wait_line("launch: server0 died (signal 9); restarting it (restart 1 of 3)")
        seen.update(job.wait_running(lambda: max(_rounds(folder, "w0")) >= before + 4,
                                     "training after the restart"))
    finally:
        code = job.stop()
    assert code == 130, job.output()
    _all_gone(seen)


@pytest.mark.slow
def test_a_killed_job_resumes_from_the_launcher(tmp_path):
    folder = str(tmp_path / "lenet" / "sync")
    ck = str(tmp_path / "ck")
    common = ["-m", "sync", "--workers", "2", "--out", str(tmp_path), "--no-progress",
              "--checkpoint-dir", ck, "--checkpoint-every", "2"]
    job = Launched([*common, "--time-limit", "300"])
    try:
        seen = set(job.wait_running(
            lambda: len(glob.glob(os.path.join(ck, "shard0", "round-*"))) >= 2,
            "two checkpoints", timeout=180))
    finally:
        job.proc.kill()  # the launcher killed outright: its children die with it
        job.stop()
    _all_gone(seen)
    done = max(_rounds(folder, "w0"), default=0)
    again = Launched([*common, "--resume", "1", "--max-rounds", str(done + 4)])
    try:
        again.proc.wait(timeout=240)
    finally:
        code = again.stop()
    assert code == 0, again.output()
    host = glob.glob(os.path.join(folder, "*"))[0]
    assert "resuming job" in open(os.path.join(host, "scheduler.log")).read()
    assert max(_rounds(folder, "w0")) >= done
