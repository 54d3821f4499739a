"""Preprocessing where CPUs are free (--remote-prep F): a worker's batches made by tasks
elsewhere, Ray's under `esync-launch --ray`.

A worker over shards whose rounds stall on preprocessing (the `prep` share of their
breakdown above F, over at least LOOK_S seconds of rounds) hands its DataLoader work to
tasks of one CPU each: decoding, the user's transform and collation,
`esync.data.timed.prepare_batch` on a batch's raw items. Ray's scheduler places each task
on a node with a free CPU (Dpex's idea, without its fixed rotation over nodes). Block reads
stay in the worker (its `fetch`), and so does the order: batches reach the training loop in
the sampler's order, whatever order the tasks finish in (esync.runtime.shardloader).

How many batches are out is load-aware: enough to cover the tasks' latency at the pace the
loop takes batches (Little's law: latency / interval + 1, both smoothed), with no more tasks
running than the CPUs the cluster had free at the last look (at most once a second) plus
those this worker's tasks held then, and at most MAX_OUT. A task not back within
PATIENCE_S (or five times the recent latency, if more; a cluster with no CPU left, say) is
cancelled with the others not yet back, and those batches are made here; the worker's own
DataLoader workers take over until a later round stalls again while the cluster has a
free CPU. A worker starts each run with its own DataLoader workers.

This module decides when and how many; it does not import ray. The tasks are run by
`Tasks`, which the launcher names to the worker as a plug-in (`module:function`, called
with the data set and the collate function) in ESYNC_RAY_TASKS: esync/launch/onray.py names
esync/launch/rayprep.py's, which joins the cluster the worker was placed on (ESYNC_RAY_ADDRESS,
ESYNC_RAY_NAMESPACE, ESYNC_RAY_RUNTIME_ENV; RAY_ADDRESS serves where the address is unset).
A worker with no cluster to reach stops when its loader is prepared, with one line naming
the flag.

    >>> prep = RemotePrep(dataset, collate, threshold=0.3)   # the tasks ESYNC_RAY_TASKS names
    >>> if prep.should_start(session.last_breakdown):        # once per round
    ...     batch, seconds, remote = prep.next(sampler.take)  # in the sampler's order

Trust: Ray serialises task arguments and results with pickle (cloudpickle) inside its own
cluster: the data set object with the user's transform, the collate function, raw samples
and the batches. The trust boundary is the Ray cluster's (its token authentication, its
network): whoever may submit tasks there can run code on its nodes anyway. Nothing of
esync unpickles data from files or from its own sockets.
"""
from __future__ import annotations

import logging
import math
import os
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Deque, Hashable, List, Mapping, Optional, Protocol, Set, \
    Tuple

from esync.infra import plugin
from esync.errors import UserError

log = logging.getLogger(__name__)

#: set by esync/launch/onray.py's actors for the processes they start
ADDRESS_ENV = "ESYNC_RAY_ADDRESS"
NAMESPACE_ENV = "ESYNC_RAY_NAMESPACE"
RUNTIME_ENV_ENV = "ESYNC_RAY_RUNTIME_ENV"
TASKS_ENV = "ESYNC_RAY_TASKS"
FLAG = "--remote-prep"
#: seconds of rounds looked at together before deciding to go remote
LOOK_S = 1.0
#: seconds between reads of the cluster's free CPUs
REFRESH_S = 1.0
#: most batches out at once (in flight, or back and not handed out yet)
MAX_OUT = 64
#: seconds a task may take before its batch is made here (at least)
PATIENCE_S = 20.0
#: weight of a new sample in the smoothed latency and interval
SMOOTHING = 0.3

Prepared = Tuple[Any, float, bool]  # a batch, the seconds it took to make, made remotely


class TaskLate(Exception):
    """A task's batch was not back in the time given."""


class TaskLost(Exception):
    """A task was lost (its worker or node), after the cluster's own retries."""


