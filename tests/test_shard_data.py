"""Shards on disk, CorgiPile over storage and block leases: the logic in process, the
prepared loader's exact continuation, and real 4-worker jobs (leases against static
shares at --slowdown 2,2,8,8: every device slowed, so that none takes the machine's
load in full; with the paper's rounds, one slow iteration long, so that these short jobs
have rounds enough for their samples to follow the speeds)."""
import collections
import glob
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image
from torchdata.stateful_dataloader import StatefulDataLoader

from esync.data.blocks import BlockSampler
from esync.data.decode import ShardDataset
from esync.data.leases import Lease, LeaseBook, StaticLeases, blocks_of, epoch_leases, runs_of
from esync.data.shards import ShardSet, ShardWriter, write_index
from esync.errors import UserError

# torchdata 0.11 calls the deprecated torch.set_vital (esync.runtime.shardloader filters it too)
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_shards(folder, n_train=300, n_test=60, shard_bytes=64 << 10, sorted_by_class=True):
    """Small 8x8 grayscale PNG shards of 10 classes (class-sorted, as an image folder
    packs), labels = sample number % 10 before sorting."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(0)
    splits = {}
    for split, n in (("train", n_train), ("test", n_test)):
        labels = np.arange(n) % 10
        if sorted_by_class:
            labels = np.sort(labels)
        writer = ShardWriter(str(folder), split, shard_bytes)
        for label in labels:
            pixels = (rng.random((8, 8)) * 64 + label * 19).astype(np.uint8)
            out = io.BytesIO()
            Image.fromarray(pixels).save(out, "PNG")
            writer.write({"png": out.getvalue()}, int(label))
        splits[split] = writer.close()
    write_index(str(folder), splits, "png", "cls", [str(i) for i in range(10)])
    return str(folder)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("shards"))


@pytest.fixture(scope="module")
def job_shards(tmp_path_factory):
    """Enough samples for a job of 5-15 rounds, where ESync's budgets follow speeds."""
    return write_shards(tmp_path_factory.mktemp("job_shards"), n_train=1000)


# --- leases, in process -----------------------------------------------------------------
def test_epoch_leases_cover_every_sample_once_with_a_finer_tail():
    blocks = blocks_of([0, 100, 250], 16)
    leases = epoch_leases(blocks, 3, [7], epoch=2, tail=4)
    ids = np.concatenate([lease.order() for lease in leases])
    assert sorted(ids.tolist()) == list(range(250))
    assert [len(lease.ranges) for lease in leases[-6:]] == [1] * 6  # one block each
    assert max(lease.size for lease in leases[-2:]) <= 8              # the last halved
    assert all(first + count <= 100 or first >= 100 for lease in leases
               for first, count in lease.ranges)                      # no range crosses a shard


def test_shuffle_once_keeps_the_first_epochs_order_and_none_the_stored_one():
    blocks = blocks_of([0, 100], 10)
    ids = lambda epoch, kind: np.concatenate(
        [lease.order() for lease in epoch_leases(blocks, 2, [4], epoch, shuffle=kind)])
    assert ids(0, "none").tolist() == list(range(100)) == ids(5, "none").tolist()
    assert ids(0, "once").tolist() == ids(3, "once").tolist() != list(range(100))
    assert ids(0, "corgipile").tolist() != ids(1, "corgipile").tolist()


def test_lease_book_deals_every_block_once_an_epoch_to_uneven_askers():
    book = LeaseBook(blocks_of([0, 500], 10), per_lease=2, seed=[1], num_workers=3)
    seen = collections.defaultdict(list)
    rng = np.random.default_rng(0)
    while book.epoch < 3:
        rank = int(rng.choice(3, p=[0.7, 0.2, 0.1]))  # device 0 asks seven times as often
        lease = book.grant(rank)
        seen[lease.epoch] += lease.order()[lease.skip:].tolist()
        book.report(rank, [lease.id], None)
    for epoch in range(3):
        assert sorted(seen[epoch]) == list(range(500))
    assert book.granted[0] > 3 * book.granted[2]


