"""The worker's side of `--backend allreduce`: SSGD and ESync without servers.

Beside esync.comm.kvstore, at the same level: where the kvstore pushes a round's gradient
(or delta) to the servers and pulls the new weights, here the workers sum it among
themselves with torch.distributed's all_reduce and each applies the update itself,
with the servers' own rule (esync.algorithms.rules) on its copy of the whole model, so that both
backends do the same arithmetic and every worker holds the same weights.

- *Process group*: gloo, or nccl when every worker trains on a GPU (a job of CPU and GPU
  workers uses gloo, through host copies). The job is started by the same DMLC_*
  variables and scheduler as a parameter-server job, with DMLC_NUM_SERVER=0: worker 0
  hosts torch's TCPStore on a free port and leaves its address with the scheduler
  (`rendezvous`), where the other workers and the evaluator find it.
- *A round*: one all_reduce (sum) of the pushed weights vector (with `--compress fp16`
  in float16, divided by the number of workers first so that the sum cannot overflow,
  as DDP's fp16 hook does; with `partial:K` of the round's slice only), after one of a
  small float32 vector holding the buffers (BatchNorm statistics; averaged by steps,
  also each worker's times its steps, rules.py taking their weighted mean), each worker's stop
  flag, its samples of the round (the job's count of samples trained, `job_samples`)
  and its local steps, each worker's in its own slot (ESync with --average steps,
  normalized or anchored, which needs their largest and their squares). That small one
  goes first, alone: it completes once every worker has come to the round's end, so its
  time is the round's wait for the others (`waited`) and the weights' all-reduce the
  communication. A worker whose stop criterion (or, on worker 0, the evaluator's) says
  stop raises its flag and leaves the reason in the store: all stop after that round,
  as with the servers.
- *Sparse codecs* (`topk:R`, `threshold:T`): each worker picks its values of the whole
  weights vector (with its error feedback, as esync.comm.compress does per chunk for the
  servers), says how many in the control vector, and the workers all_gather their int32
  indices and float32 values, padded to the most any sent (index 0, value 0), as
  torch's top-k and PowerSGD communication hooks gather rather than reduce; each adds
  them all up into the dense sum the rule takes.
- *The evaluator* pulls worker 0's model (esync.comm.publish), whose address is part of the
  rendezvous.
- *Failures*: an all-reduce cannot lose a member, so a dead worker ends the job: its
  peers' all_reduce fails at once when its connections drop (or after
  ALLREDUCE_TIMEOUT seconds if it hangs), and the scheduler, which hears of it too,
  aborts the job. Checkpoints, `--resume` and rejoining need the servers.

Traffic is estimated, as gloo and nccl do not count bytes: a ring all-reduce of n bytes
sends (and receives) 2(W-1)/W * n per worker, a ring all-gather of n bytes from each
(W-1) * n.
"""
from __future__ import annotations

import contextlib
import logging
import time
from datetime import timedelta
from typing import TYPE_CHECKING, List, Optional, Tuple

import torch
import torch.distributed as dist

from esync import config
from esync.comm.compress import Compression
from esync.comm.flat import FlatModel
from esync.comm.link import Link
from esync.algorithms.rules import BUFFERS, WEIGHTS, RuleConfig, make_rule
from esync.transport.node import JobAborted

if TYPE_CHECKING:
    from esync.algorithms.base import Job

log = logging.getLogger(__name__)

#: the store's key under which a worker leaves the reason it stops the job
STOP_KEY = "esync/stop/{rank}"
#: a sparse push's count travels in the float32 control vector as two parts below this
COUNT_BASE = 1 << 20


