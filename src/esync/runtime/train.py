"""main.py's built-in training loop: its networks (or a plug-in network) on its data
sets (or a plug-in's), trained through the public API's optimizer wrapper, exactly as
a user's script is (esync.runtime.api). There is no other training loop: every algorithm, the
rounds, timing, logging and stopping live behind `DistributedOptimizer.step`
(esync.runtime.session)."""
from __future__ import annotations

import time
from typing import Iterable, Iterator, Optional

import torch
from torch import nn
from torch.utils.data import DataLoader

from esync.runtime.api import DistributedOptimizer
from esync.data.batches import BatchStream
from esync.data.order import WorkerOrder, draws_whole
from esync.runtime.loader import job_loader
from esync.runtime.session import Session, TrainResult
from esync.runtime.task import Task


def train(session: Session, model: nn.Module, task: Task, batch_size: int, lr: float,
          momentum: float = 0.0, weight_decay: float = 0.0,
          feed: Optional[Iterable] = None) -> TrainResult:
    """Train `model` on `task`'s data with SGD until the job stops; worker 0 (or a
    process alone) evaluates `task`'s metric where the algorithm says. `feed`: the
    loop's (inputs, targets) batches instead of `batches`' (esync-stalls' synthetic
    run repeats one batch)."""
    net = session.adopt(model)
    session.evaluate_with(lambda: task.evaluate(model, session.device), task.metric)
    optimizer = DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum,
                        weight_decay=weight_decay), job=session)
    for inputs, targets in feed if feed is not None else batches(session, task, batch_size):
        optimizer.zero_grad(set_to_none=True)
        loss = task.loss(net(inputs), targets)
        loss.backward()
        session.report(loss.item())
        optimizer.step()
    return session.result()


def batches(session: Session, task: Task, batch_size: int) -> Iterator:
    """The loop's batches of `task`'s training data, on the session's device, until the
    job stops: a built-in data set's in-memory stream, or a torch Dataset's prepared
    loader (esync.runtime.loader), as a user's script would have it."""
    if task.arrays is not None:
        order = WorkerOrder(task.labels(), session.rank, session.num_workers, session.data,
                            whole=draws_whole(session.data, session.algorithm.job_epochs))
        return _stream(session, BatchStream(task.arrays, order.order, batch_size,
                                            session.device, share=order.share))
    loader = job_loader(DataLoader(task.pairs(), batch_size=batch_size, shuffle=True,
                                   num_workers=session.data.loader_workers),
                        session, session.data)
    return _passes(session, loader)


def _stream(session: Session, stream: BatchStream) -> Iterator:
    """The in-memory stream as a prepared loader: batches of the size the algorithm asks
    (speed-balanced DDP's vary), until the job stops."""
    session.follow_data(lambda: stream.epochs_done)
    if session.resume_epoch:
        stream.skip_to(int(round(session.resume_epoch * stream.share)))
    while session.stop_reason is None:
        size = session.batch_size()
        started = time.perf_counter()
        inputs, labels = stream.next(size)
        session.batch_fetched(time.perf_counter() - started, len(labels))
        yield inputs, labels


def _passes(session: Session, loader) -> Iterator:
    """Epoch after epoch of a prepared loader, until the job stops."""
    while session.stop_reason is None:
        yield from loader