def test_a_dead_devices_leases_wait_for_it_then_go_to_others_from_its_last_round():
    book = LeaseBook(blocks_of([0, 40], 10), per_lease=1, seed=[0], num_workers=2)
    mine = book.grant(1)
    book.report(1, [], (mine.id, 4))  # its last finished round left 4 samples done
    book.lost(1)
    others = []
    while book.queue:  # the epoch's other leases
        others.append(book.grant(0))
    assert mine.id not in {lease.id for lease in others}
    rest = book.grant(0)  # nothing else in epoch 0: the dead device's lease, from sample 4
    assert (rest.id, rest.skip, rest.epoch) == (mine.id, 4, 0)
    trained = mine.order()[:4].tolist() + rest.order()[4:].tolist() + \
        [i for lease in others for i in lease.order().tolist()]
    assert sorted(trained) == list(range(40))
    assert book.grant(0).epoch == 1


def test_a_restarted_device_gets_its_reserved_lease_back_at_its_saved_position():
    book = LeaseBook(blocks_of([0, 40], 10), per_lease=1, seed=[0], num_workers=2)
    mine, later = book.grant(1), book.grant(1)  # one in progress, one prefetched
    book.lost(1)
    saved = Lease(**{**mine.__dict__, "skip": 6})
    back = book.resume(1, saved, 6)
    assert (back.id, back.skip) == (mine.id, 6)
    # the prefetched one, never started, goes back to the queue for anyone
    assert book.grant(0).id == later.id
    assert book.resume(0, later, 0) is None  # nothing reserved for device 0


def test_a_resumed_job_gets_the_book_as_it_was_at_its_checkpoint_round():
    """Rounds 1-3 trained some samples; round 4 more, but the job is resumed from the
    checkpoint of round 3: what round 4 trained is trained again, nothing else."""
    blocks = blocks_of([0, 200], 10)
    book = LeaseBook(blocks, per_lease=2, seed=[5], num_workers=2)
    trained_by_3 = []
    for round_ in (1, 2, 3, 4):
        for rank in (0, 1):
            lease = book.grant(rank)
            half = lease.size // 2
            book.report(rank, [], (lease.id, half), round_)
            if round_ <= 3:
                trained_by_3 += lease.order()[:half].tolist()
            book.report(rank, [lease.id], None, round_ + 1 if round_ == 3 else round_)
            if round_ < 3:
                trained_by_3 += lease.order()[half:].tolist()
    state = json.loads(json.dumps(book.state()))
    again = LeaseBook.restored(blocks, 2, [5], 2, state, round_=3)
    # the two leases half done at round 3 wait for their devices, at their place
    assert sorted(len(h) for h in again.reserved.values()) == [1, 1]
    rest = []
    for rank, (held,) in sorted(again.reserved.items()):
        back = again.resume(rank, held.lease, held.trained)
        assert back.skip == held.trained
        rest += back.order()[back.skip:].tolist()
    while again.epoch == 0:
        lease = again.grant(0)
        if lease.epoch == 0:
            rest += lease.order()[lease.skip:].tolist()
    assert sorted(trained_by_3 + rest) == list(range(200))


def test_a_lease_from_the_wire_is_checked_field_by_field():
    good = epoch_leases(blocks_of([0, 64], 16), 2, [3], 0)[0].to_dict()
    assert Lease.from_dict(good).to_dict() == good
    for bad in ({**good, "ranges": [[0, 0]]}, {**good, "ranges": "0-16"},
                {**good, "seed": [1] * 9}, {**good, "seed": [-1]}, {**good, "skip": 10 ** 6}, {**good, "id": 5},
                {**good, "epoch": -1}, {**good, "id": "x"}, [1, 2]):
        with pytest.raises(ValueError):
            Lease.from_dict(bad)


def test_runs_of_ids_never_cross_a_shard():
    ids = np.array([3, 4, 5, 6, 9, 10, 11, 12, 13])
    assert runs_of(ids, [0, 5, 20], 3).tolist() == [[3, 2], [5, 2], [9, 3], [12, 2]]


# --- shards, in process -----------------------------------------------------------------
def test_blocks_are_read_back_as_their_samples(shards):
    data = ShardSet(shards)
    assert len(data.files) > 1
    for first, count in data.blocks(32):
        samples = data.read(int(first), int(count))
        assert [int(key) for key, _ in samples] == list(range(first, first + count))
        assert [int(parts["cls"]) for _, parts in samples] == \
            data.labels[first:first + count].tolist()
    image, label = ShardDataset(shards)[299]
    assert image.shape == (1, 8, 8) and label == 9


