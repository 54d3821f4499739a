"""ESync (Li et al.), one unit: a budget of local steps per round for each device, so
that all reach the aggregation together, then the round's model deltas averaged.

- `ESync` here: the policy (its settings, their flags, defaults and checks), torch-free;
- `budget`: the budget rule, torch-free and Django-free: the state server computes
  budgets with it and esync-stalls predicts them with it;
- `worker`: the worker's hooks (a round of its budget, push of the delta);
- `rule`: the servers' rule (the mean delta scaled by -gl, or an outer Nesterov step).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, List, Optional

from esync import config, registry
from esync.algorithms.policy import Policy, number_in
from esync.errors import UserError
from esync.flagtypes import (flag, momentum, positive_float, positive_int, share,
                              speed_share)


@dataclass(frozen=True)
class ESync(Policy):
    """ESync's settings: the most local iterations a device runs in a round
    (`max_local_steps`, --max-local-steps), how the round's deltas are averaged
    (`average`: "mean", "steps", "normalized" or "anchored", --average), the scale of the averaged
    delta (`global_lr`, -gl), Nesterov momentum of that outer step (`outer_momentum`,
    --outer-momentum: DiLoCo's), and seconds a round should take (`round_time`,
    --round-time; None: the slowest living device's one iteration, longer where the
    synchronisation would take more than `coordination_share` of the round:
    --coordination-share, 0 for the paper's rule; see budget.py), and the least speed,
as a share of the fastest device's, at which a device trains (`least_speed`,
--least-speed: slower ones sit rounds out; 0: every device trains, the paper's rule;
only with --average steps or anchored, where a device that trains nothing weighs
nothing)."""

    max_local_steps: int = flag(["--max-local-steps"], config.MAX_LOCAL_STEPS,
                                "esync: the most local iterations a device runs in a round",
                                type=positive_int)
    average: str = flag(["--average"], config.AVERAGE,
                        "esync: how the round's deltas are averaged: mean (each the same, "
                        "the paper's), steps (each weighted by its local steps, i.e. its "
                        "samples of the round), normalized (each divided by its local "
                        "steps, scaled by the mean steps: FedNova) or anchored (weighted "
                        "by steps, the move as long as the fastest device's own round)",
                        choices=list(registry.AVERAGES))
    global_lr: float = flag(["-gl", "--global-lr"], config.LEARNING_RATE_GLOBAL,
                            "esync, localsgd: scale of the averaged model delta",
                            type=positive_float)
    outer_momentum: float = flag(["--outer-momentum"], config.OUTER_MOMENTUM,
                                 "esync, localsgd: Nesterov momentum of the outer step on the "
                                 "averaged delta, -gl its learning rate (DiLoCo); 0: the "
                                 "plain average", type=momentum)
    round_time: Optional[float] = flag(["--round-time"], config.ROUND_TIME,
                                       "esync: seconds each round should take; every "
                                       "device runs as many local iterations as fit (at "
                                       "most --max-local-steps); default: the slowest "
                                       "living device's one iteration sets the round",
                                       type=positive_float)
    coordination_share: float = flag(["--coordination-share"], config.COORDINATION_SHARE,
                                     "esync: the most of a round its synchronisation (push, "
                                     "pull, budget request, as the devices measure it) may "
                                     "take: rounds are made long enough; 0: the paper's "
                                     "rule, the slowest device's one iteration",
                                     type=share)

    least_speed: float = flag(["--least-speed"], config.LEAST_SPEED,
                              "esync: a device slower than this share of the fastest "
                              "living device's measured speed sits rounds out (trains "
                              "nothing, weighs nothing) instead of dragging the fast "
                              "devices back with its stale iteration; 0: every device "
                              "trains, the paper's rule (the default: a device that "
                              "sits out takes its partition with it); only with "
                              "--average steps",
                              type=speed_share)

    #: the paper's rule (Li et al.), beside the defaults that measured better: every
    #: delta averaged the same, a round as long as the slowest device's one iteration,
    #: every device training
    PAPER = {"average": "mean", "coordination_share": 0.0, "least_speed": 0.0}

    key = "esync"
    FLAGS = {"max_local_steps": "max_local_steps", "average": "average",
             "global_lr": "global_lr", "outer_momentum": "outer_momentum",
             "round_time": "round_time", "coordination_share": "coordination_share",
             "least_speed": "least_speed"}

    def __post_init__(self) -> None:
        steps = self.max_local_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"ESync(max_local_steps={self.max_local_steps!r}): expected a "
                             f"positive integer")
        if self.average not in registry.AVERAGES:
            raise ValueError(f"ESync(average={self.average!r}): expected one of "
                             f"{', '.join(registry.AVERAGES)}")
        number_in(self, "global_lr", low=0.0, low_open=True)
        number_in(self, "outer_momentum", low=0.0, high=1.0, high_open=True)
        if self.round_time is not None:
            number_in(self, "round_time", low=0.0, low_open=True)
        number_in(self, "coordination_share", low=0.0, high=1.0, high_open=True)
        number_in(self, "least_speed", low=0.0, high=1.0)

    @property
    def sits_out(self) -> float:
        """The least speed that applies: --least-speed under --average steps or anchored
        (where a device's delta weighs as its steps, none for a device that sat out),
        else 0."""
        return self.least_speed if registry.AVERAGES[self.average].get("by_steps") else 0.0

    @classmethod
    def paper_flags(cls) -> List[str]:
        """The command line's flags that select the paper's rule (PAPER)."""
        spelled = {f.name: f.metadata["args"][0] for f in fields(cls)}
        return [item for name, value in cls.PAPER.items()
                for item in (spelled[name], f"{value:g}" if isinstance(value, float)
                             else str(value))]

    @classmethod
    def flags_given(cls, opts: Any) -> List[str]:
        return [flag for flag, given in ((f"--average {opts.average}",
                                          opts.average != config.AVERAGE),
                                         ("--outer-momentum", opts.outer_momentum),
                                         ("--round-time", opts.round_time is not None),
                                         ("--coordination-share",
                                          opts.coordination_share != config.COORDINATION_SHARE),
                                         ("--least-speed",
                                          opts.least_speed != config.LEAST_SPEED))
                if given]

    def check(self, opts: Any) -> None:
        if opts.compress.startswith("partial") and self.outer_momentum:
            raise UserError(f"--compress {opts.compress} leaves the other slices unmoved, "
                            f"which --outer-momentum would move: use one of them")
