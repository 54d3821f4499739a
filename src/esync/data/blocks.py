"""CorgiPile over storage: a device's batches, read from shards block by block.

`BlockSampler` is the batch sampler of a prepared loader over a `ShardDataset`: it takes
one lease at a time (a few whole blocks: esync.data.leases), reads each block with one
sequential read of its byte range (the *fetch*, timed and counted in bytes), and emits
the lease's samples in its seeded order, as (sample id, {extension: bytes}) that the
DataLoader's worker processes decode (the *prep*). When a lease runs out it asks its
source for the next one: its own blocks (`--data-split static`) or the scheduler's
(`leased`).

A pass over the loader is one epoch of leases: it ends when the next lease belongs to
the next epoch (with the batch that reaches into it: every batch is full). The sampler's state (`state_dict`: the lease in progress and the
position in its order) is what torchdata's StatefulDataLoader saves, as of the last
batch it handed out, so a restarted or resumed worker continues at its exact next
sample. A block that cannot be read mid-run (a corrupt shard) is skipped with a warning
naming the shard and counted (`skipped`). `emitted` holds, per batch emitted and not
yet handed to the training loop, its sample ids and the leases it finished (the loader reports them at each round's end).

With a `cache` (esync.data.cache, --cache-fraction) a range the cache holds is not read
(nor counted in `read_bytes`, `read_seconds`; `cache_hits`, `cache_hit_bytes` count it)
and a range read is offered to it. `disk_bandwidth` (MB/s, --disk-bandwidth) emulates
slower storage, as --slowdown a slower device: a lease's reads from disk take at least
their bytes over it (the rest is slept, in `read_seconds`).
"""
from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Deque, Dict, Iterator, List, Optional, Protocol, Tuple

import numpy as np

from esync.data.cache import SampleCache
from esync.data.leases import Lease
from esync.data.shards import Raw, ShardSet
from esync.errors import UserError

log = logging.getLogger(__name__)

Item = Tuple[int, Dict[str, bytes]]


class LeaseSource(Protocol):
    def next(self) -> Lease: ...

    def resume(self, lease: Lease) -> Optional[Lease]: ...

    def report(self, done: List[str], at: Optional[Tuple[str, int]]) -> None: ...


@dataclass
class Emitted:
    """A batch the sampler emitted: its sample ids, the leases it finished, and where
    it left the lease in progress (lease id, samples of its order done)."""

    ids: List[int]
    epochs: List[int]  # the epoch of each sample's lease
    done: List[str]
    at: Optional[Tuple[str, int]]
    place: float  # the lease in progress's place in the job's data, in epochs


