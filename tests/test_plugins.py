"""The user's own network, data set and loss as plug-ins, `-n module:function`,
`--dataset module:function`, `--loss module:function` (esync/infra/plugin.py, esync/models,
esync/runtime/task.py): checked in-process for each way they can be wrong, then trained by
real processes, alone and as a job of the local launcher, from the folder holding the
user's module, to a target accuracy or loss."""
import io
import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from esync.infra import plugin
from esync.errors import UserError
from esync.models import build_network
from esync.launch import local
from tests.helpers import REPO, assert_no_traceback, evaluator_accuracy, run_main

# A user's file of networks for 1x28x28 inputs and 10 classes, as one would write it
NETS = r'''
import torch
from torch import nn

def build():
    return nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 64), nn.BatchNorm1d(64),
                         nn.ReLU(), nn.Linear(64, 10))

def seven_classes():
    return nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 7))

def for_cifar():
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))

def not_a_module():
    return "a network"

def raises():
    raise RuntimeError("no weights here\nsecond line of the message")

class zoo:
    @staticmethod
    def small():
        return nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 10))

not_callable = 3
'''


@pytest.fixture
def nets(tmp_path, monkeypatch):
    """A folder holding the user's `usernets.py` (and a module that fails to import),
    as the current folder; the test process's path is restored afterwards."""
    (tmp_path / "usernets.py").write_text(NETS)
    (tmp_path / "brokennets.py").write_text("import torch\nraise ImportError('cuda 13 needed')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("usernets", "brokennets"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return tmp_path


def _error(spec: str) -> str:
    with pytest.raises(UserError) as caught:
        build_network(spec, 10, torch.zeros(2, 1, 28, 28))
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"-n/--network {spec}: "), message
    return message[len(f"-n/--network {spec}: "):]


@pytest.mark.parametrize("spec, message", [
    ("nosuchmodule:build", "no module named 'nosuchmodule' on the Python path or in "),
    ("usernets:nope", "usernets has no 'nope'"),
    ("usernets:zoo.large", "usernets has no 'zoo.large'"),
    ("usernets:not_callable", "not_callable is a int, not a function"),
    ("brokennets:build", "importing brokennets failed: ImportError: cuda 13 needed"),
    ("usernets:not_a_module", "returned a str, not a torch.nn.Module"),
    ("usernets:raises", "calling it raised RuntimeError: no weights here"),
    ("usernets:seven_classes", "the network's output for 2 samples is [2, 7], expected "
                               "[2, 10] (one score per class)"),
    ("usernets:for_cifar", "the network fails on the data set's samples (shape [2, 1, "
                           "28, 28]): RuntimeError: "),
])
def test_a_bad_plugin_is_one_line_naming_the_flag(nets, spec, message):
    assert _error(spec).startswith(message)


def test_a_good_plugin_is_built_from_the_current_folder_and_left_untouched(nets):
    model = build_network("usernets:build", 10, torch.randn(2, 1, 28, 28))
    assert isinstance(model, torch.nn.Sequential) and model.training
    batch_norm = model[2]
    assert int(batch_norm.num_batches_tracked) == 0  # the check ran in evaluation mode
    assert torch.equal(batch_norm.running_mean, torch.zeros(64))
    assert isinstance(build_network("usernets:zoo.small"), torch.nn.Module)


@pytest.mark.parametrize("text, ok", [
    ("pkg.mod:build", True), ("mod:fn", True), ("mod:Cls.method", True),
    ("mod", False), ("mod:", False), (":fn", False), ("mod:fn:x", False),
    ("mod/x:fn", False), ("1mod:fn", False), ("mod:fn()", False),
])
def test_the_form_module_function(text, ok):
    assert plugin.is_spec(text) is ok


def test_main_refuses_a_name_that_is_neither_builtin_nor_a_plugin(tmp_path):
    proc = run_main(["-m", "local", "-n", "lenet5", "--epochs", "1"], cwd=str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "main.py: error: argument -n/--network: expected one of alexnet, ")
    assert "module:function, got 'lenet5'" in proc.stderr
    assert not (tmp_path / "logs").exists()


