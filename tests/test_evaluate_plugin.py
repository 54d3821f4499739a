"""`--evaluate module:function`, the user's own evaluation (esync/runtime/task.py): with it a
data set's samples may be anything (here dicts), the function is checked before
anything starts and measures the model wherever esync evaluates (Task.evaluate);
without it samples are (inputs..., target) tuples, a dict refused with one line that
points to --evaluate. In process for the logic; then a real job of esync-run trains a
script of dict samples to the evaluator's target, measured by the plug-in."""
import glob
import json
import math
import os
import subprocess
import sys
import uuid

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from esync import config
from esync.errors import UserError
from esync.runtime.task import load_task

CPU = torch.device("cpu")

# A user's module: a data set whose samples are dicts, a small model (676 weights, far
# under 64 KB), an evaluation of its own, and evaluations that go wrong in each way.
MODULE = r'''
import math

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

DIM, CLASSES = 16, 4
SEEN = {}  # what the last evaluation saw


class Records(Dataset):
    """Samples {"features": x, "label": y}: points around one centre per class."""

    def __init__(self, n, seed):
        centres = 3.0 * torch.randn(CLASSES, DIM, generator=torch.Generator().manual_seed(0))
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, CLASSES, (n,), generator=g)
        self.features = centres[self.labels] + torch.randn(n, DIM, generator=g)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"features": self.features[i], "label": self.labels[i]}


def build_data():
    return Records(512, 1), Records(256, 2)


def build_model():
    return nn.Sequential(nn.Linear(DIM, 32), nn.ReLU(), nn.Dropout(0.5),
                         nn.Linear(32, CLASSES))


def evaluate(model, test_set, device):
    """Top-1 accuracy over dict samples."""
    SEEN.update(training=model.training, grad=torch.is_grad_enabled(), n=len(test_set),
                device=str(device))
    right = 0
    for batch in DataLoader(test_set, batch_size=64):
        out = model(batch["features"].to(device))
        right += (out.argmax(-1) == batch["label"].to(device)).sum().item()
    return right / len(test_set)


def as_tensor(model, test_set, device):
    return torch.tensor(0.25)


def raises(model, test_set, device):
    raise KeyError("image")


def wrong_input(model, test_set, device):
    return float(model(test_set[0]["features"][:3]).sum())


def a_string(model, test_set, device):
    return "0.9"


def a_bool(model, test_set, device):
    return True


def nan(model, test_set, device):
    return math.nan


def pairs():
    x = torch.randn(64, DIM)
    y = (x[:, 0] > 0).long()
    pair = torch.utils.data.TensorDataset(x, y)
    return pair, pair


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(DIM, CLASSES), nn.Linear(DIM, CLASSES)

    def forward(self, a, b):
        return self.a(a) + self.b(b)


def two_inputs_model():
    return TwoInputs()


def triples():
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(64, DIM, generator=g), torch.randn(64, DIM, generator=g)
    y = torch.randint(0, CLASSES, (64,), generator=g)
    triple = torch.utils.data.TensorDataset(a, b, y)
    return triple, triple


def wide_model():
    return nn.Sequential(nn.Linear(2 * DIM, CLASSES))
'''

# The user's training script: esync's public API over the dict samples.
SCRIPT = r'''
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

import esync
from {module} import build_data, build_model

esync.init()
torch.manual_seed(0)
train, _ = build_data()
model = esync.prepare_model(build_model())
loader = esync.prepare_data_loader(DataLoader(train, batch_size=32, shuffle=True))
opt = esync.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-2))
for epoch in range(100):
    for batch in loader:
        opt.zero_grad()
        loss = F.cross_entropy(model(batch["features"]), batch["label"])
        loss.backward()
        esync.report(loss)
        opt.step()
'''


@pytest.fixture
def mod(tmp_path):
    """The user's module, under a name of its own (load_task caches by the names), in
    tmp_path on the Python path; the path and the module are removed afterwards."""
    name = f"evalplug_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(MODULE)
    sys.path.insert(0, str(tmp_path))
    try:
        yield name
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


def task(mod, evaluate=None, data="build_data", metric="accuracy"):
    return load_task(f"{mod}:{data}", config.DATA_DIR, metric=metric,
                     evaluate=f"{mod}:{evaluate}" if evaluate else None)