class BlockSampler:
    """Batches of a device's leases, read block by block (see the module)."""

    def __init__(self, shards: ShardSet, source: LeaseSource, batch_size: Callable[[], int],
                 drop_last: bool = False, share: Optional[int] = None, *,
                 cache: Optional[SampleCache] = None, disk_bandwidth: Optional[float] = None):
        if disk_bandwidth is not None and not disk_bandwidth > 0:
            raise ValueError(f"disk_bandwidth must be a positive MB/s, not {disk_bandwidth}")
        self.shards, self.source = shards, source
        self.cache, self.disk_bandwidth = cache, disk_bandwidth  # MB/s of 10^6 bytes
        self.batch_size, self.drop_last = batch_size, drop_last
        self.share = share or len(shards)  # samples a pass has, nominally (len())
        self.lease: Optional[Lease] = None
        self.pos = 0                      # samples of the lease's order emitted
        self.pending: Optional[Lease] = None  # the next epoch's first lease
        self.epoch: Optional[int] = None  # the pass in progress
        self.drawn = 0                    # samples emitted, all passes
        self.emitted: Deque[Emitted] = deque()
        self.read_bytes, self.read_seconds = 0, 0.0
        self.skipped = 0  # samples of blocks that could not be read (corrupt shards)
        self._order = np.zeros(0, np.int64)
        self._buffer: Dict[int, Dict[str, bytes]] = {}
        self._done: List[str] = []
        self._pass_over = False
        self._epochs: List[int] = []

    def __len__(self) -> int:
        size = max(1, self.batch_size())
        return self.share // size if self.drop_last else -(-self.share // size)

    def __iter__(self) -> Iterator[List[Item]]:
        while True:
            size = max(1, self.batch_size())
            batch = self._take(size)
            if not batch or (len(batch) < size and self.drop_last):
                self.epoch = None  # the next pass begins with the pending lease
                return
            self.drawn += len(batch)
            at = (self.lease.id, self.pos) if self.lease is not None else None
            self.emitted.append(Emitted([i for i, _ in batch], self._epochs, self._done, at,
                                        self.lease.place if self.lease else 0.0))
            self._epochs = []
            self._done = []
            yield batch
            if self._pass_over:  # this batch reached into the next epoch
                self._pass_over = False
                return

    def _take(self, size: int) -> List[Item]:
        batch: List[Item] = []
        while len(batch) < size:
            if self.lease is None or self.pos >= len(self._order):
                if not self._next_lease(filling=bool(batch)):
                    break
            ids = self._order[self.pos:self.pos + size - len(batch)]
            self.pos += len(ids)
            taken = [(int(i), self._buffer.pop(int(i))) for i in ids if int(i) in self._buffer]
            batch += taken  # a block that could not be read is not there
            self._epochs += [self.lease.epoch] * len(taken)
        return batch

    def _next_lease(self, filling: bool) -> bool:
        """Start the next lease; False at the pass's end. A batch that reaches the
        epoch's end (`filling`) is completed from the next epoch's first lease, so that
        every batch is full, and the pass ends with it."""
        if self.lease is not None:
            self._done.append(self.lease.id)
            self.lease = None
        lease, self.pending = self.pending or self.source.next(), None
        if self.epoch is None:
            self.epoch = lease.epoch
        elif lease.epoch != self.epoch:
            if not filling:
                self.pending = lease
                return False
            self.epoch, self._pass_over = lease.epoch, True
        self._start(lease)
        return True

    @property
    def cache_hits(self) -> int:
        """Samples served by the cache, not read."""
        return self.cache.hits if self.cache is not None else 0

    @property
    def cache_hit_bytes(self) -> int:
        """Their bytes in the shards."""
        return self.cache.hit_bytes if self.cache is not None else 0

    def _start(self, lease: Lease) -> None:
        """Read the lease's blocks into the buffer (what the cache holds from it, the rest
        from disk, no faster than `disk_bandwidth`); emit from its `skip`-th sample."""
        self._buffer, seconds, disk_bytes = {}, 0.0, 0
        for first, count, samples in (p for r in lease.ranges for p in self._pieces(*r)):
            if samples is None:  # from disk
                started = time.perf_counter()
                samples = self._read(first, count)
                seconds += time.perf_counter() - started
                if samples is None:
                    continue
                disk_bytes += self.shards.read_bytes(first, count)
            for sample_id, (_, parts) in zip(range(first, first + count), samples):
                self._buffer[sample_id] = parts
        if self.disk_bandwidth and disk_bytes / (self.disk_bandwidth * 1e6) > seconds:
            started = time.perf_counter()  # emulated slower storage: wait for the rest
            time.sleep(disk_bytes / (self.disk_bandwidth * 1e6) - seconds)
            seconds += time.perf_counter() - started
        self.read_bytes += disk_bytes
        self.read_seconds += seconds
        self.lease, self._order, self.pos = lease, lease.order(), lease.skip
        for trained in self._order[:lease.skip]:
            self._buffer.pop(int(trained), None)

    def _pieces(self, first: int, count: int) -> List[Tuple[int, int, Optional[List[Raw]]]]:
        """A range as (first, count, samples) runs: the cache's samples, or None where
        they are to be read (consecutive such runs: one read)."""
        if self.cache is None:
            return [(first, count, None)]
        out: List[Tuple[int, int, Optional[List[Raw]]]] = []
        for start, n in self.cache.pieces(first, count):
            held = self.cache.get_range(start, n)
            if held is None and out and out[-1][2] is None:
                out[-1] = (out[-1][0], out[-1][1] + n, None)
            else:
                out.append((start, n, held))
        return out

    def _read(self, first: int, count: int) -> Optional[List[Raw]]:
        """A range's samples, read (and offered to the cache); None if it cannot be."""
        try:
            samples = self.shards.read(first, count)
        except UserError as e:  # the run goes on without the block, counted
            log.warning("skipped samples %d..%d: %s", first, first + count - 1, e)
            self.skipped += count
            return None
        if self.cache is not None:
            for start, n in self.cache.pieces(first, count):
                self.cache.offer(start, n, samples[start - first:start - first + n])
        return samples

    # --- state (torchdata's StatefulDataLoader saves it as of each handed-out batch) ---
    def state_dict(self) -> dict:
        return {"lease": self.lease.to_dict() if self.lease else None, "pos": self.pos,
                "pending": self.pending.to_dict() if self.pending else None,
                "epoch": self.epoch, "drawn": self.drawn}

    def load_state_dict(self, state: dict) -> None:
        """Continue where `state` left off (a lease the source no longer gives back, as
        one a scheduler dealt to others meanwhile, is replaced by the next one)."""
        self.drawn, self.epoch = int(state.get("drawn", 0)), state.get("epoch")
        self.lease, self.pending, self.emitted = None, None, deque()
        if state.get("pending"):
            self.pending = self.source.resume(Lease.from_dict(state["pending"]))
        elif state.get("lease"):
            saved = Lease.from_dict(state["lease"])
            saved.skip = max(saved.skip, min(int(state.get("pos", 0)), saved.size))
            lease = self.source.resume(saved)
            if lease is not None:
                self._start(lease)