class Tasks(Protocol):
    """Where batches are made: one task per batch of raw items, `prepare_batch`'s work."""

    def submit(self, items: List[Any]) -> Hashable:
        """Start a task making the batch of `items`; its handle."""

    def ready(self, handles: List[Hashable]) -> Set[Hashable]:
        """Those of `handles` whose tasks are back (not waiting)."""

    def result(self, handle: Hashable, timeout: float) -> Tuple[Any, float]:
        """The task's batch and its seconds, waiting at most `timeout` (TaskLate); TaskLost
        if it was lost; the data set's or transform's own exception if it raised one."""

    def cancel(self, handle: Hashable) -> None:
        """Give up a task not back yet."""

    def free_cpus(self) -> float:
        """The CPUs the cluster has free now."""


def address(environ: Mapping[str, str] = os.environ) -> str:
    """The Ray cluster this worker was placed on (see the module); UserError, naming
    --remote-prep, if it has none."""
    where = environ.get(ADDRESS_ENV) or environ.get("RAY_ADDRESS")
    if not where:
        raise UserError(f"{FLAG} needs a Ray cluster: start the job with esync-launch --ray "
                        f"(this worker has no {ADDRESS_ENV} or RAY_ADDRESS)")
    return where


def open_tasks(dataset, collate: Callable[[List[Any]], Any],
               environ: Mapping[str, str] = os.environ) -> Tasks:
    """The tasks ESYNC_RAY_TASKS names, for `dataset`'s batches; UserError, naming
    --remote-prep, if this worker has no cluster to reach or no tasks named."""
    address(environ)
    spec = environ.get(TASKS_ENV)
    if not spec:
        raise UserError(f"{FLAG} needs {TASKS_ENV}, the module:function that sends batches "
                        f"to Ray tasks (esync-launch --ray sets it)")
    return plugin.call(spec, TASKS_ENV, dataset, collate)


def _smooth(old: Optional[float], new: float) -> float:
    return new if old is None else old + SMOOTHING * (new - old)


@dataclass
class _Out:
    """A batch sent out: its raw items (kept, to make it here if need be), its task's
    handle (None: to be made here) and when it was sent and seen back."""

    items: List[Any]
    ref: Optional[Hashable]
    sent: float
    back: Optional[float] = None


