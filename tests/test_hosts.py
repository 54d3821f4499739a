"""esync/launch/hosts.py: the per-host commands of a multi-host job, printed, or as a Slurm
batch script (--slurm).

The printed commands are checked word by word (parsed back with shlex.split). The Slurm
script is checked line by line, and run here for real: with bash, and a stand-in for
Slurm's `srun` (a script first on PATH that drops srun's options and runs the step's
command on this machine, passing signals on to it as Slurm does), for host files whose
hosts are names of this machine (localhost, 127.0.0.1, 127.0.0.2)."""
from __future__ import annotations

import importlib.util
import os
import shlex
import signal
import stat
import subprocess
import sys
import time
import uuid

import pytest

from esync import registry

from esync.launch.supervisor import free_port
from tests.helpers import REPO

HOSTS_PY = os.path.join(REPO, "src", "esync", "launch", "hosts.py")


def _env():
    return {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PS_"))}


def hosts_py(*args, timeout=30, env=None):
    return subprocess.run([sys.executable, HOSTS_PY, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env=env or _env())


def _load_module():
    spec = importlib.util.spec_from_file_location("launch_hosts_under_test", HOSTS_PY)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _write(path, text, executable=False):
    path.write_text(text)
    if executable:
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


# --- printed commands -----------------------------------------------------------------

CLUSTER = """\
# the head node runs the scheduler, the server and the state server
head.example.org roles=scheduler,server,stateserver dir=/srv/esync iface=eno2 \
python=/srv/venv/bin/python

gpu1.example.org workers=2 gpus=0,1 slowdown=2   # the fast pair
gpu2.example.org workers=2 gpus=3
"""
TRAIN = ["-m", "esync", "-n", "resnet18-v1", "--dataset", "fashion-mnist",
         "-dd", "/data/my sets"]


#: the job's id (--job-id) and so its live page on the state server's host
JOB_ID = "demo-1"
LIVE_PAGE = "http://head.example.org:10020/jobs/demo-1/"


def _env_words(role, iface=None, rank=None):
    words = [f"DMLC_ROLE={role}", "DMLC_PS_ROOT_URI=head.example.org", "DMLC_PS_ROOT_PORT=9200",
             "DMLC_NUM_SERVER=1", "DMLC_NUM_WORKER=4"]
    words += [f"DMLC_WORKER_ID={rank}"] if rank is not None else []  # rank: file order
    return words + ([f"DMLC_INTERFACE={iface}"] if iface else []) + \
        [f"ESYNC_JOB_ID={JOB_ID}", f"ESYNC_LIVE_URL={LIVE_PAGE}"]


def _worker(short, k, gpu, slowdown=None, rank=0):
    words = ["cd", "~/esync", "&&", "env", *_env_words("worker", rank=rank), "python",
             "main.py", *TRAIN,
             "--device-name", f"{short}-w{k}", "-g", str(gpu)]
    if slowdown:
        words += ["--slowdown", slowdown]
    return words + ["-ip", "head.example.org", "-port", "10020"]


EXPECTED = [
    ("# head.example.org: stateserver",
     ["cd", "/srv/esync/stateserver", "&&", "/srv/venv/bin/python", "manage.py", "runserver",
      "0.0.0.0:10020"]),
    ("# head.example.org: scheduler",
     ["cd", "/srv/esync", "&&", "env", *_env_words("scheduler", "eno2"), "/srv/venv/bin/python",
      "main.py", *TRAIN]),
    ("# head.example.org: server",
     ["cd", "/srv/esync", "&&", "env", *_env_words("server", "eno2"), "/srv/venv/bin/python",
      "main.py", *TRAIN]),
    ("# gpu1.example.org: worker 0", _worker("gpu1", 0, 0, "2", rank=0)),
    ("# gpu1.example.org: worker 1", _worker("gpu1", 1, 1, "2", rank=1)),
    ("# gpu2.example.org: worker 0", _worker("gpu2", 0, 3, rank=2)),
    ("# gpu2.example.org: worker 1", _worker("gpu2", 1, 3, rank=3)),
]


@pytest.fixture
def cluster_file(tmp_path):
    return _write(tmp_path / "hosts.txt", CLUSTER)


def test_printed_commands(cluster_file):
    # --no-auth: the commands as they were; with the job's key and token: test_launch_restart
    result = hosts_py(cluster_file, "--port", "9200", "--state-port", "10020", "--no-auth",
                      "--job-id", JOB_ID, "--", *TRAIN)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    first, *lines = result.stdout.splitlines()
    assert first == f"# live page: {LIVE_PAGE}"
    assert len(lines) == 2 * len(EXPECTED)
    for i, (comment, words) in enumerate(EXPECTED):
        assert lines[2 * i] == comment
        assert shlex.split(lines[2 * i + 1]) == words, lines[2 * i + 1]
    # the flag with a space is quoted once, the default ~ is left for the remote shell
    assert "-dd '/data/my sets'" in lines[7]
    assert lines[7].startswith("cd ~/esync && env ")
    # distinct device names on each host
    names = [w[w.index("--device-name") + 1] for _, w in EXPECTED[3:]]
    assert len(set(names)) == 4


def test_ssh_form_is_the_same_command_behind_ssh(cluster_file):
    result = hosts_py(cluster_file, "--port", "9200", "--state-port", "10020", "--ssh-form",
                      "--ssh", "ssh -p 2222 -o BatchMode=yes", "--no-auth", "--job-id", JOB_ID,
                      "--", *TRAIN)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()[1:]  # after the live page's address
    for i, (comment, words) in enumerate(EXPECTED):
        host = comment[2:].split(":")[0]
        assert lines[2 * i] == comment
        argv = shlex.split(lines[2 * i + 1])
        assert argv[:-1] == ["ssh", "-p", "2222", "-o", "BatchMode=yes", "-tt", host]
        assert shlex.split(argv[-1]) == words


def test_cpu_workers_tilde_dirs_and_no_state_server(tmp_path):
    hostfile = _write(tmp_path / "h", "root@10.0.0.1 roles=scheduler,server,worker\n"
                                      "a.x workers=2 dir=\"~/my esync\" python=~/venv/bin/python\n"
                                      "a.y\n")
    result = hosts_py(hostfile, "--remote-dir", "/opt/e", "--no-auth", "--", "-m", "sync")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0::2] == ["# root@10.0.0.1: scheduler", "# root@10.0.0.1: server",
                           "# root@10.0.0.1: worker 0", "# a.x: worker 0", "# a.x: worker 1",
                           "# a.y: worker 0"]
    words = [shlex.split(line) for line in lines[1::2]]
    assert all("DMLC_PS_ROOT_URI=10.0.0.1" in w and "DMLC_NUM_WORKER=4" in w for w in words)
    assert all("-ip" not in w and "--slowdown" not in w for w in words)
    assert words[2][-4:] == ["--device-name", "10.0.0.1-w0", "-c", "1"]
    # a.x and a.y share their first label: the whole names keep the device names apart
    assert [w[-3] for w in words[3:]] == ["a.x-w0", "a.x-w1", "a.y-w0"]
    assert lines[7].startswith("cd ~/'my esync' && env ") and " ~/venv/bin/python main.py " \
        in lines[7]
    assert lines[11].startswith("cd /opt/e && ")


# --- bad host files -------------------------------------------------------------------

BAD = [
    ("a roles=server\nb\n", [], "no host has the scheduler role"),
    ("a roles=scheduler,server\n\nb roles=scheduler,worker\n", [], ":3: a second scheduler"),
    ("a roles=scheduler,server colour=red\nb\n", [], ":1: unknown key 'colour'"),
    ("a roles=scheduler,server\nb workers=0\n", [], ":2: workers= expects a positive integer"),
    ("a roles=scheduler,server\nb\n", ["-m", "esync"], "-m esync needs a host with the "
                                                       "stateserver role"),
    ("a roles=scheduler,server,gpu\nb\n", [], ":1: unknown role 'gpu'"),
    ("a roles=scheduler,server\nb gpus=0,x\n", [], ":2: gpus= expects GPU numbers"),
    ("a roles=scheduler,server\nb slowdown=0.5\n", [], ":2: slowdown= expects a number >= 1"),
    ("a roles=scheduler,server\nb\nb workers=2\n", [], ":3: host b is already on line 2"),
    ("a roles=scheduler,server\nb dir='/x\n", [], ":2: No closing quotation"),
    ("a roles=scheduler,server gpus=0\nb\n", [], ":1: gpus= given, but the host has no worker"),
    ("a roles=scheduler,worker\n", [], "no host has the server role"),
    ("a roles=scheduler,server,stateserver\nb roles=stateserver,worker\n", [],
     ":2: a second stateserver"),
    ("a roles=scheduler,server\nb workers\n", [], ":2: expected key=value, got 'workers'"),
]


@pytest.mark.parametrize("text,flags,message", BAD)
def test_bad_host_file_is_one_line_and_exit_2(tmp_path, text, flags, message):
    hostfile = _write(tmp_path / "bad-hosts", text)
    result = hosts_py(hostfile, "--", *flags)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"hosts.py: error: {hostfile}"), lines[0]
    assert message in lines[0]


