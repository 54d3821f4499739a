"""esync's public API: a training script of the user's, with its own model, data,
optimizer and loop, under ESync, SSGD, ASGD or DC-ASGD (or alone), as PyTorch's own
post-local SGD and Ray Train's `prepare_*` verbs are used::

    import esync
    esync.init()                                  # joins the job esync-run started
    model = esync.prepare_model(MyNet())          # on the device, the job's weights
    loader = esync.prepare_data_loader(DataLoader(train_set, batch_size=64, shuffle=True))
    opt = esync.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=3e-4))
    for x, y in loader:                           # this worker's partition
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()

The job's settings (mode, backend, stop criteria, logs...) are main.py's flags: those
esync-run passes in ESYNC_ARGS, then `init`'s `argv`. Without a job (no DMLC_ROLE) the
script trains alone (`-m local`), logging as every mode does.

What each algorithm does with the user's optimizer (its state is never sent):
- every mode steps it on this worker's own gradients and keeps its state (momentum,
  Adam's moments and step count) local: after a synchronisation the weights are the
  job's, the state this worker's;
- ESync: a round is this device's budget of steps; the servers average the rounds'
  deltas. SSGD: a round is one step; the servers average the steps, which for SGD
  (momentum and weight decay included) is the classic SSGD on the mean gradient.
  ASGD / DC-ASGD: each step is applied on the servers as it comes.
- floating-point buffers (BatchNorm's running statistics) are averaged with the weights;
  integer buffers (`num_batches_tracked`) stay each worker's count;
- the synchronised tensors are all parameters that require a gradient, in the model's
  order, whether or not this step gave them one (a parameter without a gradient is
  unchanged by the step, so its delta is zero).
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterable, Optional, Sequence

import torch
from torch import nn
from torch.utils.data import DataLoader

from esync.runtime import join
from esync.algorithms.policy import Policy
from esync.errors import UserError
from esync.runtime.loader import job_loader
from esync.runtime.lrschedule import JobScheduler
from esync.options import ARGS_VARIABLE
from esync.runtime.session import Session
from esync.runtime.startup import start

log = logging.getLogger(__name__)


_session: Optional[Session] = None
_failed: Optional[BaseException] = None
#: the process that joined the job: a process forked from it (a DataLoader worker) runs
#: threading's exit calls too, and must not leave the job in its place
_joined_by: Optional[int] = None
# alone (-m local) with the model and data named as plug-ins (-n, --dataset): the task
# whose metric this process measures by the clock, as the evaluator would in a job
_alone_task: Optional[Callable[[], Any]] = None


def init(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> Session:
    """Join the job this process belongs to, once: as a worker of a parameter-server or
    all-reduce job (DMLC_* variables, as esync-run sets them), a rank of DDP (RANK,
    WORLD_SIZE, MASTER_ADDR, MASTER_PORT), or alone (neither). The settings are main.py's
    flags: ESYNC_ARGS's, then `argv`'s. Bad settings end the process with one line
    naming the flag and exit status 2, as main.py does. Returns the session (`rank`,
    `num_workers`, `device`, `stop_reason`...); the job is left at the end of the
    process, or by `finish()`."""
    global _session
    if _session is not None:
        return _session
    from esync.errors import say_error

    prog = prog or os.path.basename(sys.argv[0]) or "esync"
    try:
        _session = _join(_flags(argv), prog)
    except UserError as e:
        say_error(prog, e)
        raise SystemExit(2) from None
    global _joined_by
    _joined_by = os.getpid()
    _leave_at_exit()
    _chain_excepthook()
    return _session


def _flags(argv: Optional[Sequence[str]]) -> list:
    text = os.environ.get(ARGS_VARIABLE, "")
    try:
        given = json.loads(text) if text else []
    except ValueError:
        given = None
    if not isinstance(given, list) or not all(isinstance(a, str) for a in given):
        raise UserError(f"{ARGS_VARIABLE}: expected a JSON list of strings, got {text[:60]!r}")
    return given + list(argv or [])


def _join(flags: list, prog: str) -> Session:
    """The start-up every esync process goes through (esync.runtime.startup), as a worker; then
    join the job."""
    begun = start(flags, prog, script=True)
    if not begun.plan.algorithm.distributed and "network" in begun.given:
        global _alone_task
        from esync.runtime.task import task_of

        _alone_task = lambda: task_of(begun.opts)
    return join.join(begun.plan, begun.env, begun.settings)


def _leave_at_exit() -> None:
    """Leave the job when the script's main thread ends (its loop done, or an exception
    it did not catch): in the interpreter's first exit step, where threading's own exit
    calls run, while the interpreter is whole. By atexit's time pyzmq has stopped the
    thread its zero-copy sends need (a model over 64 KB could not push its last round,
    and the others waited for it for ever), and from Python 3.12 no thread may start
    (the state server's budget request). atexit too, where threading has no such hook:
    `finish` runs once."""
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        try:
            register(finish)
        except RuntimeError:  # the interpreter is already shutting down
            pass
    atexit.register(finish)


def _chain_excepthook() -> None:
    """Remember an exception that ends the script, so that leaving the job at exit tells
    the others it failed (the job ends, non-zero) rather than finished. The job's own end
    under the script (JobAborted: another process failed, or the scheduler is gone) is
    said in one line, not as a traceback through esync's internals."""
    from esync.transport.node import JobAborted, describe

    previous = sys.excepthook

    def hook(kind, error, traceback):
        global _failed
        _failed = error
        if isinstance(error, JobAborted):
            print(f"esync: error: {describe(error)}", file=sys.stderr, flush=True)
            return
        previous(kind, error, traceback)

    sys.excepthook = hook


def get_session() -> Session:
    """The session `init` opened (RuntimeError before)."""
    if _session is None:
        raise RuntimeError("call esync.init() first")
    return _session


def prepare_model(model: nn.Module) -> nn.Module:
    """Move `model` to this worker's device and give it the job's initial weights (the
    first worker's, or the servers' when resuming or rejoining); returns the module to
    run forward through: `model` itself, DDP's wrapper of it under `-m ddp`. Call once,
    before `DistributedOptimizer` (after it, where that gives an algorithm object whose
    settings differ from the flags'); `model`'s parameters are from now on views of the
    flat vector the job synchronises. Alone (`-m local`) with `-n` and `--dataset`
    naming the script's model and data, `model` is evaluated in this process by the
    clock (`--eval-interval`, the clock paused meanwhile), as main.py's standalone
    training is: the evaluator's measure, without an evaluator process."""
    session = get_session()
    net = session.adopt(model)
    if _alone_task is not None and session.evaluation is None:
        task = _alone_task()
        session.evaluate_with(lambda: task.evaluate(model, session.device), task.metric)
    return net


def prepare_data_loader(loader: DataLoader) -> Iterable[Any]:
    """`loader`'s data set, batch size, workers and collate function over this worker's
    partition of the data set (split as `-s` says; shuffled in `--shuffle`'s order if
    `loader` shuffles), batches moved to the device. Each pass is one epoch of the
    partition, cut short when the job stops; a worker that continues a job (resume,
    rejoin) goes on at its exact next sample.

    A `esync.data.decode.ShardDataset` (shards written by esync-pack) is read block by
    block with CorgiPile's shuffle, its samples decoded in `loader`'s worker processes,
    from this worker's own blocks or from blocks the scheduler leases to whichever
    worker asks (`--data-split`); a pass is then one epoch of leases. A loader that
    cannot be prepared (no batch_size; shards too few for the workers; --remote-prep
    without a Ray cluster) ends the process with one line and exit status 2, the job
    told, as `init` does."""
    session = get_session()
    try:
        return job_loader(loader, session, session.data)
    except UserError as e:
        _fail(session, e)


class DistributedOptimizer(torch.optim.Optimizer):
    """`optimizer` (any torch.optim optimizer over the prepared model's parameters), whose
    `step()` also counts the local iteration and, when this device's budget for the round
    is used up, runs the round's synchronisation and fetches the next budget. Everything
    else (`zero_grad`, `param_groups`, learning-rate schedulers, AMP's GradScaler) works
    as on `optimizer`; a step GradScaler skips (inf or NaN gradients) still counts and
    still joins the synchronisation. `state_dict()` adds where the job is (`"esync":
    {"round", "iterations", "budget", "epochs"}`: the round in progress or last ended,
    local iterations so far, the round's budget (0 between rounds), epochs of the
    partition); the job's own checkpoints (--checkpoint-dir) hold the weights, and a
    resumed job's round comes from them.

    `algorithm`: the algorithm's settings in code (`esync.ESync(max_local_steps=16)`,
    `esync.SSGD()`, `esync.DCASGD(lamda=0.1)`...) in place of their flags' values; the
    job's `-m` still chooses the algorithm, and another one's object ends the process
    with one line and exit status 2. Settings go to the servers and the state server as
    the model is prepared: wrap the optimizer before `prepare_model` (its parameters
    stay the same objects) where they differ from the flags'."""

    #: GradScaler hands this optimizer its scale and inf flags and lets `step` skip
    _step_supports_amp_scaling = True

    def __init__(self, optimizer: torch.optim.Optimizer, model: Optional[nn.Module] = None,
                 *, algorithm: Optional[Policy] = None, job: Optional[Session] = None):
        # `model` is accepted for the form DistributedOptimizer(optimizer, model) other
        # libraries use: the model is the session's, from prepare_model.
        self.optimizer = optimizer
        # An Optimizer whose parameter groups and state are the wrapped one's (the
        # properties below), so not Optimizer.__init__, which would make its own: torch's
        # restore path (unpickling's) gives it the rest, its defaults, every hook
        # registry and the step wrapper that runs step hooks and profiles the step
        torch.optim.Optimizer.__setstate__(self, {"defaults": optimizer.defaults})
        self.session = job or get_session()
        if algorithm is not None:
            _use_policy(self.session, algorithm)
        self.session.kept.add("optimizer", self)  # with the job's checkpoints

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value) -> None:
        self.optimizer.param_groups = value

    @property
    def state(self):
        return self.optimizer.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none)

    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        def update() -> Any:
            found_inf = getattr(self, "found_inf", None)
            if found_inf is not None:  # inside GradScaler.step: unscale, or skip
                if found_inf.item():
                    return None
                scale = getattr(self, "grad_scale", None)
                if scale is not None:
                    inverse = scale.double().reciprocal().float()
                    for group in self.optimizer.param_groups:
                        for p in group["params"]:
                            if p.grad is not None:
                                p.grad.mul_(inverse.to(p.grad.device))
            return self.optimizer.step(closure) if closure else self.optimizer.step()

        return self.session.step(update)

    def state_dict(self) -> Dict[str, Any]:
        state = self.optimizer.state_dict()
        state["esync"] = self.session.position()
        return state

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        state = dict(state_dict)
        state.pop("esync", None)  # the job's round comes from the job (its servers)
        self.optimizer.load_state_dict(state)

    def __repr__(self) -> str:
        return f"DistributedOptimizer({self.optimizer!r})"


