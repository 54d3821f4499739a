"""A worker's part in a job, round by round: the machinery behind the public API's
optimizer wrapper (esync.api), and so behind every training loop, the built-in one
(esync.train) included.

A round: the algorithm names its budget of local iterations (`begin_round`); each
local iteration is the user's forward and backward, then `step`, which runs the
algorithm's local update (the user's optimizer), the simulated slowdown and the timing;
when the budget is used up the algorithm ends the round (push/pull or all-reduce), the
process may evaluate, the round's record is written and the stop criteria are agreed on.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import torch
from torch import nn

from esync.algorithms.base import Algorithm, Phases
from esync.breakdown import breakdown
from esync.clock import Clock, Slowdown
from esync.data import METRIC_LINE, METRIC_RECORD
from esync.data.order import DataSettings
from esync.recorder import Recorder
from esync.stop import StopCriteria

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
    round in progress. The API creates it (esync.api.init); its verbs call it.

    `evaluation`, if set, measures the model in this process (the built-in loop's test
    accuracy) after the rounds the algorithm names, or with `eval_interval` by the clock;
    `epochs_done` is read from the prepared data loader; `on_close` undoes the joining
    (leaves the cluster or the process group)."""

    def __init__(self, algorithm: Algorithm, recorder: Recorder, stop: StopCriteria,
                 device: torch.device, slowdown: float = 1.0,
                 eval_interval: Optional[float] = None, rank: int = 0,
                 num_workers: int = 1, data: DataSettings = DataSettings(),
                 on_close: Callable[[Optional[BaseException]], None] = lambda error: None):
        self.algorithm, self.recorder, self.stop = algorithm, recorder, stop
        self.device, self.rank, self.num_workers = device, rank, num_workers
        self.data = data  # how prepared data loaders split and order the data
        self.eval_interval = eval_interval
        self.evaluation: Optional[Callable[[], float]] = None
        self.metric_kind = "accuracy"  # what `evaluation` measures (--metric)
        self.epochs_done: Callable[[], float] = lambda: 0.0
        self.model: Optional[nn.Module] = None
        self.clock = Clock()
        self._slower = Slowdown(slowdown)
        self._on_close = on_close
        self.round = 0            # the round in progress (or the last one)
        self.iterations = 0
        self.metric: Optional[float] = None  # the last in-process evaluation's
        self.stop_reason: Optional[str] = None
        self.diverged = False
        self.resume_epoch: Optional[float] = None  # data position to go on from
        #: the prepared loader's state in this worker's last record, to go on from
        self.resume_data: Optional[Dict[str, Any]] = None
        #: called at each round's end, before its synchronisation (the push)
        self.before_push: List[Callable[[], None]] = []
        #: called at each round's end, before its record is written: fields to add
        self.round_fields: List[Callable[[], Dict[str, Any]]] = []
        #: the ps-lite cluster's node (None alone or under DDP): block leases ask it
        self.node = None
        #: where the last round's time went (esync.breakdown), once a round has ended
        self.last_breakdown: Dict[str, float] = {}
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
        return self.algorithm.training_module(model)

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

    @property
    def in_round(self) -> bool:
        """Whether a round has begun and not ended."""
        return bool(self._budget)

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
        self._batch_ready = time.perf_counter()

    def report(self, loss: Optional[float] = None, samples: Optional[int] = None) -> None:
        """The user's loss of this local iteration (and its samples, where the loader is
        not esync's)."""
        if loss is not None:
            self._loss_sum += float(loss)
            self._losses += 1
        if samples is not None:
            self._samples = samples

    def step(self, update: Callable[[], Any]) -> Any:
        """The end of a local iteration: the algorithm's local update (it calls `update`,
        the user's optimizer step), the timing, and the round's end once its budget is
        used up. After the job has stopped, only `update`."""
        if self.stop_reason is not None:
            return update()
        self._begin_round()
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
        waited = self._slower.wait(computing, self._samples)
        if waited is not None:
            phases["slowdown"] = waited
        self.algorithm.iteration_timed(computing + self._fetch + (waited or 0.0),
                                       self._samples or 0)
        i = len(self._times)
        self._times[i] = {**self._first_phases, **phases} if i == 0 else phases
        self._round_samples += self._samples or 0
        self.iterations += 1
        self._next_iteration()
        if len(self._times) >= self._budget or (
                self.algorithm.decides_stop and self.stop.epochs_reached(self.epochs_done())):
            self._end_round()
        return result

    def _next_iteration(self) -> None:
        self._fetch, self._samples = 0.0, None
        self._batch_ready = time.perf_counter()

    # --- rounds --------------------------------------------------------------------------
    def _begin_round(self) -> None:
        if self._budget or self.stop_reason is not None:
            return
        if self.model is None:
            raise RuntimeError("call esync.prepare_model(model) before training")
        self.round += 1
        budget, self._first_phases = self.algorithm.begin_round(self.round)
        if budget < 1:
            raise ValueError(f"{self.algorithm.name} gave round {self.round} {budget} "
                             f"local iterations")
        self._budget = budget
        self._times: Dict[int, Phases] = {}
        self._loss_sum, self._losses, self._round_samples = 0.0, 0, 0
        self._stalls = [0.0, 0.0]  # seconds blocked on data: fetch, prep
        self._prep_work = 0.0
        self._paused = 0.0  # in-process evaluations the clock does not count
        self._traffic = self.algorithm.traffic()
        self._next_iteration()

    def _end_round(self, announce: Optional[str] = None) -> None:
        if not self._times:  # a round ended before its first local iteration
            self._times[0] = dict(self._first_phases)
        for hook in self.before_push:
            hook()
        self._times[len(self._times) - 1].update(self.algorithm.end_round(self.round, self.model))
        self._budget = 0
        metric = self._evaluate()
        sent, received = self.algorithm.traffic()
        mean_loss = self._loss_sum / self._losses if self._losses else math.nan
        evaluated = {} if metric is None else {METRIC_RECORD[self.metric_kind]: metric}
        ended = time.perf_counter()
        evaluated["breakdown"] = breakdown(
            self._times.values(), *self._stalls, self.algorithm.waited_seconds(),
            ended - self._round_end - self._paused)
        evaluated["prep_seconds"] = round(self._prep_work, 6)
        self.last_breakdown = evaluated["breakdown"]
        self._round_end = ended
        for fields in self.round_fields:
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
            announce or self.stop.reason(self.round, self.epochs_done(), elapsed, metric))
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
        self._finish_algorithm()
        log.info("[%s] %s after %d rounds, %d iterations, %.1fs; last %s %s",
                 self.algorithm.name, reason, self.round, self.iterations, self.clock(),
                 METRIC_LINE[self.metric_kind], "n/a" if self.metric is None else f"{self.metric:.4f}")

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
        if not (self._budget and self._times) and not self.algorithm.synchronous:
            self._stopped(reason)  # nothing to push, and nobody waits for it
            return
        if not self._budget:
            self._begin_round()
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
            self._finish_algorithm()
            self.recorder.close()
        finally:
            self._on_close(error)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, kind, error, traceback) -> None:
        self.close(error)