@pytest.mark.parametrize("flags, message", [
    (["-m", "sync", "-c", "maybe"], "argument -c/--cpu: expected 1/0, true/false or yes/no, "
                                    "got 'maybe'"),
    (["-m", "fast"], "argument -m/--mode: invalid choice: 'fast'"),
    (["-m", "sync", "--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_main_flag_is_one_line_and_exit_2(cluster_file, flags, message):
    """The flags after -- go through main.py's own parser, before anything is printed."""
    result = hosts_py(cluster_file, "--", *flags)
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("hosts.py: error: "), result.stderr
    assert message in lines[0]


def test_algorithm_from_the_registry():
    module = _load_module()
    assert module.algorithm_of(["-m", "esync"]).state_server
    assert not module.algorithm_of(["-m", "sync"]).state_server
    assert module.algorithm_of(["-m", "async", "-dcasgd", "1"]).key == "dcasgd"
    assert module.algorithm_of([]).key == "local"  # main.py's default mode


def test_missing_host_file_and_bad_port(tmp_path):
    result = hosts_py(str(tmp_path / "nope"))
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert "cannot read the host file" in result.stderr
    result = hosts_py(str(tmp_path / "nope"), "--port", "0")
    assert result.returncode == 2 and "--port: expected a port number" in result.stderr


def test_help_documents_the_format():
    result = hosts_py("--help")
    assert result.returncode == 0
    for word in ("roles=", "workers=", "gpus=", "slowdown=", "dir=", "python=", "iface=",
                 "--slurm", "--ssh-form", "--state-port", "--remote-dir", "sbatch job.sh"):
        assert word in result.stdout, word
    for gone in ("--run", "--grace"):
        assert gone not in result.stdout, gone


#: what hosts.py may import of esync: main.py's parser and the registry, nothing of the
#: runtime (and no torch); the job key's module (zmq only), to draw the job's key; the
#: plug-ins' form (esync.infra.plugin: no import of a plug-in)
ALLOWED = {"esync", "esync.infra", "esync.logs", "esync.comm", "esync.options", "esync.registry", "esync.errors", "esync.data",
           "esync.models", "esync.infra.plugin", "esync.infra.ready", "esync.transport", "esync.transport.auth",
           "esync.infra.stateclient", "esync.comm.compress", "esync.logs.live",
           # the parser's flags that algorithms declare: their torch-free policies
           "esync.flagtypes", "esync.algorithms", "esync.algorithms.policy",
           *(row.policy.partition(":")[0] for row in registry.ALGORITHMS.values())}


def test_api_and_no_runtime_import(cluster_file, tmp_path):
    code = ("import sys; import esync.launch.hosts; "
            # the tool's own package aside
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('esync', 'torch') "
            "and not m.startswith(('esync.launch', 'esync.logs_tools', 'esync.config'))))")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    imported = set(eval(result.stdout))
    assert imported <= ALLOWED, imported - ALLOWED
    module = _load_module()
    hosts = module.parse_hostfile(cluster_file)
    assert [(h.name, h.line, h.workers) for h in hosts] == [
        ("head.example.org", 2, 0), ("gpu1.example.org", 4, 2), ("gpu2.example.org", 5, 2)]
    args = module.build_parser().parse_args([cluster_file, "--port", "9200",
                                             "--state-port", "10020", "--job-id", JOB_ID])
    args.flags = TRAIN
    cmds = module.commands(hosts, args)
    assert [(h, r) for h, r, _ in cmds] == [(c[2:].split(": ")[0], c.split(": ")[1].split()[0])
                                            for c, _ in EXPECTED]
    assert [shlex.split(c) for _, _, c in cmds] == [w for _, w in EXPECTED]


def test_an_allreduce_job_has_no_servers(tmp_path):
    """--backend allreduce: DMLC_NUM_SERVER=0 and no server command; a server role is
    refused, as is a host file without servers for the parameter servers."""
    module = _load_module()
    path = _write(tmp_path / "hosts", "a roles=scheduler,worker workers=2\nb workers=2\n")
    hosts = module.parse_hostfile(path)
    args = module.build_parser().parse_args([path])
    args.flags = ["-m", "sync", "--backend", "allreduce"]
    cmds = module.commands(hosts, args)
    assert [r for _, r, _ in cmds] == ["scheduler", "worker", "worker", "worker", "worker"]
    assert all("DMLC_NUM_SERVER=0" in c for _, _, c in cmds)
    args.flags = ["-m", "sync"]
    with pytest.raises(module.HostFileError, match="no host has the server role"):
        module.commands(hosts, args)
    served = module.parse_hostfile(_write(tmp_path / "served", "a roles=scheduler,server,worker\n"))
    args.flags = ["-m", "sync", "--backend", "allreduce"]
    with pytest.raises(module.HostFileError, match="runs without servers"):
        module.commands(served, args)


# --- --slurm: the batch script ----------------------------------------------------------

AUTH = ("ESYNC_JOB_KEY", "ESYNC_JOB_KEY_FILE", "ESYNC_STATE_TOKEN")


def _slurm(*args, env=None):
    result = hosts_py(*args, env=env or {k: v for k, v in _env().items() if k not in AUTH})
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return result.stdout


def _sbatch_lines(script):
    return [line for line in script.splitlines() if line.startswith("#SBATCH")]


def _steps(script):
    """(host, command) of each step the script starts: `srun ... bash -c COMMAND &`."""
    steps = []
    for line in script.splitlines():
        if line.startswith("srun ") and line.endswith(" &"):
            argv = shlex.split(line[:-2])
            assert argv[:3] == ["srun", "--nodes=1", "--ntasks=1"] and \
                argv[4:7] == ["--overlap", "bash", "-c"] and len(argv) == 8, argv
            steps.append((argv[3].split("=", 1)[1], argv[7]))
    return steps


def _bash_n(script, tmp_path):
    path = _write(tmp_path / "job.sh", script)
    result = subprocess.run(["bash", "-n", path], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr


def test_slurm_script_from_the_host_file(cluster_file, tmp_path):
    key, token = "k" * 40, "s3cr3t-T0ken"
    env = dict({k: v for k, v in _env().items() if k not in AUTH}, ESYNC_JOB_KEY=key,
               ESYNC_STATE_TOKEN=token)
    script = _slurm(cluster_file, "--port", "9200", "--state-port", "10020", "--slurm",
                    "--job-id", JOB_ID,
                    "--", *TRAIN, env=env)
    _bash_n(script, tmp_path)
    assert script.startswith("#!/bin/bash\n# An esync job as a Slurm batch job, written by\n"
                             f"#   hosts.py {cluster_file} --port 9200 ")
    assert "sbatch job.sh" in script
    # gpus=0,1 and gpus=3: -g 3 is the fourth GPU Slurm gives the job on gpu2
    assert _sbatch_lines(script) == [
        "#SBATCH --job-name=esync", "#SBATCH --nodes=3",
        "#SBATCH --nodelist=head.example.org,gpu1.example.org,gpu2.example.org",
        "#SBATCH --ntasks-per-node=3", "#SBATCH --gres=gpu:4"]
    # each process a step on its host, with the command that is printed without --slurm
    steps = _steps(script)
    assert [(h, shlex.split(c)) for h, c in steps] == [
        (comment[2:].split(":")[0], words) for comment, words in EXPECTED]
    # the job's key and token drawn when it runs: not the ones exported here, on no line
    assert key not in script and token not in script
    assert "export ESYNC_JOB_KEY\n" in script and "export ESYNC_STATE_TOKEN\n" in script
    assert ("srun --nodes=1 --ntasks=1 --nodelist=head.example.org --overlap bash -c "
            "'cd /srv/esync && /srv/venv/bin/python -m esync.transport.auth'") in script
    # --no-auth: none of it, and whatever the submitter exported is dropped
    script = _slurm(cluster_file, "--slurm", "--no-auth", "--", *TRAIN, env=env)
    _bash_n(script, tmp_path)
    assert "export ESYNC" not in script and "esync.transport.auth" not in script
    assert "\nunset ESYNC_JOB_KEY ESYNC_JOB_KEY_FILE ESYNC_STATE_TOKEN\n" in script
    assert len(_steps(script)) == len(EXPECTED)


def test_slurm_script_cpu_hosts_and_user_names(tmp_path):
    hostfile = _write(tmp_path / "h", "root@10.0.0.1 roles=scheduler,server,worker\n"
                                      "a.x workers=2\nbob@a.y\n")
    script = _slurm(hostfile, "--slurm", "--", "-m", "sync")
    _bash_n(script, tmp_path)
    assert _sbatch_lines(script) == [
        "#SBATCH --job-name=esync", "#SBATCH --nodes=3", "#SBATCH --nodelist=10.0.0.1,a.x,a.y",
        "#SBATCH --ntasks-per-node=3"]  # no GPU: no --gres
    assert [h for h, _ in _steps(script)] == ["10.0.0.1"] * 3 + ["a.x"] * 2 + ["a.y"]
    assert "label[$!]='bob@a.y worker 0'" in script


def test_slurm_and_ssh_form_exclude_each_other(cluster_file):
    result = hosts_py(cluster_file, "--slurm", "--ssh-form")
    assert result.returncode == 2 and result.stdout == ""
    assert "not allowed with argument" in result.stderr


# --- --slurm: the script run here, with a stand-in srun -----------------------------------

SRUN = """\
#!{python}
# srun, for the tests: drop the options, run the rest (bash -c COMMAND) on this machine
# in a process group of its own; pass SIGTERM, SIGINT and SIGHUP on to that group (as
# slurmstepd does to the step's processes) and kill what is left of it at the end
import os, signal, subprocess, sys
argv = sys.argv[1:]
while argv and argv[0].startswith("-"):
    argv.pop(0)
proc = subprocess.Popen(argv, start_new_session=True)
def forward(signum, frame):
    try:
        os.killpg(proc.pid, signum)
    except ProcessLookupError:
        pass
for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(signum, forward)
code = proc.wait()
try:
    os.killpg(proc.pid, signal.SIGKILL)
except ProcessLookupError:
    pass
sys.exit(code if code >= 0 else 128 - code)
"""
#: a host's Python, for the tests: the job key drawn, a state server that runs until it
#: is stopped, or a scheduler, server or worker that shows what it got (or sleeps)
FAKE_PYTHON = """\
#!/bin/sh
case "$1" in
  -m) echo "drawn-key-$$"; exit 0;;
  manage.py) exec sleep 60;;
esac
[ -n "$SLEEP" ] && exec sleep "$SLEEP"
echo "$DMLC_ROLE key=$ESYNC_JOB_KEY token=$ESYNC_STATE_TOKEN"
"""


class SlurmRun:
    """A --slurm script, run by bash with the stand-in srun first on PATH; every process
    it starts carries a mark in its environment, to find what it leaves behind."""

    def __init__(self, tmp_path):
        self.tmp = tmp_path
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        _write(bin_dir / "srun", SRUN.format(python=sys.executable), True)
        self.fake = _write(tmp_path / "fake-python", FAKE_PYTHON, True)
        self.work = tmp_path / "work"
        (self.work / "stateserver").mkdir(parents=True)
        self.mark = f"ESYNC_TEST_MARK={uuid.uuid4().hex}"
        self.env = dict({k: v for k, v in _env().items() if k not in AUTH},
                        PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
                        OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                        ESYNC_STATE_DB=str(tmp_path / "state.sqlite3"),
                        ESYNC_TEST_MARK=self.mark.split("=", 1)[1])
        self.proc = None

    def script(self, hosts_text, *args):
        hostfile = _write(self.tmp / "hosts", hosts_text)
        return _write(self.tmp / "job.sh", _slurm(hostfile, "--slurm", *args))

    def start(self, script, **env):
        self.proc = subprocess.Popen(["bash", script], cwd=self.tmp, env=dict(self.env, **env),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return self.proc

    def run(self, script, timeout=60, **env):
        out, err = self.start(script, **env).communicate(timeout=timeout)
        return self.proc.returncode, out, err

    def marked(self):
        """The pids of live processes (not zombies) with the mark."""
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/environ", "rb") as f:
                        if self.mark.encode() in f.read().split(b"\0"):
                            found.append(int(entry))
                except OSError:
                    pass
        return found

    def assert_nothing_left(self):
        deadline = time.monotonic() + 3
        while self.marked() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self.marked() == []

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
        for pid in self.marked():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def slurm(tmp_path):
    run = SlurmRun(tmp_path)
    yield run
    run.close()


def test_slurm_script_shares_the_drawn_key_and_stops_the_state_server(slurm):
    hosts = (f"localhost roles=scheduler,server,stateserver dir={slurm.work} "
             f"python={slurm.fake}\n127.0.0.1 workers=2 dir={slurm.work} python={slurm.fake}\n")
    script = slurm.script(hosts, "--", "-m", "sync")
    code, out, err = slurm.run(script)
    assert code == 0, out + err
    assert err.splitlines() == ["esync: every scheduler, server and worker exited 0"]
    lines = sorted(out.splitlines())
    assert [line.split()[0] for line in lines] == ["scheduler", "server", "worker", "worker"]
    keys = {line.split()[1] for line in lines}
    tokens = {line.split()[2] for line in lines}
    assert len(keys) == 1 and keys.pop().startswith("key=drawn-key-")  # drawn once, shared
    assert len(tokens) == 1 and len(tokens.pop()) == len("token=") + 64
    slurm.assert_nothing_left()  # the state server was stopped
    # exported when the job was submitted: those
    code, out, err = slurm.run(script, ESYNC_JOB_KEY="mine", ESYNC_STATE_TOKEN="tok")
    assert code == 0, out + err
    assert set(line.split(" ", 1)[1] for line in out.splitlines()) == {"key=mine token=tok"}
    slurm.assert_nothing_left()


def test_slurm_script_fails_when_the_state_server_ends_first(slurm):
    hosts = (f"localhost roles=scheduler,server dir={slurm.work} python={slurm.fake}\n"
             f"127.0.0.1 dir={slurm.work} python={slurm.fake}\n"
             f"127.0.0.2 roles=stateserver dir={slurm.work} python=false\n")
    code, out, err = slurm.run(slurm.script(hosts, "--", "-m", "esync"), SLEEP="60")
    assert code == 1, out + err
    assert "esync: 127.0.0.2 stateserver ended (status 1) before the job; stopping the " \
        "others" in err.splitlines()
    slurm.assert_nothing_left()


def test_slurm_script_stops_every_step_on_sigterm(slurm):
    hosts = (f"localhost roles=scheduler,server,stateserver dir={slurm.work} "
             f"python={slurm.fake}\n127.0.0.1 workers=2 dir={slurm.work} python={slurm.fake}\n")
    proc = slurm.start(slurm.script(hosts, "--no-auth", "--", "-m", "esync"), SLEEP="60")

    def sleeping():  # the steps' `sleep 60` (the script has its own `sleep 1`)
        count = 0
        for pid in slurm.marked():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    count += f.read() == b"sleep\x0060\x00"
            except OSError:
                pass
        return count

    deadline = time.monotonic() + 30
    while sleeping() < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sleeping() == 5  # the state server, the scheduler, the server, two workers
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, out + err
    assert "esync: SIGTERM; stopping every step" in err.splitlines()
    slurm.assert_nothing_left()


def _training_hosts(*extra):
    """Host file lines, with dir= the repository and python= this Python unless given."""
    python = f"python={shlex.quote(sys.executable)}"
    return "".join(f"{line} dir={shlex.quote(REPO)}"
                   f"{'' if 'python=' in line else ' ' + python}\n"
                   for line in ("localhost roles=scheduler,server,stateserver", *extra))


def _training_flags(slurm):
    return ["--port", str(free_port()), "--state-port", str(free_port()), "--",
            "-m", "sync", "-n", "lenet", "--max-rounds", "3", "--num-threads", "1",
            "-ld", str(slurm.tmp / "logs")]


@pytest.mark.slow
def test_slurm_script_runs_a_job(slurm):
    """main.py's scheduler, server and two workers and the state server, each a step."""
    script = slurm.script(_training_hosts("127.0.0.1 workers=2"), *_training_flags(slurm))
    start = time.monotonic()
    code, out, err = slurm.run(script, timeout=120)
    assert code == 0, out + err
    assert time.monotonic() - start < 60
    assert "esync: every scheduler, server and worker exited 0" in err.splitlines()
    assert "(CurveZMQ: job key required)" in out + err  # the key drawn on localhost
    for k in range(2):
        rounds = list((slurm.tmp / "logs").glob(f"*/127.0.0.1-w{k}/iter-*.json"))
        assert len(rounds) >= 3, out + err
    slurm.assert_nothing_left()


@pytest.mark.slow
def test_slurm_script_stops_the_job_when_a_worker_fails(slurm):
    """A worker whose Python fails at once: the others are stopped, exit status 1."""
    script = slurm.script(_training_hosts("127.0.0.1", "127.0.0.2 python=false"),
                          *_training_flags(slurm))
    start = time.monotonic()
    code, out, err = slurm.run(script, timeout=120)
    assert code == 1, out + err
    assert time.monotonic() - start < 30
    assert "esync: 127.0.0.2 worker 0 exited with status 1; stopping the others" \
        in err.splitlines()
    slurm.assert_nothing_left()


def test_plugins_go_to_every_process_as_given(tmp_path):
    """-n, --dataset and --loss plug-ins (module:function) pass through to every main.py
    command, untouched: the module must be importable where each command runs."""
    hostfile = _write(tmp_path / "h", "root@10.0.0.1 roles=scheduler,server,worker\n")
    plugins = ["-n", "mynets:build", "--dataset", "mydata:build", "--loss", "mydata:loss"]
    result = hosts_py(hostfile, "--no-auth", "--", "-m", "sync", *plugins)
    assert result.returncode == 0, result.stderr
    words = [shlex.split(line) for line in result.stdout.splitlines()[1::2]]
    worker = words[-1]
    start = worker.index("-n")
    assert worker[start:start + len(plugins)] == plugins
