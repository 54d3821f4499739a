"""The training loop, written once: every algorithm plugs into it through its hooks."""
from __future__ import annotations

import logging
import math
import statistics
import time
from collections import deque
from dataclasses import dataclass
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
    """Whichever limit is reached first ends the run; None means no such limit."""

    epochs: Optional[float] = None
    max_rounds: Optional[int] = None
    time_limit: Optional[float] = None
    target_accuracy: Optional[float] = None

    def epochs_reached(self, epochs_done: float) -> bool:
        return self.epochs is not None and epochs_done >= self.epochs - 1e-9

    def reason(self, rounds: int, epochs_done: float, elapsed: float,
               accuracy: Optional[float]) -> Optional[str]:
        if self.target_accuracy is not None and accuracy is not None \
                and accuracy >= self.target_accuracy:
            return f"reached target accuracy {self.target_accuracy}"
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
    real slower device has; the median also ignores the slow first iteration."""

    WINDOW = 15

    def __init__(self, factor: float):
        self.factor = factor
        self.recent: Deque[float] = deque(maxlen=self.WINDOW)

    def wait(self, seconds: float) -> Optional[float]:
        """Wait after an iteration of `seconds`; returns the wait (None with factor 1)."""
        if self.factor <= 1.0:
            return None
        self.recent.append(seconds)
        waited = (self.factor - 1.0) * statistics.median(self.recent)
        time.sleep(waited)
        return waited


def _local_iteration(model: nn.Module, algorithm: Algorithm, batches: BatchStream,
                     device: torch.device, slowdown: Slowdown) -> Tuple[Dict[str, float], float, int]:
    """One batch, forward and backward, the algorithm's update, and the simulated wait.

    Returns the timed phases, the batch's loss and its number of samples.
    """
    t0 = time.perf_counter()
    images, labels = batches.next()
    t1 = time.perf_counter()
    model.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(images), labels)
    loss.backward()
    _sync(device)
    t2 = time.perf_counter()
    algorithm.local_update(model)
    _sync(device)
    t3 = time.perf_counter()
    phases = {"get_batch": t1 - t0, "forward and backward": t2 - t1, "local update": t3 - t2}
    waited = slowdown.wait(t3 - t0)
    if waited is not None:
        phases["slowdown"] = waited
    return phases, loss.item(), len(labels)


def train(model: nn.Module, algorithm: Algorithm, batches: BatchStream, dataset: Dataset,
          recorder: Recorder, stop: StopCriteria, device: torch.device,
          slowdown: float = 1.0) -> TrainResult:
    """Run rounds until a stop criterion holds.

    A round: the algorithm names its number of local iterations; each local iteration
    fetches a batch, runs forward and backward, and lets the algorithm update; then the
    algorithm ends the round (aggregation), the process may evaluate, and the round's
    record is written. With `slowdown` F > 1, each local iteration is followed by a
    wait of (F-1) times the median of the recent iterations' times (Slowdown), logged
    as the phase `slowdown`.
    """
    model.train()
    slower = Slowdown(slowdown)
    algorithm.setup(model, device)
    recorder.restart_clock()
    start = time.perf_counter()
    round_, iterations, accuracy = 0, 0, None
    try:
        while True:
            round_ += 1
            budget, first_phases = algorithm.begin_round(round_)
            if budget < 1:
                raise ValueError(f"{algorithm.name} gave round {round_} {budget} local iterations")
            times: Dict[int, Dict[str, float]] = {}
            loss_sum, samples, sent0, received0 = 0.0, 0, *algorithm.traffic()
            for i in range(budget):
                phases, loss, count = _local_iteration(model, algorithm, batches, device,
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
            sent, received = algorithm.traffic()
            mean_loss = loss_sum / max(1, len(times))
            recorder.write_round(round_, times, samples, mean_loss, sent - sent0,
                                 received - received0, accuracy_now,
                                 epoch=round(batches.epochs_done, 6), **algorithm.round_record())
            elapsed = time.perf_counter() - start
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
             algorithm.name, reason, round_, iterations, time.perf_counter() - start,
             "n/a" if accuracy is None else f"{accuracy:.4f}")
    return TrainResult(round_, iterations, batches.epochs_done, time.perf_counter() - start,
                       accuracy, reason, diverged)
