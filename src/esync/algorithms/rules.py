"""Aggregation rules: what a server does with the chunks workers push to its shard.

The machinery every rule shares (RuleConfig, SGDStep, Rule, SyncRule's round, make_rule),
in one module as Flower keeps its aggregation arithmetic in one; beside it the rules of
the algorithms whose worker is the shared push/pull (esync.algorithms.pushpull): SSGD's
is SyncRule itself, ASGD's and DC-ASGD's are a few lines each. ESync's own rule lives in
its unit (esync.algorithms.esync.rule).

A shard has two sections: 0, the weights, and 1, the buffers (BatchNorm statistics).
Pushes arrive chunk by chunk (`add`); a rule says when a chunk is *complete*, that is,
ready to be answered with the current values of that chunk, so that the server can
answer chunk i while chunk i+1 is still on the wire.

- `sync` (SSGD): a chunk is complete once all N workers pushed it for the round; then
  the averaged gradient takes one SGD step and the buffers become the workers' mean.
- `async` (ASGD): each gradient chunk takes an SGD step as it comes, and is complete at
  once; buffers move 1/N of the way towards each worker's (tracking the workers' mean
  without waiting for anyone).
- `esync` (ESync, Li et al.): as `sync`, with the round's model deltas averaged and
  scaled by `-gl` (its rule is ESync's own: esync.algorithms.esync.rule); averaged by
  steps (`by_steps`), the buffers too: each worker's weighs as its local steps of the
  round, so that a device that sat it out (0 steps, its buffers the last round's) does
  not hold the statistics back, and one that ran more steps (its statistics the
  fresher) counts more (where every worker ran 0 steps, a round that measured speeds,
  their plain mean).
- `dcasgd` (DC-ASGD, Zheng et al. 2017): as async, with the gradient compensated for
  delay: g + lamda * g * g * (w - w_backup[worker]), w_backup[worker] being the weights
  that worker last received.

The arithmetic runs in place on torch views of the numpy vectors (fused multiply-adds,
no temporaries), one chunk of a few MiB at a time, so it stays in cache. With
`--backend allreduce` (esync.comm.allreduce) each worker runs the same rule on its own copy
of the whole model (torch tensors, on its device), handing `aggregate` the sum the
all-reduce made: both backends do the same arithmetic.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Tuple

import numpy as np
import torch

from esync import registry

WEIGHTS, BUFFERS = 0, 1

# Frames received without a copy are read-only; torch warns when it views them, though
# the rules only ever read pushed values.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


def _t(array) -> torch.Tensor:
    """A torch view of a numpy vector (a tensor is taken as it is)."""
    return array if isinstance(array, torch.Tensor) else torch.from_numpy(array)


@dataclass(frozen=True)
class RuleConfig:
    name: str
    num_workers: int
    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    lamda: float = 0.0
    normalize: bool = False  # esync: FedNova's normalised averaging of the deltas
    by_steps: bool = False   # esync: the deltas' mean weighted by their local steps
    anchored: bool = False   # esync, with by_steps: that mean scaled to the most steps'

    @classmethod
    def from_header(cls, header: Dict[str, Any]) -> "RuleConfig":
        """Check a rule sent in an `init` header; ValueError says what is wrong."""
        if not isinstance(header, dict):
            raise ValueError("'rule' must be a map")
        name = header.get("name")
        names = [a.key for a in registry.with_rules()]
        if name not in names:
            raise ValueError(f"unknown rule {name!r} (expected one of {', '.join(names)})")
        numbers = {}
        for key in ("lr", "momentum", "weight_decay", "lamda"):
            value = header.get(key, 0.0)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or \
                    not np.isfinite(value) or value < 0:
                raise ValueError(f"rule field {key!r} must be a finite number >= 0")
            numbers[key] = float(value)
        workers = header.get("num_workers")
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise ValueError("rule field 'num_workers' must be a positive integer")
        switches = {}
        for key in ("normalize", "by_steps", "anchored"):
            switches[key] = header.get(key, False)
            if not isinstance(switches[key], bool):
                raise ValueError(f"rule field {key!r} must be true or false")
        if switches["normalize"] and switches["by_steps"]:
            raise ValueError("rule fields 'normalize' and 'by_steps' exclude each other")
        if switches["anchored"] and not switches["by_steps"]:
            raise ValueError("rule field 'anchored' needs 'by_steps'")
        if numbers["momentum"] >= 1:
            raise ValueError("rule field 'momentum' must be below 1")
        return cls(name, workers, **numbers, **switches)

    def to_header(self) -> Dict[str, Any]:
        return dict(self.__dict__)


class SGDStep:
    """SGD with momentum and weight decay on a slice of the weights (torch's convention:
    v = momentum * v + g + wd * w;  w -= lr * v), for gradients that arrive multiplied
    by 1/`grad_scale` (SSGD hands in the sum of N gradients: scale 1/N). The velocity is
    kept divided by the scale, so that each step is two fused passes over the slice."""

    def __init__(self, weights: np.ndarray, config: RuleConfig, grad_scale: float = 1.0):
        self.w = _t(weights)
        self.config = config
        self.scale = grad_scale
        self.velocity = torch.zeros_like(self.w) if config.momentum else None

    def apply(self, offset: int, grad: torch.Tensor) -> None:
        c, sl = self.config, slice(offset, offset + len(grad))
        w = self.w[sl]
        if c.weight_decay:  # scale * (g + (wd / scale) * w) = scale * g + wd * w
            grad = torch.add(grad, w, alpha=c.weight_decay / self.scale)
        if self.velocity is not None:
            u = self.velocity[sl]
            torch.add(grad, u, alpha=c.momentum, out=u)  # u = g + momentum * u
            grad = u
        w.add_(grad, alpha=-c.lr * self.scale)

    def state(self) -> Dict[str, np.ndarray]:
        return {} if self.velocity is None else {"velocity": self.velocity.numpy()}

    def restore(self, tensors: Dict[str, np.ndarray]) -> None:
        if self.velocity is not None and "velocity" in tensors:
            self.velocity.copy_(torch.from_numpy(tensors["velocity"]))


Key = Tuple[int, int]  # (section, offset)


class Rule:
    """Base of the rules; `weights` and `buffers` are this server's shard, updated in place."""

    #: whether a chunk may change before ZeroMQ has sent an answer holding it, so that
    #: answers must carry a copy. Asynchronous rules change it at the next push; SSGD
    #: only once every worker has received this round's answer and pushed again.
    snapshot_replies = True

    def grad_scale(self, config: RuleConfig) -> float:
        """The factor that turns a pushed gradient into the one to apply (SSGD: 1/N, as
        it hands in the sum of N gradients)."""
        return 1.0

    def __init__(self, weights: np.ndarray, buffers: np.ndarray, config: RuleConfig):
        self.weights, self.buffers, self.config = weights, buffers, config
        self.sgd = SGDStep(weights, config, self.grad_scale(config))
        #: completions of the shard's first weight chunk: the model's round (rounds in
        #: SSGD and ESync, pushes in ASGD), which answers carry as `updates`
        self.updates = 0

    def check(self, worker: int, round_: int, key: Key) -> Optional[str]:
        """Why this chunk of a push cannot be taken now (None: it can)."""
        return None

    def late(self, worker: int, round_: int) -> bool:
        """Whether a push of `round_` comes after its round was aggregated without it (a
        worker that missed rounds while a server was restarted): it is answered with
        the current values at once and not taken."""
        return False

    def move_to(self, round_: int) -> List[Key]:
        """Before a push of `round_` is added: a restored shard learns from the workers'
        pushes which round it is (SyncRule.restore). Returns the chunks whose earlier
        pushes must now be answered without being taken."""
        return []

    def add(self, worker: int, key: Key, values: np.ndarray,
            steps: Optional[int] = None) -> bool:
        """Take a pushed chunk (`steps`: the pusher's local steps of the round, where it
        says); True when the chunk is complete and can be answered."""
        raise NotImplementedError

    def sent(self, worker: int, key: Key, length: int) -> None:
        """This chunk's current values were just sent to `worker`."""

    # --- membership: workers that die and come back ------------------------------------
    def leave(self, worker: int) -> List[Key]:
        """`worker` died: forget it; the chunks now complete without it."""
        return []

    def join(self, worker: int, round_: int) -> bool:
        """`worker` comes back and takes part from round `round_` on; False if that round
        is already under way without it."""
        return True

    def joined(self, worker: int, round_: int) -> bool:
        """Whether round `round_`, which `worker` joins at, may start for it now."""
        return True

    @property
    def at_boundary(self) -> bool:
        """Whether the shard is between rounds (a consistent state to checkpoint)."""
        return True

    # --- checkpoints ----------------------------------------------------------------------
    def state(self) -> Tuple[Dict[str, np.ndarray], Dict[str, Any]]:
        """The rule's tensors and settings beyond the weights and buffers."""
        return self.sgd.state(), {}

    def restore(self, tensors: Dict[str, np.ndarray], meta: Dict[str, Any],
                members: Iterable[int]) -> None:
        """Take back `state()`; `members` are the workers alive now."""
        self.sgd.restore(tensors)
        self.updates = int(meta.get("updates", 0))