def _use_policy(session: Session, policy: Policy) -> None:
    """The session's algorithm with `policy`'s settings; a policy the job cannot run
    ends the process with one line, as `init` does."""
    try:
        if not isinstance(policy, Policy):
            raise UserError(f"algorithm={policy!r}: expected an esync algorithm object "
                            f"(esync.ESync(...), esync.SSGD(), ...)")
        current = session.algorithm
        if session.model is not None and policy != current.policy and \
                policy.key == current.policy.key:
            raise UserError(f"algorithm={policy!r} came after prepare_model, which started "
                            f"the job with {current.policy!r}: wrap the optimizer first")
        session.algorithm = current.rebound(policy)
    except UserError as e:
        _fail(session, e)


def _fail(session: Session, error: UserError) -> None:
    """End the process with `error`'s one line and exit status 2, the job told."""
    from esync.errors import say_error

    session.close(error)
    say_error(os.path.basename(sys.argv[0]) or "esync", error)
    raise SystemExit(2) from None


def prepare_scheduler(scheduler: Any) -> JobScheduler:
    """`scheduler` (any torch.optim.lr_scheduler, over the wrapped optimizer's) advanced
    with the job rather than with this device's own steps, the same on a fast and a
    slow device: size it as for the plain loop (OneCycleLR(total_steps=epochs *
    len(loader)), CosineAnnealingLR(T_max=epochs) stepped once an epoch) and call its
    `step()` where the plain loop would. Its state is kept with the job's checkpoints
    (--checkpoint-dir) and given back on --resume."""
    session = get_session()
    prepared = JobScheduler(scheduler, session)
    session.kept.add("scheduler", prepared)
    return prepared


