"""Standalone training (`-m local`): one device, the user's optimizer, no communication."""
from __future__ import annotations

from typing import Optional, Tuple

from esync.algorithms.base import Algorithm, Job, Phases


class StandaloneSGD(Algorithm):
    """A round is `eval_every` local iterations, each round ends with an evaluation; with
    `eval_every` 0 a round is one iteration and the loop evaluates by the clock
    (--eval-interval)."""

    def __init__(self, eval_every: int):
        self.eval_every = eval_every

    @classmethod
    def bind(cls, policy, opts, job: Optional[Job]) -> "StandaloneSGD":
        algorithm = cls(opts.eval_every)
        algorithm.name = policy.key
        return algorithm

    def begin_round(self, round_: int) -> Tuple[int, Phases]:
        return max(1, self.eval_every), {}

    def evaluates(self, round_: int) -> bool:
        return self.eval_every > 0