@pytest.mark.parametrize("workers", [0, 2])
def test_the_sampler_continues_at_its_exact_next_sample(shards, workers):
    """A StatefulDataLoader's state, taken with batches prefetched, restores the
    BlockSampler at the sample after the last one handed out."""
    def loader():
        data = ShardDataset(shards)
        blocks = data.shards.blocks(16)
        sampler = BlockSampler(data.shards, StaticLeases(blocks, 2, [0, 0]), lambda: 8)
        return StatefulDataLoader(data, batch_sampler=sampler, num_workers=workers,
                                  snapshot_every_n_steps=1), sampler

    whole, sampler = loader()
    expected, epochs = [], []
    for batch in whole:
        emitted = sampler.emitted.popleft()
        expected += emitted.ids
        epochs += emitted.epochs
    # one pass: every sample once, and its last batch filled from the next epoch
    assert sorted(i for i, e in zip(expected, epochs) if e == 0) == list(range(300))
    assert len(expected) == 304 and epochs[-4:] == [1] * 4

    first, sampler = loader()
    got, it = [], iter(first)
    for _ in range(13):  # past the first lease of 32 samples
        next(it)
        got += sampler.emitted.popleft().ids
    state = json.loads(json.dumps(first.state_dict()))  # as a round's record keeps it
    del it
    second, sampler = loader()
    second.load_state_dict(state)
    for batch in second:
        got += sampler.emitted.popleft().ids
    assert got == expected


def test_bad_shards_are_one_line_errors_naming_the_file(tmp_path):
    folder = write_shards(tmp_path / "s", n_train=40, n_test=10, shard_bytes=8 << 10)
    index = json.load(open(os.path.join(folder, "index.json")))
    index["splits"]["train"][0]["labels"][3] = 12
    json.dump(index, open(os.path.join(folder, "index.json"), "w"))
    with pytest.raises(UserError, match=r"index.json: shard train-000000.tar's sample 3 has label 12"):
        ShardSet(folder)
    os.remove(os.path.join(folder, "index.json"))
    with pytest.raises(UserError, match=r"index.json: no index .* esync-pack --index"):
        ShardSet(folder)


def test_a_shard_corrupted_mid_run_is_skipped_with_a_warning_and_counted(tmp_path, caplog):
    folder = write_shards(tmp_path / "s", n_train=100, n_test=10, shard_bytes=16 << 10)
    data = ShardSet(folder)
    broken = data.files[1]
    with open(broken.path, "r+b") as f:  # same size, garbage where the headers were
        f.write(b"\xff" * int(broken.offsets[-1]))
    sampler = BlockSampler(data, StaticLeases(data.blocks(10), 2, [0, 0]), lambda: 10)
    for _ in sampler:
        pass
    ids = [i for e in sampler.emitted for i, epoch in zip(e.ids, e.epochs) if epoch == 0]
    lost = int(data.starts[2] - data.starts[1])
    assert sampler.skipped >= lost and sorted(ids) == sorted(
        set(range(100)) - set(range(int(data.starts[1]), int(data.starts[2]))))
    assert f"{broken.path} is corrupt" in caplog.text