def refused(call) -> str:
    with pytest.raises(UserError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message, message
    return message


def test_dict_samples_are_measured_by_the_plug_in(mod):
    """It loads, its check passes (calling the function on two test samples, on the
    CPU), and Task.evaluate returns the function's value on the whole test set; the
    function runs in evaluation mode without gradients, and the model is left training."""
    t = task(mod, "evaluate")
    model = t.check(f"{mod}:build_model")
    seen = sys.modules[mod].SEEN
    assert seen == {"training": False, "grad": False, "n": 2, "device": "cpu"}
    assert model.training
    value = t.evaluate(model, CPU)
    assert seen["n"] == 256 and not seen["training"] and not seen["grad"]
    assert model.training and torch.is_grad_enabled()
    model.eval()
    with torch.no_grad():
        expected = sys.modules[mod].evaluate(model, t.test_set, CPU)
    assert value == expected and 0.0 <= value <= 1.0
    assert t.evaluate(model, CPU) == value and not model.training  # its mode, kept


def test_a_tensor_of_one_number_is_a_metric(mod):
    t = task(mod, "as_tensor")
    assert t.evaluate(t.check(f"{mod}:build_model"), CPU) == 0.25


@pytest.mark.parametrize("function, message", [
    ("raises", "calling it raised KeyError: 'image'"),
    ("wrong_input", "calling it raised RuntimeError: "),
    ("a_string", "returned a str, not a number"),
    ("a_bool", "returned a bool, not a number"),
    ("nan", "on 2 test samples it returned nan, not a finite number"),
])
def test_an_evaluation_that_fails_is_refused_with_one_line(mod, function, message):
    t = task(mod, function)
    text = refused(lambda: t.check(f"{mod}:build_model"))
    assert text.startswith(f"--evaluate {mod}:{function}: "), text
    assert message in text, text


def test_a_missing_evaluation_is_refused_naming_the_flag(mod):
    text = refused(lambda: task(mod, "nope"))
    assert text == f"--evaluate {mod}:nope: {mod} has no 'nope'"


def test_without_evaluate_dict_samples_are_refused_pointing_to_it(mod):
    text = refused(lambda: task(mod))
    assert text.startswith(f"--dataset {mod}:build_data: a training sample is a dict, "
                           f"not a pair (input, target)"), text
    assert "give --evaluate module:function" in text, text


def test_pairs_are_still_run_through_the_network_with_evaluate(mod):
    """With --evaluate, (input, target) samples are still run through the network
    before anything starts: a network written for other inputs is refused naming -n."""
    t = task(mod, "as_tensor", data="pairs")
    text = refused(lambda: t.check(f"{mod}:wide_model"))
    assert text.startswith(f"-n/--network {mod}:wide_model: the network fails on two "
                           f"samples of --dataset {mod}:pairs"), text
    assert t.evaluate(t.check(f"{mod}:build_model"), CPU) == 0.25


def test_pairs_are_measured_as_before_without_evaluate(mod):
    t = task(mod, data="pairs")
    model = t.check(f"{mod}:build_model")
    x, y = t.test_set.tensors
    model.eval()
    with torch.no_grad():
        expected = (model(x).argmax(-1) == y).float().mean().item()
    model.train()
    assert t.evaluate(model, CPU) == pytest.approx(expected)


@pytest.mark.parametrize("metric", ["accuracy", "loss"])
def test_a_tuple_s_last_element_is_the_target_and_the_rest_the_inputs(mod, metric):
    """(a, b, target) samples: the network is checked and measured as model(a, b)."""
    t = task(mod, data="triples", metric=metric)
    model = t.check(f"{mod}:two_inputs_model")
    a, b, y = t.test_set.tensors
    with torch.no_grad():
        out = model.eval()(a, b)
    model.train()
    expected = ((out.argmax(-1) == y).float().mean() if metric == "accuracy"
                else nn.functional.cross_entropy(out, y)).item()
    assert t.evaluate(model, CPU) == pytest.approx(expected, rel=1e-6)
    text = refused(lambda: t.check(f"{mod}:wide_model"))  # takes one input, not two
    assert text.startswith(f"-n/--network {mod}:wide_model: the network fails on two "
                           f"samples of --dataset {mod}:triples"), text


def test_a_built_in_data_set_gives_its_test_images_as_pairs(mod):
    """--evaluate with digits: the function gets its normalised test images and labels."""
    t = load_task("digits", config.DATA_DIR, evaluate=f"{mod}:as_tensor")
    model = t.check("lenet")
    image, label = t.test_data()[0]
    assert list(image.shape) == [1, 28, 28] and int(label) == int(t.arrays.test_labels[0])
    assert len(t.test_data()) == len(t.arrays.test_labels)
    assert t.evaluate(model, CPU) == 0.25


@pytest.mark.slow  # a whole job of real processes, trained to the evaluator's target
def test_a_job_of_dict_samples_ends_at_the_plug_in_s_target(tmp_path, mod):
    """esync-run trains a script of dict samples; the evaluator measures the global
    model with --evaluate and ends the job at --target-accuracy."""
    (tmp_path / "train_dicts.py").write_text(SCRIPT.format(module=mod))
    out = tmp_path / "runs"
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "esync.launch.run", "--workers", "2", "-m", "sync",
         "--no-progress", "--num-threads", "1", "--time-limit", "40", "--out", str(out),
         "-n", f"{mod}:build_model", "--dataset", f"{mod}:build_data",
         "--evaluate", f"{mod}:evaluate", "--metric", "accuracy",
         "--target-accuracy", "0.9", "train_dicts.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (evaluator,) = glob.glob(str(out / "train_dicts" / "sync" / "*" / "evaluator"))
    records = [json.load(open(p)) for p in glob.glob(os.path.join(evaluator, "iter-*.json"))]
    accuracies = [r["accuracy"] for r in sorted(records, key=lambda r: r["total_time"])]
    assert accuracies and all(0.0 <= a <= 1.0 for a in accuracies), accuracies
    assert max(accuracies) >= 0.9, accuracies
    assert accuracies[0] < 0.9, accuracies  # it was measured learning, not at the start
    log = open(os.path.join(os.path.dirname(evaluator), "evaluator.log")).read()
    assert f"by {mod}:evaluate" in log and "Traceback" not in log, log[-3000:]
    assert "reached target accuracy 0.9" in log, log[-3000:]
