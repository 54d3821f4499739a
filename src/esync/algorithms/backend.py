"""The one interface in front of the two ways a round's pushes are combined: the
parameter servers (`--backend ps`: esync.comm.kvstore, wrapped here as `Servers`) and the
all-reduce among the workers (`--backend allreduce`: esync.comm.allreduce.AllReduce).
The push/pull worker (esync.algorithms.pushpull) calls it and never asks which.
"""
from __future__ import annotations

from typing import List, Optional, Protocol, Tuple

import numpy as np
import torch
from torch import nn

from esync.algorithms.base import Job
from esync.algorithms.rules import RuleConfig
from esync.comm.compress import Compression
from esync.comm.flat import FlatModel
from esync.comm.kvstore import KVStore
from esync.comm.link import Link
from esync.transport.node import JobAborted


class Backend(Protocol):
    """What a push/pull worker needs of the way its rounds are combined."""

    #: True: a push leaves the weights at the round's start and the rule moves them from
    #: there (all-reduce); False: the servers' answer overwrites them
    rewinds: bool
    #: True: push_later can push a round and take its answers with the next operation
    answers_later: bool
    stop_reason: Optional[str]   # a worker's stop, told with a round's answer
    job_samples: int             # samples every worker's rounds trained so far
    waited: float                # seconds the last round waited for the others
    bytes_sent: int              # traffic so far, cumulative
    bytes_received: int
    pushed_values: int           # the weights' values the last push sent (sparse codecs)
    resumed_from: Optional[int]  # the checkpoint round a resumed job took its model from

    def join(self, model: nn.Module) -> Optional[Tuple[Optional[int], float]]:
        """Take the job's model; for a process that continues a job (rejoining it,
        resuming it), its first round (None: after its own last) and the job's clock."""

    def push_pull(self, round_: int, pushed: torch.Tensor, stop: Optional[str] = None,
                  steps: Optional[int] = None, samples: int = 0) -> None:
        """Combine the round's `pushed` vector (on the model's device) and the buffers
        with the other workers'; the flat model then holds the job's."""

    def push_later(self, round_: int, pushed: torch.Tensor, stop: Optional[str] = None,
                   steps: Optional[int] = None, samples: int = 0) -> None:
        """As push_pull, without waiting for the others: the round's answer is taken by
        the next operation (`settle`), and the flat model keeps its weights. Only where
        `answers_later`, for a round whose pushes weigh nothing."""

    def answered(self) -> bool:
        """Whether the answer of a push_later has come (or none is outstanding), without
        waiting or taking it."""

    def settle(self, last: bool = False) -> bool:
        """Take the answer of a push_later (if one is outstanding: True): kept aside, as
        the flat model has moved on since, unless it tells the job's stop or the job
        ended with that round (`last`): then the flat model takes it, the job's model as
        of that round."""

    def checkpoints(self) -> List[int]:
        """The rounds the job's model was checkpointed at since the last call."""

    def final_model(self) -> None:
        """After the job stopped: bring the flat model to the job's last weights."""

    def close(self) -> None:
        """Leave; free sockets and process groups."""


