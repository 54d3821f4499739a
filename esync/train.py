"""The training loop, written once: every algorithm plugs into it through its hooks."""
from __future__ import annotations

import logging
import math
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from esync.algorithms.base import Algorithm
from esync.data.batches import BatchStream
from esync.data.datasets import Dataset
from esync.recorder import Recorder

EVAL_BATCH = 512

log = logging.getLogger(__name__)


@dataclass
class StopCriteria:
    """Whichever limit is reached first ends the run; None means no such limit. The
    target accuracy counts once it has held `target_hold` seconds (every evaluation in
    between at or above it)."""

    epochs: Optional[float] = None
    max_rounds: Optional[int] = None
    time_limit: Optional[float] = None
    target_accuracy: Optional[float] = None
    target_hold: float = 0.0
    _held_since: Optional[float] = field(default=None, repr=False)

    def epochs_reached(self, epochs_done: float) -> bool:
        return self.epochs is not None and epochs_done >= self.epochs - 1e-9

    def target_held(self, accuracy: Optional[float], elapsed: float) -> Optional[str]:
        """After an evaluation (accuracy None: none this time): the reason to stop, if
        the target has now held long enough."""
        if self.target_accuracy is None or accuracy is None:
            return None
        if accuracy < self.target_accuracy:
            self._held_since = None
            return None
        if self._held_since is None:
            self._held_since = elapsed
        if elapsed - self._held_since < self.target_hold:
            return None
        held = f" (held {self.target_hold:g} s)" if self.target_hold else ""
        return f"reached target accuracy {self.target_accuracy}{held}"

    def reason(self, rounds: int, epochs_done: float, elapsed: float,
               accuracy: Optional[float]) -> Optional[str]:
        reached = self.target_held(accuracy, elapsed)
        if reached:
            return reached
        if self.epochs_reached(epochs_done):
            return f"finished {self.epochs:g} epoch{'' if self.epochs == 1 else 's'}"
        if self.max_rounds is not None and rounds >= self.max_rounds:
            return f"finished {self.max_rounds} rounds"
        if self.time_limit is not None and elapsed >= self.time_limit:
            return f"reached the time limit of {self.time_limit:g} s"
        return None


@dataclass
class TrainResult:
    rounds: int
    iterations: int
    epochs: float
    seconds: float
    accuracy: Optional[float]
    stop_reason: str
    diverged: bool = False


def evaluate(model: nn.Module, dataset: Dataset, device: torch.device) -> float:
    """Top-1 accuracy on the whole test set."""
    model.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, len(dataset.test_labels), EVAL_BATCH):
            images = dataset.normalize(dataset.test_images[start:start + EVAL_BATCH])
            labels = dataset.test_labels[start:start + EVAL_BATCH].to(device)
            correct += (model(images.to(device)).argmax(1) == labels).sum().item()
    model.train()
    return correct / len(dataset.test_labels)


def _sync(device: torch.device) -> None:
    """Wait for queued GPU work, so that phase timings measure the work itself."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Slowdown:
    """Makes this process act as a device `factor` times slower: after a local iteration
    of t seconds it waits (factor - 1) * m, where m is the median of its last WINDOW
    iterations' t (this one included). Using m rather than t keeps the device's speed
    steady: on a machine shared by several simulated devices, t swings with the others'
    load, and waiting (factor - 1) * t would multiply each swing by `factor`, a noise no
    real slower device has; the median also ignores the slow first iteration. The
    window holds iterations of one batch size: a new size (speed-balanced DDP) starts it
    afresh, as a real device's time follows its batch at once."""

    WINDOW = 15

    def __init__(self, factor: float):
        self.factor = factor
        self.recent: Deque[float] = deque(maxlen=self.WINDOW)
        self.samples: Optional[int] = None  # the batch size of those in `recent`

    def wait(self, seconds: float, samples: Optional[int] = None) -> Optional[float]:
        """Wait after an iteration of `seconds` on `samples` samples; returns the wait
        (None with factor 1)."""
        if self.factor <= 1.0:
            return None
        if samples != self.samples:
            self.recent.clear()
            self.samples = samples
        self.recent.append(seconds)
        waited = (self.factor - 1.0) * statistics.median(self.recent)
        time.sleep(waited)
        return waited


def _local_iteration(model: nn.Module, algorithm: Algorithm, batches: BatchStream,
                     device: torch.device, slowdown: Slowdown) -> Tuple[Dict[str, float], float, int]:
    """One batch, forward and backward, the algorithm's update, and the simulated wait.

    Returns the timed phases, the batch's loss and its number of samples. Communication
    inside the iteration (DDP's all-reduce during backward) is logged as `global
    aggregate`, not as computing, and the simulated slowdown scales computing only.
    """
    t0 = time.perf_counter()
    images, labels = batches.next(algorithm.batch_size())
    t1 = time.perf_counter()
    model.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(images), labels)
    loss.backward()
    _sync(device)
    t2 = time.perf_counter()
    algorithm.local_update(model)
    _sync(device)
    t3 = time.perf_counter()
    communicated = algorithm.communication_seconds()
    phases = {"get_batch": t1 - t0, "forward and backward": t2 - t1 - communicated,
              "local update": t3 - t2}
    if communicated:
        phases["global aggregate"] = communicated
    waited = slowdown.wait(t3 - t0 - communicated, len(labels))
    if waited is not None:
        phases["slowdown"] = waited
    algorithm.iteration_timed(t3 - t0 - communicated + (waited or 0.0), len(labels))
    return phases, loss.item(), len(labels)


