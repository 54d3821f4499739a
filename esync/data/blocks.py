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
"""
from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Deque, Dict, Iterator, List, Optional, Protocol, Tuple

import numpy as np

from esync.data.leases import Lease
from esync.data.shards import ShardSet
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
                 drop_last: bool = False, share: Optional[int] = None):
        self.shards, self.source = shards, source
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

    def _start(self, lease: Lease) -> None:
        """Read the lease's blocks into the buffer; emit from its `skip`-th sample."""
        started = time.perf_counter()
        self._buffer = {}
        for first, count in lease.ranges:
            try:
                samples = self.shards.read(first, count)
            except UserError as e:  # the run goes on without the block, counted
                log.warning("skipped samples %d..%d: %s", first, first + count - 1, e)
                self.skipped += count
                continue
            for sample_id, (_, parts) in zip(range(first, first + count), samples):
                self._buffer[sample_id] = parts
            self.read_bytes += self.shards.read_bytes(first, count)
        self.read_seconds += time.perf_counter() - started
        self.lease, self._order, self.pos = lease, lease.order(), lease.skip
        for trained in self._order[:lease.skip]:
            self._buffer.pop(int(trained), None)

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
