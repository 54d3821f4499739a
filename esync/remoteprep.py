"""Preprocessing where CPUs are free (--remote-prep F): a worker's batches made by Ray tasks.

With `esync-launch --ray`, a worker over shards whose rounds stall on preprocessing (the
`prep` share of their breakdown above F, over at least LOOK_S seconds of rounds) hands its
DataLoader work to Ray tasks of one CPU each: decoding, the user's transform and collation,
`esync.loader.prepare_batch` on a batch's raw items. Ray's scheduler places each task on a
node with a free CPU (Dpex's idea, without its fixed rotation over nodes). Block reads stay
in the worker (its `fetch`), and so does the order: batches reach the training loop in the
sampler's order, whatever order the tasks finish in (esync.shardloader).

How many batches are out is load-aware: enough to cover the tasks' latency at the pace the
loop takes batches (Little's law: latency / interval + 1, both smoothed), with no more tasks
running than the CPUs the cluster had free at the last look (ray.available_resources, at
most once a second) plus those this worker's tasks held then, and at most MAX_OUT. A task
not back within PATIENCE_S (or five times the recent latency, if more; a cluster with no
CPU left, say) is cancelled with the others not yet back, and those batches are made here;
the worker's own DataLoader workers take over until a later round stalls again while the
cluster has a free CPU. A worker starts each run with its own DataLoader workers.

The worker reaches the cluster launch/onray.py placed it on: its actor passes the address,
the namespace and the runtime environment (the shipped checkout) as ESYNC_RAY_ADDRESS,
ESYNC_RAY_NAMESPACE and ESYNC_RAY_RUNTIME_ENV; RAY_ADDRESS serves where they are unset. Ray
is imported, and the cluster joined, only with --remote-prep, when the loader is prepared:
a worker with no cluster to reach stops there with one line naming the flag.

Trust: Ray serialises task arguments and results with pickle (cloudpickle) inside its own
cluster: the data set object with the user's transform, the collate function, raw samples
and the batches. The trust boundary is the Ray cluster's (its token authentication, its
network): whoever may submit tasks there can run code on its nodes anyway. Nothing of
esync unpickles data from files or from its own sockets.
"""
from __future__ import annotations

import json
import logging
import math
import os
import socket
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, List, Mapping, Optional, Tuple

from esync.errors import UserError

log = logging.getLogger(__name__)

#: set by launch/onray.py's actors for the processes they start
ADDRESS_ENV = "ESYNC_RAY_ADDRESS"
NAMESPACE_ENV = "ESYNC_RAY_NAMESPACE"
RUNTIME_ENV_ENV = "ESYNC_RAY_RUNTIME_ENV"
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

#: in a Ray worker process: the data set and collate function of the job's tasks, by the
#: id of their object (a worker process serves one job)
_held: Dict[str, Tuple[Any, Callable[[List[Any]], Any]]] = {}


def _prepare(held: List[Any], items: List[Any]) -> Tuple[Any, float]:
    """A Ray task: one batch of raw `items`, made as a DataLoader worker makes it, and its
    seconds. `held` is [the object ref of (data set, collate)], in a list so that Ray
    passes the ref, fetched once per worker process."""
    import ray

    from esync.loader import prepare_batch

    key = held[0].hex()
    if key not in _held:
        try:
            value = ray.get(held[0])
        except Exception as e:  # noqa: BLE001  (the user's classes, unpickled here)
            raise UserError(f"{FLAG}: a Ray task cannot load the data set: "
                            f"{_last_line(e)} (is its code on the Ray nodes' Python path?)"
                            ) from None
        _held.clear()
        _held[key] = value
    dataset, collate = _held[key]
    return prepare_batch(dataset, items, collate)


def _last_line(error: BaseException) -> str:
    text = str(getattr(error, "cause", None) or error).strip()
    return text.splitlines()[-1] if text else type(error).__name__


