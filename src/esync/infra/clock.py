"""A training process's clocks: the training time the logs and the time limit count
(Clock), and the wait that makes it act as a slower device (Slowdown)."""
from __future__ import annotations

import time
from collections import deque
from typing import Deque, Iterable, Optional


def lower_quartile(values: Iterable[float]) -> float:
    """The value a quarter of the way up the sorted values (the least of up to 4)."""
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 4]


class Slowdown:
    """Makes this process act as a device `factor` times slower: a local iteration whose
    computing took `seconds` is made to last factor * m in all, m the lower quartile of
    its last WINDOW iterations' computing (this one included): it waits factor * m -
    seconds, less what earlier iterations overran (`owed`).

    m is measured in the process's CPU seconds where it computes on a CPU with one torch
    thread (`cpu_seconds`, the thread's time.thread_time()), else in wall seconds. On a
    machine shared by several simulated devices the wall time of an iteration swings
    with the others' load (sixteen devices that start a round at once each wait their
    turn for a core: 4x the iteration's CPU time), and a device that waited (F - 1)
    times that would be slower than F by the load, most of all a slow device, whose
    every iteration is a round's first. Its CPU time is what the iteration cost, as a
    device of its own would run it, less what the others' computing adds to some
    iterations' CPU time on shared caches and a shared host: the lower quartile leaves
    that out (the LM's fast device at 8x15: a median of 33.7-37.9 ms of CPU per
    iteration beside 16 processes, 31.5 ms alone, the lowest tenth at 30.5-31.5 ms in
    both), where the median, used until 2026-11-28, charged it to the device, made 2.875
    times as long. The quartile also ignores the slow first iteration. The window holds
    iterations of one batch size: a new size (speed-balanced DDP) starts it afresh, as a
    real device's time follows its batch at once.

    An iteration whose computing alone took longer than factor * m (it waited for a
    core the others held: on 2 cores every device of an ESync round starts computing at
    once) waits nothing, and the excess, up to one iteration's factor * m, is taken off
    the next waits: the device keeps its speed over a few iterations as a device of its
    own would, where before it lost the excess every round (the LM's fast device at
    4x7: a median of 41 ms of computing an iteration, a mean of 67 against 36 alone,
    its iterations 15% longer than alone's)."""

    WINDOW = 15

    def __init__(self, factor: float):
        self.factor = factor
        self.recent: Deque[float] = deque(maxlen=self.WINDOW)
        self.samples: Optional[int] = None  # the batch size of those in `recent`
        self.owed = 0.0  # seconds earlier iterations lasted beyond factor * m

    def wait(self, seconds: float, samples: Optional[int] = None,
             cpu_seconds: Optional[float] = None) -> Optional[float]:
        """Wait after an iteration that computed for `seconds` (wall; its CPU time
        `cpu_seconds` where that is the measure) on `samples` samples; returns the wait
        (None with factor 1)."""
        if self.factor <= 1.0:
            return None
        waited = self.due(seconds, samples, cpu_seconds)
        time.sleep(waited)
        return waited

    def due(self, seconds: float, samples: Optional[int] = None,
            cpu_seconds: Optional[float] = None) -> float:
        """The wait after that iteration, without waiting (the window and what is owed
        move on as in `wait`)."""
        if samples != self.samples:
            self.recent.clear()
            self.samples = samples
        self.recent.append(seconds if cpu_seconds is None else cpu_seconds)
        lasts = self.factor * lower_quartile(self.recent)
        waited = lasts - seconds - self.owed
        self.owed = min(max(0.0, -waited), lasts)
        return max(0.0, waited)


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
