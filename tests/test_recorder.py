"""The per-round log files: format, atomic writes, one owner per folder."""
import json
import os
import re

import pytest

from esync.errors import UserError
from esync.logs.recorder import Recorder


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


def _full(path):
    """`path` as a link to /dev/full: a write to it fails with a real ENOSPC."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this machine")
    os.symlink("/dev/full", path)


def test_a_full_disk_is_a_user_error_naming_the_file(tmp_path):
    with Recorder(str(tmp_path), "h", "cpu") as rec:
        rec.write_round(1, {0: {}}, 1, 0.1)
        _full(os.path.join(rec.path, "iter-2.json.partial"))
        final = os.path.join(rec.path, "iter-2.json")
        with pytest.raises(UserError) as error:
            rec.write_round(2, {0: {}}, 1, 0.1)
        assert str(error.value) == (f"-ld/--log-dir: cannot write {final}: "
                                    f"No space left on device")
        # nothing half-written is left, and the earlier round is whole
        assert sorted(os.listdir(rec.path)) == [".lock", "iter-1.json"]
        assert json.load(open(os.path.join(rec.path, "iter-1.json")))["num_iters"] == 1
        rec.write_round(2, {0: {}}, 1, 0.1)  # space again: it goes on


def test_a_log_that_cannot_be_removed_is_a_user_error_naming_it(tmp_path):
    folder = os.path.join(str(tmp_path), "h", "cpu")
    os.makedirs(os.path.join(folder, "iter-7.json"))  # a folder: os.remove refuses it
    with pytest.raises(UserError, match=rf"-ld/--log-dir: cannot remove "
                                        rf"{re.escape(folder)}/iter-7.json: "):
        Recorder(str(tmp_path), "h", "cpu")  # a new run removes the old rounds
    with Recorder(str(tmp_path), "h", "cpu", keep=True) as rec:  # the lock was let go
        with pytest.raises(UserError, match="cannot remove .*iter-7.json"):
            rec.drop_from(5)