def report(loss: Optional[float] = None, samples: Optional[int] = None, *,
           metric: Optional[float] = None, **scalars: float) -> None:
    """What this script measured, for the round's log record and TensorBoard (numbers,
    or one-element tensors):
    - `loss`: this local iteration's training loss (also the divergence check);
    - `samples`: its samples, where the batches do not come from prepare_data_loader;
    - `metric`: the job's metric as the script measured it (rank 0's validation, say):
      the accuracy, or with `--metric loss` a validation loss. It is logged as an
      evaluation is (the progress line, `esync-draw`'s curves, the live page) and the
      job's `--target-accuracy`/`--target-loss` apply to it;
    - any other `name=value`: kept in the round's record under `scalars` (TensorBoard:
      `script/<name>`).
    The round that ends next records them (a metric once: the latest reported)."""
    values = {k: v.item() if isinstance(v, torch.Tensor) else v
              for k, v in dict(scalars, loss=loss, metric=metric).items() if v is not None}
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"esync.report({name}=...): expected a number or a "
                            f"one-element tensor, got {type(value).__name__}")
    loss, metric = values.pop("loss", None), values.pop("metric", None)
    get_session().report(loss, samples, metric=metric, scalars=values)


def get_device() -> torch.device:
    """The device this worker trains on (the prepared model's: `cuda:N` for a GPU
    worker, else the CPU), for tensors the script makes or loads itself: a validation
    loader's batches (`x.to(esync.get_device())`), a mask, a checkpoint's map_location.
    The prepared data loader's batches are there already."""
    return get_session().device


