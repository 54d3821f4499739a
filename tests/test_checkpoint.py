"""Checkpoints of a shard (esync.comm.checkpoint) on real files, and a shard server's state
through a checkpoint: written atomically, kept K deep, loaded without unpickling, a
damaged or half-written one skipped for the previous whole one, or a one-line error
naming the file."""
import json
import os

import numpy as np
import pytest

from esync.comm.checkpoint import Checkpoints, survey
from esync.errors import UserError
from esync.algorithms.rules import WEIGHTS, RuleConfig
from esync.comm.server import ShardServer


def _tensors(value):
    return {"weights": np.full(5, value, np.float32), "buffers": np.arange(3, dtype=np.float32)}


def test_round_trip_keeps_the_newest_k(tmp_path):
    store = Checkpoints(str(tmp_path), 1, keep=2)
    for round_ in (10, 20, 30):
        store.save(round_, _tensors(round_), {"updates": round_})
    assert store.rounds() == [20, 30]
    tensors, meta = store.load_newest()
    assert meta["round"] == 30 and meta["updates"] == 30
    np.testing.assert_array_equal(tensors["weights"], np.full(5, 30, np.float32))
    assert survey(str(tmp_path)) == {"1": [20, 30]}
    # nothing in it is a pickle: the metadata is JSON, the tensors safetensors
    folder = os.path.join(store.path, "round-30")
    assert sorted(os.listdir(folder)) == ["meta.json", "tensors.safetensors"]
    json.load(open(os.path.join(folder, "meta.json")))


def test_a_half_written_checkpoint_is_never_seen(tmp_path):
    store = Checkpoints(str(tmp_path), 0)
    store.save(10, _tensors(1.0), {})
    # a writer killed before its rename leaves only a hidden partial folder
    os.makedirs(os.path.join(store.path, ".partial-20-abcd"))
    open(os.path.join(store.path, ".partial-20-abcd", "tensors.safetensors"), "wb").write(b"xx")
    assert store.rounds() == [10]
    assert store.load_newest()[1]["round"] == 10


@pytest.mark.parametrize("damage", ["truncated", "flipped", "meta"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path, damage, caplog):
    store = Checkpoints(str(tmp_path), 0)
    store.save(10, _tensors(1.0), {})
    store.save(20, _tensors(2.0), {})
    newest = os.path.join(store.path, "round-20")
    path = os.path.join(newest, "meta.json" if damage == "meta" else "tensors.safetensors")
    data = open(path, "rb").read()
    if damage == "truncated":
        data = data[:len(data) // 2]
    elif damage == "flipped":
        data = data[:-3] + bytes([data[-3] ^ 0xFF]) + data[-2:]
    else:
        data = b"{not json"
    open(path, "wb").write(data)
    tensors, meta = store.load_newest()
    assert meta["round"] == 10
    np.testing.assert_array_equal(tensors["weights"], np.full(5, 1.0, np.float32))
    assert path in caplog.text  # the warning names the damaged file


def test_no_whole_checkpoint_is_one_line_naming_the_file(tmp_path):
    store = Checkpoints(str(tmp_path), 0)
    store.save(10, _tensors(1.0), {})
    path = os.path.join(store.path, "round-10", "tensors.safetensors")
    open(path, "ab").write(b"trailing garbage")
    with pytest.raises(UserError) as error:
        store.load_newest()
    assert path in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(UserError, match="no checkpoint of shard 3"):
        Checkpoints(str(tmp_path), 3).load_newest()


def _server(tmp_path, name, momentum=0.0):
    config = RuleConfig(name, 2, lr=0.1, momentum=momentum, lamda=0.5)
    server = ShardServer(0, 2, sock=None, who=lambda identity: None,
                         checkpoints=Checkpoints(str(tmp_path), 0))
    weights = np.linspace(-1, 1, 7).astype(np.float32)
    server.sections = (weights, np.ones(2, np.float32))
    from esync.algorithms.rules import make_rule

    server.rule = make_rule(*server.sections, config)
    return server


@pytest.mark.parametrize("name,momentum", [("sync", 0.9), ("dcasgd", 0.0), ("esync", 0.0)])
def test_a_shard_is_restored_as_it_was(tmp_path, name, momentum):
    """Weights, buffers, momentum, DC-ASGD's backups and the round survive a restore."""
    before = _server(tmp_path, name, momentum)
    grad = np.full(7, 0.5, np.float32)
    for worker in (0, 1):
        before.rule.add(worker, (WEIGHTS, 0), grad)
    if name == "dcasgd":
        before.rule.sent(0, (WEIGHTS, 0), 7)
    before.rule.updates = 1  # (the rule counts the model's rounds)
    before.save_checkpoint()

    after = ShardServer(0, 2, sock=None, who=lambda identity: None,
                        checkpoints=Checkpoints(str(tmp_path), 0))
    after.restore(None, [0, 1], resumed=True)
    np.testing.assert_array_equal(after.sections[0], before.sections[0])
    np.testing.assert_array_equal(after.sections[1], before.sections[1])
    assert after.updates == 1 and after.rule.config == before.rule.config
    if momentum:
        np.testing.assert_array_equal(after.rule.sgd.velocity, before.rule.sgd.velocity)
    if name == "dcasgd":
        np.testing.assert_array_equal(after.rule.backup[0], before.rule.backup[0])
    else:  # the next push is taken as the workers' round, whatever the checkpoint says
        assert after.rule.round == before.rule.round and after.rule.resync
    # both go on identically
    for server in (before, after):
        for worker in (0, 1):
            server.rule.add(worker, (WEIGHTS, 0), grad)
    np.testing.assert_allclose(after.sections[0], before.sections[0], rtol=1e-6)
