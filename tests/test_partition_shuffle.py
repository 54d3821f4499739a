"""Partitions (disjoint, covering, class split) and the per-epoch orders (CorgiPile)."""
import numpy as np
import pytest
import torch

from esync.data.batches import BatchStream
from esync.data.datasets import load_dataset
from esync.data.partition import partition
from esync.data.shuffle import EpochOrder

LABELS = np.repeat(np.arange(10), 101)  # 1010 samples, 101 per class, stored by class
np.random.default_rng(5).shuffle(LABELS)


@pytest.mark.parametrize("by_class", [False, True])
@pytest.mark.parametrize("parts", [1, 3, 4, 7])
def test_partitions_disjoint_and_covering(parts, by_class):
    got = [partition(LABELS, parts, r, by_class, seed=3) for r in range(parts)]
    size = len(LABELS) // parts
    assert all(len(p) == size for p in got)
    everything = np.concatenate(got)
    assert len(np.unique(everything)) == size * parts  # no index twice
    assert len(LABELS) - len(everything) == len(LABELS) % parts  # only the remainder is left


def test_iid_partition_agrees_across_calls_and_is_sorted():
    a = partition(LABELS, 4, 2, False, seed=11)
    assert np.array_equal(a, partition(LABELS, 4, 2, False, seed=11))
    assert np.all(np.diff(a) > 0)
    assert not np.array_equal(a, partition(LABELS, 4, 2, False, seed=12))
    assert len(np.unique(LABELS[a])) == 10  # IID: every class present


def test_split_by_class_gives_few_classes_each():
    for rank in range(5):
        part = partition(LABELS, 5, rank, True, seed=0)
        classes = np.unique(LABELS[part])
        assert len(classes) <= 3  # 10 classes over 5 workers: 2, or 3 where a cut falls inside one
        assert np.all(np.diff(LABELS[part]) >= 0)  # contiguous in class order


def test_partition_rejects_bad_rank():
    with pytest.raises(ValueError):
        partition(LABELS, 4, 4, False, 0)


def _is_permutation(order, indices):
    return len(order) == len(indices) and np.array_equal(np.sort(order), np.sort(indices))


@pytest.mark.parametrize("kind", ["random", "corgipile", "once", "none"])
@pytest.mark.parametrize("n", [1, 31, 100, 257])
def test_every_epoch_is_a_permutation(kind, n):
    indices = np.arange(1000, 1000 + 3 * n, 3)
    order = EpochOrder(indices, kind, seed=[1, 2], block_size=8, buffer_ratio=0.1)
    for epoch in range(4):
        assert _is_permutation(order.order(epoch), indices)


def test_none_keeps_stored_order_and_once_keeps_its_shuffle():
    idx = np.arange(200)
    assert np.array_equal(EpochOrder(idx, "none", 0).order(3), idx)
    once = EpochOrder(idx, "once", 0)
    assert not np.array_equal(once.order(0), idx)
    assert np.array_equal(once.order(0), once.order(5))


def test_random_is_a_new_full_permutation_each_epoch_and_by_seed():
    """As a DataLoader with shuffle=True: no blocks; where CorgiPile's first block of 50
    keeps consecutive samples together, the permutation scatters them."""
    idx = np.arange(500)
    a = EpochOrder(idx, "random", seed=[0, 0], block_size=50)
    assert not np.array_equal(a.order(0), a.order(1))
    assert not np.array_equal(a.order(0), EpochOrder(idx, "random", [0, 1]).order(0))
    assert np.array_equal(a.order(2), EpochOrder(idx, "random", [0, 0]).order(2))
    first = a.order(0)[:50]
    assert np.ptp(first) > 300  # spread over the whole set, not one block's range
    corgi = EpochOrder(idx, "corgipile", seed=[0, 0], block_size=50, buffer_ratio=0.1)
    assert np.ptp(corgi.order(0)[:50]) < 50  # one whole block fills the buffer


def test_corgipile_shuffles_anew_each_epoch_and_by_seed():
    idx = np.arange(500)
    a = EpochOrder(idx, "corgipile", seed=[0, 0], block_size=10, buffer_ratio=0.1)
    b = EpochOrder(idx, "corgipile", seed=[0, 1], block_size=10, buffer_ratio=0.1)
    assert not np.array_equal(a.order(0), a.order(1))
    assert not np.array_equal(a.order(0), b.order(0))
    assert np.array_equal(a.order(2), EpochOrder(idx, "corgipile", [0, 0], 10, 0.1).order(2))


