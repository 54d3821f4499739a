"""The evaluator (DMLC_ROLE=evaluator): measures every mode on one clock.

A process apart from training (as the "evaluator" of TensorFlow's parameter-server
jobs): every `--eval-interval` seconds of wall-clock time it pulls the global model,
read-only, evaluates it on the test set (esync.runtime.task's `Task.evaluate`: `--metric`'s
measure, or the user's `--evaluate module:function`) and logs (seconds since training
started, the model's round, the metric) to LOG_DIR/<host>/evaluator/iter-<n>.json, in
the workers' format (esync.logs.recorder; `num_samples` 0, `round` the model's round). No
worker waits for an evaluation, and every mode is evaluated at the same pace.

- Parameter-server modes: it joins the job at the scheduler (at any time; it is not
  waited for, and its death does not end the job), gets the servers' addresses and
  pulls from them (servers accept only pulls from it); a server not ready yet holds the
  pull until worker 0 initialised it. It ends when the scheduler shuts the job down.
  With `--backend allreduce` (no servers) it pulls from worker 0's publisher
  (esync.comm.publish), whose address the scheduler's rendezvous gives.
- DDP (`-m ddp`): rank 0 answers its pulls (esync.comm.publish) at the address it left in
  torch.distributed's rendezvous store (MASTER_ADDR:MASTER_PORT); it ends when rank 0
  says the job is done or the store is gone.

Its priority: lower than training's (`yield_to_training`: nice 10), so that where it
competes with a training process for a core, the training process gets most of it.
Measuring a job should not slow it: on the emulated bed (2 cores, the devices'
computing about one) an evaluation of the ResNet every 4 s took 0.95 s of a core,
beside a fast device computing on 0.7 of one (the fast device alone evaluates in its
process, its clock paused). Where every core trains, evaluations come later, never
wrong: each is of the model the servers sent at `pulled`.

Its clock: each answer says how long training had run when the model was sent (the
servers, or rank 0, count from when worker 0 said every worker had joined), so it logs
the time since training started whoever's clock it runs on and even if it joined late;
before training starts it evaluates the initial model once. With `--target-accuracy`
it ends the job once that accuracy has held `--target-hold` seconds: its next pull
carries `stop`, which the servers (rank 0) pass to every worker.
"""
from __future__ import annotations

import logging
import math
import os
import socket
import time
from datetime import timedelta
from typing import Callable, Dict, Optional

import torch
import zmq

from esync import registry
from esync.data import METRIC_LINE, METRIC_RECORD
from esync.errors import UserError
from esync.infra.memory import keep_freed_memory
from esync.options import Options
from esync.comm.publish import STORE_ADDRESS, STORE_FINISHED
from esync.transport.cluster import ClusterEnv, DDPEnv

log = logging.getLogger(__name__)



class JobEnded(Exception):
    """The job is over (shut down, or its rank 0 is gone): the evaluator ends too."""


class _Source:
    """What the kvstore needs of a node: a ZeroMQ context, a `check` that raises while
    it waits (here also when the job has ended), and the key guard; with a `node` (a
    parameter-server job), its id and the servers' addresses too."""

    def __init__(self, context: zmq.Context, check: Callable[[], None], node=None):
        from esync.transport.auth import Guard

        self.context, self.check, self._node = context, check, node
        self.guard = node.guard if node is not None else Guard.from_environ(context)

    def __getattr__(self, name: str):
        node = self.__dict__.get("_node")
        if node is None:
            raise AttributeError(name)
        return getattr(node, name)


#: the evaluator's niceness above the launcher's (`yield_to_training`)
NICENESS = 10


def yield_to_training() -> int:
    """Lower this thread (and those it starts later: torch's) by NICENESS on the OS's
    scale (at most 19); its niceness now. Competing with a training process for a core
    it gets about a tenth of it; the lowest priority, Linux's SCHED_IDLE, starved it on
    a machine whose cores were all busy: a job of 40 rounds ended before the evaluator
    had logged its first line."""
    if not hasattr(os, "nice"):  # not on this OS
        return 0
    try:
        return os.nice(min(NICENESS, 19 - os.nice(0)))
    except OSError:  # refused: as it is
        return os.nice(0)


