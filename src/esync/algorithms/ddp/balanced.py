"""Speed-balanced DDP (`-m ddp --balance-batches 1`): LB-BSP (Chen et al., SoCC 2018).

DDP as its users run it (esync.algorithms.ddp.worker), with the one change a user of a
heterogeneous cluster makes: each rank's batch is in proportion to its speed, so that
the ranks finish computing at about the same moment and none waits long in the
all-reduce. The global batch (-b times the ranks) and the learning rate stay those of
plain DDP.

- *Batches of the user's loader*: the global batch is the ranks' prepared loaders'
  batch sizes together (-b times the ranks in main.py's loop); each local iteration
  takes the next global batch of one order of the whole data set (the same on every
  rank: esync.runtime.loader's shared batches) and each rank its part, so that every rank takes
  as many steps in a pass, an epoch loop ends on every rank after the same step, and
  every sample is trained once a pass whatever the batches.
- *Speed*: each rank keeps the computing time of its steps as the loop measures it
  (`iteration_timed`: the simulated slowdown included, time inside collectives not),
  as seconds per sample of its batch. Every PERIOD rounds the ranks
  all-gather the median of their last 2 * PERIOD rounds (on a shared machine one
  period's median still swings with the others' load), and each computes the same new
  batches from them.
- *Batches* (`apportion`): in proportion to samples per second, none below --min-batch
  (BatchNorm's batch statistics collapse on a handful of samples), summing to the global
  batch exactly. A step also has a fixed cost, so a rank's speed measured at a small
  batch is lower than at a large one; re-estimating every PERIOD rounds converges to
  batches whose steps take equally long, as LB-BSP's and OmniLearn's controllers do.
- *Global batch* (`--global-batch`): `ranks`, as above and as LB-BSP keeps it; or
  `fastest` (`fastest_keeps`): at each estimate the fastest rank keeps its loader's batch
  and the global batch becomes what all the ranks compute in the time it computes that,
  its batch times the summed speed over its own, so that the job steps at the fastest
  device's pace on the batch its devices' summed speed affords (bench/oracle.py's
  large-batch oracle, which bounds what data parallelism can gain); the learning rate
  stays the user's.
- *Gradient*: each rank's loss is the mean over its own batch; before the all-reduce
  its gradients are weighed by W * b_k / B, so that DDP's average over the W ranks is
  the mean over the global batch of B samples.
Every round record carries the batches of that round (`batch_sizes`, by rank); each
change is logged as a line.

(main.py's built-in loop over data in memory draws each rank's batches from its own
partition, as plain DDP's, so a fast rank goes through its partition more often there.)
"""
from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import nn

from esync.algorithms.base import Job, Phases
from esync.algorithms.ddp.worker import DDPWorker
from esync.errors import UserError
from esync.comm.link import Link, link_of

log = logging.getLogger(__name__)

#: rounds between two estimates of the ranks' speeds
PERIOD = 10


def apportion(total: int, speeds: Sequence[float], floor: int) -> List[int]:
    """Whole batches in proportion to `speeds`, each at least `floor`, summing to
    `total` (which is at least `floor` times the number of ranks): a rank whose share
    would fall below the floor gets the floor and the others share the rest in
    proportion; the samples left by rounding down go to the largest remainders, the
    faster rank first where two are equal (speeds an ulp apart can give equal shares)."""
    if floor * len(speeds) > total:
        raise ValueError(f"{len(speeds)} batches of at least {floor} exceed {total}")
    floored: set = set()
    while True:
        free = [i for i in range(len(speeds)) if i not in floored]
        rest, weight = total - floor * len(floored), sum(speeds[i] for i in free)
        shares = {i: rest * speeds[i] / weight for i in free} if free else {}
        low = {i for i, share in shares.items() if share < floor}
        if not low:
            break
        floored |= low
    exact = [shares.get(i, float(floor)) for i in range(len(speeds))]
    batches = [int(x) for x in exact]
    by_remainder = sorted(range(len(speeds)), key=lambda i: (batches[i] - exact[i], -speeds[i]))
    for i in by_remainder[:total - sum(batches)]:
        batches[i] += 1
    return batches