def test_corgipile_keeps_block_locality():
    """Each buffer's worth of output is exactly a set of whole blocks, mixed inside."""
    idx = np.arange(1000, 2000)  # 1000 samples, blocks of 20, buffer 10% = 5 blocks
    order = EpochOrder(idx, "corgipile", seed=7, block_size=20, buffer_ratio=0.1)
    assert order.blocks_per_buffer == 5
    out = order.order(0)
    blocks_seen = []
    for start in range(0, len(out), 100):
        chunk = out[start:start + 100]
        blocks = np.unique((chunk - 1000) // 20)
        assert len(blocks) == 5
        assert sorted(chunk) == sorted(np.concatenate([idx[b * 20:(b + 1) * 20] for b in blocks]))
        assert not np.all(np.diff(chunk) == 1)  # shuffled inside the buffer
        blocks_seen.extend(blocks)
    assert sorted(blocks_seen) == list(range(50))
    assert blocks_seen != sorted(blocks_seen)  # block order shuffled too


def test_batch_stream_visits_each_sample_once_per_epoch():
    data = load_dataset("digits", "")
    part = partition(data.train_labels.numpy(), 3, 1, False, seed=0)
    order = EpochOrder(part, "corgipile", seed=0, block_size=16, buffer_ratio=0.2)
    stream = BatchStream(data, order, batch_size=50, device=torch.device("cpu"))
    seen = []
    while stream.samples_drawn < 2 * len(part):
        images, labels = stream.next()
        assert images.shape == (50, 1, 28, 28) and images.dtype == torch.float32
        seen.append(labels)
    assert stream.epochs_done == pytest.approx(stream.samples_drawn / len(part))
    # the labels drawn in the first epoch are exactly the partition's labels
    first = torch.cat(seen)[:len(part)]
    assert sorted(first.tolist()) == sorted(data.train_labels[part].tolist())


def test_a_whole_order_draws_every_sample_in_each_rank_s_own_order():
    """--data-split whole: each rank's epochs are permutations of every sample, in an
    order of its own (the same for the same seed and rank); its share is a partition's
    size, which its epochs are counted in."""
    from esync.data.order import DataSettings, WorkerOrder

    settings = DataSettings(shuffle="random", seed=3)
    orders = [WorkerOrder(LABELS, rank, 4, settings, whole=True) for rank in range(4)]
    static = WorkerOrder(LABELS, 1, 4, settings)
    assert sorted(orders[1].indices) == list(range(len(LABELS)))
    assert orders[1].share == len(LABELS) // 4 == len(static) == static.share
    firsts = [o.order.order(0).tolist() for o in orders]
    assert all(sorted(f) == list(range(len(LABELS))) for f in firsts)
    assert len({tuple(f) for f in firsts}) == 4  # each rank its own order
    assert firsts[2] == WorkerOrder(LABELS, 2, 4, settings, whole=True).order.order(0).tolist()
    assert orders[0].order.order(1).tolist() != firsts[0]  # a new permutation each epoch
    orders[0].samples_drawn = len(LABELS) // 4 * 3
    assert orders[0].epochs_done == pytest.approx(3.0)


def test_the_built_in_stream_over_a_whole_order_counts_epochs_of_its_share():
    """The built-in loop's stream (esync.runtime.train) under --data-split whole: its
    batches come from every sample, and its epochs are of one partition's size."""
    from esync.data.order import DataSettings, WorkerOrder

    data = load_dataset("digits", "")
    order = WorkerOrder(data.train_labels.numpy(), 1, 3, DataSettings(), whole=True)
    stream = BatchStream(data, order.order, batch_size=50, device=torch.device("cpu"),
                         share=order.share)
    drawn = 0
    while drawn < order.share:
        drawn += len(stream.next()[1])
    assert stream.epochs_done == pytest.approx(drawn / (len(data.train_labels) // 3))
    seen = set(order.order.order(0)[:drawn].tolist())
    part = set(partition(data.train_labels.numpy(), 3, 1, False, seed=0).tolist())
    assert seen - part  # not confined to rank 1's partition
