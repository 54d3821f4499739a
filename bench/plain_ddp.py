"""The plain DistributedDataParallel script that bench/ddp_fidelity.py compares `-m ddp`
with: what a DDP user writes, plus the simulated slowdown and a time limit.

One rank: a gloo process group (rank 0 hosts the TCPStore, on the given port or on a
free one it reports through esync.infra.ready), `DistributedDataParallel(build_network(
"lenet"))` with DDP's defaults (broadcast_buffers=True, 25 MB buckets, ...),
`torch.optim.SGD(lr=0.05, momentum=0.9)`, cross-entropy, one torch thread. Batches: 64
per rank from esync's data classes, so the same samples in the same order as `-m ddp`
(the digits, `partition(labels, world, rank, by_class=False, seed=0)`, CorgiPile's
`EpochOrder(seed=[0, rank])`, `BatchStream`): a plain DataLoader would add its own
per-batch costs, which are not what is being compared.

Slowdown F (esync.infra.clock.Slowdown, as in -m ddp): after each step the rank sleeps until
the step's computing has lasted F times the median of its last 15 steps' computing (their CPU
time, the thread's, with one torch thread; else wall time), where computing is the step's
wall time (batch, forward, backward, optimizer step) less the time spent in collectives:
- DDP's buffer broadcast at the start of its forward: the gap between a forward
  pre-hook on the DDP module and one on the wrapped module;
- the gradient all-reduce: a comm hook wrapping torch's own `allreduce_hook` (DDP's
  default arithmetic), from its first bucket's call to its last future's completion.

Stop: rank 0 looks at its clock after each step n; once `seconds` have passed it sets
`last = n + 1` in the TCPStore (then reads it back, a round trip, so the store holds it
before rank 0 can start step n + 1). Every rank checks for the key after each step (one
store round trip, no collective) and stops after step `last`. No rank can end step
n + 1 before rank 0 has joined that step's all-reduce, so every rank sees the key by
then: all run the same steps, none waits in a collective the others left. A barrier
after the last step keeps rank 0 (and its store) up until every rank has read it.

Result (JSON), per step: its end time (seconds since DDP's construction, its first
collective; taken after the slowdown's sleep, when the next step can start), and the
seconds it spent in the collectives, in computing and in the store check.
"""
from __future__ import annotations

import gc
import json
import time

from nodes import gloo_group

LR, MOMENTUM, BATCH, SEED = 0.05, 0.9, 64, 0
TIMEOUT_S = 120.0


def run(rank: int, world: int, port: int, slowdown: float, seconds: float,
        result: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    from esync.data.batches import BatchStream
    from esync.data.datasets import load_dataset
    from esync.data.partition import partition
    from esync.data.shuffle import EpochOrder
    from esync.models import build_network
    from esync.infra.clock import Slowdown

    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    store = gloo_group(rank, world, port, TIMEOUT_S)

    dataset = load_dataset("digits", "data")
    order = EpochOrder(partition(dataset.train_labels.numpy(), world, rank, False, SEED),
                       "corgipile", seed=[SEED, rank])
    batches = BatchStream(dataset, order, BATCH, torch.device("cpu"))
    model = build_network("lenet")
    ddp = DistributedDataParallel(model)  # broadcasts rank 0's weights: all start here
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=MOMENTUM)

    # --- time spent in collectives, per step -----------------------------------------
    comm = {"pre": 0.0, "broadcast": 0.0, "start": None, "end": 0.0}

    def before_ddp(module, args):
        comm["pre"] = time.perf_counter()

    def before_model(module, args):  # DDP has broadcast its buffers in between
        comm["broadcast"] = time.perf_counter() - comm["pre"]

    def timed_allreduce(state, bucket):
        if comm["start"] is None:
            comm["start"] = time.perf_counter()

        def done(fut):
            comm["end"] = time.perf_counter()
            return fut.value()

        return allreduce_hook(None, bucket).then(done)

    ddp.register_forward_pre_hook(before_ddp)
    model.register_forward_pre_hook(before_model)
    ddp.register_comm_hook(None, timed_allreduce)

    slower = Slowdown(slowdown)
    ends, collectives, computing, checks = [], [], [], []
    start = time.perf_counter()
    step, last = 0, None
    try:
        while last is None or step < last:
            step += 1
            t0, cpu0 = time.perf_counter(), time.thread_time()
            images, labels = batches.next()
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(ddp(images), labels).backward()
            optimizer.step()
            t1, cpu = time.perf_counter(), time.thread_time() - cpu0
            allreduce = comm["end"] - comm["start"] if comm["start"] is not None else 0.0
            comm["start"] = None
            collectives.append(comm["broadcast"] + allreduce)
            computing.append(t1 - t0 - collectives[-1])
            slower.wait(computing[-1], BATCH, cpu if torch.get_num_threads() == 1 else None)
            ends.append(time.perf_counter() - start)
            t2 = time.perf_counter()
            if last is None:
                if rank == 0 and ends[-1] >= seconds:
                    store.set("last", str(step + 1))
                    store.get("last")  # a round trip: the store has it now
                if store.check(["last"]):
                    last = int(store.get("last"))
            checks.append(time.perf_counter() - t2)
        dist.barrier()  # once, at the end: rank 0 keeps the store up until all have read
        with open(result, "w") as f:
            json.dump({"ends": ends, "collectives": collectives, "computing": computing,
                       "check": checks}, f)
    finally:
        # drop DDP (its reducer) before the group, not at interpreter exit, where gloo's
        # threads still finishing make the process abort ("terminate called ...")
        del ddp, optimizer
        gc.collect()
        dist.destroy_process_group()
