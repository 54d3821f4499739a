"""The worker's side of synchronous and asynchronous aggregation: at a round's end, push,
then pull (`--backend ps`: through the parameter servers, esync.comm.kvstore), or all-reduce
among the workers (`--backend allreduce`, SSGD and ESync only: esync.comm.allreduce), both
behind one interface (esync.algorithms.backend.Backend).

SSGD, ASGD and DC-ASGD run this class as it is: each round is one local iteration, a
step of the user's optimizer, and pushes that step as a gradient: (w_start - w) / lr,
lr being the rule's learning rate (-l), so that the servers' SGD step of lr (momentum
and weight decay are the worker's optimizer's, not the servers') moves the weights by
the optimizer's step, averaged (SSGD) or as it comes (ASGD, DC-ASGD). With
`torch.optim.SGD` (lr -l) that is the gradient itself, and SSGD's arithmetic is the
classic one, momentum and weight decay included (the mean of the workers' momentum
steps is the momentum step of the mean gradient); any other optimizer (AdamW) works
the same way, each worker keeping its own optimizer state. On the worker the three
are the same; they differ in the server's rule (esync.algorithms.rules): SSGD's server answers
once all workers pushed the round, ASGD's at once, DC-ASGD's at once with delay
compensation (of the step read as a gradient). ESync (esync.algorithms.esync.worker) builds on
it with a budget of local steps and pushes its model delta. With `--compress partial:K`
(esync.algorithms.partial) a round synchronises one slice of the weights.
"""
from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

from esync.algorithms.backend import Backend, Servers
from esync.algorithms.base import Algorithm, Job, Phases
from esync.algorithms.partial import PartialSync
from esync.algorithms.rules import RuleConfig
from esync.comm.compress import Compression, compression
from esync.comm.flat import FlatModel
from esync.comm.link import Link, link_of


