"""--tensorboard DIR (esync/logs/scalars.py through esync/logs/recorder.py): the round records
as TensorBoard scalars, read back with TensorBoard's own reader; in-process for the
recorder, then a real job of the local launcher."""
import glob
import io
import json
import math
import socket
import subprocess
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from esync.logs import scalars
from esync.errors import UserError
from esync.logs.recorder import Recorder
from esync.launch import local
from tests.helpers import assert_no_traceback


def _scalars(folder) -> dict:
    """{tag: [(step, value), ...]} of every event file in `folder`."""
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


def test_each_round_becomes_scalars_at_its_step(tmp_path):
    with Recorder(str(tmp_path / "logs"), "h", "w0", tensorboard=str(tmp_path / "tb")) as r:
        r.write_round(1, {0: {"forward and backward": 0.1}}, 64, 2.5, 1000, 2000, budget=3)
        r.write_round(2, {0: {}}, 32, float("nan"), 10, 20, accuracy=0.5, budget=True)
    found = _scalars(tmp_path / "tb" / "h" / "w0")
    assert found["train/loss"] == [(1, 2.5)]  # NaN is left out, as the log's null
    assert found["train/samples"] == [(1, 64.0), (2, 32.0)]
    assert found["traffic/bytes_sent"] == [(1, 1000.0), (2, 10.0)]
    assert found["traffic/bytes_received"] == [(1, 2000.0), (2, 20.0)]
    assert found["esync/budget"] == [(1, 3.0)]  # not a number: left out
    assert found["eval/accuracy"] == [(2, 0.5)]
    assert [step for step, _ in found["train/seconds"]] == [1, 2]
    assert all(math.isfinite(v) and v >= 0 for _, v in found["train/seconds"])


def test_a_new_run_replaces_the_last_ones_events_a_continued_one_adds(tmp_path):
    def run(rounds, keep=False):
        with Recorder(str(tmp_path / "logs"), "h", "w0", keep=keep,
                      tensorboard=str(tmp_path / "tb")) as r:
            for n in rounds:
                r.write_round(n, {}, 8, float(n))
    run([1, 2, 3])
    run([1, 2])
    assert _scalars(tmp_path / "tb" / "h" / "w0")["train/loss"] == [(1, 1.0), (2, 2.0)]
    run([3], keep=True)  # a rejoined worker or a resumed job goes on
    assert [s for s, _ in _scalars(tmp_path / "tb" / "h" / "w0")["train/loss"]] == [1, 2, 3]


def test_an_unwritable_folder_is_one_line_and_frees_the_log_folder(tmp_path):
    (tmp_path / "tb").write_text("a file where the folder goes")
    with pytest.raises(UserError) as caught:
        Recorder(str(tmp_path / "logs"), "h", "w0", tensorboard=str(tmp_path / "tb"))
    assert str(caught.value).startswith(f"--tensorboard: cannot write {tmp_path / 'tb'}/h/w0: ")
    Recorder(str(tmp_path / "logs"), "h", "w0").close()  # its lock was let go


def test_without_the_package_the_flag_is_refused_before_anything_starts(monkeypatch):
    real = scalars.importlib.util.find_spec
    monkeypatch.setattr(scalars.importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(UserError) as caught:
        scalars.check_installed()
    assert str(caught.value) == ("--tensorboard: needs the tensorboard package "
                                 "(pip install -e '.[tensorboard]')")


@pytest.mark.slow
def test_every_process_of_a_job_writes_its_scalars(tmp_path, monkeypatch):
    """ESync with two workers and the evaluator: each worker's rounds as loss, budget and
    traffic, the evaluator's accuracy, one folder per device as in the logs; and
    `tensorboard --inspect`, the viewer's own command, finds them."""
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    code = local.run(["-m", "esync", "--workers", "2", "--slowdown", "1,2", "-n", "lenet",
                      "--out", "runs", "--tensorboard", "tb", "--target-accuracy", "0.8",
                      "--time-limit", "60", "--no-auth"], progress=False, out=out)
    host = socket.gethostname()
    logs_at = tmp_path / "runs" / "lenet" / "esync" / host
    logs = {str(p.relative_to(logs_at)): p.read_text() for p in logs_at.rglob("*.log")}
    assert code == 0, (out.getvalue(), logs)
    assert_no_traceback(logs)
    for device in ("w0", "w1-x2"):
        found = _scalars(tmp_path / "tb" / host / device)
        rounds = len(glob.glob(str(logs_at / device / "iter-*.json")))
        budgets = [json.load(open(logs_at / device / f"iter-{k}.json"))["budget"]
                   for k in range(1, rounds + 1)]
        # a loss for every round that computed (not round 2 of a device that, measured
        # before the other, waited it out with budget 0)
        assert [s for s, _ in found["train/loss"]] == \
            [k for k, b in enumerate(budgets, start=1) if b > 0]
        assert [v for _, v in found["esync/budget"]] == budgets
        assert sum(b > 0 for b in budgets) >= rounds - 1
        assert all(v > 0 for _, v in found["traffic/bytes_sent"])
    accuracy = _scalars(tmp_path / "tb" / host / "evaluator")["eval/accuracy"]
    assert max(v for _, v in accuracy) >= 0.8
    inspect = subprocess.run([sys.executable, "-m", "tensorboard.main", "--inspect",
                              "--logdir", "tb"], capture_output=True, text=True, timeout=120,
                             cwd=tmp_path)
    assert "eval/accuracy" in inspect.stdout and "train/loss" in inspect.stdout, inspect