def _reachable(address: str) -> Optional[str]:
    """Why HOST:PORT cannot be connected to (None if it can; other forms are Ray's)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or "://" in address:
        return None
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5.0).close()
    except OSError as e:
        return e.strerror or type(e).__name__
    return None


def connect(environ: Mapping[str, str] = os.environ) -> None:
    """Join the Ray cluster this worker was placed on (see the module), unless this
    process has joined one already; UserError, naming --remote-prep, if there is none
    to reach."""
    joined = sys.modules.get("ray")
    if joined is not None and joined.is_initialized():  # the user's script's own
        return
    address = environ.get(ADDRESS_ENV) or environ.get("RAY_ADDRESS")
    if not address:
        raise UserError(f"{FLAG} needs a Ray cluster: start the job with esync-launch --ray "
                        f"(this worker has no {ADDRESS_ENV} or RAY_ADDRESS)")
    try:
        import ray
    except ImportError:
        raise UserError(f"{FLAG} needs Ray: pip install -e '.[ray]'") from None
    why = _reachable(address)
    if why is not None:
        raise UserError(f"{FLAG}: cannot reach the Ray cluster at {address}: {why}")
    try:
        runtime_env = json.loads(environ.get(RUNTIME_ENV_ENV) or "{}")
    except ValueError:
        runtime_env = None
    if not isinstance(runtime_env, dict):
        raise UserError(f"{RUNTIME_ENV_ENV}: expected a JSON object (a Ray runtime "
                        f"environment), got {environ.get(RUNTIME_ENV_ENV, '')[:60]!r}")
    try:
        ray.init(address=address, namespace=environ.get(NAMESPACE_ENV) or None,
                 runtime_env=runtime_env or None, logging_level=logging.ERROR,
                 log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise UserError(f"{FLAG}: cannot join the Ray cluster at {address}: "
                        f"{_last_line(e)}") from None


def _smooth(old: Optional[float], new: float) -> float:
    return new if old is None else old + SMOOTHING * (new - old)


@dataclass
class _Out:
    """A batch sent out: its raw items (kept, to make it here if need be), its task
    (None: to be made here) and when it was sent and seen back."""

    items: List[Any]
    ref: Any
    sent: float
    back: Optional[float] = None


class RemotePrep:
    """A worker's Ray tasks for `dataset`'s batches (see the module). `threshold` is
    --remote-prep's F."""

    def __init__(self, dataset, collate: Callable[[List[Any]], Any], threshold: float):
        connect()
        import ray

        self._ray = ray
        try:
            self._held = [ray.put((dataset, collate))]
        except Exception as e:  # noqa: BLE001  (whatever the user's objects raise)
            raise UserError(f"{FLAG}: the data set or its collate function cannot be sent "
                            f"to Ray tasks: {type(e).__name__}: {_last_line(e)}") from None
        self._task = ray.remote(num_cpus=1)(_prepare)
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
            log.info("rounds stall %.0f%% on preprocessing, but the Ray cluster has no "
                     "free CPU: batches are made here", 100 * prep / wall)
            return False
        log.info("rounds stall %.0f%% on preprocessing (%s %g): batches go to Ray tasks",
                 100 * prep / wall, FLAG, self.threshold)
        self.active = True
        return True

    def _free_cpus(self, fresh: bool = False) -> float:
        now = time.monotonic()
        if fresh or now - self._read_at >= REFRESH_S:
            self._free = float(self._ray.available_resources().get("CPU", 0.0))
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
            self.out.append(_Out(items, self._task.remote(self._held, items),
                                 time.perf_counter()))

    def _see_back(self) -> None:
        """Note when tasks came back (for the latency)."""
        running = [o for o in self.out if o.ref is not None and o.back is None]
        if not running:
            return
        ready, _ = self._ray.wait([o.ref for o in running], num_returns=len(running),
                                  timeout=0)
        ready = set(ready)
        now = time.perf_counter()
        for o in running:
            if o.ref in ready:
                o.back = now
                self._latency = _smooth(self._latency, now - o.sent)

    def _result(self, out: _Out) -> Prepared:
        from ray.exceptions import GetTimeoutError, RayError, RayTaskError

        from esync.loader import prepare_batch

        if out.ref is not None:
            patience = max(PATIENCE_S, 5 * (self._latency or 0.0))
            try:
                batch, seconds = self._ray.get(
                    out.ref, timeout=max(0.0, out.sent + patience - time.perf_counter()))
            except GetTimeoutError:
                self._ray.cancel(out.ref)
                self._fall_back(f"a task was not back within {patience:.0f} s")
            except RayTaskError as e:
                cause = getattr(e, "cause", None)
                if isinstance(cause, Exception):  # the data set's or transform's own
                    raise cause from None
                raise
            except RayError as e:  # a worker or node lost, after Ray's retries
                self._fall_back(f"a task failed: {_last_line(e)}")
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
                self._ray.cancel(o.ref)
                o.ref = None
