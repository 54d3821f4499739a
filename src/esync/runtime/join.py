"""A training process joins its job: the checks before it joins anything, then the
joining itself (a ps-lite cluster's registration, torch.distributed's process group, or
nothing for a process training alone), which gives the process its Session.

Both the command line (esync.cli, esync.runtime.worker) and the public API (esync.runtime.api.init) come
through here, after the one start-up sequence (esync.runtime.startup, which calls `check`), so a
script of the user's joins a job exactly as main.py's workers do.
"""
from __future__ import annotations

import gc
import logging
import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Dict, Optional, Union

import torch

from esync import registry
from esync.algorithms.base import Job
from esync.comm.statefile import WorkerState
from esync.data.order import DataSettings
from esync.errors import UserError
from esync.logs.live import LiveReporter
from esync.algorithms.policy import check_aggregation
from esync.options import Options
from esync.logs.recorder import MODEL_FILE, Recorder
from esync.runtime.session import Session
from esync.infra.memory import keep_freed_memory
from esync.infra.stop import StopCriteria
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
    against the cluster variables, the plug-ins, the device, the state server's
    patience. (DDP's variables are checked where they are read.)"""
    algorithm = opts.algorithm
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
    device = select_device(opts)
    patience = 0.0
    if algorithm.state_server:
        from esync.infra.stateclient import patience_from_environ

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
                        opts.target_hold, opts.target_loss)


def join(plan: WorkerPlan, env: Union[ClusterEnv, DDPEnv, None],
         settings: Optional[Dict[str, str]] = None) -> Session:
    """Join the job `env` describes (None: train alone) and return this process's
    Session; closing the session leaves the job. `settings`: what must agree with the
    job's other nodes (esync.runtime.startup.agreed_settings)."""
    opts = plan.opts
    keep_freed_memory()
    if opts.num_threads:
        torch.set_num_threads(opts.num_threads)
    torch.manual_seed(opts.seed)
    if isinstance(env, ClusterEnv):
        job, leave = _join_cluster(plan, env, settings or {})
    elif isinstance(env, DDPEnv):
        job, leave = _join_process_group(plan, env)
    else:
        job, leave = None, lambda error: None
    try:
        algorithm = plan.algorithm.worker_class().from_options(opts, job)
        ddp_rank = job.rank if job is not None and not plan.algorithm.parameter_server else None
        keep = job is not None and (job.rejoin or job.resume)  # its logs go on
        label = device_label(opts, plan.device, ddp_rank)
        live = LiveReporter.from_environ("worker", rank=job.rank if job else 0, device=label,
                                         mode=plan.algorithm.key)
        recorder = Recorder(opts.log_dir, socket.gethostname(), label, keep=keep,
                            tensorboard=opts.tensorboard, live=live)
    except BaseException as e:
        leave(e)
        raise
    # alone and with -e 0, evaluations go by the clock (there is no evaluator)
    timed = opts.eval_interval if job is None and opts.eval_every == 0 else None
    rank, workers = (job.rank, job.num_workers) if job else (0, 1)
    kept = None
    if opts.checkpoint_dir and plan.algorithm.parameter_server and job is not None:
        # beside the servers' shards: as many as they keep of each (their rounds may
        # differ, with --checkpoint-every in seconds)
        kept = WorkerState(opts.checkpoint_dir, job.rank,
                           opts.keep_checkpoints * max(1, len(job.servers)))
    return Session(algorithm, recorder, stop_criteria(opts), plan.device, opts.slowdown,
                   timed, rank, workers, DataSettings.from_options(opts), on_close=leave,
                   metric_kind=opts.metric, node=job.node if job is not None else None,
                   model_file=os.path.join(recorder.path, MODEL_FILE), kept=kept)


def _join_cluster(plan: WorkerPlan, env: ClusterEnv, settings: Dict[str, str]):
    from esync.transport.node import Node

    device = device_label(plan.opts, plan.device)
    node = Node(env, "worker", device)
    try:
        wanted = {} if env.worker_id is None else {"rank": env.worker_id}
        assignment = node.register(plan.opts.start_timeout, device=device, settings=settings,
                                   **wanted)
    except BaseException as e:
        node.__exit__(type(e), e, None)
        raise
    job = Job.from_assignment(node, assignment, plan.state_server_patience,
                              resume=plan.opts.resume, host=advertised_address(env))

    def leave(error: Optional[BaseException]) -> None:
        if error is None:
            node.finish()
        node.__exit__(type(error) if error else None, error, None)

    return job, leave


def _join_process_group(plan: WorkerPlan, env: DDPEnv):
    """`-m ddp`: join torch.distributed's process group (nccl when every rank is on a
    GPU, else gloo: esync.comm.allreduce.agreed_backend) by its own rendezvous."""
    import torch.distributed as dist

    from esync.comm.allreduce import agreed_backend
    from esync.infra import ready

    if env.master_port == 0:  # rank 0 hosts the store on a free port and reports it
        store = dist.TCPStore(env.master_addr, 0, env.world_size, is_master=True,
                              wait_for_workers=False, timeout=timedelta(seconds=120))
        ready.announce(store.port)
    elif "TORCHELASTIC_RUN_ID" in os.environ:  # torchrun: its agent hosts the store; a
        # client of it: to agree on the backend and to stop (and rank 0: to tell the
        # evaluator where to pull)
        store = dist.TCPStore(env.master_addr, env.master_port, is_master=False,
                              timeout=timedelta(seconds=60))
    else:  # rank 0 hosts the store (on MASTER_PORT, or on the free port it reported)
        store = dist.TCPStore(env.master_addr, env.master_port, env.world_size,
                              is_master=env.rank == 0, wait_for_workers=False,
                              timeout=timedelta(seconds=120))
    backend = agreed_backend(store, env.rank, env.world_size, plan.device)
    if "TORCHELASTIC_RUN_ID" in os.environ:
        dist.init_process_group(backend, init_method="env://", rank=env.rank,
                                world_size=env.world_size)
    else:
        dist.init_process_group(backend, store=store, rank=env.rank,
                                world_size=env.world_size)
    port = store.port if env.master_port == 0 else env.master_port
    job = Job(None, env.rank, env.world_size, [], f"ddp-{env.master_addr}-{port}",
              store=store, host=env.local_address())

    def leave(error: Optional[BaseException]) -> None:
        if error is not None:  # a peer may be inside a collective with this rank, which
            return             # would never end: leave the group to the process's exit
        dist.destroy_process_group()
        gc.collect()  # the group's last work objects, before the interpreter exits

    return job, leave
