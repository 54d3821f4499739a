"""main.py's built-in training loop: its networks (or a plug-in network) on its data
sets (or a plug-in's), trained through the public API's optimizer wrapper, exactly as
a user's script is (esync.api). There is no other training loop: every algorithm, the
rounds, timing, logging and stopping live behind `DistributedOptimizer.step`
(esync.session)."""
from __future__ import annotations

import torch
from torch import nn

from esync.api import DistributedOptimizer
from esync.session import Session, TrainResult
from esync.task import Task


def train(session: Session, model: nn.Module, task: Task, batch_size: int, lr: float,
          momentum: float = 0.0, weight_decay: float = 0.0) -> TrainResult:
    """Train `model` on `task`'s data with SGD until the job stops; worker 0 (or a
    process alone) evaluates `task`'s metric where the algorithm says."""
    net = session.adopt(model)
    session.evaluation = lambda: task.evaluate(model, session.device)
    session.metric_kind = task.metric
    optimizer = DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum,
                        weight_decay=weight_decay), job=session)
    for inputs, targets in task.batches(session, batch_size, session.device):
        optimizer.zero_grad(set_to_none=True)
        loss = task.loss(net(inputs), targets)
        loss.backward()
        session.report(loss.item())
        optimizer.step()
    return session.result()
