"""The baseline most users run today: PyTorch DistributedDataParallel (`-m ddp`).

Exactly what a DDP user writes: the model wrapped in `DistributedDataParallel` with its
defaults (its buffers, BatchNorm's statistics, broadcast from rank 0 at every forward),
gloo on CPU (nccl on GPU), torch's own rendezvous (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT: torchrun's variables, or esync/launch/local.py's), the loop's optimizer (the
built-in loop's `torch.optim.SGD` with the flags' learning rate, momentum and weight
decay), the same partitions and batch size as every mode. Each step all-reduces the gradients (the average over ranks, DDP's default)
during backward, so every step waits for the slowest rank.

Five additions, each needed for the comparison or by a script, none changing DDP's
arithmetic or adding a collective to a step (one all-gather at the start):
- *Evaluating on one rank*: a forward in evaluation mode runs the wrapped module alone
  (LocalEvaluation), without DDP's buffer broadcast, a collective the other ranks would
  never join when rank 0 validates by itself.
- *Agreeing to stop* without a collective per step: rank 0 decides (its time limit, its
  epochs, the evaluator's target) and writes the round after which every rank stops
  into torch.distributed's store, where every rank reads it after each step (one
  small request to the store, no waiting for anyone); a rank whose own loop ends first
  lowers it to the next round, which it takes with the others without training
  (`leave`: its last input forward and a zero loss backward, as DDP's Join shadows a
  rank out of data), so that no rank waits for it in a collective nor dies of its
  leaving. A decision taken after round r
  ends the job after round r+1: a rank that has finished round r+1 has all-reduced with
  rank 0 in it, so it surely sees what rank 0 wrote before that round; round r itself
  could be over on a rank before rank 0 decides. --max-rounds is written at the start,
  so that limit is exact. All ranks pass one barrier at the end (rank 0 hosts the store
  the others read until then).
- *Publishing the model to the evaluator* (esync.comm.publish) from rank 0, only when asked.
- *Agreeing on the flags that must match* (`agreement`): the ranks all-gather them once
  at the start and, if one differs from rank 0's, every rank stops with the same line
  naming the flag (ranks started by hand could otherwise disagree on collectives and
  hang, or weigh gradients differently).
- *Timing communication apart from computing*, so that the log shows it as `global
  aggregate` and the simulated slowdown (esync.runtime.train.Slowdown) scales computing only:
  the buffer broadcast is the gap between forward pre-hooks on the DDP module and on the
  module it wraps; the all-reduce runs through torch's own `allreduce_hook` (the Python
  form of DDP's default all-reduce: the same sum divided by the world size), wrapped to
  time it. With `--bandwidth`/`--latency` the wrapper also holds it for the emulated
  link (esync.comm.link.Link.before_allreduce: gloo has no byte-level hook).
Traffic is estimated, as gloo does not count bytes: a ring all-reduce of the gradients
sends (and receives) 2(W-1)/W of their bytes per step (the buffers' broadcast, small
beside them, is not counted).
"""
from __future__ import annotations

import gc
import logging
import os
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from esync.algorithms.base import Algorithm, Job, Phases
from esync.errors import UserError
from esync.comm.link import Link, link_of

log = logging.getLogger(__name__)

#: the store key holding the round after which every rank stops (0: not decided); a
#: job restarted by torchrun has keys of its own
STOP_KEY = "esync/ddp/stop-after-round/" + os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
#: why, where a rank other than rank 0 (or rank 0's own loop) ended the job early
WHY_KEY = STOP_KEY + "/why"


