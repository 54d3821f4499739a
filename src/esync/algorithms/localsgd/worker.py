"""Local SGD's hooks in a joined job: the shared push/pull (esync.algorithms.pushpull)
with rounds of the policy's local iterations and the round's delta pushed as it is."""
from __future__ import annotations

from typing import Optional, Tuple

from esync.algorithms.base import Job, Phases
from esync.algorithms.localsgd import LocalSGD
from esync.algorithms.pushpull import PushPull
from esync.algorithms.rules import RuleConfig
from esync.comm.compress import compression
from esync.comm.link import link_of


class LocalSGDWorker(PushPull):
    """A round is `policy.local_iterations(round)`; the servers' rule (ESync's, named
    `localsgd`) adds gl times the mean delta."""

    @classmethod
    def bind(cls, policy: LocalSGD, opts, job: Optional[Job]) -> "LocalSGDWorker":
        rule = RuleConfig(policy.key, job.num_workers, lr=policy.global_lr,
                          momentum=policy.outer_momentum)
        hooks = cls(rule, job, opts.eval_every, synchronous=True, link=link_of(opts),
                    backend=opts.backend, compression=compression(opts))
        hooks.lockstep = False  # a round is `period` local iterations
        return hooks

    def begin_round(self, round_: int) -> Tuple[int, Phases]:
        super().begin_round(round_)  # the weights the round's delta is taken from
        return self.policy.local_iterations(round_), {}

    def push_scale(self, steps: int) -> float:
        """The round's delta as it is: the rule sets w <- w + gl * mean(delta)."""
        return 1.0