class RemotePrep:
    """A worker's tasks for `dataset`'s batches (see the module). `threshold` is
    --remote-prep's F; `tasks` runs them (by default those ESYNC_RAY_TASKS names)."""

    def __init__(self, dataset, collate: Callable[[List[Any]], Any], threshold: float,
                 tasks: Optional[Tasks] = None):
        self.tasks = open_tasks(dataset, collate) if tasks is None else tasks
        self.dataset, self.collate, self.threshold = dataset, collate, threshold
        self.active = False   # taking new batches (else only handing out those out)
        self.out: Deque[_Out] = deque()
        self._pass_over = False
        self._latency: Optional[float] = None   # a task's, sent to seen back
        self._interval: Optional[float] = None  # the loop's own time per batch
        self._handed: Optional[float] = None    # when the last batch was handed out
        self._free, self._read_at, self._running_at_read = 0.0, -math.inf, 0
        self._looked: Optional[Mapping[str, float]] = None
        self._seen = [0.0, 0.0]  # prep stall and wall seconds of rounds not judged yet

    # --- when ----------------------------------------------------------------------------
    def should_start(self, breakdown: Mapping[str, float]) -> bool:
        """Given the last round's breakdown (session.last_breakdown): whether to start
        now (the rounds since the last decision stalled on prep beyond the threshold and
        the cluster has a free CPU); once per round."""
        if self.active or not breakdown or breakdown is self._looked:
            return False
        self._looked = breakdown
        self._seen[0] += float(breakdown.get("prep", 0.0))
        self._seen[1] += float(sum(breakdown.values()))
        if self._seen[1] < LOOK_S:
            return False
        (prep, wall), self._seen = self._seen, [0.0, 0.0]
        if prep <= self.threshold * wall:
            return False
        if self._free_cpus(fresh=True) < 1:
            log.info("rounds stall %.0f%% on preprocessing, but the cluster has no "
                     "free CPU: batches are made here", 100 * prep / wall)
            return False
        log.info("rounds stall %.0f%% on preprocessing (%s %g): batches go to Ray tasks",
                 100 * prep / wall, FLAG, self.threshold)
        self.active = True
        return True

    def _free_cpus(self, fresh: bool = False) -> float:
        now = time.monotonic()
        if fresh or now - self._read_at >= REFRESH_S:
            self._free = self.tasks.free_cpus()
            self._read_at, self._running_at_read = now, self._running()
        return self._free

    def _running(self) -> int:
        return sum(1 for o in self.out if o.ref is not None and o.back is None)

    def _target(self) -> int:
        """Batches to have out: the tasks' latency over the loop's interval, plus one."""
        if self._latency is None or self._interval is None:
            return 2
        return min(MAX_OUT, math.ceil(self._latency / max(self._interval, 1e-3)) + 1)

    # --- the batches ---------------------------------------------------------------------
    def next(self, take: Callable[[], Optional[List[Any]]]) -> Optional[Prepared]:
        """The next batch in the sampler's order, sending out more of `take`'s (the
        sampler's next raw batch; None at its pass's end) while active; None when none is
        left out: at the pass's end, or after the cluster fell behind (`active` False)."""
        now = time.perf_counter()
        if self._handed is not None:
            self._interval = _smooth(self._interval, now - self._handed)
        self._see_back()
        if self.active:
            self._send(take)
        if not self.out:
            self._pass_over, self._handed = False, None
            return None
        prepared = self._result(self.out.popleft())
        if self.active:  # the CPU it held works on the next one while the loop trains
            self._send(take)
        self._handed = time.perf_counter()
        return prepared

    def _send(self, take: Callable[[], Optional[List[Any]]]) -> None:
        target = self._target()
        while not self._pass_over and len(self.out) < target:
            cpus = max(1, int(self._running_at_read + self._free_cpus()))
            if self._running() >= cpus:
                break
            items = take()
            if items is None:
                self._pass_over = True
                break
            self.out.append(_Out(items, self.tasks.submit(items), time.perf_counter()))

    def _see_back(self) -> None:
        """Note when tasks came back (for the latency)."""
        running = [o for o in self.out if o.ref is not None and o.back is None]
        if not running:
            return
        ready = self.tasks.ready([o.ref for o in running])
        now = time.perf_counter()
        for o in running:
            if o.ref in ready:
                o.back = now
                self._latency = _smooth(self._latency, now - o.sent)

    def _result(self, out: _Out) -> Prepared:
        # torch, not imported by the launchers that read this module's variables
        from esync.data.timed import prepare_batch

        if out.ref is not None:
            patience = max(PATIENCE_S, 5 * (self._latency or 0.0))
            try:
                batch, seconds = self.tasks.result(
                    out.ref, max(0.0, out.sent + patience - time.perf_counter()))
            except TaskLate:
                self.tasks.cancel(out.ref)
                self._fall_back(f"a task was not back within {patience:.0f} s")
            except TaskLost as e:
                self._fall_back(f"a task failed: {e}")
            else:
                if out.back is None:
                    self._latency = _smooth(self._latency, time.perf_counter() - out.sent)
                return batch, seconds, True
        batch, seconds = prepare_batch(self.dataset, out.items, self.collate)
        return batch, seconds, False

    def _fall_back(self, why: str) -> None:
        """Stop sending; the tasks not back yet are cancelled, their batches made here."""
        log.warning("%s: %s; batches are made by this worker's own DataLoader workers "
                    "until a round stalls again", FLAG, why)
        self.active = False
        self._see_back()
        for o in self.out:
            if o.ref is not None and o.back is None:
                self.tasks.cancel(o.ref)
                o.ref = None