def _tensors(value: Any) -> List[torch.Tensor]:
    """The tensors in a module's output (a tensor, or tuples, lists and dicts of them)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    return []


class LocalEvaluation(DistributedDataParallel):
    """DistributedDataParallel, as its users run it, except that a forward in evaluation
    mode (`model.eval()`) runs the wrapped module alone, with no collective: rank 0
    validating by itself would otherwise start DDP's buffer broadcast, which the other
    ranks never join (a hang, or a crash once they have left)."""

    def forward(self, *args, **kwargs):
        if not self.module.training:
            return self.module(*args, **kwargs)
        return super().forward(*args, **kwargs)


class DDPWorker(Algorithm):
    name = "ddp"

    def __init__(self, job: Job, eval_every: int, link: Link,
                 max_rounds: Optional[int] = None):
        self.rank, self.world = job.rank, job.num_workers
        self.eval_every = eval_every
        self.link = link
        self.step_bytes = 0     # bytes a rank sends (and receives) per step
        self.store, self.host = job.store, job.host  # to stop, and for the evaluator
        self.max_rounds = max_rounds
        self.stop_after: Optional[int] = None  # the last round, once rank 0 has said it
        self._reason: Optional[str] = None      # rank 0: why it ends the job
        self.module: Optional[DistributedDataParallel] = None
        self.publisher = None
        self.bytes = 0          # estimated bytes sent (= received) by this rank
        self._comm_start: Optional[float] = None
        self._comm_end = 0.0
        self._forward_start: Optional[float] = None
        self._broadcast = 0.0   # seconds of the buffer broadcast of the last forward
        self.gradient_scale = 1.0  # this rank's gradients are multiplied by it before
        #                            the all-reduce (BalancedDDP weighs by batch size)
        self._device: Optional[torch.device] = None
        self._round = 0
        self._job_samples = 0  # every rank's samples so far (each step: all ranks')
        self._last_input: Optional[Tuple[tuple, dict]] = None  # of the last training step

    @classmethod
    def bind(cls, policy, opts, job: Optional[Job]) -> "DDPWorker":
        return cls(job, opts.eval_every, link_of(opts), opts.max_rounds)

    def agreement(self) -> Dict[str, int]:
        """The flags every rank must give alike, as integers: the same names in the same
        order in every DDP variant (the ranks all-gather them as one tensor), 0 where a
        flag does not matter (plain DDP ranks may give different -b)."""
        return {"--balance-batches": 0, "-b": 0, "--min-batch": 0, "--global-batch": 0}

    def _check_agreement(self) -> None:
        names, mine = zip(*self.agreement().items())
        values = torch.tensor(mine, dtype=torch.int64, device=self._device)
        everyone = [torch.zeros_like(values) for _ in range(self.world)]
        dist.all_gather(everyone, values)
        first = everyone[0].tolist()
        for rank, theirs in enumerate(everyone[1:], start=1):
            for name, expected, given in zip(names, first, theirs.tolist()):
                if given != expected:
                    raise UserError(f"{name}: rank {rank} gives {given}, rank 0 gives "
                                    f"{expected}; every rank of a DDP job must give the same")

    def setup(self, model: nn.Module, device: torch.device) -> None:
        self._device = device
        self._check_agreement()
        self.module = LocalEvaluation(
            model, device_ids=[device.index] if device.type == "cuda" else None)
        self.module.register_comm_hook(None, self._allreduce)
        self.module.register_forward_pre_hook(self._forward_begins, with_kwargs=True)
        model.register_forward_pre_hook(self._buffers_broadcast)
        gradient_bytes = sum(p.numel() * p.element_size() for p in model.parameters()
                             if p.requires_grad)
        self.step_bytes = Link.ring_allreduce_bytes(gradient_bytes, self.world)
        if self.rank == 0 and self.store is not None:
            from esync.comm.publish import STORE_ADDRESS, ModelPublisher

            self.publisher = ModelPublisher(model, self.host)
            self.store.set(STORE_ADDRESS, self.publisher.address)
        if self.rank == 0:
            self._say_stop_after(self.max_rounds or 0)
        dist.barrier()  # start the clocks together
        if self.rank != 0:
            self._read_stop_after()
        if self.publisher is not None:
            self.publisher.restart_clock()

    def training_module(self, model: nn.Module) -> nn.Module:
        return self.module

    # --- communication: the buffer broadcast and the all-reduce, timed and paced -------
    def _forward_begins(self, module, args, kwargs) -> None:  # DDP's: before the broadcast
        self._forward_start = time.perf_counter()
        if module.module.training:  # a training step's input: a last step may need it
            self._last_input = (args, kwargs)

    def _buffers_broadcast(self, module, args) -> None:  # the wrapped module's: after it
        if self._forward_start is not None:  # (not an evaluation of the bare model)
            self._broadcast = time.perf_counter() - self._forward_start
            self._forward_start = None

    def _allreduce(self, state, bucket):  # (no annotation: DDP checks its exact type)
        if self._comm_start is None:
            self._comm_start = time.perf_counter()
        if self.gradient_scale != 1.0:
            bucket.buffer().mul_(self.gradient_scale)
        nbytes = bucket.buffer().numel() * bucket.buffer().element_size()
        self.link.before_allreduce(nbytes, self.world)

        def done(fut):
            self._comm_end = time.perf_counter()
            return fut.value()

        return allreduce_hook(None, bucket).then(done)

    def communication_seconds(self) -> float:
        seconds, self._broadcast = self._broadcast, 0.0
        if self._comm_start is not None:
            seconds += max(0.0, self._comm_end - self._comm_start)
            self._comm_start = None
        return seconds

    # --- the round: one step -------------------------------------------------------------
    def begin_round(self, round_: int) -> Tuple[int, Phases]:
        self._round = round_
        return 1, {}

    def local_update(self, model: nn.Module, step: Callable[[], Any]) -> Any:
        self.bytes += self.step_bytes  # all-reduced in backward, stepped or skipped
        return step()

    def iteration_timed(self, computing: float, samples: int) -> None:
        self._job_samples += samples * self.world  # every rank's batch is as big

    def job_samples(self) -> Optional[int]:
        return self._job_samples

    def end_round(self, round_: int, model: nn.Module) -> Phases:
        if self.publisher is not None:
            self.publisher.offer(round_)
        return {}

    def evaluates(self, round_: int) -> bool:
        return self.rank == 0 and self.eval_every > 0 and round_ % self.eval_every == 0

    @property
    def decides_stop(self) -> bool:
        return self.rank == 0

    def agree_stop(self, reason: Optional[str], everyone: bool = False) -> Optional[str]:
        # --max-rounds (`everyone`) was written as the last round at the start
        if self.rank == 0:
            if reason is None and self.publisher is not None:
                reason = self.publisher.stop_reason
            self._reason = self._reason or reason
            if self._reason and (self.stop_after is None or self.stop_after > self._round + 1):
                self._lower_stop_after(self._round + 1)
        self._read_stop_after()  # (rank 0 too: a rank whose loop ended may have lowered it)
        if self.stop_after is None or self._round < self.stop_after:
            return None
        dist.barrier()  # no rank leaves (rank 0: with the store) while another reads it
        if self.rank == 0 and self._reason:
            return self._reason
        why = self.store.get(WHY_KEY).decode() if self.store.check([WHY_KEY]) else ""
        return why or "rank 0 ended the job"

    def leave(self, reason: str) -> bool:
        """This rank's loop ended (its own count, its own clock) while the others may
        be in their next step's collectives already: every rank stops after that step
        (the store's round, lowered), which this rank takes with them without training,
        as DDP's Join shadows a rank out of data: a forward on its last input and the
        backward of a zero loss (its gradients all-reduced as zeros), then the end's
        barrier. So no rank waits for it, nor dies of its leaving."""
        if self.module is None or self._last_input is None:
            return False
        self.store.set(WHY_KEY, reason)
        self._lower_stop_after(self._round + 1)
        args, kwargs = self._last_input
        training = self.module.training
        self.module.train()
        with torch.enable_grad():
            learned = [t for t in _tensors(self.module(*args, **kwargs)) if t.requires_grad]
            if not learned:
                raise RuntimeError(f"rank {self.rank}'s model gives no output with a "
                                   "gradient: it cannot take the job's last step")
            (sum(t.float().sum() for t in learned) * 0.0).backward()
        self.module.train(training)
        self.communication_seconds()  # (not logged: no round of its own)
        self._round += 1
        self.agree_stop(reason)  # the store's round is reached: the end's barrier
        return True

    def _lower_stop_after(self, round_: int) -> None:
        """Any rank: every rank stops after round `round_` at the latest."""
        while True:
            current = self.store.add(STOP_KEY, 0)
            if current and current <= round_:
                break
            if self.store.compare_set(STOP_KEY, str(current), str(round_)) == \
                    str(round_).encode():
                break
        self.stop_after = self.store.add(STOP_KEY, 0) or None

    def _say_stop_after(self, round_: int) -> None:
        """Rank 0: every rank stops after round `round_` (0: not decided)."""
        self.stop_after = round_ or None
        self.store.set(STOP_KEY, str(round_))
        self.store.add(STOP_KEY, 0)  # answered once the value is in (set is not)

    def _read_stop_after(self) -> None:
        self.stop_after = self.store.add(STOP_KEY, 0) or None

    def traffic(self) -> Tuple[int, int]:
        return self.bytes, self.bytes

    def finish(self) -> None:
        # let the DDP module (and its hook, which refers back to this object) go now,
        # not at interpreter exit: collected then, gloo's thread still finishing its
        # last work aborts the process ("terminate called without an active exception")
        self.module = None
        gc.collect()
        if self.publisher is not None:
            from esync.comm.publish import STORE_FINISHED

            self.publisher.close()
            try:
                self.store.set(STORE_FINISHED, "1")
            except (RuntimeError, OSError):
                pass
