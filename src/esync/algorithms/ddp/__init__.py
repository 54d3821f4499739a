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


@dataclass(frozen=True)
class BalancedDDP(Policy):
    """DDP with each rank's batch in proportion to its measured speed, the global batch
    unchanged (LB-BSP); `min_batch` (--min-batch) is the smallest batch a rank gets."""

    min_batch: int = flag(["--min-batch"], config.MIN_BATCH,
                          "with --balance-batches: the smallest batch a worker is given",
                          type=positive_int)

    key = "ddp-balanced"
    FLAGS = {"min_batch": "min_batch"}

    def __post_init__(self) -> None:
        if isinstance(self.min_batch, bool) or not isinstance(self.min_batch, int) \
                or self.min_batch < 1:
            raise ValueError(f"BalancedDDP(min_batch={self.min_batch!r}): expected a "
                             f"positive integer")

    @classmethod
    def flags_given(cls, opts: Any) -> List[str]:
        return ["--balance-batches"] if opts.balance_batches else []

    def check(self, opts: Any) -> None:
        if self.min_batch > opts.batch_size:
            raise UserError(f"--min-batch {self.min_batch} is more than -b {opts.batch_size}: "
                            f"the workers' batches could not add up to the global batch")
