"""A training process, standalone or a worker of a job: checked, built and run here.

`check` runs before the process joins anything (a bad flag must end the job before it
starts); `run_standalone` and `run_cluster_worker` then build the process's parts once
(device, data, partition, network, recorder, algorithm) and run the training loop.
"""
from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from typing import Dict, Optional

import torch

from esync import registry
from esync.algorithms.base import Job
from esync.errors import UserError
from esync.options import Options, check_aggregation, check_plugins
from esync.train import StopCriteria, TrainResult, train
from esync.transport.cluster import REQUIRED, ClusterEnv, DDPEnv, advertised_address

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerPlan:
    """A training process's settings, checked: what `check` found good."""

    opts: Options
    algorithm: registry.Algorithm
    device: torch.device
    state_server_patience: float = 0.0


def select_device(opts: Options) -> torch.device:
    """cpu, or cuda:N for `-g N` (an error if there is no such GPU)."""
    if opts.cpu or opts.gpu is None:
        return torch.device("cpu")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if opts.gpu >= count:
        found = f"{count} CUDA device{'s' if count != 1 else ''}" if count else "no CUDA device"
        raise UserError(f"-g/--gpu {opts.gpu}: this machine has {found}; "
                        f"leave out -g (or pass -c 1) to train on the CPU")
    return torch.device(f"cuda:{opts.gpu}")


def check(opts: Options, env: Optional[ClusterEnv]) -> WorkerPlan:
    """Everything about a training process that can be wrong before it starts: the mode
    against the cluster variables, the device, the state server's patience. (DDP's
    variables are checked by esync.cli, which reads them.)"""
    algorithm = registry.of_options(opts)
    standalone = registry.ALGORITHMS[registry.STANDALONE]
    if env is None and algorithm.parameter_server:
        missing = ", ".join(v for v in REQUIRED if v not in os.environ)
        raise UserError(f"-m/--mode {opts.mode} runs in a cluster: set {missing} "
                        f"(or use -m {standalone.mode})")
    if env is not None and not algorithm.parameter_server:
        others = ", ".join(dict.fromkeys(a.mode for a in registry.ALGORITHMS.values()
                                         if a.parameter_server))
        raise UserError(f"-m/--mode {opts.mode} does not run with DMLC_ROLE={env.role}: "
                        f"unset DMLC_ROLE, or pick a parameter-server mode ({others})")
    check_aggregation(opts, env.num_servers if env is not None else None)
    check_plugins(opts)
    device = select_device(opts)
    patience = 0.0
    if algorithm.state_server:
        from esync.stateclient import patience_from_environ

        patience = patience_from_environ()
    return WorkerPlan(opts, algorithm, device, patience)


def device_label(opts: Options, device: torch.device, rank: Optional[int] = None) -> str:
    """--device-name, or cpu / gpu<N> (with `-rank<k>` for a DDP rank: torchrun starts
    them all with the same flags)."""
    if opts.device_name:
        return opts.device_name
    label = "cpu" if device.type == "cpu" else f"gpu{device.index}"
    return label if rank is None else f"{label}-rank{rank}"


def stop_criteria(opts: Options) -> StopCriteria:
    return StopCriteria(opts.epochs, opts.max_rounds, opts.time_limit, opts.target_accuracy,
                        opts.target_hold)


