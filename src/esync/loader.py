"""A user's DataLoader over this worker's partition (esync.api.prepare_data_loader):
the same data set, batch size, workers and collate function, sampled in the worker's
order (its partition, in --shuffle's order, resumable at its exact next sample), in
batches of the size the algorithm asks for, moved to the device, and timed for the
round's log record.

Shards (a ShardDataset) are read block by block instead (esync.data.blocks): this
worker's own blocks, or blocks the scheduler leases to it (`--data-split`), through
torchdata's StatefulDataLoader, whose state as of the last batch handed out goes into
each round's record, so that a worker continuing a job goes on at its exact next
sample."""
from __future__ import annotations

import time
from typing import Any, Callable, Iterator, List, Optional, Tuple

import torch
from torch.utils.data import DataLoader, RandomSampler

from esync.data.order import DataSettings, WorkerOrder, labels_of
from esync.errors import UserError
from esync.session import Session


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch


def _samples(batch: Any) -> Optional[int]:
    """The number of samples of a batch: the first tensor's first dimension."""
    if isinstance(batch, torch.Tensor):
        return len(batch) if batch.dim() else None
    items = batch.values() if isinstance(batch, dict) else \
        batch if isinstance(batch, (list, tuple)) else ()
    for item in items:
        found = _samples(item)
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


class _Batches(torch.utils.data.Sampler):
    """The rest of the current epoch of a worker's order, in batches of the loader's
    size, or of the size the algorithm asks for (speed-balanced DDP's vary: with
    DataLoader workers prefetching, a new size applies a few batches late)."""

    def __init__(self, order: WorkerOrder, batch_size: int, drop_last: bool,
                 session: Session):
        self.order, self.batch_size, self.drop_last = order, batch_size, drop_last
        self.session = session

    def __iter__(self) -> Iterator[List[int]]:
        rest = list(self.order.epoch_rest())
        start = 0
        while start < len(rest):
            size = self.session.algorithm.batch_size() or self.batch_size
            batch = rest[start:start + size]
            if len(batch) < size and self.drop_last:
                return
            yield batch
            start += size

    def __len__(self) -> int:
        whole, part = divmod(len(self.order), self.batch_size)
        return whole + (1 if part and not self.drop_last else 0)


def job_loader(loader: DataLoader, session: Session, settings: DataSettings):
    """A data loader over this worker's partition (prepare_data_loader)."""
    from esync.data.decode import ShardDataset

    if isinstance(loader.dataset, ShardDataset):
        from esync.shardloader import ShardLoader

        return ShardLoader(loader, session, settings)
    return SampleLoader(loader, session, settings)


class SampleLoader:
    """A data loader over this worker's partition of a map-style data set."""

    def __init__(self, loader: DataLoader, session: Session, settings: DataSettings):
        dataset = loader.dataset
        try:
            self.order = WorkerOrder(labels_of(dataset), session.rank, session.num_workers, settings,
                                     shuffle=isinstance(loader.sampler, RandomSampler))
        except ValueError as e:
            raise UserError(f"prepare_data_loader: {e}") from None
        self.order.skip_to(session.resume_epoch)
        self.session = session
        session.epochs_done = lambda: self.order.epochs_done
        if loader.batch_size is None:
            raise UserError("prepare_data_loader: the loader has no batch_size (a "
                            "batch_sampler of its own): give it a batch_size")
        self.loader = DataLoader(
            TimedDataset(dataset),
            batch_sampler=_Batches(self.order, loader.batch_size, loader.drop_last, session),
            num_workers=loader.num_workers, collate_fn=TimedCollate(loader.collate_fn),
            pin_memory=loader.pin_memory, timeout=loader.timeout,
            worker_init_fn=loader.worker_init_fn,
            prefetch_factor=loader.prefetch_factor if loader.num_workers else None,
            persistent_workers=False)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        if self.session.stop_reason is not None:
            return
        started = time.perf_counter()  # starting the workers counts as the first wait
        batches = iter(self.loader)
        while True:
            try:
                batch, prep = next(batches)
            except StopIteration:
                self.order.next_epoch()
                return
            count = _samples(batch)
            self.order.samples_drawn += count or 0
            self.session.batch_fetched(time.perf_counter() - started, count, prep=prep)
            yield _to_device(batch, self.session.device)
            if self.session.stop_reason is not None:
                return
            started = time.perf_counter()