class Clock:
    """Seconds of training: wall-clock time since `restart`, less the pauses (the
    in-process evaluations of a run timed by --eval-interval)."""

    def __init__(self) -> None:
        self.restart()

    def restart(self, elapsed: float = 0.0) -> None:
        self.start, self.paused = time.perf_counter() - elapsed, 0.0

    def __call__(self) -> float:
        return time.perf_counter() - self.start - self.paused

    def pause(self, seconds: float) -> None:
        self.paused += seconds


def _continue(continues: Tuple[Optional[int], float], recorder: Recorder,
              batches: BatchStream, clock: Clock) -> int:
    """A process continuing a job (rejoining it, or resuming it from a checkpoint) goes
    on from its first round, on the job's clock, at the data position its own log had
    reached before that round; returns the round before its first."""
    first, elapsed = continues
    last = recorder.last_record(before=first)
    if first is None:
        first = last["num_iters"] + 1 if last and isinstance(last.get("num_iters"), int) else 1
    recorder.drop_from(first)
    epoch = last.get("epoch") if last else None
    if isinstance(epoch, (int, float)) and epoch >= 0:
        batches.skip_to(int(round(epoch * batches.partition_size)))
    recorder.restart_clock(elapsed)
    clock.restart(elapsed)
    log.info("continuing the job from round %d at %.1f s (epoch %.2f of this partition)",
             first, elapsed, batches.epochs_done)
    return first - 1


def train(model: nn.Module, algorithm: Algorithm, batches: BatchStream, dataset: Dataset,
          recorder: Recorder, stop: StopCriteria, device: torch.device,
          slowdown: float = 1.0, eval_interval: Optional[float] = None) -> TrainResult:
    """Run rounds until a stop criterion holds.

    A round: the algorithm names its number of local iterations; each local iteration
    fetches a batch, runs forward and backward, and lets the algorithm update; then the
    algorithm ends the round (aggregation), the process may evaluate, and the round's
    record is written. With `slowdown` F > 1, each local iteration is followed by a
    wait of (F-1) times the median of the recent iterations' computing times
    (Slowdown), logged as the phase `slowdown`.

    Evaluation: after the rounds the algorithm names (`-e`), or, with `eval_interval`,
    after the first round that ends `eval_interval` seconds of training after the last
    evaluation; such an evaluation pauses the clock (the logs' `total_time` and the
    time limit), as a separate evaluator process would cost training nothing.
    """
    model.train()
    slower = Slowdown(slowdown)
    algorithm.setup(model, device)
    net = algorithm.training_module(model)
    recorder.restart_clock()
    clock = Clock()
    round_, iterations, accuracy, last_eval = 0, 0, None, 0.0
    continues = algorithm.continues()
    if continues is not None:
        round_ = _continue(continues, recorder, batches, clock)
    try:
        while True:
            round_ += 1
            budget, first_phases = algorithm.begin_round(round_)
            if budget < 1:
                raise ValueError(f"{algorithm.name} gave round {round_} {budget} local iterations")
            times: Dict[int, Dict[str, float]] = {}
            loss_sum, samples, sent0, received0 = 0.0, 0, *algorithm.traffic()
            for i in range(budget):
                phases, loss, count = _local_iteration(net, algorithm, batches, device,
                                                       slower)
                times[i] = {**first_phases, **phases} if i == 0 else phases
                loss_sum += loss
                samples += count
                iterations += 1
                if algorithm.decides_stop and stop.epochs_reached(batches.epochs_done):
                    break
            times[len(times) - 1].update(algorithm.end_round(round_, model))
            accuracy_now = None
            if algorithm.evaluates(round_):
                accuracy = accuracy_now = evaluate(model, dataset, device)
            elif eval_interval is not None and clock() - last_eval >= eval_interval:
                started = time.perf_counter()
                accuracy = accuracy_now = evaluate(model, dataset, device)
                spent = time.perf_counter() - started
                clock.pause(spent)
                recorder.pause(spent)
                last_eval = clock()
            sent, received = algorithm.traffic()
            mean_loss = loss_sum / max(1, len(times))
            recorder.write_round(round_, times, samples, mean_loss, sent - sent0,
                                 received - received0, accuracy_now,
                                 epoch=round(batches.epochs_done, 6), **algorithm.round_record())
            elapsed = clock()
            if accuracy_now is not None:
                log.info("[%s] round %d iteration %d epoch %.2f loss %.4f test accuracy %.4f "
                         "time %.1fs", algorithm.name, round_, iterations,
                         batches.epochs_done, mean_loss, accuracy_now, elapsed)
            diverged = not math.isfinite(mean_loss)
            if diverged:
                reason = "stopped: the training loss is not finite (learning rate too high?)"
                break
            reason = algorithm.agree_stop(
                stop.reason(round_, batches.epochs_done, elapsed, accuracy_now))
            if reason:
                break
    finally:
        algorithm.finish()
    log.info("[%s] %s after %d rounds, %d iterations, %.1fs; last test accuracy %s",
             algorithm.name, reason, round_, iterations, clock(),
             "n/a" if accuracy is None else f"{accuracy:.4f}")
    return TrainResult(round_, iterations, batches.epochs_done, clock(), accuracy, reason,
                       diverged)
