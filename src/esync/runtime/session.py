"""A worker's part in a job, round by round: the machinery behind the public API's
optimizer wrapper (esync.runtime.api), and so behind every training loop, the built-in one
(esync.runtime.train) included.

A round: the algorithm names its budget of local iterations (`begin_round`); each
local iteration is the user's forward and backward, then `step`, which runs the
algorithm's local update (the user's optimizer), the simulated slowdown and the timing;
when the budget is used up the algorithm ends the round (push/pull or all-reduce), the
process may evaluate, the round's record is written and the stop criteria are agreed on.
"""
from __future__ import annotations

import logging
import math
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch
from torch import nn

from esync.algorithms.base import Algorithm, Phases
from esync.logs.breakdown import breakdown
from esync.comm.statefile import WorkerState
from esync.infra.clock import Clock, Slowdown
from esync.data import METRIC_LINE, METRIC_RECORD
from esync.data.order import DataSettings
from esync.logs.recorder import Recorder
from esync.infra.stop import StopCriteria

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    rounds: int
    iterations: int
    epochs: float
    seconds: float
    accuracy: Optional[float]  # the last in-process evaluation's metric
    stop_reason: str
    diverged: bool = False


def _sync(device: torch.device) -> None:
    """Wait for queued GPU work, so that phase timings measure the work itself."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Session:
    """One process's training: its algorithm, recorder, clock, stop criteria and the
    round in progress. The API creates it (esync.runtime.api.init); its verbs call it.

    `evaluate_with` gives it a measure of the model in this process (the built-in loop's
    test accuracy), taken after the rounds the algorithm names, or with `eval_interval`
    by the clock; the prepared data loaders tell it where the data is (`loader_prepared`,
    `follow_data`, `data_pass`); `on_close` undoes the joining (leaves the cluster or the
    process group). Only this class sets its fields."""

    def __init__(self, algorithm: Algorithm, recorder: Recorder, stop: StopCriteria,
                 device: torch.device, slowdown: float = 1.0,
                 eval_interval: Optional[float] = None, rank: int = 0,
                 num_workers: int = 1, data: DataSettings = DataSettings(),
                 on_close: Callable[[Optional[BaseException]], None] = lambda error: None,
                 *, metric_kind: str = "accuracy", node: Any = None,
                 model_file: Optional[str] = None, kept: Optional[WorkerState] = None):
        self.algorithm, self.recorder, self.stop = algorithm, recorder, stop
        self.device, self.rank, self.num_workers = device, rank, num_workers
        self.data = data  # how prepared data loaders split and order the data
        self.eval_interval = eval_interval
        self.evaluation: Optional[Callable[[], float]] = None
        self.metric_kind = metric_kind  # what `evaluation` measures (--metric)
        self._epochs_done: Callable[[], float] = lambda: 0.0
        self.model: Optional[nn.Module] = None
        self.clock = Clock()
        self._slower = Slowdown(slowdown, seed=rank)
        self._on_close = on_close
        self.round = 0            # the round in progress (or the last one)
        self.iterations = 0
        self.metric: Optional[float] = None  # the last in-process evaluation's
        self.stop_reason: Optional[str] = None
        #: the job stopped while this local iteration waited for its round (the device
        #: sitting rounds out): its step has no round and is not taken
        self._stopped_unrounded = False
        self.diverged = False
        self.resume_epoch: Optional[float] = None  # data position to go on from
        #: the prepared loader's state in this worker's last record, to go on from
        self.resume_data: Optional[Dict[str, Any]] = None
        #: called at each round's end, before its synchronisation (the push)
        self._before_push: List[Callable[[], None]] = []
        #: called at each round's end, before its record is written: fields to add
        self._round_fields: List[Callable[[], Dict[str, Any]]] = []
        #: the ps-lite cluster's node (None alone or under DDP): block leases ask it
        self.node = node
        #: where the last round's time went (esync.logs.breakdown), once a round has ended
        self.last_breakdown: Dict[str, float] = {}
        #: samples this process trained so far (its local iterations' batches)
        self.samples = 0
        #: the batch size of the first prepared data loader (the training loader's)
        self.loader_batch: Optional[int] = None
        #: where rank 0 writes the job's final model (None: nowhere)
        self.model_file = model_file
        #: this worker's own state, kept with the job's checkpoints (where there are some)
        self.kept = kept if kept is not None else WorkerState()
        #: the prepared loaders' passes: how many ended, and whether one is under way
        self.passes_done = 0
        self.in_pass = False
        #: the job's samples at which the pass under way ends (job epochs: data_pass)
        self.pass_ends: Optional[int] = None
        self._empty_passes = 0  # passes asked for once the job had stopped
        self._reported_metric: Optional[float] = None  # esync.report(metric=...)
        self._scalars: Dict[str, float] = {}  # esync.report(name=value), for the record
        self._budget = 0          # local iterations of the round in progress; 0: none
        self._round_end = time.perf_counter()  # when the last round ended (or training began)
        self._last_eval = 0.0
        self._finished = False  # the algorithm's finish() ran
        self._closed = False

    # --- setting up ----------------------------------------------------------------------
    def adopt(self, model: nn.Module) -> nn.Module:
        """The model, on this process's device, with the job's initial weights: the
        module the user's loop runs forward through (DDP's wrapper under -m ddp)."""
        if self.model is not None:
            raise RuntimeError("esync.prepare_model was called already: one model a job")
        model.to(self.device).train()
        self.model = model
        # torch's first optimizer imports torch._dynamo (a second or more): built after
        # prepare_model, the user's would do it on the job's clock, so one is built here,
        # before the workers start their clocks together
        torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.0)
        self.algorithm.setup(model, self.device)
        self.recorder.restart_clock()
        self.clock.restart()
        self._round_end = time.perf_counter()
        continues = self.algorithm.continues()
        if continues is not None:
            self._continue(*continues)
        if self.algorithm.resumed_from is not None and self.kept.path is not None:
            for name, value in self.kept.take_back(self.algorithm.resumed_from,
                                                   self._integers()).items():
                setattr(self, name, value)  # the job's steps go on from there
        return self.algorithm.training_module(model)

    def _integers(self) -> Dict[str, torch.Tensor]:
        """The model's integer buffers (BatchNorm's num_batches_tracked): each worker's
        own, not synchronised, so kept with its state."""
        return {name: b for name, b in self.model.named_buffers() if not b.is_floating_point()}

    def _keep_states(self) -> None:
        """The state of each checkpoint the last round's synchronisation named, as the
        script's loop left it after that round (its scheduler stepped after the round's
        last optimizer step): as the next round begins, or at the end."""
        self.kept.keep_pending({"iterations": self.iterations, "samples": self.samples},
                               self._integers())

    def _continue(self, first: Optional[int], elapsed: float) -> None:
        """A process continuing a job (rejoining it, or resuming it from a checkpoint)
        goes on from its first round, on the job's clock, at the data position its own
        log had reached before that round."""
        last = self.recorder.last_record(before=first)
        if first is None:
            first = last["num_iters"] + 1 if last and isinstance(last.get("num_iters"), int) else 1
        self.recorder.drop_from(first)
        epoch = last.get("epoch") if last else None
        if isinstance(epoch, (int, float)) and epoch >= 0:
            self.resume_epoch = float(epoch)
        # where the loader was when round first-1 was pushed (a checkpoint of that round
        # has its samples even if this worker died before logging it), else its record's
        self.resume_data = self.recorder.read_data(first - 1)
        if self.resume_data is None and last and isinstance(last.get("data"), dict):
            self.resume_data = last["data"]
        self.recorder.restart_clock(elapsed)
        self.clock.restart(elapsed)
        self.round = first - 1
        log.info("continuing the job from round %d at %.1f s (epoch %.2f of this partition)",
                 first, elapsed, self.resume_epoch or 0.0)

    # --- what the evaluation and the prepared loaders tell it ----------------------------
    def evaluate_with(self, evaluation: Callable[[], float], metric_kind: str) -> None:
        """Measure the model in this process with `evaluation`, whose value is a
        `metric_kind` (--metric: accuracy or loss)."""
        self.evaluation, self.metric_kind = evaluation, metric_kind

    def loader_prepared(self, batch_size: int) -> bool:
        """A data loader of `batch_size` was prepared: whether it is the training loader
        (the first prepared), whose batch size the algorithm is told and the job's steps
        are counted in (global_steps)."""
        if self.loader_batch is not None:
            return False
        self.loader_batch = batch_size
        self.algorithm.loader_prepared(batch_size)
        return True

    def follow_data(self, epochs_done: Callable[[], float],
                    before_push: Optional[Callable[[], None]] = None,
                    round_fields: Optional[Callable[[], Dict[str, Any]]] = None) -> None:
        """The training data's loader: `epochs_done` says the epochs it has trained (the
        stop criteria and the records read it); `before_push` runs at each round's end,
        before its synchronisation (to keep where the loader is); `round_fields` gives
        fields for each round's record."""
        self._epochs_done = epochs_done
        if before_push is not None:
            self._before_push.append(before_push)
        if round_fields is not None:
            self._round_fields.append(round_fields)

    def epochs_done(self) -> float:
        """Epochs trained, as the training data's loader counts them (0 without one)."""
        return self._epochs_done()

    @contextmanager
    def data_pass(self, ends: Optional[int] = None) -> Iterator[None]:
        """A pass of the training loader under way; counted in passes_done at its end
        (a scheduler stepped once an epoch follows them: esync.runtime.api.prepare_scheduler);
        `ends`: the job's samples at which it ends (job epochs: `pass_ended`)."""
        self.in_pass, self.pass_ends = True, ends
        try:
            yield
        finally:
            self.in_pass, self.pass_ends = False, None
            self.passes_done += 1

    @property
    def in_round(self) -> bool:
        """Whether a round has begun and not ended."""
        return bool(self._budget)

    #: passes asked for after the job stopped: a warning, then an error (a loop that
    #: does not end on esync.should_stop() would otherwise spin for ever, silently)
    EMPTY_PASSES_WARNED, EMPTY_PASSES_REFUSED = 1000, 1_000_000

    def pass_after_stop(self) -> None:
        """A prepared loader was asked for a pass once the job had stopped: it yields
        nothing (an epoch loop runs out its epochs at once); a loop that keeps asking,
        not ending on esync.should_stop(), is told so, then stopped with an error."""
        self._empty_passes += 1
        advice = (f"the job has stopped ({self.stop_reason}) and its prepared loader "
                  f"yields nothing; a loop that counts its own steps or epochs must end on "
                  f"esync.should_stop() too")
        if self._empty_passes == self.EMPTY_PASSES_WARNED:
            log.warning("%s: %d empty passes so far", advice, self._empty_passes)
        if self._empty_passes >= self.EMPTY_PASSES_REFUSED:
            raise RuntimeError(f"{advice} ({self._empty_passes} empty passes)")

    def job_samples(self) -> int:
        """The samples every worker together has trained so far (as of the last
        synchronisation; alone: this process's)."""
        counted = self.algorithm.job_samples()
        return self.samples if counted is None else counted

    def global_steps(self) -> int:
        """How far the job is, in steps of one device's plain loop, the same number on
        a fast and a slow device (prepare_scheduler steps a learning-rate schedule by
        it): with --max-rounds, the rounds ended (a job bounded in rounds counts in
        rounds); where every device takes one step a round (SSGD, DDP, alone), this
        process's local iterations; otherwise (ESync's budgets, ASGD) the batches every
        worker together trained, over the number of workers, as of the last
        synchronisation. A schedule sized as the plain loop's (epochs times
        len(loader)) so ends when the job has trained that many epochs."""
        ended = self.round - (1 if self.in_round else 0)
        if self.stop.max_rounds is not None:
            return ended
        if self.algorithm.lockstep:
            return self.iterations
        batch = self.loader_batch or (self.samples / self.iterations if self.iterations else 0)
        if not batch:
            return ended
        return int(self.job_samples() // (self.num_workers * batch))

    # --- a local iteration ---------------------------------------------------------------
    def batch_size(self) -> Optional[int]:
        """The next local iteration's batch (None: the loader's own); begins a round."""
        self._begin_round()
        return self.algorithm.batch_size()

    def batch_fetched(self, seconds: float, samples: Optional[int], read: float = 0.0,
                      prep: Optional[float] = None) -> None:
        """The data loader kept the loop waiting `seconds` for the next batch, of
        `samples` samples; `read` of them it spent reading shards (the fetch stall, the
        rest is the prep stall); `prep`: the seconds the batch's decoding took where it
        ran (None: in this process, during `seconds`)."""
        self._begin_round()
        self._fetch, self._samples = self._fetch + seconds, samples
        fetched = min(max(0.0, read), seconds)
        self._stalls[0] += fetched
        self._stalls[1] += seconds - fetched
        self._prep_work += seconds - fetched if prep is None else prep
        if self.in_round:  # --slowdown: its computing anywhere in the iteration; not
            self._slower.before()  # for a batch held over a pass's end (Slowdown.before)
        self._mark_batch_ready()

    def report(self, loss: Optional[float] = None, samples: Optional[int] = None,
               metric: Optional[float] = None,
               scalars: Optional[Dict[str, float]] = None) -> None:
        """The user's loss of this local iteration (and its samples, where the loader is
        not esync's); a metric it measured and other scalars, for the next round's
        record (esync.runtime.api.report)."""
        if loss is not None or samples is not None:
            self._begin_round()  # they are the local iteration's, of its round
        if loss is not None:
            self._loss_sum += float(loss)
            self._losses += 1
        if samples is not None:
            self._samples = samples
        if metric is not None:
            self._reported_metric = float(metric)
        if scalars:
            self._scalars.update((k, float(v)) for k, v in scalars.items())

    def step(self, update: Callable[[], Any]) -> Any:
        """The end of a local iteration: the algorithm's local update (it calls `update`,
        the user's optimizer step), the timing, and the round's end once its budget is
        used up. After the job has stopped, only `update`; not even that for the
        iteration the stop reached while it waited for a round (sitting rounds out):
        a step on the job's final model would leave this device's off it."""
        self._begin_round()  # nothing once stopped; it may stop while sitting rounds out
        if self.stop_reason is not None:
            if self._stopped_unrounded:
                self._stopped_unrounded = False
                return None
            return update()
        _sync(self.device)
        t2 = time.perf_counter()
        result = self.algorithm.local_update(self.model, update)
        _sync(self.device)
        t3 = time.perf_counter()
        communicated = self.algorithm.communication_seconds()
        phases = {"get_batch": self._fetch,
                  "forward and backward": t2 - self._batch_ready - communicated,
                  "local update": t3 - t2}
        if communicated:
            phases["global aggregate"] = communicated
        # a slower device's accelerator is slower, not its storage or CPUs: the wait
        # scales the computing only, not the batch's fetch and prep
        computing = t3 - self._batch_ready - communicated
        cpu = time.thread_time() - self._batch_ready_cpu if self._cpu_measured() else None
        ahead = self._slower.ahead  # (the part of the wait before the computing)
        waited = self._slower.wait(computing, self._samples, cpu)
        if waited is not None:
            phases["slowdown"] = waited
            self._aheads.append(round(ahead, 6))
            if cpu is not None:
                self._cpu_times.append(round(cpu, 6))
        self.algorithm.iteration_timed(computing + self._fetch + (waited or 0.0),
                                       self._samples or 0)
        i = len(self._times)
        self._times[i] = {**self._first_phases, **phases} if i == 0 else phases
        self._round_samples += self._samples or 0
        self.samples += self._samples or 0
        self.iterations += 1
        self._next_iteration()
        if len(self._times) >= self._budget or self.algorithm.round_over() or (
                self.algorithm.decides_stop and self.stop.epochs_reached(self.epochs_done())):
            self._end_round()
        return result

    def _mark_batch_ready(self) -> None:
        """The batch is in hand: the local iteration's computing starts now (its CPU
        time read only where --slowdown needs it)."""
        self._batch_ready = time.perf_counter()
        self._batch_ready_cpu = time.thread_time() if self._slower.factor > 1.0 else 0.0

    def _cpu_measured(self) -> bool:
        """Whether --slowdown's wait is based on the computing's CPU time (a CPU device
        computing on this thread alone) rather than its wall time (Slowdown)."""
        return self._slower.factor > 1.0 and self.device.type == "cpu" and \
            torch.get_num_threads() == 1

    def _next_iteration(self) -> None:
        self._fetch, self._samples = 0.0, None
        self._mark_batch_ready()

    # --- rounds --------------------------------------------------------------------------
    def _begin_round(self, sit_out: bool = True) -> None:
        """Begin the next round, unless one is under way or the job has stopped. A
        budget of 0 (ESync's --least-speed: this device is too slow to help this round)
        is a round sat out: it ends at once, synchronising nothing of its own, and the
        next begins, until the algorithm gives a budget or the job stops; `sit_out`
        False (leaving) begins it and returns."""
        running = self.stop_reason is None
        while not self._budget and self.stop_reason is None and not self.pass_ended():
            if self.model is None:
                raise RuntimeError("call esync.prepare_model(model) before training")
            if self.kept.pending:
                self._keep_states()
            self.round += 1
            budget, self._first_phases = self.algorithm.begin_round(self.round)
            if budget < 0:
                raise ValueError(f"{self.algorithm.name} gave round {self.round} {budget} "
                                 f"local iterations")
            self._budget = budget
            self._times: Dict[int, Phases] = {}
            self._cpu_times: List[float] = []  # the slowdown's basis, where it is CPU time
            self._aheads: List[float] = []  # the slowdown's waits before the computing
            self._loss_sum, self._losses, self._round_samples = 0.0, 0, 0
            self._stalls = [0.0, 0.0]  # seconds blocked on data: fetch, prep
            self._prep_work = 0.0
            self._paused = 0.0  # in-process evaluations the clock does not count
            self._traffic = self.algorithm.traffic()
            self._next_iteration()
            if not budget:
                if not sit_out:
                    return
                self._slower.rested()  # its next iteration measures it afresh
                self._end_round()
        if running and self.stop_reason is not None:
            self._stopped_unrounded = True

    def pass_ended(self) -> bool:
        """Whether the job's samples have reached the end of the pass under way
        (`pass_ends`): the loader ends its pass after that round, and a device sitting
        rounds out stops sitting out there, after the same round as the others' (it went
        on into the next round, whose end the others, their pass over and maybe their
        job, never pushed: one more round than theirs)."""
        return self.pass_ends is not None and self.job_samples() >= self.pass_ends

    def _end_round(self, announce: Optional[str] = None) -> None:
        if not self._times:  # a round ended before its first local iteration
            self._times[0] = dict(self._first_phases)
        for hook in self._before_push:
            hook()
        self._times[len(self._times) - 1].update(self.algorithm.end_round(self.round, self.model))
        self._budget = 0
        self.kept.pending += self.algorithm.checkpointed()  # kept as the next round begins
        metric = self._evaluate()
        if metric is None and self._reported_metric is not None:  # the script's own
            metric = self.metric = self._reported_metric
        self._reported_metric = None
        if self._scalars:
            evaluated_scalars, self._scalars = self._scalars, {}
        else:
            evaluated_scalars = None
        sent, received = self.algorithm.traffic()
        mean_loss = self._loss_sum / self._losses if self._losses else math.nan
        evaluated = {} if metric is None else {METRIC_RECORD[self.metric_kind]: metric}
        if evaluated_scalars:
            evaluated["scalars"] = evaluated_scalars
        ended = time.perf_counter()
        evaluated["breakdown"] = breakdown(
            self._times.values(), *self._stalls, self.algorithm.waited_seconds(),
            ended - self._round_end - self._paused)
        evaluated["prep_seconds"] = round(self._prep_work, 6)
        if self._cpu_times:
            evaluated["compute_cpu"] = self._cpu_times
        if self._aheads:
            evaluated["slowdown_ahead"] = self._aheads
        self.last_breakdown = evaluated["breakdown"]
        self._round_end = ended
        for fields in self._round_fields:
            evaluated.update(fields())
        # one reading for the record and the stop decision: a round stopped by the time
        # limit records a total_time of at least that limit
        elapsed = self.clock()
        self.recorder.write_round(self.round, self._times, self._round_samples, mean_loss,
                                  sent - self._traffic[0], received - self._traffic[1],
                                  at=elapsed, epoch=round(self.epochs_done(), 6), **evaluated,
                                  **self.algorithm.round_record())
        if metric is not None:
            log.info("[%s] round %d iteration %d epoch %.2f loss %.4f %s %.4f time %.1fs",
                     self.algorithm.name, self.round, self.iterations, self.epochs_done(),
                     mean_loss, METRIC_LINE[self.metric_kind], metric, elapsed)
        if self._losses and not math.isfinite(mean_loss):
            self.diverged = True
            self._stopped("stopped: the training loss is not finite (learning rate too high?)")
            return
        reason = self.algorithm.agree_stop(
            announce or self.stop.reason(self.round, self.epochs_done(), elapsed, metric),
            everyone=announce is None and self.stop.rounds_reached(self.round))
        if reason:
            self._stopped(reason)

    def _evaluate(self) -> Optional[float]:
        if self.evaluation is None:
            return None
        if self.algorithm.evaluates(self.round):
            self.metric = self.evaluation()
            return self.metric
        if self.eval_interval is not None and self.clock() - self._last_eval >= self.eval_interval:
            started = time.perf_counter()
            self.metric = self.evaluation()
            spent = time.perf_counter() - started
            self.clock.pause(spent)
            self.recorder.pause(spent)
            self._paused += spent
            self._last_eval = self.clock()
            return self.metric
        return None

    def _stopped(self, reason: str) -> None:
        self.stop_reason = reason
        if self.rank == 0 and self.model is not None:
            self.algorithm.final_model(self.model)
            self._write_model()
        self._finish_algorithm()
        log.info("[%s] %s after %d rounds, %d iterations, %.1fs; last %s %s",
                 self.algorithm.name, reason, self.round, self.iterations, self.clock(),
                 METRIC_LINE[self.metric_kind], "n/a" if self.metric is None else f"{self.metric:.4f}")

    def _write_model(self) -> None:
        """The job's final model as a state_dict in safetensors (no pickle): load it with
        `model.load_state_dict(safetensors.torch.load_file(path))`."""
        if self.model_file is None:
            return
        from safetensors.torch import save_file

        state = {k: v.detach().to("cpu").contiguous().clone()  # tied weights: copies
                 for k, v in self.model.state_dict().items()}
        try:
            os.makedirs(os.path.dirname(self.model_file) or ".", exist_ok=True)
            save_file(state, self.model_file + ".partial",
                      metadata={"round": str(self.round), "stop": self.stop_reason or ""})
            os.replace(self.model_file + ".partial", self.model_file)
        except OSError as e:
            log.warning("cannot write the job's model to %s: %s", self.model_file,
                        e.strerror or e)
            return
        log.info("[%s] the job's model (its state_dict, safetensors): %s",
                 self.algorithm.name, self.model_file)

    def _finish_algorithm(self) -> None:
        if not self._finished:
            self._finished = True
            self.algorithm.finish()

    # --- the end -------------------------------------------------------------------------
    def leave(self, reason: str) -> None:
        """The user's loop ended before the job's stop criteria: the round in progress
        ends now (its local iterations so far), telling the others in a synchronous job
        that this worker stops, so that all stop after that round."""
        if self.stop_reason is not None or self.model is None:
            return
        if not self._budget and self.algorithm.leave(reason):
            self._stopped(reason)
            return
        if not (self._budget and self._times) and not self.algorithm.synchronous:
            self._stopped(reason)  # nothing to push, and nobody waits for it
            return
        if not self._budget:
            self._begin_round(sit_out=False)
        self.algorithm.agree_stop(reason)  # said with this round's push, in a synchronous job
        self._end_round(announce=reason)
        if self.stop_reason is None:  # the others learn it after this round's push
            self._stopped(reason)

    def position(self) -> Dict[str, Any]:
        """Where this worker is in the job: its round, local iterations, the round's
        budget (0 between rounds) and epochs of its partition."""
        return {"round": self.round, "iterations": self.iterations, "budget": self._budget,
                "epochs": round(self.epochs_done(), 6)}

    def result(self) -> TrainResult:
        return TrainResult(self.round, self.iterations, self.epochs_done(), self.clock(),
                           self.metric, self.stop_reason or "", self.diverged)

    def close(self, error: Optional[BaseException] = None) -> None:
        """Release the job's resources (the algorithm's connections, the recorder, the
        cluster membership, told of `error` if training failed); idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if error is None and self.kept.pending:  # the last round's, as the loop left it
                self._keep_states()
            self._finish_algorithm()
            self.recorder.close()
        finally:
            self._on_close(error)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, kind, error, traceback) -> None:
        self.close(error)
