"""Which samples a worker visits, and in what order, epoch after epoch: its partition of
the data set (partition.py) in the order `--shuffle` gives (shuffle.py), as one object
that knows its position, so that a worker continuing a job goes on at its exact next
sample."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import numpy as np

from esync import config
from esync.data.partition import partition, partition_size
from esync.data.shuffle import EpochOrder


def labels_of(dataset) -> Sequence[int]:
    """One label per sample of a torch Dataset, for the partitions (-s 1 splits by
    class): its `targets` (torchvision's and formats.py's data sets have them), else
    all alike."""
    targets = getattr(dataset, "targets", None)
    if targets is not None and len(targets) == len(dataset):
        return list(targets)
    return [0] * len(dataset)


@dataclass(frozen=True)
class DataSettings:
    """The flags that decide a worker's samples (--shuffle, --block-size,
    --buffer-ratio, -s, --seed, --data-split, --log-samples) and how they are read and
    decoded (--loader-workers, --cache-fraction, --disk-bandwidth, --remote-prep)."""

    shuffle: str = config.SHUFFLE
    block_size: int = 32
    buffer_ratio: float = 0.1
    split_by_class: bool = False
    seed: int = 0
    split: Optional[str] = None  # None: leased where it can be (see config.DATA_SPLIT)
    log_samples: bool = False
    loader_workers: int = 0
    cache_fraction: float = 0.0
    disk_bandwidth: Optional[float] = None  # MB/s
    remote_prep: Optional[float] = None

    @classmethod
    def from_options(cls, opts) -> "DataSettings":
        return cls(opts.shuffle, opts.block_size, opts.buffer_ratio,
                   bool(opts.split_by_class), opts.seed, opts.data_split,
                   bool(opts.log_samples), opts.loader_workers, opts.cache_fraction,
                   opts.disk_bandwidth, opts.remote_prep)


def draws_whole(settings: DataSettings, job_epochs: bool) -> bool:
    """Whether a worker draws a map-style data set whole (WorkerOrder's `whole`): only in
    a job that counts its epochs in samples (`job_epochs`), where --data-split is whole
    or, by default, where -s 1 does not keep each worker on its classes."""
    return job_epochs and (settings.split or
                           ("static" if settings.split_by_class else "whole")) == "whole"


class WorkerOrder:
    """Partition `rank` of `num_workers` of a data set of `labels` (one per sample; all
    alike where the data set has none), visited in `settings.shuffle`'s order (`shuffle`
    False: the stored order). `samples_drawn` counts the samples taken so far.

    `whole` (--data-split whole): every sample, in an order of this rank's own, so that
    a device that trains more (or alone, the others sitting out) draws from the whole
    data set rather than going round its own share; `share` is still the size of one
    partition, the samples each device draws in an epoch of the job's on average."""

    def __init__(self, labels: Sequence[int], rank: int, num_workers: int,
                 settings: DataSettings, shuffle: bool = True, whole: bool = False):
        labels = np.asarray(labels)
        self.indices = partition(labels, 1 if whole else num_workers, 0 if whole else rank,
                                 settings.split_by_class, settings.seed)
        self.share = partition_size(len(labels), num_workers) if whole else len(self.indices)
        self.order = EpochOrder(self.indices, settings.shuffle if shuffle else "none",
                                seed=[settings.seed, rank], block_size=settings.block_size,
                                buffer_ratio=settings.buffer_ratio)
        self.samples_drawn = 0

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def epochs_done(self) -> float:
        """Epochs of this device's share drawn (static: passes over its partition)."""
        return self.samples_drawn / self.share

    def epoch_rest(self) -> Iterator[int]:
        """The samples of the current epoch not drawn yet (the order is a function of
        the seed, the rank and the epoch alone)."""
        epoch, position = divmod(self.samples_drawn, len(self.indices))
        return iter(self.order.order(epoch)[position:].tolist())

    def next_epoch(self) -> None:
        """Skip what is left of the current epoch (a loader dropping its last batch)."""
        epoch, position = divmod(self.samples_drawn, len(self.indices))
        if position:
            self.samples_drawn = (epoch + 1) * len(self.indices)

    def skip_to(self, epochs: Optional[float]) -> None:
        if epochs:
            self.samples_drawn = int(round(epochs * self.share))