class PushPull(Algorithm):
    job_epochs = True

    def __init__(self, rule: RuleConfig, job: Job, eval_every: int, synchronous: bool,
                 link: Optional[Link] = None, backend: str = "ps",
                 compression: Compression = Compression()):
        self.name = rule.name
        self.lockstep = synchronous  # SSGD; ASGD's workers each go at their own pace
        self.rule, self.job, self.node = rule, job, job.node
        self.backend_name, self.compression = backend, compression
        self.rank = job.rank
        self.servers = job.servers
        self.rejoin, self.resume = job.rejoin, job.resume
        self._continues: Optional[Tuple[Optional[int], float]] = None
        self.eval_every = eval_every
        self.synchronous = synchronous  # every worker waits for all in each round
        self.link = link
        self.flat: Optional[FlatModel] = None
        self.round_start_weights: Optional[torch.Tensor] = None
        self.backend: Optional[Backend] = None  # once set up
        self.partial: Optional[PartialSync] = None  # --compress partial:K
        self._announced: Optional[str] = None
        self._round_samples = 0  # samples of the round in progress (iteration_timed)
        self.resumed_from: Optional[int] = None

    @classmethod
    def bind(cls, policy, opts, job: Optional[Job]) -> "PushPull":
        rule = RuleConfig(policy.key, job.num_workers, opts.learning_rate,
                          lamda=getattr(policy, "lamda", 0.0))
        return cls(rule, job, opts.eval_every, policy.algorithm.synchronous, link_of(opts),
                   opts.backend, compression(opts))

    def setup(self, model: nn.Module, device: torch.device) -> None:
        self.flat = FlatModel(model, device)
        self.round_start_weights = torch.empty_like(self.flat.params)
        self._join_backend(model)
        if self.compression.kind == "partial":  # every slice as the job's model has it
            self.partial = PartialSync(self.compression, self.flat.params)

    def _join_backend(self, model: nn.Module) -> None:
        """Take the job's model from the servers or the other workers."""
        if self.backend_name == "allreduce":
            from esync.comm.allreduce import AllReduce  # torch.distributed: only where used

            self.backend = AllReduce(self.job, self.flat, self.rule, self.compression,
                                     self.link)
        else:
            self.backend = Servers(self.job, self.flat, self.rule, self.synchronous,
                                   self.compression, self.link)
        self._continues = self.backend.join(model)
        self.resumed_from = self.backend.resumed_from

    def continues(self):
        return self._continues

    def begin_round(self, round_: int) -> Tuple[int, Phases]:
        self.round_start_weights.copy_(self.flat.params)
        self._round_samples = 0
        return 1, {}

    def iteration_timed(self, computing: float, samples: int) -> None:
        self._round_samples += samples

    def job_samples(self) -> Optional[int]:
        """The samples every worker's rounds trained so far, as the last synchronisation
        said (the servers count them; the all-reduce sums them)."""
        return self.backend.job_samples if self.backend is not None else None

    def checkpointed(self) -> List[int]:
        return self.backend.checkpoints() if self.backend is not None else []

    #: the log's name of end_round's phase: push, wait for the servers, pull
    aggregate_phase = "global aggregate"

    def pushed(self, steps: int) -> torch.Tensor:
        """The vector this round pushes for the weights (on the model's device, in the
        flat model's `grads`, reused as its buffer): the weights' change over the round
        (partial: the slice's since its last synchronisation) times `push_scale(steps)`.
        With all-reduce, the weights go back to the round's start: the rule moves them
        from there."""
        change, params = self.flat.grads, self.flat.params
        if self.partial is not None:
            self.partial.change(params, out=change)
        else:
            torch.sub(params, self.round_start_weights, out=change)
        change.mul_(self.push_scale(steps))
        if self.backend.rewinds:
            if self.partial is not None:
                self.partial.rewind(params)
            else:
                params.copy_(self.round_start_weights)
        return change

    def round_steps(self) -> int:
        """The local steps of the round just ended."""
        return 1

    def push_scale(self, steps: int) -> float:
        """The optimizer's step as a gradient for the servers' SGD step of lr: -1/lr
        (partial: the sum of the `steps` steps' gradients)."""
        return -1.0 / self.rule.lr

    def pushed_steps(self, steps: int) -> Optional[int]:
        """The local steps the push reports (ESync averaging by steps), or None."""
        return None

    def end_round(self, round_: int, model: nn.Module) -> Phases:
        start = time.perf_counter()
        steps = self.round_steps()
        if self.partial is not None:
            steps = self.partial.begin(round_, steps)
        pushed = self.pushed(steps)
        if self.partial is not None and not self.backend.rewinds:
            self.partial.keep_local(self.flat.params)  # the servers' answer overwrites it
        self.backend.push_pull(round_, pushed, stop=self._announced,
                               steps=self.pushed_steps(steps), samples=self._round_samples)
        if self.partial is not None:
            self.partial.synchronised(self.flat.params, pulled=not self.backend.rewinds)
        return {self.aggregate_phase: time.perf_counter() - start}

    def round_record(self) -> Dict[str, Any]:
        """partial: the [start, stop) of the weights the round synchronised; sparse
        codecs: how many of the weights' values the push sent."""
        record: Dict[str, Any] = {}
        if self.partial is not None:
            record["synced"] = list(self.partial.window)
        if self.compression.sparse and self.backend is not None:
            record["pushed_values"] = self.backend.pushed_values
        return record

    def waited_seconds(self) -> float:
        """As the servers measured it (a push's wait there for the others'), or the
        all-reduce's control vector (it completes once all have come)."""
        return self.backend.waited if self.backend is not None else 0.0

    def evaluates(self, round_: int) -> bool:
        return self.rank == 0 and self.eval_every > 0 and round_ % self.eval_every == 0

    def agree_stop(self, reason: Optional[str], everyone: bool = False) -> Optional[str]:
        """SSGD and ESync: any worker's stop criterion ends the job for all (whichever
        worker is alive: worker 0 may have died), told through the servers with its next
        push; all then stop after that round (one leaving alone would stall the round).
        ASGD: a worker stops alone; worker 0 also tells the others, as before. A limit
        every worker reaches at the same round of its own (`everyone`: --max-rounds)
        stops each at once, untold: exactly that many rounds."""
        stop = self.backend.stop_reason
        if stop is not None:
            return stop if stop == self._announced else f"the job ends: {stop}"
        if reason is None or everyone:
            return reason
        if self.synchronous or self.rank == 0:
            self._announced = self._announced or reason
            return None
        return reason

    def final_model(self, model: nn.Module) -> None:
        if self.backend is not None:
            self.backend.final_model()

    def traffic(self) -> Tuple[int, int]:
        if self.backend is None:
            return 0, 0
        return self.backend.bytes_sent, self.backend.bytes_received

    def finish(self) -> None:
        if self.backend is not None:
            self.backend.close()
