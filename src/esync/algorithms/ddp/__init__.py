"""DDP, one unit: PyTorch's DistributedDataParallel as its users run it (`worker`), and
its speed-balanced variant (`balanced`: LB-BSP, `--balance-batches 1`). No servers.

The policies here are torch-free: the launchers check flags with them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List

from esync import config
from esync.algorithms.policy import Policy
from esync.errors import UserError
from esync.flagtypes import flag, positive_int


@dataclass(frozen=True)
class DDP(Policy):
    """PyTorch's DistributedDataParallel: every step all-reduces the gradients."""

    key = "ddp"

    def check(self, opts: Any) -> None:
        if opts.global_batch != config.GLOBAL_BATCH:
            raise UserError(f"--global-batch {opts.global_batch} needs --balance-batches 1 "
                            f"(plain DDP's ranks each take -b)")


#: speed-balanced DDP's global batches (--global-batch): the ranks' loaders' batches
#: together (LB-BSP's), or the fastest rank's batch times the ranks' summed speed over its
#: own (bench/oracle.py's large batch)
GLOBAL_BATCHES = ("ranks", "fastest")


@dataclass(frozen=True)
class BalancedDDP(Policy):
    """DDP with each rank's batch in proportion to its measured speed (LB-BSP);
    `min_batch` (--min-batch) is the smallest batch a rank gets; `global_batch`
    (--global-batch): "ranks", the global batch unchanged (-b times the ranks, LB-BSP's),
    or "fastest", the fastest rank keeps -b and the others get what they compute in
    the time it takes (the global batch -b times the ranks' summed speed over the
    fastest's, re-estimated with the speeds: the large-batch oracle of bench/oracle.py)."""

    min_batch: int = flag(["--min-batch"], config.MIN_BATCH,
                          "with --balance-batches: the smallest batch a worker is given",
                          type=positive_int)
    global_batch: str = flag(["--global-batch"], config.GLOBAL_BATCH,
                             "with --balance-batches: ranks (the global batch is -b times "
                             "the workers, LB-BSP's) or fastest (the fastest worker keeps "
                             "-b, every other gets the batch it computes meanwhile: the "
                             "global batch grows with the devices' summed speed)",
                             choices=list(GLOBAL_BATCHES))

    key = "ddp-balanced"
    FLAGS = {"min_batch": "min_batch", "global_batch": "global_batch"}

    def __post_init__(self) -> None:
        if isinstance(self.min_batch, bool) or not isinstance(self.min_batch, int) \
                or self.min_batch < 1:
            raise ValueError(f"BalancedDDP(min_batch={self.min_batch!r}): expected a "
                             f"positive integer")
        if self.global_batch not in GLOBAL_BATCHES:
            raise ValueError(f"BalancedDDP(global_batch={self.global_batch!r}): expected "
                             f"one of {', '.join(GLOBAL_BATCHES)}")

    @classmethod
    def flags_given(cls, opts: Any) -> List[str]:
        given = ["--balance-batches"] if opts.balance_batches else []
        if opts.global_batch != config.GLOBAL_BATCH and opts.mode != "ddp":  # ddp: DDP.check
            given.append(f"--global-batch {opts.global_batch}")
        return given

    def check(self, opts: Any) -> None:
        if self.min_batch > opts.batch_size:
            raise UserError(f"--min-batch {self.min_batch} is more than -b {opts.batch_size}: "
                            f"the workers' batches could not add up to the global batch")
