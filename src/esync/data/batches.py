"""An endless stream of training batches from one worker's partition."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from esync.data.datasets import Dataset
from esync.data.shuffle import EpochOrder


class BatchStream:
    """Draws batches epoch after epoch, each epoch in the order `EpochOrder` gives.

    Epochs are concatenated: a batch that reaches past an epoch's end is completed from
    the next epoch, so every batch is full and no sample is skipped. `epochs_done` is
    the (fractional) number of passes over the partition so far (of `share` samples
    each where given: --data-split whole, whose order is of the whole data set).
    """

    def __init__(self, dataset: Dataset, order: EpochOrder, batch_size: int,
                 device: torch.device, share: Optional[int] = None):
        self.dataset = dataset
        self.order = order
        self.batch_size = batch_size
        self.device = device
        self.partition_size = len(order.indices)
        self.share = share or self.partition_size
        self.samples_drawn = 0
        self._epoch = 0
        self._queue = order.order(0)
        self._pos = 0

    @property
    def epochs_done(self) -> float:
        return self.samples_drawn / self.share

    def skip_to(self, samples: int) -> None:
        """Go on as if `samples` samples had been drawn (a worker continuing a job): the
        position within the epoch is exact, as each epoch's order depends only on the
        seed, the rank and the epoch."""
        self.samples_drawn = samples
        self._epoch, self._pos = divmod(samples, self.partition_size)
        self._queue = self.order.order(self._epoch)

    def _take(self, count: int) -> np.ndarray:
        parts = []
        while count > 0:
            if self._pos == len(self._queue):
                self._epoch += 1
                self._queue, self._pos = self.order.order(self._epoch), 0
            chunk = self._queue[self._pos:self._pos + count]
            self._pos += len(chunk)
            count -= len(chunk)
            parts.append(chunk)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def next(self, size: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The next batch, of `size` samples (None: `batch_size`)."""
        index = torch.from_numpy(self._take(self.batch_size if size is None else size))
        self.samples_drawn += len(index)
        images = self.dataset.normalize(self.dataset.train_images[index])
        labels = self.dataset.train_labels[index]
        return images.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)
