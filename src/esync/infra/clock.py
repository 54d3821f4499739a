"""A training process's clocks: the training time the logs and the time limit count
(Clock), and the wait that makes it act as a slower device (Slowdown)."""
from __future__ import annotations

import statistics
import time
from collections import deque
from typing import Deque, Optional


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
