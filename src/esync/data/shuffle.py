"""The order in which a worker visits its partition, epoch after epoch.

`random` draws a new permutation of the partition each epoch, as a DataLoader with
shuffle=True does (shards, which are read block by block, take CorgiPile's order
instead: esync.data.leases).
`corgipile` is CorgiPile's two-level shuffle (Xu et al., SIGMOD 2022): cut the partition
into blocks of contiguous samples, visit the blocks in random order, fill a buffer with
whole blocks and emit the buffer's samples in random order. It reads storage block by
block yet mixes almost as well as a full shuffle. `once` shuffles once before the first
epoch and keeps that order; `none` keeps the stored order.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from esync.data import SHUFFLES


class EpochOrder:
    """`order(epoch)` is a permutation of `indices` for that epoch (deterministic by seed)."""

    def __init__(self, indices: np.ndarray, kind: str, seed: int | Sequence[int],
                 block_size: int = 32, buffer_ratio: float = 0.1):
        if kind not in SHUFFLES:
            raise ValueError(f"unknown shuffle {kind!r}")
        self.indices = np.asarray(indices)
        self.kind = kind
        self.seed = [int(s) for s in np.atleast_1d(seed)]
        self.block_size = block_size
        n = len(self.indices)
        # the buffer holds whole blocks: at least one, as many as fit in buffer_ratio * n
        self.blocks_per_buffer = max(1, int(buffer_ratio * n) // block_size)
        self._fixed = (np.random.default_rng(self.seed).permutation(self.indices)
                       if kind == "once" else self.indices)

    def order(self, epoch: int) -> np.ndarray:
        if self.kind == "random":
            return np.random.default_rng([*self.seed, epoch]).permutation(self.indices)
        if self.kind != "corgipile":
            return self._fixed
        rng = np.random.default_rng([*self.seed, epoch])
        n, b = len(self.indices), self.block_size
        starts = rng.permutation(np.arange(0, n, b))
        out = []
        for i in range(0, len(starts), self.blocks_per_buffer):
            buffer = np.concatenate([self.indices[s:s + b]
                                     for s in starts[i:i + self.blocks_per_buffer]])
            out.append(rng.permutation(buffer))
        return np.concatenate(out) if out else self.indices[:0]
