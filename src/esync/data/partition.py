"""Which training samples each of N workers owns (by rank): IID or split by class."""
from __future__ import annotations

import numpy as np


def partition_size(n: int, num_parts: int) -> int:
    """Samples in each of `num_parts` partitions of `n` samples (ValueError if none)."""
    size = n // num_parts
    if size == 0:
        raise ValueError(f"{n} samples cannot be split into {num_parts} parts")
    return size


def partition(labels: np.ndarray, num_parts: int, rank: int, by_class: bool,
              seed: int) -> np.ndarray:
    """Indices of the samples of partition `rank` out of `num_parts`, in stored order.

    IID: a permutation drawn from `seed` (the same on every worker, so the parts are
    disjoint) is cut into equal parts. By class: samples are sorted by label (stable)
    and cut into contiguous equal parts, so each worker sees only a few classes, as the
    original ESync did. Either way the `len % num_parts` samples left over by an uneven
    split belong to nobody, and each part is returned sorted by stored position, so
    that CorgiPile's blocks are runs of samples that lie together in storage.
    """
    if not 0 <= rank < num_parts:
        raise ValueError(f"rank {rank} outside 0..{num_parts - 1}")
    n = len(labels)
    size = partition_size(n, num_parts)
    if by_class:
        order = np.argsort(np.asarray(labels), kind="stable")
        part = order[rank * size:(rank + 1) * size]
        # keep class order: stored order within each class, classes one after another
        return part
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[rank * size:(rank + 1) * size])
