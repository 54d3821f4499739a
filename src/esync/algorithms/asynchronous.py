"""ASGD and its delay-compensated variant DC-ASGD (the original spells it `-m async
-dcasgd 1`): each worker's step is applied on the servers as it comes.

Their worker is the shared push/pull (esync.algorithms.pushpull); their server rules
(esync.algorithms.rules.AsyncRule, DCASGDRule) are a few lines beside the rules' shared
machinery.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List

from esync import config
from esync.algorithms.policy import Policy, number_in
from esync.flagtypes import flag, non_negative_float


@dataclass(frozen=True)
class ASGD(Policy):
    """Asynchronous SGD: each worker at its own pace, each step applied as it comes."""

    key = "async"


@dataclass(frozen=True)
class DCASGD(Policy):
    """DC-ASGD (Zheng et al. 2017): ASGD with each gradient compensated for its delay,
    g + lamda * g * g * (w - w_sent), `lamda` the variance-control factor."""

    lamda: float = flag(["--dcasgd-lamda"], config.DCASGD_LAMDA,
                        "DC-ASGD's variance-control factor", type=non_negative_float)

    key = "dcasgd"
    FLAGS = {"lamda": "dcasgd_lamda"}

    def __post_init__(self) -> None:
        number_in(self, "lamda", low=0.0)

    @classmethod
    def flags_given(cls, opts: Any) -> List[str]:
        return []  # --dcasgd-lamda is taken, and unused, with any mode, as it always was

