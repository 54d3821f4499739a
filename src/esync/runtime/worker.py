"""A training process of main.py, standalone or a worker of a job: checked at start-up
(esync.runtime.startup), joined (esync.runtime.join), and trained by the built-in loop (esync.runtime.train)."""
from __future__ import annotations

import logging
from typing import Dict, Optional, Union

from esync.data.partition import partition_size
from esync.errors import UserError
from esync.runtime.join import WorkerPlan, join
from esync.runtime.session import TrainResult
from esync.runtime.task import task_of
from esync.runtime.train import train
from esync.transport.cluster import ClusterEnv, DDPEnv

__all__ = ["run_standalone", "run_cluster_worker", "run_ddp_worker"]

log = logging.getLogger(__name__)


def _train(plan: WorkerPlan, env: Union[ClusterEnv, DDPEnv, None],
           settings: Optional[Dict[str, str]] = None) -> TrainResult:
    """Join the job, build the built-in loop's parts once, and train this process's
    partition (all the data alone)."""
    opts = plan.opts
    with join(plan, env, settings) as session:
        # loaded, and a plug-in checked on it, by check() already
        task = task_of(opts)
        try:
            samples = partition_size(len(task.labels()), session.num_workers)
        except ValueError as e:
            raise UserError(f"--dataset {opts.dataset}: {e}") from None
        model = task.build_model(opts.network)
        algorithm = session.algorithm
        log.info("[%s] training %s on %s (%d samples, rank %d of %d) on %s; logs in %s",
                 algorithm.name, opts.network, opts.dataset, samples, session.rank,
                 session.num_workers, plan.device, session.recorder.path)
        if not any(vars(session.stop).values()):
            log.info("[%s] no stop criterion given (--epochs, --max-rounds, --time-limit, "
                     "--target-accuracy, --target-loss): training until interrupted",
                     algorithm.name)
        return train(session, model, task, opts.batch_size, algorithm.learning_rate(opts),
                     opts.momentum, opts.weight_decay)


def _exit_status(result: TrainResult) -> int:
    return 1 if result.diverged else 0


def run_standalone(plan: WorkerPlan) -> int:
    """`-m local`: one process trains on all the data; the exit status."""
    return _exit_status(_train(plan, None))


def run_cluster_worker(plan: WorkerPlan, env: ClusterEnv,
                       settings: Optional[Dict[str, str]] = None) -> int:
    """Join the parameter-server (or all-reduce) job, train this worker's partition,
    tell the scheduler it is done. `settings`: what must agree with the job's other
    nodes (esync.runtime.startup.agreed_settings)."""
    return _exit_status(_train(plan, env, settings))


def run_ddp_worker(plan: WorkerPlan, env: DDPEnv) -> int:
    """`-m ddp`: join torch.distributed's process group (nccl when every rank is on a
    GPU, else gloo) by its own rendezvous, train this rank's partition, leave the
    group."""
    return _exit_status(_train(plan, env))