class Servers:
    """The parameter servers as a Backend: a KVStore over the job's servers, and the ways
    a worker joins them (the first, its model the job's; the others, pulling it;
    one coming back into a running job; a job resumed from a checkpoint)."""

    rewinds = False
    answers_later = True
    #: attempts of a worker coming back to agree a round with every server
    JOIN_ATTEMPTS = 20

    def __init__(self, job: Job, flat: FlatModel, rule: RuleConfig, synchronous: bool,
                 compression: Compression, link: Optional[Link] = None):
        self.job, self.flat, self.rule, self.synchronous = job, flat, rule, synchronous
        self.kv = KVStore(job.node, job.servers, job.rank, flat.params.numel(),
                          flat.buffers.numel(), link, compression)
        self.resumed_from: Optional[int] = None
        self._unanswered = False  # a push_later's answers are still to be taken
        self._held: Tuple[np.ndarray, np.ndarray] = (np.empty(0), np.empty(0))

    # the KVStore's round-by-round state, read as the Backend's
    stop_reason = property(lambda self: self.kv.stop_reason)
    job_samples = property(lambda self: self.kv.job_samples)
    waited = property(lambda self: self.kv.waited)
    bytes_sent = property(lambda self: self.kv.bytes_sent)
    bytes_received = property(lambda self: self.kv.bytes_received)
    pushed_values = property(lambda self: self.kv.pushed_values)

    def join(self, model: nn.Module) -> Optional[Tuple[Optional[int], float]]:
        kv, flat, job = self.kv, self.flat, self.job
        params, buffers = flat.host_state()
        if job.rejoin:
            continues = self._come_back(params, buffers)
            flat.load_host_state()
            return continues
        if job.rank == 0:
            kv.init(self.rule.to_header(), params, buffers)
        else:
            self._pull()
        job.node.barrier("workers")  # start the clocks together
        if job.rank == 0:  # and the servers' (the evaluator reads it)
            self._pull(start=True)
        if not job.resume:
            return None
        self._pull()  # go on from the checkpoint's round and clock
        self.resumed_from = kv.model_round
        kv.checkpoints()  # the one resumed from is known
        return (kv.model_round + 1 if self.synchronous else None), kv.model_age or 0.0

    def _pull(self, **where) -> None:
        """The servers' model into the flat model (`where`: KVStore.pull's start or
        at_round)."""
        params, buffers = self.flat.host_state()
        self.kv.pull(params, buffers, **where)
        self.flat.load_host_state()

    def _come_back(self, params: np.ndarray,
                   buffers: np.ndarray) -> Tuple[Optional[int], float]:
        """Take a dead worker's place in a running job: pull the current model; in
        synchronous modes agree with every server on a round to take part from (a
        little ahead, so that none has begun it), and wait for it to start."""
        kv = self.kv
        kv.pull(params, buffers)
        first = None
        if self.synchronous:
            for _ in range(self.JOIN_ATTEMPTS):
                first = max(u or 0 for u in kv.server_updates) + 2
                if kv.join(first):
                    break
                kv.pull(params, buffers)
            else:
                raise JobAborted(f"worker {self.job.rank} could not agree a round to rejoin "
                                 f"at with the servers in {self.JOIN_ATTEMPTS} attempts")
            kv.pull(params, buffers, at_round=first)
        return first, kv.model_age or 0.0

    def push_pull(self, round_: int, pushed: torch.Tensor, stop: Optional[str] = None,
                  steps: Optional[int] = None, samples: int = 0) -> None:
        self.settle()
        flat = self.flat  # `pushed` is the flat model's grads vector
        self.kv.push_pull(round_, flat.to_host("grads"), flat.to_host("buffers"),
                          flat.host("params"), flat.host("buffers"), stop=stop, steps=steps,
                          samples=samples)
        flat.load_host_state()

    def push_later(self, round_: int, pushed: torch.Tensor, stop: Optional[str] = None,
                   steps: Optional[int] = None, samples: int = 0) -> None:
        self.settle()
        flat = self.flat  # copies: ZeroMQ sends them as they are while training goes on
        self._held = (flat.to_host("grads").copy(), flat.to_host("buffers").copy())
        self.kv.push_pull(round_, *self._held, None, None, stop=stop, steps=steps,
                          samples=samples)
        self._unanswered = True

    def answered(self) -> bool:
        return not self._unanswered or self.kv.answers_ready()

    def settle(self, last: bool = False) -> bool:
        if not self._unanswered:
            return False
        self._unanswered = False
        params, buffers = self._held  # the pushed copies, sent: the answers land there
        self.kv.receive_answers(params, buffers)
        if last or self.kv.stop_reason is not None:
            host_params, host_buffers = self.flat.host_state()
            host_params[:], host_buffers[:] = params, buffers
            self.flat.load_host_state()
        self._held = (np.empty(0), np.empty(0))
        return True

    def checkpoints(self) -> List[int]:
        return self.kv.checkpoints()

    def final_model(self) -> None:
        """ASGD and DC-ASGD: the others' last pushes come after worker 0 stopped; wait
        until every other worker has finished, then take the servers' model. (In SSGD
        and ESync the last round's pull is the job's model already.)"""
        if self.synchronous:  # the job's model: a first round's answers (ESync's start-up
            self.settle(last=True)  # keeps the device's own step: worker.py) if it ended then
            return
        self.job.node.wait_for_others()
        self._pull()

    def close(self) -> None:
        self.kv.close()