def _train(plan: WorkerPlan, job: Optional[Job]) -> TrainResult:
    """Build the process's parts, once, and train partition `job.rank` (all data alone)."""
    from esync.data.batches import BatchStream
    from esync.data.datasets import load_dataset
    from esync.data.partition import partition
    from esync.data.shuffle import EpochOrder
    from esync.models import build_network
    from esync.recorder import Recorder

    opts, device = plan.opts, plan.device
    rank, num_workers = (job.rank, job.num_workers) if job else (0, 1)
    if opts.num_threads:
        torch.set_num_threads(opts.num_threads)
    torch.manual_seed(opts.seed)
    dataset = load_dataset(opts.dataset, opts.data_dir)
    try:
        indices = partition(dataset.train_labels.numpy(), num_workers, rank,
                            opts.split_by_class, opts.seed)
    except ValueError as e:
        raise UserError(f"--dataset {opts.dataset}: {e}") from None
    order = EpochOrder(indices, opts.shuffle, seed=[opts.seed, rank],
                       block_size=opts.block_size, buffer_ratio=opts.buffer_ratio)
    batches = BatchStream(dataset, order, opts.batch_size, device)
    # a plug-in was built and checked on the data once already, by check()
    model = build_network(opts.network, dataset.num_classes).to(device)
    algorithm = plan.algorithm.worker_class().from_options(opts, job)
    stop = stop_criteria(opts)
    ddp_rank = job.rank if job is not None and not plan.algorithm.parameter_server else None
    keep = job is not None and (job.rejoin or job.resume)  # its logs go on
    with Recorder(opts.log_dir, socket.gethostname(),
                  device_label(opts, device, ddp_rank), keep=keep,
                  tensorboard=opts.tensorboard) as recorder:
        log.info("[%s] training %s on %s (%d samples, rank %d of %d) on %s; logs in %s",
                 algorithm.name, opts.network, opts.dataset, len(indices), rank, num_workers,
                 device, recorder.path)
        if not any(vars(stop).values()):
            log.info("[%s] no stop criterion given (--epochs, --max-rounds, --time-limit, "
                     "--target-accuracy): training until interrupted", algorithm.name)
        # alone and with -e 0, evaluations go by the clock (there is no evaluator)
        timed = opts.eval_interval if job is None and opts.eval_every == 0 else None
        return train(model, algorithm, batches, dataset, recorder, stop, device,
                     opts.slowdown, timed)


def _exit_status(result: TrainResult) -> int:
    return 1 if result.diverged else 0


def run_standalone(plan: WorkerPlan) -> int:
    """`-m local`: one process trains on all the data; the exit status."""
    return _exit_status(_train(plan, None))


def run_cluster_worker(plan: WorkerPlan, env: ClusterEnv,
                       settings: Optional[Dict[str, str]] = None) -> int:
    """Join the job, train this worker's partition, tell the scheduler it is done.
    `settings`: what must agree with the job's other nodes (esync.options.agreed_settings)."""
    from esync.transport.node import Node

    device = device_label(plan.opts, plan.device)
    with Node(env, "worker", device) as node:
        assignment = node.register(plan.opts.start_timeout, device=device,
                                   settings=settings or {})
        job = Job.from_assignment(node, assignment, plan.state_server_patience,
                                  resume=plan.opts.resume, host=advertised_address(env))
        result = _train(plan, job)
        node.finish()
    return _exit_status(result)


def run_ddp_worker(plan: WorkerPlan, env: DDPEnv) -> int:
    """`-m ddp`: join torch.distributed's process group (gloo on CPU, nccl on GPU) by
    its own rendezvous, train this rank's partition, leave the group."""
    import gc
    from datetime import timedelta

    import torch.distributed as dist

    from esync import ready

    backend = "nccl" if plan.device.type == "cuda" else "gloo"
    store = None
    if env.master_port == 0:  # rank 0 hosts the store on a free port and reports it
        store = dist.TCPStore(env.master_addr, 0, env.world_size, is_master=True,
                              wait_for_workers=False, timeout=timedelta(seconds=120))
        ready.announce(store.port)
        dist.init_process_group(backend, store=store, rank=0, world_size=env.world_size)
    elif "TORCHELASTIC_RUN_ID" in os.environ:  # torchrun: its agent hosts the store
        dist.init_process_group(backend, init_method="env://", rank=env.rank,
                                world_size=env.world_size)
        # a client of the store: to agree to stop (and rank 0: to tell the evaluator
        # where to pull)
        store = dist.TCPStore(env.master_addr, env.master_port, is_master=False,
                              timeout=timedelta(seconds=60))
    else:  # rank 0 hosts the store (on MASTER_PORT, or on the free port it reported)
        store = dist.TCPStore(env.master_addr, env.master_port, env.world_size,
                              is_master=env.rank == 0, wait_for_workers=False,
                              timeout=timedelta(seconds=120))
        dist.init_process_group(backend, store=store, rank=env.rank,
                                world_size=env.world_size)
    try:
        port = store.port if env.master_port == 0 else env.master_port
        job = Job(None, env.rank, env.world_size, [], f"ddp-{env.master_addr}-{port}",
                  store=store, host=env.local_address())
        result = _train(plan, job)
    finally:
        dist.destroy_process_group()
        gc.collect()  # the group's last work objects, before the interpreter exits
    return _exit_status(result)
