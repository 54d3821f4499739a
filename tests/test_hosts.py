"""launch/hosts.py: the per-host commands of a multi-host job, printed or run over ssh.

The printed commands are checked word by word (parsed back with shlex.split); `--run`
is checked with a fake ssh (a script that ignores the host and runs the command here
with `sh -c`) and fake Pythons (host file `python=` scripts that print, fail or sleep)."""
from __future__ import annotations

import importlib.util
import os
import shlex
import signal
import stat
import subprocess
import sys
import time

import pytest

from tests.helpers import REPO

HOSTS_PY = os.path.join(REPO, "launch", "hosts.py")


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


def _env_words(role, iface=None):
    words = [f"DMLC_ROLE={role}", "DMLC_PS_ROOT_URI=head.example.org", "DMLC_PS_ROOT_PORT=9200",
             "DMLC_NUM_SERVER=1", "DMLC_NUM_WORKER=4"]
    return words + ([f"DMLC_INTERFACE={iface}"] if iface else [])


def _worker(short, k, gpu, slowdown=None):
    words = ["cd", "~/esync", "&&", "env", *_env_words("worker"), "python", "main.py", *TRAIN,
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
    ("# gpu1.example.org: worker 0", _worker("gpu1", 0, 0, "2")),
    ("# gpu1.example.org: worker 1", _worker("gpu1", 1, 1, "2")),
    ("# gpu2.example.org: worker 0", _worker("gpu2", 0, 3)),
    ("# gpu2.example.org: worker 1", _worker("gpu2", 1, 3)),
]


@pytest.fixture
def cluster_file(tmp_path):
    return _write(tmp_path / "hosts.txt", CLUSTER)


def test_printed_commands(cluster_file):
    # --no-auth: the commands as they were; with the job's key and token: test_launch_restart
    result = hosts_py(cluster_file, "--port", "9200", "--state-port", "10020", "--no-auth",
                      "--", *TRAIN)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
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
                      "--ssh", "ssh -p 2222 -o BatchMode=yes", "--no-auth", "--", *TRAIN)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
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
                 "--run", "--ssh-form", "--state-port", "--remote-dir", "--grace"):
        assert word in result.stdout, word


#: what hosts.py may import of esync: main.py's parser and the registry, nothing of the
#: runtime (and no torch); the job key's module (zmq only), to draw the job's key
ALLOWED = {"esync", "esync.options", "esync.registry", "esync.errors", "esync.data",
           "esync.models", "esync.ready", "esync.transport", "esync.transport.auth",
           "esync.stateclient", "esync.compress"}


def test_api_and_no_runtime_import(cluster_file, tmp_path):
    code = ("import sys; import launch.hosts; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('esync', 'torch')))")
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
                                             "--state-port", "10020"])
    args.flags = TRAIN
    cmds = module.commands(hosts, args)
    assert [(h, r) for h, r, _ in cmds] == [(c[2:].split(": ")[0], c.split(": ")[1].split()[0])
                                            for c, _ in EXPECTED]
    assert [shlex.split(c) for _, _, c in cmds] == [w for _, w in EXPECTED]


# --- --run, with a fake ssh and fake Pythons ------------------------------------------

FAKE_SSH = """\
#!{python}
import os, sys
# ssh [options] HOST COMMAND: ignore the options and the host, run COMMAND here
os.execvp("sh", ["sh", "-c", sys.argv[-1]])
"""
OK = """\
#!/bin/sh
n=0
while [ "$(ls "$PIDDIR" 2>/dev/null | wc -l)" -lt "${WAITFOR:-0}" ] && [ $n -lt 100 ]; do
  sleep 0.1; n=$((n+1))
done
echo "role=${DMLC_ROLE:-stateserver} uri=$DMLC_PS_ROOT_URI workers=$DMLC_NUM_WORKER"
for a in "$@"; do echo "arg:$a"; done
"""
SLEEP = """\
#!/bin/sh
echo "cwd=$(pwd)"
echo $$ > "$PIDDIR/${DMLC_ROLE:-stateserver}-$$.pid"
exec sleep 60
"""
STUBBORN = """\
#!/bin/sh
trap '' TERM
echo $$ > "$PIDDIR/stubborn-$$.pid"
exec sleep 60
"""
FAIL = """\
#!/bin/sh
n=0
while [ "$(ls "$PIDDIR" | wc -l)" -lt "$WAITFOR" ] && [ $n -lt 100 ]; do sleep 0.1; n=$((n+1)); done
echo "giving up"
exit 3
"""


