"""What main.py trains and how it measures it, from its flags: the data (--dataset,
--data-dir), the network (-n), the loss (--loss) and the evaluation metric (--metric).

The built-in data sets are in-memory arrays (esync.data.datasets) streamed in batches
of any size the algorithm asks for; every other data set (a plug-in's
`module:function`, an image folder, CIFAR-10's binary batches) is a pair of torch
Datasets, fed to the loop by the public API's prepare_data_loader as a user's script
would be. Either way the same loop trains it (esync.train) and the same `evaluate`
measures it, in a worker or in the evaluator.

Before anything starts (`check`), the network is built and run on two training
samples, and the loss computed on its output, so that a plug-in written for other data
is refused with one line naming the flag.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from esync import plugin
from esync.data import ON_DISK, SHARDS_PREFIX
from esync.data.order import labels_of
from esync.data.datasets import Dataset as Arrays, load_dataset
from esync.errors import UserError
from esync.models import build_network, run_on

EVAL_BATCH = 512
DATASET_FLAG, LOSS_FLAG = "--dataset", "--loss"

@dataclass
class Task:
    """A data set (in memory, or a torch training and test set), its loss and metric."""

    dataset: str
    arrays: Optional[Arrays]           # a built-in data set, in memory
    train_set: Any = None              # torch Datasets otherwise
    test_set: Any = None
    loss: Callable[..., torch.Tensor] = F.cross_entropy
    metric: str = "accuracy"

    @property
    def num_classes(self) -> int:
        """The classes a built-in network is built for (10 where the data do not say)."""
        if self.arrays is not None:
            return self.arrays.num_classes
        classes = getattr(self.train_set, "classes", None)
        if classes is not None:
            return len(classes)
        targets = getattr(self.train_set, "targets", None)
        return int(max(targets)) + 1 if targets is not None and len(targets) else 10

    def labels(self):
        """One label per training sample, for the partitions (-s 1 splits by class)."""
        if self.arrays is not None:
            return self.arrays.train_labels.numpy()
        return labels_of(self.train_set)

    def sample(self, n: int = 2) -> Tuple[Any, Any]:
        """The first `n` training samples as one batch (inputs, targets)."""
        if self.arrays is not None:
            return self.arrays.sample(n), self.arrays.train_labels[:n]
        return next(iter(DataLoader(self.train_set, batch_size=n)))

    def build_model(self, network: str) -> nn.Module:
        return build_network(network, self.num_classes)

    def check(self, network: str) -> nn.Module:
        """The network, built; UserError (one line naming -n or --loss) unless it runs
        on two training samples and the loss of its output is a number."""
        model = build_network(network, self.num_classes, *(
            [self.arrays.sample()] if self.arrays is not None else []))
        if self.arrays is not None and self.loss is F.cross_entropy:
            return model  # checked by build_network: one score per class
        inputs, targets = self.sample()
        out = run_on(model, network, inputs, f"two samples of --dataset {self.dataset}")
        try:
            value = self.loss(out, targets)
            value = float(value)
        except Exception as e:
            raise UserError(f"{LOSS_FLAG}: the loss of the network's output "
                            f"({_shape(out)}) and the targets ({_shape(targets)}) fails: "
                            f"{plugin.describe(e)}") from None
        if not math.isfinite(value):
            raise UserError(f"{LOSS_FLAG}: the loss of two samples is {value}, not a number")
        return model

    def batches(self, session, batch_size: int, device: torch.device) -> Iterator:
        """The loop's batches, until the job stops (esync.train)."""
        if self.arrays is not None:
            from esync.data.batches import BatchStream
            from esync.data.order import WorkerOrder

            order = WorkerOrder(self.labels(), session.rank, session.num_workers,
                                session.data)
            return _stream(session, BatchStream(self.arrays, order.order, batch_size, device))
        from esync.loader import job_loader

        return _passes(job_loader(DataLoader(self.train_set, batch_size=batch_size,
                                             shuffle=True,
                                             num_workers=session.data.loader_workers),
                                  session, session.data))

    def evaluate(self, model: nn.Module, device: torch.device) -> float:
        """The metric on the whole test set: top-1 accuracy, or the mean loss."""
        model.eval()
        total, count = 0.0, 0
        with torch.no_grad():
            for inputs, targets in self._test_batches(device):
                out = model(inputs)
                if self.metric == "accuracy":
                    total += (out.argmax(-1) == targets).sum().item()
                    count += targets.numel()
                else:
                    total += self.loss(out, targets).item() * len(targets)
                    count += len(targets)
        model.train()
        return total / max(1, count)

    def _test_batches(self, device: torch.device) -> Iterator[Tuple[Any, Any]]:
        if self.arrays is not None:
            data = self.arrays
            for start in range(0, len(data.test_labels), EVAL_BATCH):
                yield (data.normalize(data.test_images[start:start + EVAL_BATCH]).to(device),
                       data.test_labels[start:start + EVAL_BATCH].to(device))
            return
        for inputs, targets in DataLoader(self.test_set, batch_size=EVAL_BATCH):
            yield inputs.to(device), targets.to(device)


