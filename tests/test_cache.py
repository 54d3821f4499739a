"""The sample cache (esync.data.cache, --cache-fraction) and the emulated disk
(--disk-bandwidth) of the BlockSampler, in process: real shards, real leases."""
import json

import numpy as np
import pytest

from esync.data.blocks import BlockSampler
from esync.data.cache import SampleCache
from esync.data.leases import LeaseBook, StaticLeases
from esync.data.shards import ShardSet, ShardWriter, write_index

BLOCK = 8


def write_shards(folder, n=600, shard_bytes=40 << 10):
    """`n` samples of 100..600 random bytes (`.bin`, never decoded here) and a label."""
    rng = np.random.default_rng(1)
    splits = {}
    for split, count in (("train", n), ("test", 20)):
        writer = ShardWriter(str(folder), split, shard_bytes)
        for i in range(count):
            writer.write({"bin": rng.bytes(int(rng.integers(100, 600)))}, i % 10)
        splits[split] = writer.close()
    write_index(str(folder), splits, "bin", "cls", [str(i) for i in range(10)])
    return str(folder)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    data = ShardSet(write_shards(tmp_path_factory.mktemp("cache_shards")))
    assert len(data.files) > 3  # blocks cut short at the shards' ends too
    return data


class BookLeases:
    """One device's leases from a job's LeaseBook of two: the epoch's tail blocks one at
    a time, the last ones halved."""

    def __init__(self, shards):
        self.book = LeaseBook(shards.blocks(BLOCK), per_lease=3, seed=[5], num_workers=2)

    def next(self):
        return self.book.grant(0)

    def resume(self, lease):
        return self.book.resume(0, lease, lease.skip)

    def report(self, done, at):
        self.book.report(0, done, at)


def source(kind, shards):
    return BookLeases(shards) if kind == "book" else \
        StaticLeases(shards.blocks(BLOCK), 3, [0, 0])


def passes(sampler, count):
    """The (id, parts) of `count` passes over the sampler, and read_bytes, cache hits
    after each pass."""
    items, after = [], []
    for _ in range(count):
        for batch in sampler:
            items += batch
        after.append((sampler.read_bytes, sampler.cache_hits))
    return items, after