@pytest.mark.parametrize("damage", ["no index", "truncated", "no such folder"])
def test_the_command_line_refuses_bad_shards_in_one_line_before_training(tmp_path, damage):
    folder = write_shards(tmp_path / "s", n_train=40, n_test=10, shard_bytes=8 << 10)
    if damage == "no index":
        os.remove(os.path.join(folder, "index.json"))
        expected = "index.json: no index of the shards"
    elif damage == "truncated":
        with open(os.path.join(folder, "train-000001.tar"), "r+b") as f:
            f.truncate(1000)
        expected = "train-000001.tar is 1000 bytes, the index says"
    else:
        folder, expected = str(tmp_path / "nothing"), "no index of the shards"
    done = subprocess.run([sys.executable, "main.py", "-m", "local", "--dataset",
                           f"shards:{folder}", "--max-rounds", "1", "--log-dir",
                           str(tmp_path / "logs")], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    assert expected in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


# --- real jobs --------------------------------------------------------------------------
def run_job(shards, out, split, epochs=3):
    command = [sys.executable, os.path.join(ROOT, "src", "esync", "launch", "local.py"), "-m", "esync",
               "--workers", "4", "--slowdown", "2,2,8,8", "--coordination-share", "0", "--out", str(out), "--no-progress",
               "--no-evaluator", "--dataset", f"shards:{shards}", "-n", "lenet",
               "--block-size", "16", "--epochs", str(epochs), "--log-samples", "1",
               "--num-threads", "1", "--data-split", split]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    folder = glob.glob(os.path.join(str(out), "lenet", "esync", "*"))[0]
    per_device = {}
    for device in sorted(glob.glob(os.path.join(folder, "w*"))):
        records = [json.load(open(p)) for p in glob.glob(os.path.join(device, "iter-*.json"))]
        ids = collections.defaultdict(list)
        busy = 0.0
        for record in records:
            for epoch, samples in record["sample_ids"].items():
                ids[int(epoch)] += samples
            busy += sum(t for phases in record["time"].values() for name, t in phases.items()
                        if name != "global aggregate")
        per_device[os.path.basename(device)] = (ids, busy)
    return per_device


@pytest.fixture(scope="module")
def leased_and_static(job_shards, tmp_path_factory):
    out = tmp_path_factory.mktemp("jobs")
    # six epochs for the static shares: in three, a slow device had not finished one pass
    # of its share in some runs, so its visits read 1.0 whatever its speed
    return (run_job(job_shards, out / "leased", "leased"),
            run_job(job_shards, out / "static", "static", epochs=6))


@pytest.mark.slow
def test_leases_train_every_sample_once_an_epoch_and_follow_the_devices_speeds(
        leased_and_static):
    leased, _ = leased_and_static
    visits = collections.defaultdict(collections.Counter)
    for ids, _ in leased.values():
        for epoch, samples in ids.items():
            visits[epoch].update(samples)
    assert all(count == 1 for counter in visits.values() for count in counter.values())
    complete = [e for e in sorted(visits) if e + 1 in visits and e + 2 in visits]
    assert complete, sorted(visits)
    for epoch in complete:  # epochs the job went well past: every sample, once
        assert sorted(visits[epoch]) == list(range(1000))
    samples = {d: sum(len(s) for s in ids.values()) for d, (ids, _) in leased.items()}
    speed = {d: samples[d] / busy for d, (_, busy) in leased.items()}
    for device in leased:
        share = samples[device] / sum(samples.values())
        expected = speed[device] / sum(speed.values())
        assert abs(share - expected) <= 0.2 * expected, (device, share, expected)
    assert min(samples["w0-x2"], samples["w1-x2"]) > max(samples["w2-x8"], samples["w3-x8"])


@pytest.mark.slow
def test_static_shares_leave_the_slow_devices_data_visited_less_by_their_speed(
        leased_and_static):
    """The contrast: each device trains its own equal share, so a sample's visits
    follow its device's speed (bench/shards.py shows it at a realistic cost per step)."""
    _, static = leased_and_static
    visits, speed = {}, {}
    for device, (ids, busy) in static.items():
        trained = sum(len(s) for s in ids.values())
        visits[device] = trained / len({i for s in ids.values() for i in s})
        speed[device] = trained / busy
    for fast in ("w0-x2", "w1-x2"):
        for slow in ("w2-x8", "w3-x8"):
            assert visits[fast] > 1.5 * visits[slow], visits
            ratio = (visits[fast] / visits[slow]) / (speed[fast] / speed[slow])
            assert 0.75 < ratio < 1.33, (visits, speed)


@pytest.mark.slow
def test_a_users_script_trains_shards_decoded_in_dataloader_workers(shards, tmp_path):
    """esync-run, the API and esync.ShardDataset: two workers lease the blocks; each
    round's record says what it read, and no sample is trained twice in an epoch."""
    command = [sys.executable, os.path.join(ROOT, "src", "esync", "launch", "run.py"), "-m", "esync",
               "--workers", "2", "--out", str(tmp_path), "--no-progress", "--max-rounds", "12",
               "--log-samples", "1", "--num-threads", "1",
               os.path.join(ROOT, "tests", "shard_script.py"), shards]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    records = [json.load(open(p)) for p in
               glob.glob(os.path.join(str(tmp_path), "shard_script", "esync", "*", "w*", "iter-*.json"))]
    assert len(records) >= 24
    visits = collections.Counter((epoch, i) for r in records
                                 for epoch, ids in r["sample_ids"].items() for i in ids)
    assert visits and max(visits.values()) == 1
    assert {r["data"]["split"] for r in records} == {"leased"}
    assert sum(r["read_bytes"] for r in records) > 0
