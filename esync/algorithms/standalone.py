"""Standalone training (`-m local`): plain SGD on one device, no communication."""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import nn

from esync import registry
from esync.algorithms.base import Algorithm, Job, Phases


class StandaloneSGD(Algorithm):
    """A round is `eval_every` SGD iterations, each round ends with an evaluation; with
    `eval_every` 0 a round is one iteration and the loop evaluates by the clock
    (--eval-interval)."""

    def __init__(self, lr: float, momentum: float, weight_decay: float, eval_every: int):
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.eval_every = eval_every
        self.optimizer: torch.optim.Optimizer | None = None

    @classmethod
    def from_options(cls, opts, job: Optional[Job]) -> "StandaloneSGD":
        algorithm = cls(opts.learning_rate, opts.momentum, opts.weight_decay, opts.eval_every)
        algorithm.name = registry.of_options(opts).key
        return algorithm

    def setup(self, model: nn.Module, device: torch.device) -> None:
        self.optimizer = torch.optim.SGD(model.parameters(), lr=self.lr, momentum=self.momentum,
                                         weight_decay=self.weight_decay)

    def begin_round(self, round_: int) -> Tuple[int, Phases]:
        return max(1, self.eval_every), {}

    def local_update(self, model: nn.Module) -> None:
        self.optimizer.step()

    def evaluates(self, round_: int) -> bool:
        return self.eval_every > 0
