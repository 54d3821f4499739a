"""The examples (examples/), run as their users would: each under esync-run in ESync,
SSGD on the parameter servers, SSGD by all-reduce and ASGD, 2 workers, to its target
(the evaluator's validation loss or accuracy, the script's own model and data given as
plug-ins), then through summary.py and drawer.py; and the esync version of the plain
PyTorch script differs from it by at most 10 lines."""
import difflib
import json
import os
import re
import subprocess
import sys

import pytest

from tests.helpers import REPO, assert_no_traceback

EXAMPLES = os.path.join(REPO, "examples")
MODES = {"esync": ["-m", "esync"], "sync": ["-m", "sync"],
         "sync-allreduce": ["-m", "sync", "--backend", "allreduce"],
         "async": ["-m", "async"]}
LM = ["-n", "examples.charlm:build_model", "--dataset", "examples.charlm:build_data",
      "--loss", "examples.charlm:loss_fn", "--metric", "loss", "--target-loss", "3.0"]


def code_of(path):
    """A script's lines after its module docstring (which says how to run it)."""
    text = open(path).read()
    return text.split('"""', 2)[2].splitlines() if text.startswith('"""') else text.splitlines()


def added_lines(name):
    """The lines of code examples/<name>_esync.py adds to (or changes in) <name>_plain.py."""
    plain = code_of(os.path.join(EXAMPLES, f"{name}_plain.py"))
    converted = code_of(os.path.join(EXAMPLES, f"{name}_esync.py"))
    return [line for line in difflib.unified_diff(plain, converted, lineterm="", n=0)
            if line.startswith("+") and not line.startswith("+++")]


@pytest.mark.parametrize("name", ["charlm", "resnet"])
def test_the_esync_example_differs_from_the_plain_script_by_at_most_10_lines(name):
    added = added_lines(name)
    assert 0 < len(added) <= 10, "\n".join(added)


def test_the_documented_diff_is_the_examples_diff():
    """The manual's tutorial shows the diff of the language model's scripts: it is the
    real one."""
    page = open(os.path.join(REPO, "docs", "tutorials", "your-own-script.md")).read()
    shown = page.split("<!-- example diff -->\n```diff\n", 1)[1].split("```", 1)[0]
    plain = open(os.path.join(EXAMPLES, "charlm_plain.py")).read().splitlines()
    converted = open(os.path.join(EXAMPLES, "charlm_esync.py")).read().splitlines()
    real = difflib.unified_diff(plain, converted, "examples/charlm_plain.py",
                                "examples/charlm_esync.py", lineterm="", n=0)
    assert shown.splitlines() == [line for line in real if not line.startswith("@@")]


