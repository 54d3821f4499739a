"""main.py's built-in training loop: its networks (or a plug-in network) on its data
sets, trained through the public API's optimizer wrapper, exactly as a user's script
is (esync.api). There is no other training loop: every algorithm, the rounds, timing,
logging and stopping live behind `DistributedOptimizer.step` (esync.session)."""
from __future__ import annotations

import logging
import time
from typing import Iterator, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from esync.api import DistributedOptimizer
from esync.data.batches import BatchStream
from esync.data.datasets import Dataset
from esync.session import Session, TrainResult

EVAL_BATCH = 512

log = logging.getLogger(__name__)


def evaluate(model: nn.Module, dataset: Dataset, device: torch.device) -> float:
    """Top-1 accuracy on the whole test set."""
    model.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, len(dataset.test_labels), EVAL_BATCH):
            images = dataset.normalize(dataset.test_images[start:start + EVAL_BATCH])
            labels = dataset.test_labels[start:start + EVAL_BATCH].to(device)
            correct += (model(images.to(device)).argmax(1) == labels).sum().item()
    model.train()
    return correct / len(dataset.test_labels)


def _batches(session: Session, stream: BatchStream) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
    """The in-memory stream as a prepared data loader: batches of the size the algorithm
    asks for (speed-balanced DDP's vary), until the job stops."""
    session.epochs_done = lambda: stream.epochs_done
    if session.resume_epoch:
        stream.skip_to(int(round(session.resume_epoch * stream.partition_size)))
    while session.stop_reason is None:
        size = session.batch_size()
        started = time.perf_counter()
        images, labels = stream.next(size)
        session.batch_fetched(time.perf_counter() - started, len(labels))
        yield images, labels


def train(session: Session, model: nn.Module, stream: BatchStream, dataset: Dataset,
          lr: float, momentum: float = 0.0, weight_decay: float = 0.0) -> TrainResult:
    """Train `model` on `stream` with SGD until the job stops; worker 0 (or a process
    alone) measures test accuracy on `dataset` where the algorithm says."""
    net = session.adopt(model)
    session.evaluation = lambda: evaluate(model, dataset, session.device)
    optimizer = DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum,
                        weight_decay=weight_decay), job=session)
    for images, labels in _batches(session, stream):
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(images), labels)
        loss.backward()
        session.report(loss.item())
        optimizer.step()
    return session.result()
