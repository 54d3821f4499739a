"""Aggregation rules: what a server does with the vectors workers push to its shard.

A rule owns the shard's weights and buffers. The server hands it each push chunk by
chunk (`add`), asks whether the round is complete (`ready`), then lets it finish the
round (`complete`) before every waiting worker is answered with the current weights.

- `sync` (SSGD): wait for all N gradients, average, one SGD step; average the buffers.
- `async` (ASGD): apply each gradient as it comes; buffers move 1/N of the way towards
  each worker's (so they track the workers' mean without waiting for anyone).
- `dcasgd` (DC-ASGD, Zheng et al. 2017): as async, with the delay compensation
  g + lamda * g * g * (w - w_backup[worker]), w_backup[worker] being the weights that
  worker last received.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

import numpy as np


@dataclass(frozen=True)
class RuleConfig:
    name: str
    num_workers: int
    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    lamda: float = 0.0

    @classmethod
    def from_header(cls, header: Dict[str, Any]) -> "RuleConfig":
        """Check a rule sent in an `init` header; ValueError says what is wrong."""
        if not isinstance(header, dict):
            raise ValueError("'rule' must be a map")
        name = header.get("name")
        if name not in RULES:
            raise ValueError(f"unknown rule {name!r} (expected one of {', '.join(RULES)})")
        numbers = {}
        for key, low in (("lr", 0.0), ("momentum", 0.0), ("weight_decay", 0.0), ("lamda", 0.0)):
            value = header.get(key, 0.0)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or \
                    not np.isfinite(value) or value < low:
                raise ValueError(f"rule field {key!r} must be a finite number >= {low}")
            numbers[key] = float(value)
        workers = header.get("num_workers")
        if not isinstance(workers, int) or workers < 1:
            raise ValueError("rule field 'num_workers' must be a positive integer")
        return cls(name, workers, **numbers)

    def to_header(self) -> Dict[str, Any]:
        return dict(self.__dict__)


class SGDStep:
    """SGD with momentum and weight decay, applied chunk by chunk (torch's convention:
    v = momentum * v + g + wd * w;  w -= lr * v)."""

    def __init__(self, weights: np.ndarray, config: RuleConfig):
        self.w = weights
        self.config = config
        self.velocity = np.zeros_like(weights) if config.momentum else None

    def apply(self, offset: int, grad: np.ndarray) -> None:
        c, sl = self.config, slice(offset, offset + len(grad))
        step = grad + c.weight_decay * self.w[sl] if c.weight_decay else grad
        if self.velocity is not None:
            v = self.velocity[sl]
            v *= c.momentum
            v += step
            step = v
        self.w[sl] -= c.lr * step


class Rule:
    """Base of the rules; `weights` and `buffers` are this server's shard, updated in place."""

    #: whether the weights may change before ZeroMQ has sent an answer holding them, so
    #: that answers must carry a snapshot. Asynchronous rules change them at the next
    #: push; SSGD only once every worker has received this round's answer and pushed again.
    snapshot_replies = True

    def __init__(self, weights: np.ndarray, buffers: np.ndarray, config: RuleConfig):
        self.weights, self.buffers, self.config = weights, buffers, config
        self.sgd = SGDStep(weights, config)

    def check(self, worker: int, round_: int) -> Optional[str]:
        """Why a push from `worker` for `round_` cannot be taken now (None: it can)."""
        return None

    def add(self, worker: int, offset: int, grad: np.ndarray) -> None:
        raise NotImplementedError

    def add_buffers(self, worker: int, offset: int, values: np.ndarray) -> None:
        raise NotImplementedError

    def pushed(self, worker: int) -> None:
        """All chunks of this worker's push have been added."""

    def ready(self) -> bool:
        return True

    def complete(self) -> None:
        """Finish the round once `ready()`."""

    def sent(self, worker: int) -> None:
        """The current weights were just sent to `worker`."""


class SyncRule(Rule):
    snapshot_replies = False

    def __init__(self, weights, buffers, config):
        super().__init__(weights, buffers, config)
        self.round = 1
        self.grad_sum = np.zeros_like(weights)
        self.buffer_sum = np.zeros_like(buffers)
        self.arrived: set = set()

    def check(self, worker, round_):
        if round_ != self.round:
            return f"push for round {round_}, but the current round is {self.round}"
        if worker in self.arrived:
            return f"worker {worker} already pushed round {round_}"
        return None

    def add(self, worker, offset, grad):
        self.grad_sum[offset:offset + len(grad)] += grad

    def add_buffers(self, worker, offset, values):
        self.buffer_sum[offset:offset + len(values)] += values

    def pushed(self, worker):
        self.arrived.add(worker)

    def ready(self):
        return len(self.arrived) == self.config.num_workers

    def complete(self):
        n = self.config.num_workers
        self.grad_sum /= n
        self.sgd.apply(0, self.grad_sum)
        np.divide(self.buffer_sum, n, out=self.buffers)
        self.grad_sum.fill(0)
        self.buffer_sum.fill(0)
        self.arrived.clear()
        self.round += 1


class AsyncRule(Rule):
    def add(self, worker, offset, grad):
        self.sgd.apply(offset, grad)

    def add_buffers(self, worker, offset, values):
        mine = self.buffers[offset:offset + len(values)]
        mine += (values - mine) / self.config.num_workers


class DCASGDRule(AsyncRule):
    def __init__(self, weights, buffers, config):
        super().__init__(weights, buffers, config)
        self.backup = [weights.copy() for _ in range(config.num_workers)]

    def add(self, worker, offset, grad):
        sl = slice(offset, offset + len(grad))
        drift = self.weights[sl] - self.backup[worker][sl]
        self.sgd.apply(offset, grad + self.config.lamda * grad * grad * drift)

    def sent(self, worker):
        np.copyto(self.backup[worker], self.weights)


RULES = {"sync": SyncRule, "async": AsyncRule, "dcasgd": DCASGDRule}


def make_rule(weights: np.ndarray, buffers: np.ndarray, config: RuleConfig) -> Rule:
    return RULES[config.name](weights, buffers, config)