class SyncRule(Rule):
    snapshot_replies = False

    def grad_scale(self, config):
        return 1.0 / config.num_workers

    def __init__(self, weights, buffers, config):
        super().__init__(weights, buffers, config)
        self.round = 1
        self.members = set(range(config.num_workers))  # the living workers
        self.joining: Dict[int, int] = {}  # worker -> the round it comes back at
        self.resync = False  # restored: the workers' pushes say which round it is
        self.sums: Optional[Tuple[np.ndarray, np.ndarray]] = None  # made on first use
        self.round_steps: Dict[int, int] = {}  # worker -> its local steps this round
        #: the living workers' local steps of the round being aggregated
        self.steps: List[float] = [1.0] * config.num_workers
        # pushed chunks held (as views of their frames) until the last worker's arrives
        self.held: Dict[Key, Dict[int, np.ndarray]] = {}
        self.completed = 0  # values of this round already aggregated

    def check(self, worker, round_, key):
        if worker not in self.members:
            return f"worker {worker} is not taking part in round {self.round}"
        if round_ != self.round and not (self.resync and round_ > self.round):
            return f"push for round {round_}, but the current round is {self.round}"
        if worker in self.held.get(key, ()):
            return f"worker {worker} already pushed chunk {key} of round {round_}"
        return None

    def late(self, worker, round_):
        return worker in self.members and round_ < self.round

    def move_to(self, round_):
        if round_ <= self.round:
            return []
        # restored: the workers are further on than the checkpoint
        flushed, self.held = list(self.held), {}
        self.round, self.completed = round_, 0
        self.updates = round_ - 1  # the rounds the job has completed
        return flushed

    def add(self, worker, key, values, steps=None):
        self.held.setdefault(key, {})[worker] = values
        if steps is not None and key[0] == WEIGHTS:
            self.round_steps[worker] = steps
        return self._complete(key)

    def _complete(self, key: Key) -> bool:
        """Aggregate chunk `key` if every living worker pushed it."""
        held = self.held.get(key)
        if not held or not self.members or not self.members <= set(held):
            return False
        del self.held[key]
        section, offset = key
        parts = [held[w] for w in sorted(self.members)]
        length = len(parts[0])
        if self.sums is None:
            self.sums = (np.empty_like(self.weights), np.empty_like(self.buffers))
        if section == WEIGHTS or self.config.by_steps:
            self.steps = [float(self.round_steps.get(w, 1)) for w in sorted(self.members)]
        out = self.sums[section][offset:offset + length]
        total = self._sum(parts, out, self.steps if section == BUFFERS and
                          self.buffers_by_steps else None)
        self.aggregate(key, total, len(parts))
        self.completed += length
        if self.completed == len(self.weights) + len(self.buffers):
            self.round, self.completed, self.resync = self.round + 1, 0, False
            self.round_steps = {}
            for w, at in list(self.joining.items()):
                if at == self.round:
                    self.members.add(w)
                    del self.joining[w]
        return True

    @property
    def buffers_by_steps(self) -> bool:
        """Whether the round's buffers are the steps-weighted mean (pushed, or summed,
        times their steps): averaged by steps, unless every worker ran 0 steps (a round
        that measured speeds: then their plain mean)."""
        return self.config.by_steps and any(self.steps)

    @property
    def mean_steps(self) -> float:
        """The living workers' mean number of local steps of the round being aggregated."""
        return float(np.mean(self.steps))

    def aggregate(self, key: Key, total: torch.Tensor, count: int) -> None:
        """Apply `total`, the sum of `count` workers' pushes of chunk `key` (the held
        chunks' sum here; the all-reduce's sum in esync.comm.allreduce). The weights take the
        rule's step; the buffers become the mean."""
        section, offset = key
        if count != self.config.num_workers:  # fewer living workers: their mean
            total = total.mul(self.config.num_workers / count)
        if section == WEIGHTS:
            self._update_weights(offset, total)
            self.updates += offset == 0
        else:  # their mean (buffers_by_steps: of buffers * steps, weighted)
            torch.mul(total, 1.0 / (self.config.num_workers *
                                    (self.mean_steps if self.buffers_by_steps else 1.0)),
                      out=_t(self.buffers)[offset:offset + len(total)])

    def leave(self, worker):
        self.members.discard(worker)
        self.joining.pop(worker, None)
        for held in self.held.values():
            held.pop(worker, None)
        return [key for key in list(self.held) if self._complete(key)]

    def join(self, worker, round_):
        if round_ < self.round or (round_ == self.round and self.completed):
            return False
        if round_ == self.round:
            self.members.add(worker)
        else:
            self.joining[worker] = round_
        return True

    def joined(self, worker, round_):
        return self.round >= round_

    @property
    def at_boundary(self):
        return self.completed == 0

    def state(self):
        tensors, meta = super().state()
        return tensors, dict(meta, next_round=self.round)

    def restore(self, tensors, meta, members):
        super().restore(tensors, meta, members)
        self.members = set(members)
        self.round = int(meta.get("next_round", 1))
        self.resync = True

    def _update_weights(self, offset: int, total: torch.Tensor) -> None:
        """`total` is the sum of the N workers' pushed gradients for this chunk."""
        self.sgd.apply(offset, total)

    @staticmethod
    def _sum(parts, out: np.ndarray, weights: Optional[List[float]] = None) -> torch.Tensor:
        """The parts' sum (each times its weight, where given), in `out` (one part
        unweighted: itself)."""
        if weights is not None:
            total = torch.mul(_t(parts[0]), weights[0], out=_t(out))
            for part, weight in zip(parts[1:], weights[1:]):
                total.add_(_t(part), alpha=weight)
            return total
        if len(parts) == 1:
            return _t(parts[0])
        total = torch.add(_t(parts[0]), _t(parts[1]), out=_t(out))
        for part in parts[2:]:
            total.add_(_t(part))
        return total