def evaluate_loop(opts: Options, device: torch.device, servers, source: _Source,
                  ended: Callable[[], bool]) -> int:
    """Pull, evaluate and log every opts.eval_interval seconds until the job ends."""
    from esync.comm.flat import FlatModel
    from esync.comm.kvstore import KVStore
    from esync.logs.live import LiveReporter
    from esync.logs.recorder import Recorder
    from esync.infra.stop import StopCriteria
    from esync.runtime.task import task_of

    priority = yield_to_training()  # before torch starts its threads
    keep_freed_memory()
    if opts.num_threads:
        torch.set_num_threads(opts.num_threads)
    task = task_of(opts)
    model = task.check(opts.network).to(device)  # its weights are pulled
    flat = FlatModel(model, device)
    kv = KVStore(source, servers, registry.EVALUATOR, flat.params.numel(),
                 flat.buffers.numel())
    stop = StopCriteria(target_accuracy=opts.target_accuracy, target_hold=opts.target_hold,
                        target_loss=opts.target_loss)
    name, label = METRIC_RECORD[opts.metric], METRIC_LINE[opts.metric]
    decided: Optional[str] = None  # the stop this evaluator asked for
    n, next_at = 0, time.monotonic()  # n: evaluations logged
    evaluated = None  # the (round, time) of the model evaluated last
    live = LiveReporter.from_environ("evaluator", device=registry.EVALUATOR,
                                     mode=opts.algorithm.key)
    with Recorder(opts.log_dir, socket.gethostname(), registry.EVALUATOR,
                  tensorboard=opts.tensorboard, live=live) as recorder:
        log.info("[evaluator] evaluating %s on %s%s every %g s at niceness %d; logs in %s",
                 opts.network, opts.dataset, f" by {opts.evaluate}" if opts.evaluate else "",
                 opts.eval_interval, priority, recorder.path)
        try:
            while not ended():
                while time.monotonic() < next_at:
                    if ended():
                        raise JobEnded()
                    time.sleep(min(0.05, max(0.0, next_at - time.monotonic())))
                sent0, received0 = kv.bytes_sent, kv.bytes_received
                t0 = time.monotonic()
                kv.pull(flat.host("params"), flat.host("buffers"), stop=decided)
                flat.load_host_state()
                t1 = time.monotonic()
                # seconds of training behind this model: its round's end (a parameter
                # server's model is the last round's; the clock at the pull is `pulled`)
                pulled = kv.model_age or 0.0
                at = pulled if kv.round_age is None else kv.round_age
                if n > 0 and (at == 0.0 or (kv.model_round, at) == evaluated):
                    # training has not started, or no round ended since: the same model
                    next_at = max(next_at + opts.eval_interval, time.monotonic())
                    continue
                evaluated = (kv.model_round, at)
                metric = task.evaluate(model, device)
                t2 = time.monotonic()
                n += 1
                recorder.write_round(n, {0: {"pull": t1 - t0, "evaluate": t2 - t1}}, 0,
                                     math.nan, kv.bytes_sent - sent0,
                                     kv.bytes_received - received0, at=at,
                                     round=kv.model_round, pulled=round(pulled, 6),
                                     **{name: metric})
                log.info("[evaluator] %.2fs round %s %s %.4f", at, kv.model_round, label,
                         metric)
                reason = stop.target_held(metric, at) if decided is None else None
                if reason:
                    decided = f"the evaluator {reason}"
                    log.info("[evaluator] %s at %.2fs: ending the job", reason, at)
                    next_at = time.monotonic()  # carry the stop at once
                    continue
                next_at = max(next_at + opts.eval_interval, time.monotonic())
        except JobEnded:
            pass
        finally:
            kv.close()
    log.info("[evaluator] the job ended; %d evaluations", n)
    return 0


def run_ps_evaluator(opts: Options, device: torch.device, env: ClusterEnv,
                     settings: Optional[Dict[str, str]] = None) -> int:
    """Join a parameter-server job as its evaluator. `settings`: what must agree with the
    job's other nodes (esync.runtime.startup.agreed_settings)."""
    from esync.transport.node import Node

    node = Node(env, registry.EVALUATOR)
    try:
        assignment = node.register(opts.start_timeout, settings=settings or {})

        def check() -> None:
            node.check()
            if node.shutdown_requested:
                raise JobEnded()

        servers = assignment["servers"]
        if not servers:  # an all-reduce job: worker 0 publishes the model
            servers = [node.rendezvous()["evaluator"]]
        return evaluate_loop(opts, device, servers,
                             _Source(node.context, check, node),
                             lambda: node.shutdown_requested)
    finally:
        node.close()


def run_ddp_evaluator(opts: Options, device: torch.device, env: DDPEnv) -> int:
    """Evaluate a DDP job: find rank 0's publisher through the rendezvous store."""
    import torch.distributed as dist

    try:
        store = dist.TCPStore(env.master_addr, env.master_port, is_master=False,
                              timeout=timedelta(seconds=60))
    except (RuntimeError, OSError) as e:
        raise UserError(f"MASTER_ADDR/MASTER_PORT: cannot reach the DDP job's store at "
                        f"{env.master_addr}:{env.master_port}: {e}") from None
    store.wait([STORE_ADDRESS], timedelta(seconds=300))
    address = store.get(STORE_ADDRESS).decode()
    finished = [False]
    last_look = [0.0]

    def ended() -> bool:
        now = time.monotonic()
        if not finished[0] and now - last_look[0] >= 0.5:
            last_look[0] = now
            try:
                finished[0] = store.check([STORE_FINISHED])
            except (RuntimeError, OSError):  # the store went with rank 0
                finished[0] = True
        return finished[0]

    def check() -> None:
        if ended():
            raise JobEnded()

    context = zmq.Context()
    source = _Source(context, check)
    try:
        return evaluate_loop(opts, device, [address], source, ended)
    finally:
        source.guard.close()
        context.destroy(linger=0)
