"""The baseline most users run today: PyTorch DistributedDataParallel (`-m ddp`).

Exactly what a DDP user writes: the model wrapped in `DistributedDataParallel`, gloo on
CPU (nccl on GPU), torch's own rendezvous (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT:
torchrun's variables, or launch/local.py's), `torch.optim.SGD` with the flags' learning
rate, momentum and weight decay, the same partitions and batch size as every mode. Each
step all-reduces the gradients (the average over ranks, DDP's default) during backward,
so every step waits for the slowest rank.

Three additions, each needed for the comparison and none changing DDP's arithmetic:
- *Agreeing to stop*: after each step rank 0 broadcasts one byte, whether the job ends
  (its time limit, its epochs, or the evaluator's target), so that no rank leaves a
  collective the others wait in. A DDP script with a time limit needs the same.
- *Publishing the model to the evaluator* (esync.publish) from rank 0, only when asked.
- *Timing the all-reduce*: it runs through torch's own `allreduce_hook` (the Python
  form of DDP's default all-reduce: the same sum divided by the world size), wrapped to
  time it, so that the log shows it as `global aggregate` and the simulated slowdown
  scales computing only; with `--bandwidth`/`--latency` the wrapper also holds it for
  the emulated link (esync.link.Link.before_allreduce: gloo has no byte-level hook).
Traffic is estimated, as gloo does not count bytes: a ring all-reduce of the gradients
sends (and receives) 2(W-1)/W of their bytes per step.
"""
from __future__ import annotations

import gc
import logging
import time
from typing import Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from esync.algorithms.base import Algorithm, Job, Phases
from esync.link import Link, link_of

log = logging.getLogger(__name__)


class DDP(Algorithm):
    name = "ddp"

    def __init__(self, job: Job, lr: float, momentum: float, weight_decay: float,
                 eval_every: int, link: Link):
        self.rank, self.world = job.rank, job.num_workers
        self.sgd = (lr, momentum, weight_decay)
        self.eval_every = eval_every
        self.link = link
        self.step_bytes = 0     # bytes a rank sends (and receives) per step
        self.store, self.host = job.store, job.host  # rank 0: to tell the evaluator
        self.optimizer: Optional[torch.optim.Optimizer] = None
        self.module: Optional[DistributedDataParallel] = None
        self.publisher = None
        self.bytes = 0          # estimated bytes sent (= received) by this rank
        self._comm_start: Optional[float] = None
        self._comm_end = 0.0
        self._device: Optional[torch.device] = None
        self._round = 0

    @classmethod
    def from_options(cls, opts, job: Optional[Job]) -> "DDP":
        return cls(job, opts.learning_rate, opts.momentum, opts.weight_decay,
                   opts.eval_every, link_of(opts))

    def setup(self, model: nn.Module, device: torch.device) -> None:
        self._device = device
        self.module = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
        self.module.register_comm_hook(None, self._allreduce)
        gradient_bytes = sum(p.numel() * p.element_size() for p in model.parameters()
                             if p.requires_grad)
        self.step_bytes = Link.ring_allreduce_bytes(gradient_bytes, self.world)
        self.optimizer = torch.optim.SGD(model.parameters(), lr=self.sgd[0],
                                         momentum=self.sgd[1], weight_decay=self.sgd[2])
        if self.rank == 0 and self.store is not None:
            from esync.publish import STORE_ADDRESS, ModelPublisher

            self.publisher = ModelPublisher(model, self.host)
            self.store.set(STORE_ADDRESS, self.publisher.address)
        dist.barrier()  # start the clocks together
        if self.publisher is not None:
            self.publisher.restart_clock()

    def training_module(self, model: nn.Module) -> nn.Module:
        return self.module

    # --- the all-reduce, timed and paced (only with emulation) ---------------------------
    def _allreduce(self, state, bucket):  # (no annotation: DDP checks its exact type)
        if self._comm_start is None:
            self._comm_start = time.perf_counter()
        nbytes = bucket.buffer().numel() * bucket.buffer().element_size()
        self.link.before_allreduce(nbytes, self.world)

        def done(fut):
            self._comm_end = time.perf_counter()
            return fut.value()

        return allreduce_hook(None, bucket).then(done)

    def communication_seconds(self) -> float:
        if self._comm_start is None:
            return 0.0
        seconds = max(0.0, self._comm_end - self._comm_start)
        self._comm_start = None
        return seconds

    # --- the round: one step -------------------------------------------------------------
    def begin_round(self, round_: int) -> Tuple[int, Phases]:
        self._round = round_
        return 1, {}

    def local_update(self, model: nn.Module) -> None:
        self.optimizer.step()
        self.bytes += self.step_bytes

    def end_round(self, round_: int, model: nn.Module) -> Phases:
        if self.publisher is not None:
            self.publisher.offer(round_)
        return {}

    def evaluates(self, round_: int) -> bool:
        return self.rank == 0 and self.eval_every > 0 and round_ % self.eval_every == 0

    @property
    def decides_stop(self) -> bool:
        return self.rank == 0

    def agree_stop(self, reason: Optional[str]) -> Optional[str]:
        if self.rank == 0:
            if reason is None and self.publisher is not None:
                reason = self.publisher.stop_reason
            decision = torch.tensor([1 if reason else 0], dtype=torch.uint8,
                                    device=self._device)
        else:
            decision = torch.zeros(1, dtype=torch.uint8, device=self._device)
        dist.broadcast(decision, src=0)
        if not decision.item():
            return None
        return reason if self.rank == 0 else "rank 0 ended the job"

    def traffic(self) -> Tuple[int, int]:
        return self.bytes, self.bytes

    def finish(self) -> None:
        # let the DDP module (and its hook, which refers back to this object) go now,
        # not at interpreter exit: collected then, gloo's thread still finishing its
        # last work aborts the process ("terminate called without an active exception")
        self.module = self.optimizer = None
        gc.collect()
        if self.publisher is not None:
            from esync.publish import STORE_FINISHED

            self.publisher.close()
            try:
                self.store.set(STORE_FINISHED, "1")
            except (RuntimeError, OSError):
                pass
