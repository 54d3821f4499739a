"""Ray's side of --remote-prep: a worker's batches made by Ray tasks of one CPU each.

esync/runtime/remoteprep.py decides when a worker's batches go out and how many are out; this
module runs them, as its `Tasks`. esync/launch/onray.py names it to the processes it starts
(ESYNC_RAY_TASKS=launch.rayprep:RayTasks, beside the cluster's address, the job's
namespace and runtime environment), so that the runtime itself never imports ray: a worker
imports this module only with --remote-prep, when its loader is prepared.

    >>> tasks = RayTasks(dataset, collate)   # joins the cluster the worker was placed on
    >>> handle = tasks.submit(items)         # a task: prepare_batch(dataset, items, collate)
    >>> batch, seconds = tasks.result(handle, timeout=20.0)

Trust: as esync/runtime/remoteprep.py says, Ray pickles the data set, raw samples and batches
inside its own cluster; the trust boundary is the Ray cluster's.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional, Set, Tuple

from esync.errors import UserError
from esync.runtime.remoteprep import FLAG, NAMESPACE_ENV, RUNTIME_ENV_ENV, TaskLate, TaskLost, \
    address

#: in a Ray worker process: the data set and collate function of the job's tasks, by the
#: id of their object (a worker process serves one job)
_held: Dict[str, Tuple[Any, Callable[[List[Any]], Any]]] = {}


def _prepare(held: List[Any], items: List[Any]) -> Tuple[Any, float]:
    """A Ray task: one batch of raw `items`, made as a DataLoader worker makes it, and its
    seconds. `held` is [the object ref of (data set, collate)], in a list so that Ray
    passes the ref, fetched once per worker process."""
    import ray

    from esync.data.timed import prepare_batch

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


def _reachable(where: str) -> Optional[str]:
    """Why HOST:PORT cannot be connected to (None if it can; other forms are Ray's)."""
    host, _, port = where.rpartition(":")
    if not host or not port.isdigit() or "://" in where:
        return None
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5.0).close()
    except OSError as e:
        return e.strerror or type(e).__name__
    return None


def connect(environ: Mapping[str, str] = os.environ) -> None:
    """Join the Ray cluster this worker was placed on (esync.runtime.remoteprep.address), unless
    this process has joined one already; UserError, naming --remote-prep, if there is
    none to reach."""
    joined = sys.modules.get("ray")
    if joined is not None and joined.is_initialized():  # the user's script's own
        return
    where = address(environ)
    try:
        import ray
    except ImportError:
        raise UserError(f"{FLAG} needs Ray: pip install -e '.[ray]'") from None
    why = _reachable(where)
    if why is not None:
        raise UserError(f"{FLAG}: cannot reach the Ray cluster at {where}: {why}")
    try:
        runtime_env = json.loads(environ.get(RUNTIME_ENV_ENV) or "{}")
    except ValueError:
        runtime_env = None
    if not isinstance(runtime_env, dict):
        raise UserError(f"{RUNTIME_ENV_ENV}: expected a JSON object (a Ray runtime "
                        f"environment), got {environ.get(RUNTIME_ENV_ENV, '')[:60]!r}")
    try:
        ray.init(address=where, namespace=environ.get(NAMESPACE_ENV) or None,
                 runtime_env=runtime_env or None, logging_level=logging.ERROR,
                 log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise UserError(f"{FLAG}: cannot join the Ray cluster at {where}: "
                        f"{_last_line(e)}") from None


class RayTasks:
    """esync.runtime.remoteprep.Tasks on the Ray cluster this worker was placed on: the data set
    and collate function are put in its object store once, each batch is a task."""

    def __init__(self, dataset, collate: Callable[[List[Any]], Any]):
        connect()
        import ray

        self._ray = ray
        try:
            self._held = [ray.put((dataset, collate))]
        except Exception as e:  # noqa: BLE001  (whatever the user's objects raise)
            raise UserError(f"{FLAG}: the data set or its collate function cannot be sent "
                            f"to Ray tasks: {type(e).__name__}: {_last_line(e)}") from None
        self._task = ray.remote(num_cpus=1)(_prepare)

    def submit(self, items: List[Any]) -> Any:
        return self._task.remote(self._held, items)

    def ready(self, handles: List[Any]) -> Set[Any]:
        done, _ = self._ray.wait(handles, num_returns=len(handles), timeout=0)
        return set(done)

    def result(self, handle: Any, timeout: float) -> Tuple[Any, float]:
        from ray.exceptions import GetTimeoutError, RayError, RayTaskError

        try:
            return self._ray.get(handle, timeout=timeout)
        except GetTimeoutError:
            raise TaskLate() from None
        except RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, Exception):  # the data set's or transform's own
                raise cause from None
            raise
        except RayError as e:  # a worker or node lost, after Ray's retries
            raise TaskLost(_last_line(e)) from None

    def cancel(self, handle: Any) -> None:
        self._ray.cancel(handle)

    def free_cpus(self) -> float:
        return float(self._ray.available_resources().get("CPU", 0.0))