@pytest.mark.slow
def test_main_trains_a_plugin_alone_and_refuses_a_bad_one_before_training(nets):
    good = run_main(["-m", "local", "-n", "usernets:build", "--epochs", "2", "-e", "1",
                     "--num-threads", "1"], cwd=str(nets))
    assert good.returncode == 0, good.stderr[-2000:]
    assert_no_traceback({"main.py": good.stdout + good.stderr})
    assert "training usernets:build on digits" in good.stdout + good.stderr
    records = list((nets / "logs" / socket.gethostname() / "cpu").glob("iter-*.json"))
    assert records
    bad = run_main(["-m", "local", "-n", "usernets:seven_classes", "--epochs", "1",
                    "-ld", "badlogs"], cwd=str(nets))
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "main.py: error: -n/--network usernets:seven_classes: the network's output for 2 "
        "samples is [2, 7], expected [2, 10] (one score per class)"]
    assert not (nets / "badlogs").exists()


@pytest.mark.slow
def test_the_launcher_runs_a_plugin_in_every_process_of_a_job(nets):
    """ESync with two workers, the state server and the evaluator, started from the
    folder of the user's module: every process imports it, and the evaluator measures
    the plug-in's accuracy."""
    out = io.StringIO()
    code = local.run(["-m", "esync", "--workers", "2", "--slowdown", "1,2", "-n",
                      "usernets:build", "--out", "runs", "--target-accuracy", "0.8",
                      "--time-limit", "60", "--no-auth"],
                     progress=False, out=out)
    folder = nets / "runs" / "usernets:build" / "esync" / socket.gethostname()
    logs = {str(p.relative_to(folder)): p.read_text() for p in folder.rglob("*.log")}
    assert code == 0, (out.getvalue(), logs)
    assert_no_traceback(logs)
    assert evaluator_accuracy(str(nets / "runs"), "esync", "usernets:build") >= 0.8
    for device in ("w0", "w1-x2"):
        assert "training usernets:build on digits" in logs[f"{device}/worker.log"]


def test_the_launcher_refuses_a_bad_plugin_before_starting_anything(nets):
    """The same one line as main.py's, exit 2, and no log folder: nothing started."""
    proc = subprocess.run([sys.executable, os.path.join(REPO, "src", "esync", "launch", "local.py"), "-m",
                           "sync", "--workers", "2", "-n", "usernets:nope", "--out", "runs",
                           "--no-auth"], capture_output=True, text=True, cwd=str(nets),
                          timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "esync-launch: error: -n/--network usernets:nope: usernets has no 'nope'"]
    assert not (nets / "runs").exists()


# --- data sets, losses and metrics as plug-ins (esync/runtime/task.py) ---------------------------
# A user's file of tabular data (rows of 8 numbers, 3 classes) and what goes with it
DATA = r'''
import torch
from torch import nn
from torch.utils.data import TensorDataset

def _rows(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = (x[:, 0] > 0.5).long() + (x[:, 0] > -0.5).long()
    return TensorDataset(x, y)

def rows():
    return _rows(600, 0), _rows(200, 1)

def net():
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))

def wide_net():
    return nn.Sequential(nn.Linear(5, 3))

def mse(out, target):
    return ((out.softmax(-1) - nn.functional.one_hot(target, 3)) ** 2).mean()

def bad_loss(out, target):
    return out  # not a scalar

def one_set():
    return _rows(10, 0)

def not_data():
    return 1, 2

def empty():
    return TensorDataset(torch.zeros(0, 8)), _rows(10, 1)

def unlabelled():
    return TensorDataset(torch.zeros(10, 8)), TensorDataset(torch.zeros(10, 8))
'''


@pytest.fixture
def data(nets):
    (nets / "userdata.py").write_text(DATA)
    sys.modules.pop("userdata", None)
    return nets


def _check(argv):
    from esync.options import parse_options
    from esync.runtime.startup import check_plugins

    check_plugins(parse_options(argv))


