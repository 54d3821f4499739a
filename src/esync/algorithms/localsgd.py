"""Local SGD with a fixed period (`-m localsgd`), as PyTorch's post-local SGD
(`PostLocalSGDOptimizer` with `PeriodicModelAverager(period, warmup_steps)`) and torchft's
`LocalSGD(..., sync_every)`: the hand-tuned baseline that ESync's budgets replace.

Every worker runs `period` local iterations of its own optimizer (the built-in loop's
SGD with `-l`), then pushes its delta (its weights minus those it started the round
with) and its buffers; the servers' `localsgd` rule, ESync's rule with global learning
rate `-gl` (1.0: the plain mean) and no weighting by steps, waits for all N workers and
sets w <- w + gl * mean(delta): with -gl 1 the average of the workers' models, which
every worker receives and starts the next round from. During the first `warmup_steps`
local iterations a round is one local iteration, so the models are averaged after every
step (post-local SGD's warm-up; with plain SGD that is SSGD). `--outer-momentum M` makes
the averaged delta a pseudo-gradient for SGD with Nesterov momentum M and learning rate
`-gl` (DiLoCo's outer optimizer), as under ESync.

Unlike PyTorch's averager, whose first average after the warm-up comes one step after
it, every round after the warm-up here holds exactly `period` local iterations. A round
cut short (the job's stop, an epoch limit) pushes the delta of the iterations it ran.
"""
from __future__ import annotations

from typing import Optional, Tuple

from esync.algorithms.base import Job, Phases
from esync.algorithms.pushpull import PushPull
from esync.compress import Compression
from esync.link import Link, link_of
from esync.options import Options, compression
from esync.rules import RuleConfig


class LocalSGD(PushPull):
    """`LocalSGD(job, period=8, warmup_steps=0)`: the module's docstring says what it does."""

    #: the registry key (esync.registry): the rule name the servers are sent
    key = "localsgd"

    def __init__(self, job: Job, period: int, warmup_steps: int = 0, global_lr: float = 1.0,
                 outer_momentum: float = 0.0, eval_every: int = 0,
                 link: Optional[Link] = None, backend: str = "ps",
                 compression: Compression = Compression()):
        if period < 1 or warmup_steps < 0:
            raise ValueError(f"local SGD needs period >= 1 and warmup_steps >= 0, got "
                             f"{period} and {warmup_steps}")
        rule = RuleConfig(self.key, job.num_workers, lr=global_lr, momentum=outer_momentum)
        super().__init__(rule, job, eval_every, synchronous=True, link=link,
                         backend=backend, compression=compression)
        self.lockstep = False  # a round is `period` local iterations
        self.period, self.warmup_steps = period, warmup_steps

    @classmethod
    def from_options(cls, opts: Options, job: Optional[Job]) -> "LocalSGD":
        return cls(job, opts.period, opts.warmup_steps, opts.global_lr, opts.outer_momentum,
                   opts.eval_every, link_of(opts), opts.backend, compression(opts))

    def local_iterations(self, round_: int) -> int:
        """Round `round_`'s local iterations: 1 in the warm-up (rounds 1..warmup_steps,
        one local iteration each), `period` after it."""
        return 1 if round_ <= self.warmup_steps else self.period

    def begin_round(self, round_: int) -> Tuple[int, Phases]:
        super().begin_round(round_)  # the weights the round's delta is taken from
        return self.local_iterations(round_), {}

    def push_scale(self, steps: int) -> float:
        """The round's delta as it is: the rule sets w <- w + gl * mean(delta)."""
        return 1.0
