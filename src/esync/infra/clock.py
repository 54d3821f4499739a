"""A training process's clocks: the training time the logs and the time limit count
(Clock), and the wait that makes it act as a slower device (Slowdown)."""
from __future__ import annotations

import random
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
    its iterations 15% longer than alone's).

    Part of the wait comes before the computing (`before`): a share drawn uniformly
    from [0, 1) of the wait the window expects, (factor - 1) * m less what is owed, so
    that the iteration's computing falls anywhere in it, as a slower device's computing
    is spread over all of its iteration, rather than all at its start. Devices that
    begin a round together (every one after the pull) otherwise all computed at once and
    then all slept: on 2 cores shared by 8 or 16 simulated devices, whose computing
    together fits in one core, the fast device's first iteration of a round in which
    the slow ones computed lasted 4-10 times its others (0.54-0.58 s for 0.14 s at
    16x7, 1.2-1.5 s at 8x15), a contention a machine whose devices each have their own
    core does not have. What the waits add up to is unchanged: the wait after computing
    is the rest, and one before that turned out longer than the whole wait (the
    computing ran long) counts as an overrun (`owed`). Only once the window holds two
    iterations (from the third on): the first, a warm-up (3 times the next ones' CPU
    time on the ResNet), would have the second wait as if it were one (a device at
    --slowdown 23 waited 7.6 s before computing an iteration that was to last 3.2 s).
    The draws follow `seed` (the worker's rank), so that a run's waits can be replayed
    from its records. Only esync's prepared loaders and the built-in loop call
    `before` (Session.batch_fetched); with a script's own loader the whole wait comes
    after the computing, as before.

    A device that sat rounds out (`rested`) owes nothing: its next iteration measures
    its speed afresh, where what it owed would have made it look several times faster
    (the one after an overrun of 3.2 s lasted 0.32 s, and a device at 1/8 of the fast
    one's speed was taken for one at its speed and trained)."""

    WINDOW = 15

    def __init__(self, factor: float, seed: Optional[int] = None):
        self.factor = factor
        self.recent: Deque[float] = deque(maxlen=self.WINDOW)
        self.samples: Optional[int] = None  # the batch size of those in `recent`
        self.owed = 0.0  # seconds earlier iterations lasted beyond factor * m
        self.ahead = 0.0  # seconds waited before this iteration's computing
        self._draws = random.Random(seed)

    def before(self) -> float:
        """Wait before an iteration's computing (ahead_of_computing's share); returns
        the wait. Called in a round only (Session.batch_fetched): a device sitting
        rounds out whose pass ends holds its fetched batch for the next pass, and a wait
        then, rounds before its computing, left its measuring iteration 0.5 s for 3.7
        (it trained at 1/16 of the fast device's speed, which waited 2-10 s a round for
        it), or, drawn again with the batch, twice the wait (4 s unrecorded)."""
        waited = self.ahead_of_computing()
        if waited:
            time.sleep(waited)
        return waited

    def rested(self) -> None:
        """The device sat rounds out: it owes nothing from before them."""
        self.owed = 0.0

    def ahead_of_computing(self) -> float:
        """The wait before the next iteration's computing, without waiting (`before`):
        a uniform share of (factor - 1) * m less what is owed; 0 with factor 1 or before
        the third iteration (the window holding the warm-up alone or nothing)."""
        self.ahead = 0.0
        if self.factor > 1.0 and len(self.recent) > 1:
            expected = (self.factor - 1.0) * lower_quartile(self.recent) - self.owed
            self.ahead = self._draws.random() * max(0.0, expected)
        return self.ahead

    def wait(self, seconds: float, samples: Optional[int] = None,
             cpu_seconds: Optional[float] = None) -> Optional[float]:
        """Wait after an iteration that computed for `seconds` (wall; its CPU time
        `cpu_seconds` where that is the measure) on `samples` samples; returns the
        iteration's whole wait, `before`'s included (None with factor 1)."""
        if self.factor <= 1.0:
            return None
        ahead = self.ahead
        waited = self.due(seconds, samples, cpu_seconds)
        time.sleep(waited - ahead)
        return waited

    def due(self, seconds: float, samples: Optional[int] = None,
            cpu_seconds: Optional[float] = None) -> float:
        """The iteration's whole wait, without waiting: the one `before` it and the one
        after (the window and what is owed move on as in `wait`)."""
        if samples != self.samples:
            self.recent.clear()
            self.samples = samples
        self.recent.append(seconds if cpu_seconds is None else cpu_seconds)
        lasts = self.factor * lower_quartile(self.recent)
        ahead, self.ahead = self.ahead, 0.0
        waited = lasts - seconds - self.owed - ahead
        self.owed = min(max(0.0, -waited), lasts)
        return ahead + max(0.0, waited)


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