def esync_run(tmp_path, flags, script, *args, timeout=240):
    """esync-run from the repository root (the plug-ins are examples.*); the output."""
    proc = subprocess.run(
        [sys.executable, "-m", "esync.launch.run", "--workers", "2", "--no-progress",
         "--out", str(tmp_path), "--time-limit", "150", *flags,
         os.path.join(EXAMPLES, script), *args],
        cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _summarise_and_draw(tmp_path, name, folder):
    for tool, argv in (("summary.py", ["-b", str(tmp_path), "-n", name, "-m", folder]),
                       ("drawer.py", ["-b", str(tmp_path), "-n", name, "-o",
                                      str(tmp_path / "figures")])):
        proc = subprocess.run([sys.executable, os.path.join(REPO, "src", "esync", "logs_tools", tool),
                               *argv], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "figures" / "accuracy_iid.png").stat().st_size > 0


def _evaluations(tmp_path, name, folder, key):
    (host,) = [h for h in (tmp_path / name / folder).iterdir() if h.is_dir()]
    logs = {str(p.relative_to(host)): p.read_text() for p in host.rglob("*.log")}
    assert_no_traceback(logs)
    records = [json.load(open(p)) for p in (host / "evaluator").glob("iter-*.json")]
    return [r[key] for r in records if key in r], logs


# (time: the suite has 15 minutes. SSGD runs the ResNet below; ASGD and standalone
# training run this LM through esync-experiment in test_experiment.py; the all-reduce
# backend and every other mode run a user's script through the same API in test_api.py)
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["esync"])
def test_the_language_model_reaches_its_validation_loss_in_esync(tmp_path, mode):
    esync_run(tmp_path, [*MODES[mode], *LM], "charlm_esync.py", "--seconds", "300")
    folder = "sync" if mode == "sync-allreduce" else mode
    losses, logs = _evaluations(tmp_path, "charlm_esync", folder, "val_loss")
    assert losses and min(losses) <= 3.0
    assert "reached target loss 3.0" in logs["evaluator.log"]
    _summarise_and_draw(tmp_path, "charlm_esync", folder)
    summary = json.load(open(next((tmp_path / "charlm_esync" / folder).glob("*.json"))))
    (devices,) = summary.values()
    assert {"w0", "w1", "evaluator"} <= set(devices)
    assert min(v for v in devices["evaluator"]["val_loss_list"] if v is not None) <= 3.0


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    """The ResNet example's image folder (4 classes of shapes, 3x32x32), written once."""
    sys.path.insert(0, REPO)
    from examples.resnet_bn import write_image_folder

    root = tmp_path_factory.mktemp("shapes")
    write_image_folder(str(root))
    return root


# (time: SSGD with BatchNorm through the API runs tests/api_script.py --model bn)
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["esync"])
def test_the_resnet_with_batchnorm_reaches_90_percent_in_esync(tmp_path, shapes, mode):
    esync_run(tmp_path, [*MODES[mode], "-n", "examples.resnet_bn:build_model", "--dataset",
                         "folder", "-dd", str(shapes), "--target-accuracy", "0.9"],
              "resnet_esync.py", "--data", str(shapes), "--seconds", "300")
    folder = "sync" if mode == "sync-allreduce" else mode
    accuracies, logs = _evaluations(tmp_path, "resnet_esync", folder, "accuracy")
    assert accuracies and max(accuracies) >= 0.9
    assert "reached target accuracy 0.9" in logs["evaluator.log"]
    _summarise_and_draw(tmp_path, "resnet_esync", folder)


#: tests/virtual_device's sitecustomize: CUDA's device rule enforced on the CPU
VIRTUAL_DEVICE = {"ESYNC_VIRTUAL_DEVICE": "1", "PYTHONPATH": os.pathsep.join(
    [os.path.join(REPO, "tests", "virtual_device"), *filter(None, [os.environ.get("PYTHONPATH")])])}


@pytest.mark.slow
@pytest.mark.parametrize("script", ["charlm_esync.py", "resnet_esync.py"])
def test_the_examples_move_every_batch_they_use_to_esync_s_device(tmp_path, shapes, script):
    """On a GPU worker a batch left on the CPU crashes the first forward it meets: under
    the tests' virtual device (CUDA's rule, on this CPU) each example trains and
    validates in DDP (rank 0 validating alone) without one. (The parameter-server modes'
    CPU path shares the device's memory with numpy, which the virtual device cannot
    tell from a GPU's host copy; their device code is the same as here.)"""
    args = ["--seconds", "5", "--eval-every", "10"] if script.startswith("charlm") else \
        ["--data", str(shapes), "--seconds", "5"]
    proc = subprocess.run(
        [sys.executable, "-m", "esync.launch.run", "--workers", "2", "--no-progress",
         "--num-threads", "1", "--out", str(tmp_path), "-m", "ddp", "--time-limit", "60",
         os.path.join(EXAMPLES, script), *args],
        cwd=REPO, capture_output=True, text=True, timeout=240,
        env=dict(os.environ, **VIRTUAL_DEVICE))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (log,) = (tmp_path / script[:-3] / "ddp").glob("*/w0/worker.log")
    validated = re.findall(r"val_loss|test_accuracy", log.read_text())
    assert len(validated) >= 2, log.read_text()[-2000:]