@pytest.fixture
def fake(tmp_path):
    """Fake ssh and Pythons in tmp_path; pids of sleeping children land in tmp_path/pids."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "pids").mkdir()
    (tmp_path / "work" / "stateserver").mkdir(parents=True)
    paths = {"ssh": _write(bin_dir / "fake-ssh", FAKE_SSH.format(python=sys.executable), True)}
    for name, text in (("ok", OK), ("sleep", SLEEP), ("stubborn", STUBBORN), ("fail", FAIL)):
        paths[name] = _write(bin_dir / f"{name}.sh", text, True)
    paths["work"] = str(tmp_path / "work")
    paths["pids"] = str(tmp_path / "pids")
    return paths


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (killed, not yet reaped by init) is dead too
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _pids(fake):
    return [int(open(os.path.join(fake["pids"], name)).read())
            for name in sorted(os.listdir(fake["pids"]))]


def _assert_all_gone(pids):
    deadline = time.monotonic() + 3
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if _alive(p)]


def _hostfile(tmp_path, fake, lines):
    text = "".join(f"{host} {keys} dir={fake['work']} python={fake[script]}\n"
                   for host, keys, script in lines)
    return _write(tmp_path / "hosts.run", text)


def _run_args(hostfile, fake, *extra):
    return [sys.executable, HOSTS_PY, hostfile, "--run", "--ssh", shlex.quote(fake["ssh"]),
            *extra]


def test_run_streams_prefixed_output_and_exits_0(tmp_path, fake):
    hostfile = _hostfile(tmp_path, fake, [("alpha", "roles=scheduler,server,worker", "ok"),
                                          ("beta", "workers=2 gpus=1", "ok")])
    # -dd takes any text: a value with a space that main.py's parser accepts
    result = subprocess.run(_run_args(hostfile, fake, "--", "-m", "sync", "-dd", "a b"),
                            cwd=REPO, capture_output=True, text=True, timeout=30, env=_env())
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    for label, role in (("alpha scheduler", "scheduler"), ("alpha server", "server"),
                        ("alpha worker 0", "worker"), ("beta worker 0", "worker"),
                        ("beta worker 1", "worker")):
        assert f"[{label}] role={role} uri=alpha workers=3" in lines
        assert f"[{label}] arg:a b" in lines  # quoting survives the ssh layer
        assert any(line.startswith(f"[{label}] $ ") and "-tt" in line for line in lines)
    assert "[alpha worker 0] arg:alpha-w0" in lines
    assert lines.index("[beta worker 1] arg:-g") + 1 == lines.index("[beta worker 1] arg:1")
    assert "[beta worker 1] arg:beta-w1" in lines
    # every line of the children is prefixed
    assert all(line.startswith("[") for line in lines)


def test_run_a_failing_child_stops_the_others(tmp_path, fake):
    hostfile = _hostfile(tmp_path, fake, [("alpha", "roles=scheduler,server", "sleep"),
                                          ("beta", "", "fail"), ("gamma", "", "stubborn")])
    env = dict(_env(), PIDDIR=fake["pids"], WAITFOR="3")
    start = time.monotonic()
    result = subprocess.run(_run_args(hostfile, fake, "--grace", "1", "--", "-m", "sync"),
                            cwd=REPO, capture_output=True, text=True, timeout=30, env=env)
    elapsed = time.monotonic() - start
    assert result.returncode == 1, result.stdout + result.stderr
    assert 1 <= elapsed < 10  # the child that ignores SIGTERM got SIGKILL after --grace 1
    assert "[beta worker 0] giving up" in result.stdout.splitlines()
    assert "hosts.py: beta worker 0 exited with status 3; stopping the others" in result.stderr
    pids = _pids(fake)
    assert len(pids) == 3  # scheduler, server and the worker that ignores SIGTERM
    _assert_all_gone(pids)


def test_run_ctrl_c_stops_everything(tmp_path, fake):
    hostfile = _hostfile(tmp_path, fake, [("alpha", "roles=scheduler,server", "sleep"),
                                          ("beta", "workers=2", "sleep")])
    env = dict(_env(), PIDDIR=fake["pids"])
    proc = subprocess.Popen(_run_args(hostfile, fake, "--", "-m", "sync"), cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 15
        while len(os.listdir(fake["pids"])) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = _pids(fake)
        assert len(pids) == 4
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out + err
    assert "interrupted; stopping every process" in err
    _assert_all_gone(pids)


def test_run_stops_the_state_server_when_the_job_ends(tmp_path, fake):
    hostfile = _hostfile(tmp_path, fake, [("state", "roles=stateserver", "sleep"),
                                          ("alpha", "roles=scheduler,server,worker", "ok")])
    env = dict(_env(), PIDDIR=fake["pids"], WAITFOR="1")  # the state server has started
    result = subprocess.run(_run_args(hostfile, fake, "--", "-m", "esync"), cwd=REPO,
                            capture_output=True, text=True, timeout=30, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert f"[state stateserver] cwd={fake['work']}/stateserver" in lines
    assert "[alpha worker 0] arg:-ip" in lines and "[alpha worker 0] arg:state" in lines
    pids = _pids(fake)
    assert len(pids) == 1
    _assert_all_gone(pids)


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
