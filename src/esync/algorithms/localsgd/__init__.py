"""Local SGD with a fixed period (`-m localsgd`), one unit: PyTorch's post-local SGD
(`PostLocalSGDOptimizer` with `PeriodicModelAverager(period, warmup_steps)`) and
torchft's `LocalSGD(..., sync_every)`, the hand-tuned period that ESync's budgets replace.

Every worker runs `period` local iterations of its own optimizer, then the workers'
models are averaged: each pushes its round's delta, and the servers (or the all-reduce)
set w <- w + gl * mean(delta), ESync's rule (esync.algorithms.esync.rule) without its
budgets or weighting by steps; with -gl 1 that is the plain average. During the first
`warmup_steps` local iterations a round is one iteration (post-local SGD's warm-up).
`outer_momentum` makes the averaged delta a pseudo-gradient for SGD with Nesterov
momentum and learning rate `global_lr`: DiLoCo's outer optimizer.

- `LocalSGD` here: the policy, whose fields declare their own flags (--period,
  --warmup-steps; -gl and --outer-momentum are ESync's flags, shared), torch-free;
- `worker`: the worker's hooks.
"""
from __future__ import annotations

from dataclasses import dataclass

from esync import config
from esync.algorithms.policy import Policy, number_in
from esync.flagtypes import flag, non_negative_int, positive_int


@dataclass(frozen=True)
class LocalSGD(Policy):
    """Local SGD: `period` local iterations a round (1 during the first `warmup_steps`),
    then the models averaged, scaled by `global_lr` with Nesterov momentum
    `outer_momentum` (0: the plain average)."""

    period: int = flag(["--period"], 8, "localsgd: local iterations of each worker between "
                       "two averagings of the workers' models", type=positive_int)
    warmup_steps: int = flag(["--warmup-steps"], 0, "localsgd: during the first N local "
                             "iterations the models are averaged after every one",
                             type=non_negative_int)
    global_lr: float = config.LEARNING_RATE_GLOBAL
    outer_momentum: float = config.OUTER_MOMENTUM

    key = "localsgd"
    FLAGS = {"period": "period", "warmup_steps": "warmup_steps", "global_lr": "global_lr",
             "outer_momentum": "outer_momentum"}

    def __post_init__(self) -> None:
        number_in(self, "period", low=1)
        number_in(self, "warmup_steps", low=0)
        if not isinstance(self.period, int) or not isinstance(self.warmup_steps, int):
            raise ValueError(f"{self!r}: period and warmup_steps are whole numbers")
        number_in(self, "global_lr", low=0.0, low_open=True)
        number_in(self, "outer_momentum", low=0.0, high=1.0, high_open=True)

    def local_iterations(self, round_: int) -> int:
        """Round `round_`'s local iterations (rounds count from 1): 1 in the warm-up,
        `period` after it."""
        return 1 if round_ <= self.warmup_steps else self.period