@pytest.mark.parametrize("argv, message", [
    (["--dataset", "userdata:one_set", "-n", "userdata:net"],
     "--dataset userdata:one_set: returned a TensorDataset, not a pair (training set, "
     "test set)"),
    (["--dataset", "userdata:not_data", "-n", "userdata:net"],
     "--dataset userdata:not_data: its training set is a int, not a torch Dataset"),
    (["--dataset", "userdata:empty", "-n", "userdata:net"],
     "--dataset userdata:empty: its training set is empty"),
    (["--dataset", "userdata:unlabelled", "-n", "userdata:net"],
     "--dataset userdata:unlabelled: a training sample is a tuple"),
    (["--dataset", "userdata:nope", "-n", "userdata:net"],
     "--dataset userdata:nope: userdata has no 'nope'"),
    (["--dataset", "userdata:rows", "-n", "userdata:wide_net"],
     "-n/--network userdata:wide_net: the network fails on two samples of --dataset "
     "userdata:rows: RuntimeError: "),
    (["--dataset", "userdata:rows", "-n", "userdata:net", "--loss", "userdata:bad_loss"],
     "--loss: the loss of the network's output (shape [2, 3]) and the targets (shape [2]) "
     "fails: "),
    (["--dataset", "userdata:rows", "-n", "userdata:net", "--loss", "nosuch:loss"],
     "--loss nosuch:loss: no module named 'nosuch'"),
    (["--dataset", "userdata:rows", "-n", "userdata:net", "--target-loss", "0.1"],
     "--target-loss needs --metric loss, not accuracy"),
    (["--dataset", "userdata:rows", "-n", "userdata:net", "--metric", "loss",
      "--target-accuracy", "0.9"], "--target-accuracy needs --metric accuracy, not loss"),
])
def test_a_bad_data_set_loss_or_target_is_one_line_naming_the_flag(data, argv, message):
    from esync.runtime import task

    task._LOADED.clear()
    with pytest.raises(UserError) as caught:
        _check(argv)
    assert "\n" not in str(caught.value) and str(caught.value).startswith(message), \
        str(caught.value)


@pytest.mark.slow
@pytest.mark.parametrize("mode, metric", [(["-m", "sync"], ["--target-accuracy", "0.9"]),
                                          (["-m", "esync"], ["--metric", "loss",
                                                             "--loss", "userdata:mse",
                                                             "--target-loss", "0.05"])],
                         ids=["sync-accuracy", "esync-loss"])
def test_the_launcher_trains_a_plugin_network_on_plugin_data_to_its_target(data, mode, metric):
    """Rows of numbers, not images: every process of the job (workers, evaluator) builds
    the plug-ins, and the evaluator ends the job at the target of the chosen metric."""
    out = io.StringIO()
    code = local.run([*mode, "--workers", "2", "-n", "userdata:net", "--dataset",
                      "userdata:rows", *metric, "--time-limit", "90", "--out", "runs",
                      "--no-auth", "-l", "0.1", "-ll", "0.1"], progress=False, out=out)
    folder = data / "runs" / "userdata:net" / mode[1] / socket.gethostname()
    logs = {str(p.relative_to(folder)): p.read_text() for p in folder.rglob("*.log")}
    assert code == 0, (out.getvalue(), logs)
    assert_no_traceback(logs)
    assert "the evaluator reached target" in logs["scheduler.log"] + "".join(logs.values())
    key = "accuracy" if "--target-accuracy" in metric else "val_loss"
    records = [json.load(open(p)) for p in (folder / "evaluator").glob("iter-*.json")]
    values = [r[key] for r in records if key in r]
    assert values and (max(values) >= 0.9 if key == "accuracy" else min(values) <= 0.05)


@pytest.mark.slow
def test_the_experiment_compares_modes_on_a_plugin_network_and_data_set(data):
    """esync-experiment with -n and --dataset plug-ins (from the folder holding them):
    its jobs, summaries and tables, as on the built-in names."""
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "src", "esync", "launch", "experiment.py"), "--modes",
         "esync,sync", "--seeds", "1", "--configs", "plain", "--workers", "2",
         "--slowdown", "1,2", "--time-limit", "8", "--targets", "0.6,0.8", "--hold", "0.2",
         "-n", "userdata:net", "--dataset", "userdata:rows", "--out", "runs", "-l", "0.1",
         "-ll", "0.1"], cwd=str(data), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    doc = json.loads((data / "runs" / "results.json").read_text())
    rows = doc["configs"]["plain"]["algorithms"]
    assert {"ESync", "SSGD"} <= set(rows)
    assert (data / "runs" / "plain" / "seed0" / "userdata:net" / "esync" / "ESync.json").exists()


def test_the_launcher_refuses_a_data_set_of_the_wrong_shape_before_starting_anything(data):
    proc = subprocess.run([sys.executable, os.path.join(REPO, "src", "esync", "launch", "local.py"), "-m",
                           "sync", "--workers", "2", "-n", "userdata:wide_net", "--dataset",
                           "userdata:rows", "--out", "runs", "--no-auth"],
                          capture_output=True, text=True, cwd=str(data), timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "esync-launch: error: -n/--network userdata:wide_net: the network fails on two "
        "samples of --dataset userdata:rows: RuntimeError: "), proc.stderr
    assert not (data / "runs").exists()