def fastest_keeps(batches: Sequence[int], speeds: Sequence[float], floor: int) -> int:
    """--global-batch fastest: the samples the ranks compute while the fastest computes
    its own batch (its loader's): the step lasts that long, or, where the slowest rank
    needs longer for the smallest batch `floor`, that long; every rank computes for the
    step's time, the global batch is the summed speed times it (rounded, and at least
    `floor` for every rank)."""
    fastest = max(range(len(speeds)), key=speeds.__getitem__)
    seconds = max(batches[fastest] / speeds[fastest], floor / min(speeds))
    return max(round(seconds * sum(speeds)), floor * len(speeds))


class BalancedDDPWorker(DDPWorker):
    name = "ddp-balanced"

    def __init__(self, job: Job, eval_every: int, link: Link, max_rounds: Optional[int],
                 batch_size: int, min_batch: int, global_batch: str = "ranks"):
        super().__init__(job, eval_every, link, max_rounds)
        self.min_batch = min_batch
        self.by_fastest = global_batch == "fastest"  # --global-batch
        self.global_batch = batch_size * self.world
        self.batches = [batch_size] * self.world   # every rank's, in rank order
        self.loader_batches = list(self.batches)   # ... as their loaders give them
        self._used = self.batches                  # those of the round just ended
        self._per_sample: Deque[float] = deque(maxlen=2 * PERIOD)  # seconds a sample

    @classmethod
    def bind(cls, policy, opts, job: Optional[Job]) -> "BalancedDDPWorker":
        return cls(job, opts.eval_every, link_of(opts), opts.max_rounds, opts.batch_size,
                   policy.min_batch, policy.global_batch)

    def agreement(self) -> Dict[str, int]:
        return {"--balance-batches": 1, "-b": self.global_batch // self.world,
                "--min-batch": self.min_batch, "--global-batch": int(self.by_fastest)}

    def batch_size(self) -> int:
        return self.batches[self.rank]

    def loader_prepared(self, batch_size: int) -> None:
        """The global batch is the ranks' loaders' batches together (a collective: every
        rank prepares its loader), apportioned by speed from then on."""
        mine = torch.tensor([batch_size], dtype=torch.int64, device=self._device)
        everyone = [torch.zeros_like(mine) for _ in range(self.world)]
        dist.all_gather(everyone, mine)
        batches = [int(t.item()) for t in everyone]
        if self.min_batch * self.world > sum(batches):
            raise UserError(f"--min-batch {self.min_batch}: the ranks' loaders take "
                            f"{sum(batches)} samples a step together, fewer than "
                            f"{self.min_batch} for each of {self.world} ranks")
        self.global_batch = sum(batches)
        self.loader_batches = batches
        self.use(batches)
        self._used = self.batches

    def batch_slice(self) -> Tuple[int, int, int]:
        """This rank's part of each global batch: after the lower ranks' parts."""
        return sum(self.batches[:self.rank]), self.batches[self.rank], self.global_batch

    def iteration_timed(self, computing: float, samples: int) -> None:
        self._per_sample.append(computing / max(1, samples))
        self._job_samples += self.global_batch

    def end_round(self, round_: int, model: nn.Module) -> Phases:
        self._used = self.batches
        phases = super().end_round(round_, model)
        if round_ % PERIOD == 0:
            started = time.perf_counter()
            self._rebalance(round_)
            phases["balance batches"] = time.perf_counter() - started
        return phases

    def _rebalance(self, round_: int) -> None:
        mine = torch.tensor([statistics.median(self._per_sample)], dtype=torch.float64,
                            device=self._device)
        everyone = [torch.zeros_like(mine) for _ in range(self.world)]
        dist.all_gather(everyone, mine)
        speeds = [1.0 / max(t.item(), 1e-9) for t in everyone]
        if self.by_fastest:
            self.global_batch = fastest_keeps(self.loader_batches, speeds, self.min_batch)
        batches = apportion(self.global_batch, speeds, self.min_batch)
        if batches != self.batches:
            log.info("[%s] after round %d: batches %s (samples per second %s)", self.name,
                     round_, "/".join(map(str, batches)),
                     "/".join(f"{s:.0f}" for s in speeds))
        self.use(batches)

    def use(self, batches: List[int]) -> None:
        """Train on these batches (by rank) from the next step on: this rank's gradients
        are weighed by W * b_k / B, so that DDP's average is the global batch's mean."""
        self.batches = list(batches)
        self.gradient_scale = self.world * batches[self.rank] / sum(batches)

    def round_record(self) -> Dict[str, Any]:
        return {"batch_sizes": list(self._used)}