def test_eligibility_is_per_block_seeded_and_near_the_fraction(shards):
    def eligible(fraction, seed):
        return SampleCache(shards, fraction, 2, seed, 1 << 30).eligible

    assert len(eligible(0.3, [0, 1])) == len(shards.blocks(2)) >= 300
    assert np.array_equal(eligible(0.3, [0, 1]), eligible(0.3, [0, 1]))
    assert not np.array_equal(eligible(0.3, [0, 1]), eligible(0.3, [0, 2]))  # rank 2's
    assert abs(eligible(0.3, [0, 1]).mean() - 0.3) < 0.06
    assert not eligible(0.0, [0]).any() and eligible(1.0, [0]).all()
    cache = SampleCache(shards, 0.5, BLOCK, [0, 1], 1 << 30)
    for first, count in shards.blocks(BLOCK).tolist():  # a block's parts: all or nothing
        halves = [(first, count // 2), (first + count // 2, count - count // 2)]
        assert {cache.is_eligible(f, n) for f, n in halves if n} == \
            {bool(cache.eligible[cache._block(first)])}


def test_a_range_across_blocks_is_cut_at_their_boundaries(shards):
    cache = SampleCache(shards, 1.0, BLOCK, [0], 1 << 30)
    assert cache.pieces(3, 15) == [(3, 5), (8, 8), (16, 2)]
    cache.offer(8, 4, shards.read(8, 4))  # half a block
    assert cache.get_range(8, 8) is None
    assert [k for k, _ in cache.get_range(8, 4)] == [k for k, _ in shards.read(8, 4)]
    cache.offer(12, 4, shards.read(12, 4))
    assert cache.get_range(8, 8) == shards.read(8, 8)
    assert (cache.hits, cache.hit_bytes) == (12, shards.read_bytes(8, 12))


def test_capacity_is_never_exceeded_and_nothing_is_evicted(shards):
    blocks = shards.blocks(BLOCK).tolist()
    capacity = shards.read_bytes_total // 5
    cache = SampleCache(shards, 1.0, BLOCK, [0], capacity)
    held, refused = [], []
    for first, count in blocks:
        room = capacity - cache.held_bytes
        if cache.offer(first, count, shards.read(first, count)):
            held.append((first, count))
        else:  # only what does not fit is refused
            assert shards.read_bytes(first, count) > room
            refused.append((first, count))
        assert cache.held_bytes <= capacity
    assert held and refused and held[0] == (0, BLOCK)  # first come, first kept
    assert all(cache.get_range(first, count) is not None for first, count in held)
    assert cache.held_bytes == sum(shards.read_bytes(f, n) for f, n in held)
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="cache fraction"):
            SampleCache(shards, bad, BLOCK, [0], capacity)


@pytest.mark.parametrize("kind", ["static", "book"])
def test_the_cache_changes_no_sample_and_serves_its_blocks_from_the_second_epoch(
        shards, kind):
    plain, plain_after = passes(BlockSampler(shards, source(kind, shards), lambda: 10), 2)
    assert plain_after == [(shards.read_bytes_total, 0), (2 * shards.read_bytes_total, 0)]
    cache = SampleCache(shards, 0.5, BLOCK, [0, 0], shards.read_bytes_total)
    sampler = BlockSampler(shards, source(kind, shards), lambda: 10, cache=cache)
    cached, after = passes(sampler, 2)
    assert [i for i, _ in cached] == [i for i, _ in plain] and cached == plain
    assert len(plain) == 2 * len(shards)  # 600 samples a pass, in batches of 10: no spill
    eligible = [i for i in range(len(shards)) if cache.is_eligible(i, 1)]
    assert 0.3 < len(eligible) / len(shards) < 0.7
    assert after[0] == (shards.read_bytes_total, 0)  # the first epoch reads everything
    assert sampler.cache_hits == len(eligible) == len(cache)
    assert sampler.cache_hit_bytes == sum(shards.read_bytes(i, 1) for i in eligible)
    assert after[1][0] - after[0][0] == shards.read_bytes_total - sampler.cache_hit_bytes


def test_a_sampler_restored_with_an_empty_cache_continues_at_its_exact_next_sample(shards):
    def sampler():
        cache = SampleCache(shards, 0.7, BLOCK, [0, 0], shards.read_bytes_total)
        return BlockSampler(shards, source("static", shards), lambda: 10, cache=cache)

    expected, _ = passes(sampler(), 2)
    first = sampler()
    for _ in first:
        pass
    got, it = [], iter(first)
    for _ in range(23):  # into the second epoch, its cache warm
        got += next(it)
    assert first.cache_hits > 0
    state = json.loads(json.dumps(first.state_dict()))
    second = sampler()
    second.load_state_dict(state)
    for batch in second:
        got += batch
    assert got == expected[len(shards):]


def test_the_emulated_disk_reads_no_faster_than_its_bandwidth(shards):
    bandwidth = 4.0  # MB/s: 0.1 s an epoch of these shards
    cache = SampleCache(shards, 0.5, BLOCK, [0, 0], shards.read_bytes_total)
    sampler = BlockSampler(shards, source("static", shards), lambda: 10, cache=cache,
                           disk_bandwidth=bandwidth)
    first = iter(sampler)
    next(first)  # one lease read
    assert 0 < sampler.read_bytes < shards.read_bytes_total
    assert sampler.read_seconds >= sampler.read_bytes / (bandwidth * 1e6)
    for _ in first:
        pass
    epoch = (sampler.read_bytes, sampler.read_seconds)
    assert epoch[1] >= shards.read_bytes_total / (bandwidth * 1e6)
    for _ in sampler:  # the cache's blocks are neither read nor waited for
        pass
    assert sampler.read_bytes - epoch[0] == shards.read_bytes_total - sampler.cache_hit_bytes
    assert sampler.read_seconds - epoch[1] >= (sampler.read_bytes - epoch[0]) / (bandwidth * 1e6)
    with pytest.raises(ValueError, match="disk_bandwidth"):
        BlockSampler(shards, source("static", shards), lambda: 10, disk_bandwidth=0)