class AsyncRule(Rule):
    def add(self, worker, key, values, steps=None):
        section, offset = key
        if section == WEIGHTS:
            self.sgd.apply(offset, self._compensate(worker, offset, _t(values)))
            self.updates += offset == 0
        else:  # b += (pushed - b) / N
            mine = _t(self.buffers[offset:offset + len(values)])
            mine.lerp_(_t(values), 1.0 / self.config.num_workers)
        return True

    def _compensate(self, worker: int, offset: int, grad: torch.Tensor) -> torch.Tensor:
        return grad


class DCASGDRule(AsyncRule):
    def __init__(self, weights, buffers, config):
        super().__init__(weights, buffers, config)
        # the weights each worker last received; None: dropped (a dead worker)
        self.backup: List[Optional[torch.Tensor]] = [
            torch.from_numpy(weights.copy()) for _ in range(config.num_workers)]

    def _compensate(self, worker, offset, grad):
        if self.backup[worker] is None:  # nothing sent to it since it came back
            return grad
        sl = slice(offset, offset + len(grad))
        drift = self.sgd.w[sl] - self.backup[worker][sl]
        return grad + self.config.lamda * grad * grad * drift

    def sent(self, worker, key, length):
        section, offset = key
        if section == WEIGHTS:
            if self.backup[worker] is None:
                self.backup[worker] = self.sgd.w.clone()
            self.backup[worker][offset:offset + length].copy_(self.sgd.w[offset:offset + length])

    def leave(self, worker):
        self.backup[worker] = None
        return []

    def state(self):
        tensors, meta = super().state()
        for k, backup in enumerate(self.backup):
            if backup is not None:
                tensors[f"backup{k}"] = backup.numpy()
        return tensors, meta

    def restore(self, tensors, meta, members):
        super().restore(tensors, meta, members)
        self.backup = [torch.from_numpy(tensors[f"backup{k}"].copy())
                       if f"backup{k}" in tensors and k in set(members) else None
                       for k in range(self.config.num_workers)]


def make_rule(weights: np.ndarray, buffers: np.ndarray, config: RuleConfig) -> Rule:
    """The rule of algorithm `config.name` (esync.registry's row names its class) on
    this shard."""
    return registry.ALGORITHMS[config.name].rule_class()(weights, buffers, config)