def _shape(x: Any) -> str:
    return f"shape {list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__


def _stream(session, stream) -> Iterator:
    """The in-memory stream as a prepared loader: batches of the size the algorithm asks
    (speed-balanced DDP's vary), until the job stops."""
    session.epochs_done = lambda: stream.epochs_done
    if session.resume_epoch:
        stream.skip_to(int(round(session.resume_epoch * stream.partition_size)))
    while session.stop_reason is None:
        size = session.batch_size()
        started = time.perf_counter()
        inputs, labels = stream.next(size)
        session.batch_fetched(time.perf_counter() - started, len(labels))
        yield inputs, labels


def _passes(loader) -> Iterator:
    """Epoch after epoch of a prepared loader, until the job stops."""
    while loader.session.stop_reason is None:
        yield from loader


_LOADED: Dict[tuple, Task] = {}


def load_task(dataset: str, data_dir: str, loss: str = "cross_entropy",
              metric: str = "accuracy") -> Task:
    """The task the flags name (loaded once per process: `check` and training share it)."""
    key = (dataset, data_dir, loss, metric)
    if key not in _LOADED:
        _LOADED[key] = _load(*key)
    return _LOADED[key]


def _load(dataset: str, data_dir: str, loss: str, metric: str) -> Task:
    loss_fn = F.cross_entropy if loss == "cross_entropy" else plugin.load(loss, LOSS_FLAG)
    if dataset.startswith(SHARDS_PREFIX):
        from esync.data.decode import ShardDataset

        folder = dataset[len(SHARDS_PREFIX):]
        pair = ShardDataset(folder, "train"), ShardDataset(folder, "test")
    elif plugin.is_spec(dataset):
        pair = plugin.call(dataset, DATASET_FLAG)
    elif dataset in ON_DISK:
        from esync.data import formats

        pair = formats.image_folder(data_dir) if dataset == "folder" else \
            formats.cifar10_binary(data_dir)
    else:
        return Task(dataset, load_dataset(dataset, data_dir), loss=loss_fn, metric=metric)
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
        raise UserError(f"{DATASET_FLAG} {dataset}: returned a {type(pair).__name__}, not "
                        f"a pair (training set, test set)")
    for name, part in zip(("training", "test"), pair):
        if not (hasattr(part, "__getitem__") and hasattr(part, "__len__")):
            raise UserError(f"{DATASET_FLAG} {dataset}: its {name} set is a "
                            f"{type(part).__name__}, not a torch Dataset")
        if len(part) == 0:
            raise UserError(f"{DATASET_FLAG} {dataset}: its {name} set is empty")
    first = pair[0][0]
    if not (isinstance(first, (tuple, list)) and len(first) == 2):
        raise UserError(f"{DATASET_FLAG} {dataset}: a training sample is a "
                        f"{type(first).__name__}, not a pair (input, target)")
    return Task(dataset, None, pair[0], pair[1], loss_fn, metric)