def agreed_backend(store: "dist.Store", rank: int, world: int, device: torch.device) -> str:
    """The process group's backend, the same on every rank: each rank writes its device's
    kind to `store` and reads every other's; nccl when every rank trains on a GPU, else
    gloo (a GPU rank's tensors then travel through host copies). A rank deciding from
    its own device alone would ask for nccl beside the CPU ranks' gloo, and the group
    would never form."""
    store.set(f"esync/device/{rank}", device.type)
    kinds = {store.get(f"esync/device/{r}").decode() for r in range(world)}
    return "nccl" if kinds == {"cuda"} else "gloo"


class AllReduce:
    """`flat` is the worker's model; `rule` the aggregation rule (as the servers would
    get it); `compression` as `--compress` says."""

    def __init__(self, job: "Job", flat: FlatModel, rule: RuleConfig,
                 compression: Compression = Compression(), link: Optional[Link] = None,
                 timeout: float = config.ALLREDUCE_TIMEOUT):
        self.node, self.rank, self.world = job.node, job.rank, job.num_workers
        self.host = job.host
        self.flat, self.config, self.compression = flat, rule, compression
        self.link = link or Link()
        self.timeout = timeout
        self.store: Optional[dist.TCPStore] = None
        self.publisher = None  # worker 0: the evaluator's source
        self.rule = None
        self.on_host = False  # gloo with a GPU model: collectives on host copies
        self.stop_reason: Optional[str] = None
        self.bytes_sent = self.bytes_received = 0
        self.waited = 0.0  # seconds the last round waited for the others (push_pull)
        self.job_samples = 0  # samples every worker's rounds trained so far (push_pull)
        self._started = time.monotonic()
        self._half: Optional[torch.Tensor] = None  # --compress fp16: the sent copy
        self._residual: Optional[torch.Tensor] = None  # sparse codecs: error feedback
        self.pushed_values = 0  # the weights' values the last round sent

    #: a push leaves the weights at the round's start: the rule moves them from there
    rewinds = True
    answers_later = False  # a collective: every rank in it at once
    #: never resumed: a job without servers keeps no checkpoints
    resumed_from = None

    # --- joining -----------------------------------------------------------------------
    def join(self, model: torch.nn.Module) -> None:
        """esync.algorithms.backend.Backend's: start, then start the clocks together."""
        self.start(model)
        self.node.barrier("workers")
        self.started()

    def start(self, model: torch.nn.Module) -> None:
        """Meet the other workers, join the process group and take worker 0's weights
        and buffers (rank 0 also opens the evaluator's publisher)."""
        if self.rank == 0:
            from esync.comm.publish import ModelPublisher

            self.publisher = ModelPublisher(model, self.host, self.config.name)
        with _failures(self.node, "joining the all-reduce"):  # a peer may die meanwhile
            backend = self._join()
            self.on_host = backend == "gloo" and self.flat.device.type != "cpu"
            params = torch.from_numpy(self.flat.host("params")) if self.on_host \
                else self.flat.params
            buffers = torch.from_numpy(self.flat.host("buffers")) if self.on_host \
                else self.flat.buffers
            self.rule = make_rule(params, buffers, self.config)
            if self.on_host:
                self.flat.host_state()
            for tensor in (params, buffers):
                if tensor.numel():
                    dist.broadcast(tensor, src=0)
        if self.on_host:
            self.flat.load_host_state()
        if self.rank == 0:
            log.info("[%s] all-reduce (%s) among %d workers%s", self.config.name, backend,
                     self.world, f", {self.compression} pushes"
                     if self.compression.kind != "none" else "")

    def _join(self) -> str:
        """Meet through rank 0's store, agree on the backend and form the process group;
        returns the backend."""
        if self.rank == 0:
            self.store = dist.TCPStore(self.host, 0, self.world, is_master=True,
                                       wait_for_workers=False,
                                       timeout=timedelta(seconds=self.timeout))
            self.node.rendezvous(store=f"{self.host}:{self.store.port}",
                                 evaluator=self.publisher.address)
        else:
            host, _, port = self.node.rendezvous()["store"].rpartition(":")
            self.store = dist.TCPStore(host, int(port), self.world, is_master=False,
                                       timeout=timedelta(seconds=self.timeout))
        device = self.flat.device
        backend = agreed_backend(self.store, self.rank, self.world, device)
        if backend == "nccl":
            torch.cuda.set_device(device)
        dist.init_process_group(backend, store=self.store, rank=self.rank,
                                world_size=self.world,
                                timeout=timedelta(seconds=self.timeout))
        return backend

    def started(self) -> None:
        """Every worker joined (after the scheduler's barrier): the clock starts."""
        self._started = time.monotonic()
        if self.publisher is not None:
            self.publisher.restart_clock()

    # --- a round -----------------------------------------------------------------------
    def push_pull(self, round_: int, pushed: torch.Tensor, stop: Optional[str] = None,
                  steps: Optional[int] = None, samples: int = 0) -> None:
        """Sum `pushed` (the round's gradient or delta, on the model's device) and the
        buffers over the workers, and apply the rule to the weights (which must be those
        the round started from) and buffers, in place. `samples`: this worker's of the
        round (summed into `job_samples`)."""
        if stop is None and self.publisher is not None:
            stop = self.publisher.stop_reason
        if stop is not None:
            self.store.set(STOP_KEY.format(rank=self.rank), stop[:500])
        flat, world = self.flat, self.world
        if self.on_host:  # the rule works on the host copies
            pushed = pushed.cpu()
            flat.host_state()
        buffers = self.rule.buffers
        sparse = self._sparse(pushed) if self.compression.sparse else None
        counts = 2 * world if sparse else 0  # each worker's count, in two parts
        # the buffers (by steps: times them, then as they are: rules.py takes their
        # weighted mean, or their mean where every worker ran 0 steps), each worker's
        # stop flag, its sparse count, its steps; the samples
        weighted = self.rule.config.by_steps and len(buffers) > 0
        nb = len(buffers) * (2 if weighted else 1)
        control = torch.zeros(nb + world + counts + world + 1,
                              dtype=torch.float32, device=pushed.device)
        control[nb - len(buffers):nb] = buffers
        if weighted:
            torch.mul(buffers, float(1 if steps is None else steps),
                      out=control[:len(buffers)])
        control[nb + self.rank] = 1.0 if stop is not None else 0.0
        if sparse:
            at = nb + world + 2 * self.rank  # exact in float32 below 2**44
            control[at:at + 2] = torch.tensor(divmod(len(sparse[0]), COUNT_BASE))
        control[-1 - world + self.rank] = float(1 if steps is None else steps)
        control[-1] = float(samples)  # exact in float32: a round's samples are < 2**24
        with _failures(self.node):
            # the small control vector first: it completes once every worker has come
            # to the round's end, so its time is the wait for the others, and the
            # weights' all-reduce after it the communication
            started = time.perf_counter()
            self._all_reduce(control)
            self.waited = time.perf_counter() - started
            if sparse:
                parts = control[nb + world:-1 - world].view(world, 2)
                most = int((parts[:, 0] * COUNT_BASE + parts[:, 1]).max())
                total = self._gather_sparse(*sparse, most, out=pushed)
            else:
                total = self._sum_weights(pushed, round_)
        self.rule.steps = control[-1 - world:-1].tolist()
        self.job_samples += int(control[-1])
        self.rule.aggregate((WEIGHTS, 0), total, world)
        if len(buffers):
            at = 0 if self.rule.buffers_by_steps else nb - len(buffers)
            self.rule.aggregate((BUFFERS, 0), control[at:at + len(buffers)], world)
        if self.on_host:
            flat.load_host_state()
        flags = control[nb:nb + world]
        if self.stop_reason is None and bool((flags > 0).any()):
            first = int(torch.nonzero(flags > 0)[0])
            self.stop_reason = self.store.get(STOP_KEY.format(rank=first)).decode()
        if self.publisher is not None:
            self.publisher.offer(self.rule.updates)

    def _sum_weights(self, pushed: torch.Tensor, round_: int) -> torch.Tensor:
        """The sum over the workers of `pushed` (float32), in its place (partial: of the
        round's slice, the rest being zero)."""
        self.pushed_values = len(pushed)
        if self.compression.kind == "partial":
            lo, hi = self.compression.window(round_, len(pushed))
            self.pushed_values = hi - lo
            if hi > lo:
                self._all_reduce(pushed[lo:hi])
            return pushed
        if self.compression.kind == "fp16":
            if self._half is None or self._half.device != pushed.device:
                self._half = torch.empty(pushed.shape, dtype=torch.float16,
                                         device=pushed.device)
            self._half.copy_(pushed.div_(self.world))
            self._all_reduce(self._half)
            return pushed.copy_(self._half).mul_(self.world)
        self._all_reduce(pushed)
        return pushed

    def _sparse(self, pushed: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """A sparse codec's (indices, values) of `pushed` with the error fed back; what
        is sent leaves the residual."""
        if self._residual is None or self._residual.device != pushed.device:
            self._residual = torch.zeros_like(pushed)
        index, values = self.compression.take(self._residual.add_(pushed))
        self.pushed_values = len(index)
        return index.to(torch.int32), values

    def _gather_sparse(self, index: torch.Tensor, values: torch.Tensor, most: int,
                       out: torch.Tensor) -> torch.Tensor:
        """Every worker's indices and values (padded to `most`), added up into `out`."""
        out.zero_()
        if most == 0:
            return out
        mine = torch.zeros(8 * most, dtype=torch.uint8, device=out.device)
        mine[:4 * len(index)] = index.view(torch.uint8)
        mine[4 * most:4 * (most + len(values))] = values.view(torch.uint8)
        gathered = [torch.empty_like(mine) for _ in range(self.world)]
        self.link.before_allgather(len(mine), self.world)
        dist.all_gather(gathered, mine)
        moved = Link.ring_allgather_bytes(len(mine), self.world)
        self.bytes_sent += moved
        self.bytes_received += moved
        for each in gathered:
            out.index_add_(0, each[:4 * most].view(torch.int32).long(),
                           each[4 * most:].view(torch.float32))
        return out

    def _all_reduce(self, tensor: torch.Tensor, async_op: bool = False):
        """Sum `tensor` over the workers in place (paced for the emulated link, counted);
        with `async_op`, the work to wait for."""
        nbytes = tensor.numel() * tensor.element_size()
        self.link.before_allreduce(nbytes, self.world)
        work = dist.all_reduce(tensor, async_op=async_op)
        moved = Link.ring_allreduce_bytes(nbytes, self.world)
        self.bytes_sent += moved
        self.bytes_received += moved
        return work

    # --- what PushPull reads (esync.algorithms.backend.Backend) -------------------------
    def checkpoints(self) -> List[int]:
        return []

    def final_model(self) -> None:
        """Every worker applied the same last round: its model is the job's."""

    @property
    def model_round(self) -> int:
        return 0 if self.rule is None else self.rule.updates

    @property
    def model_age(self) -> float:
        return time.monotonic() - self._started

    def close(self) -> None:
        if self.publisher is not None:
            self.publisher.close()
            self.publisher = None
        if dist.is_initialized():
            dist.destroy_process_group()
        self.store = None


@contextlib.contextmanager
def _failures(node, what: str = "the all-reduce among the workers"):
    """A failed collective (or store call) ends the job, saying what to look for."""
    try:
        yield
    except RuntimeError as e:  # gloo's, nccl's and the store's (DistNetworkError too)
        node.check()  # the scheduler's reason, if it already knows one
        raise JobAborted(f"{what} failed (a worker died or hung; "
                         f"an all-reduce job cannot go on without it): "
                         f"{str(e).splitlines()[0][:300]}") from None