def should_stop() -> bool:
    """Whether the job has stopped (its stop criteria, or another worker's)."""
    return get_session().stop_reason is not None


#: seconds a process that failed may take to leave its job before it exits anyway (a
#: collective that a dead peer never completes must not keep it, and so the job, alive)
FAILED_EXIT_S = 10.0


def finish() -> None:
    """Leave the job (also done when the script ends): if the job is still running, the
    round in progress ends now, and in a synchronous job the others stop after it; then
    the connections close. After an exception the script did not catch, the job is told
    that this worker failed (it ends, non-zero) and the process exits within
    FAILED_EXIT_S seconds whatever its peers do. Idempotent."""
    global _session, _failed
    if _session is None or os.getpid() != _joined_by:  # (a forked DataLoader worker)
        return
    current, _session = _session, None
    if _failed is not None:
        _exit_anyway_after(FAILED_EXIT_S)
        current.close(_failed)
        return
    try:
        current.leave(f"worker {current.rank} finished its loop")
    except BaseException as e:  # the others must not wait for a push that never comes
        _failed = e
        _exit_anyway_after(FAILED_EXIT_S)
        current.close(e)
        raise
    current.close(None)


def _exit_anyway_after(seconds: float) -> None:
    """A daemon thread that ends the process with status 1 if it is still alive then."""
    def watchdog() -> None:
        time.sleep(seconds)
        print(f"esync: error: could not leave the job within {seconds:g} s after a "
              f"failure; exiting", file=sys.stderr, flush=True)
        os._exit(1)

    threading.Thread(target=watchdog, name="esync-exit", daemon=True).start()
