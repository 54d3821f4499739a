"""A user's data set and collate function, timed where batches are made, and what every
prepared loader does with a batch (esync.runtime.loader over samples, esync.runtime.shardloader over
shards, esync.runtime.remoteprep on other CPUs): count its samples, move it to the device.

The *prep* of a batch (its samples' making and its collation) is measured in the process
that makes it (a DataLoader worker, a Ray task, or this one) and carried back with the
batch, so that a round's record can tell preprocessing from waiting for it."""
from __future__ import annotations

import time
from typing import Any, Callable, List, Optional, Tuple

import torch


def to_device(batch: Any, device: torch.device) -> Any:
    """`batch` (a tensor, or lists, tuples and dicts of them) on `device`; anything
    else as it is."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


def samples_in(batch: Any) -> Optional[int]:
    """The number of samples of a batch: the first tensor's first dimension."""
    if isinstance(batch, torch.Tensor):
        return len(batch) if batch.dim() else None
    items = batch.values() if isinstance(batch, dict) else \
        batch if isinstance(batch, (list, tuple)) else ()
    for item in items:
        found = samples_in(item)
        if found is not None:
            return found
    return None


class _Prepared(list):
    """A batch's samples as the data set gave them, and the seconds that took."""

    seconds = 0.0


class TimedDataset(torch.utils.data.Dataset):
    """A user's map-style data set whose batches of samples are timed where they are
    made (a DataLoader worker process, or this one): the *prep* of each batch, carried
    back with it by `TimedCollate`. Anything else is the user's data set's."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index):
        return self.dataset[index]

    def __getitems__(self, indices) -> _Prepared:
        started = time.perf_counter()
        many = getattr(self.dataset, "__getitems__", None)
        samples = _Prepared(many(indices) if many else [self.dataset[i] for i in indices])
        samples.seconds = time.perf_counter() - started
        return samples

    def __getattr__(self, name: str):  # a worker_init_fn may read the user's data set
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)


class TimedCollate:
    """The user's collate function, returning (batch, seconds the batch took to make:
    its samples' and its collation's)."""

    def __init__(self, collate: Callable[[List[Any]], Any]):
        self.collate = collate

    def __call__(self, samples: List[Any]) -> Tuple[Any, float]:
        started = time.perf_counter()
        batch = self.collate(list(samples))
        return batch, getattr(samples, "seconds", 0.0) + time.perf_counter() - started


def prepare_batch(dataset, items: List[Any], collate: Callable[[List[Any]], Any]
                  ) -> Tuple[Any, float]:
    """One batch of `items` of `dataset`, made and collated as a DataLoader worker does,
    and its seconds (remote preprocessing runs this on other CPUs)."""
    return TimedCollate(collate)(TimedDataset(dataset).__getitems__(items))
