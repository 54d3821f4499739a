"""Standalone training (`-m local`): plain SGD on one device, no communication."""
from __future__ import annotations

from typing import Tuple

import torch
from torch import nn

from esync.algorithms.base import Algorithm, Phases


class LocalSGD(Algorithm):
    """A round is `eval_duration` local SGD iterations, each round ends with an evaluation."""

    name = "local"

    def __init__(self, lr: float, momentum: float, weight_decay: float, eval_duration: int):
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.eval_duration = eval_duration
        self.optimizer: torch.optim.Optimizer | None = None

    def setup(self, model: nn.Module, device: torch.device) -> None:
        self.optimizer = torch.optim.SGD(model.parameters(), lr=self.lr, momentum=self.momentum,
                                         weight_decay=self.weight_decay)

    def begin_round(self, round_: int) -> Tuple[int, Phases]:
        return self.eval_duration, {}

    def local_update(self, model: nn.Module) -> None:
        self.optimizer.step()

    def evaluates(self, round_: int) -> bool:
        return True
