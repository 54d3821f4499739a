"""The per-round log files: format, atomic writes, one owner per folder."""
import json
import os

import pytest

from esync.errors import UserError
from esync.recorder import Recorder


def test_round_file_format(tmp_path):
    with Recorder(str(tmp_path), "hostA", "cpu") as rec:
        path = rec.write_round(3, {0: {"get_batch": 0.1, "forward and backward": 0.2},
                                   1: {"local update": 0.05, "global aggregate": 0.5}},
                               num_samples=128, loss=0.75, bytes_sent=10, bytes_received=20,
                               accuracy=0.9, epoch=1.5)
    assert path == os.path.join(str(tmp_path), "hostA", "cpu", "iter-3.json")
    record = json.load(open(path))
    assert record["num_iters"] == 3
    assert record["time"] == {"0": {"get_batch": 0.1, "forward and backward": 0.2},
                              "1": {"local update": 0.05, "global aggregate": 0.5}}
    assert record["num_samples"] == 128 and record["loss"] == 0.75
    assert record["bytes_sent"] == 10 and record["bytes_received"] == 20
    assert record["accuracy"] == 0.9 and record["epoch"] == 1.5
    assert record["total_time"] >= 0
    assert sorted(os.listdir(os.path.dirname(path))) == [".lock", "iter-3.json"]


def test_accuracy_only_when_evaluated(tmp_path):
    with Recorder(str(tmp_path), "h", "cpu") as rec:
        record = json.load(open(rec.write_round(1, {0: {}}, 1, 0.1)))
    assert "accuracy" not in record and record["bytes_sent"] == 0


def test_second_owner_is_refused_while_first_runs(tmp_path):
    first = Recorder(str(tmp_path), "h", "gpu0")
    first.write_round(1, {0: {}}, 1, 0.1)
    with pytest.raises(UserError, match=rf"log folder .*gpu0 is in use by another running "
                                        rf"process \(pid {os.getpid()}\).*--device-name"):
        Recorder(str(tmp_path), "h", "gpu0")
    assert os.path.exists(os.path.join(first.path, "iter-1.json"))  # nothing lost
    Recorder(str(tmp_path), "h", "gpu1").close()  # another label is fine
    first.close()
    # once the owner is gone, a new run takes the folder over and replaces old rounds
    with Recorder(str(tmp_path), "h", "gpu0") as again:
        assert not os.path.exists(os.path.join(again.path, "iter-1.json"))
