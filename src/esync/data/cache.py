"""A device's sample cache: MinIO's policy as CoorDL (Mohan et al., VLDB 2021) uses it.

A fixed, seeded subset of the data is kept in memory, raw (each sample's {extension:
bytes} parts, as `ShardSet.read` returns them), from its first read on, and never
evicted: unlike an LRU page cache, which thrashes when an epoch's data exceeds it, the
subset then serves the same share of every later epoch's reads, whatever the order.

Eligibility is decided per block of `shards.blocks(block_size)` (a seeded coin of
probability `fraction` per block), so that a lease's range, a whole block or a part of
one (the epoch's tail blocks are cut in halves), is wholly eligible or not, and a range
the cache holds needs no read at all (`pieces` cuts a range that crosses blocks, as a
split by class may give, at their boundaries). Once `capacity_bytes` are held nothing
more goes in. Bytes are counted as the samples' byte ranges in the shards (what reading
them costs), a bound of the memory their parts take.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from esync.data.shards import Raw, ShardSet


class SampleCache:
    """Samples of the blocks drawn by `seed` with probability `fraction`, held raw after
    their first read, up to `capacity_bytes` (see the module)."""

    def __init__(self, shards: ShardSet, fraction: float, block_size: int,
                 seed: Sequence[int], capacity_bytes: int):
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"a cache fraction must lie in [0, 1], not {fraction}")
        if block_size < 1 or capacity_bytes < 0:
            raise ValueError("a cache needs a positive block size and a capacity >= 0 bytes")
        self.shards, self.fraction, self.capacity = shards, fraction, int(capacity_bytes)
        blocks = shards.blocks(block_size)
        self._firsts = blocks[:, 0]  # blocks in sample order: where each begins
        coins = np.random.default_rng([*seed, 0xCAC4E]).random(len(blocks))
        self.eligible = coins < fraction  # per block
        self._held: Dict[int, Raw] = {}  # sample id: (key, parts)
        self.hits = 0        # samples served
        self.hit_bytes = 0   # their shard bytes, not read
        self.held_bytes = 0

    def __len__(self) -> int:
        return len(self._held)

    def _block(self, sample: int) -> int:
        return int(np.searchsorted(self._firsts, sample, side="right") - 1)

    def pieces(self, first: int, count: int) -> List[Tuple[int, int]]:
        """Samples first .. first+count-1 cut at the blocks' boundaries: [first, count]
        runs, each within one block."""
        out = []
        while count > 0:
            block = self._block(first)
            end = int(self._firsts[block + 1]) if block + 1 < len(self._firsts) else first + count
            n = min(count, end - first)
            out.append((first, n))
            first, count = first + n, count - n
        return out

    def is_eligible(self, first: int, count: int) -> bool:
        """Whether every block that samples first .. first+count-1 touch is cached."""
        lo, hi = self._block(first), self._block(first + count - 1)
        return bool(self.eligible[lo:hi + 1].all())

    def get_range(self, first: int, count: int) -> Optional[List[Raw]]:
        """The samples first .. first+count-1 as `ShardSet.read` gave them (each one's
        parts a copy), if the cache holds all of them; else None."""
        if not all(i in self._held for i in range(first, first + count)):
            return None
        self.hits += count
        self.hit_bytes += self.shards.read_bytes(first, count)
        return [(key, dict(parts)) for key, parts in
                (self._held[i] for i in range(first, first + count))]

    def offer(self, first: int, count: int, samples: Sequence[Raw]) -> bool:
        """Keep samples first .. first+count-1 (just read) if they are eligible and fit
        whole; whether they are held now."""
        if count <= 0 or not self.is_eligible(first, count) or len(samples) != count:
            return False
        new = [i for i in range(first, first + count) if i not in self._held]
        size = sum(self.shards.read_bytes(i, 1) for i in new)
        if self.held_bytes + size > self.capacity:
            return False  # full: nothing is evicted, nothing more goes in
        for i, (key, parts) in zip(range(first, first + count), samples):
            if i not in self._held:
                self._held[i] = (key, dict(parts))
        self.held_bytes += size
        return True
