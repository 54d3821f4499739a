"""The worker's client of the ESync state server (stateserver/, Django, JSON over HTTP).

One kept-alive HTTP connection per worker. A state server that cannot be reached,
answers 5xx or answers something that is not a JSON object is retried for `patience`
seconds (it may be restarting: its state is in its database; every request may be
repeated safely), then raises StateServerError naming -ip/-port. A kept-alive connection
that the server closed meanwhile (it closes idle ones) is replaced at once, without a
warning.

With ESYNC_STATE_TOKEN set, every request carries `Authorization: Bearer <token>`: a
state server started with that variable requires it on writes, and refuses a missing
one (401) or another (403); StateServerError then names the variable.

Any other 4xx (this job's state is not what the worker expects: a job the server does
not know, a round it refuses) and an answer whose values are out of range (a budget
outside 0..the worker's --max-local-steps, another round or rank than asked) raise
StateServerRefusal, with the server's message or the field: the worker may carry on
without the budget (esync.algorithms.esync.worker falls back to 1 local iteration).

Both are UserErrors: uncaught, the worker ends with that one line (exit 2), and, in a
job, the scheduler ends the job.
"""
from __future__ import annotations

import http.client
import json
import logging
import os
import queue
import re
import threading
import time
from typing import Any, Callable, Dict, Mapping, NamedTuple, Optional, Tuple

from esync import config
from esync.errors import UserError

PATIENCE_ENV = "ESYNC_STATE_SERVER_PATIENCE"
TOKEN_ENV = "ESYNC_STATE_TOKEN"
RETRY_S = 0.5

log = logging.getLogger(__name__)


class StateServerError(UserError):
    """This worker cannot use the state server: unreachable for its patience, or its
    token refused. The message names the flag or variable to check."""


class StateServerRefusal(StateServerError):
    """The state server refused a request (4xx, with its message), or answered values
    out of range: one answer is unusable, the state server itself works."""


def patience_from_environ(environ: Mapping[str, str] = os.environ) -> float:
    """How long a worker retries an unreachable state server (ESYNC_STATE_SERVER_PATIENCE,
    seconds); a bad value is a UserError."""
    raw = environ.get(PATIENCE_ENV, str(config.STATE_SERVER_PATIENCE))
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise UserError(f"{PATIENCE_ENV} must be a number of seconds >= 0, got {raw!r}")
    return value


def token_from_environ(environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """The state server's token (ESYNC_STATE_TOKEN; unset or empty: None); one that cannot
    travel in an HTTP header (spaces, control or non-ASCII characters) is a UserError."""
    raw = environ.get(TOKEN_ENV, "")
    if not raw:
        return None
    if not re.fullmatch(r"[!-~]+", raw):
        raise UserError(f"{TOKEN_ENV} must be printable ASCII without spaces (it travels in "
                        f"an HTTP header)")
    return raw


class Budget(NamedTuple):
    """A round's budget as the state server answered it: its local iterations (0: the
    device sits the round out), and whether the round measures speeds (`measuring`: the
    device's delta weighs nothing; esync.algorithms.esync.budget.measuring), and whether
    it is `open`: it may last until every device has measured its speed, at most the
    worker's cap (esync.algorithms.esync.budget.opens), the iterations given where the
    worker cannot tell when that is."""
    local_iterations: int
    measuring: bool = False
    open: bool = False


#: StateClient's default token: the one in the environment (token_from_environ)
FROM_ENVIRON: Any = object()
#: the largest budget taken where the caller gives no cap (the state server's own bound)
MAX_BUDGET = 1_000_000
#: characters of a message or value from the state server that an error repeats
SHOWN = 500


def _line(text: str) -> str:
    """Text from the state server as an error message repeats it: one line, cut."""
    text = " ".join(text.split())
    return text if len(text) <= SHOWN else text[:SHOWN] + "..."


def _shown(value: Any) -> str:
    """A value from the state server as an error message repeats it (its repr)."""
    try:
        return _line(repr(value))
    except ValueError:  # an int too long for Python's int-to-str limit
        return "a huge integer"


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _json_object(raw: bytes) -> Optional[Dict]:
    try:
        answer = json.loads(raw)
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


class KeptAlive:
    """One kept-alive HTTP connection to host:port, for one thread at a time: `request`
    sends a request and reads its whole answer (at most MAX_ANSWER_BYTES: a longer one
    is an HTTPException). A kept-alive connection that the server closed meanwhile (it
    closes idle ones, or restarted) is replaced once, at once; other failures raise
    (OSError, http.client.HTTPException), the connection closed, and the next request
    opens a new one."""

    #: the longest answer read: the state server's are a few hundred bytes
    MAX_ANSWER_BYTES = 1 << 20

    def __init__(self, host: str, port: int, timeout: float):
        self.host, self.port, self.timeout = host, port, timeout
        self._conn: Optional[http.client.HTTPConnection] = None

    def request(self, method: str, path: str, body: Optional[bytes],
                headers: Dict[str, str]) -> Tuple[int, bytes]:
        replaced = False
        while True:
            reused = self._conn is not None
            try:
                if self._conn is None:
                    self._conn = http.client.HTTPConnection(self.host, self.port,
                                                            timeout=self.timeout)
                self._conn.request(method, path, body=body, headers=headers)
                response = self._conn.getresponse()
                raw = response.read(self.MAX_ANSWER_BYTES + 1)
                if len(raw) > self.MAX_ANSWER_BYTES:
                    raise http.client.HTTPException(
                        f"an answer longer than {self.MAX_ANSWER_BYTES} bytes")
                if not response.isclosed():  # not read to its end: not reusable
                    self.close()
                return response.status, raw
            except ConnectionError:
                self.close()
                if reused and not replaced:
                    replaced = True
                    continue
                raise
            except (OSError, http.client.HTTPException):
                self.close()
                raise

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class StateClient:
    def __init__(self, host: str, port: int, job: str,
                 patience: float = config.STATE_SERVER_PATIENCE,
                 check: Callable[[], None] = lambda: None,
                 token: Optional[str] = FROM_ENVIRON):
        self.host, self.port, self.job = host, port, job
        self.patience, self.check = patience, check
        self.token = token_from_environ() if token is FROM_ENVIRON else token
        self._http = KeptAlive(host, port, timeout=10)
        self._requests: "queue.SimpleQueue[Optional[PendingBudget]]" = queue.SimpleQueue()
        self._requester: Optional[threading.Thread] = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _call(self, method: str, path: str, body: Optional[Dict[str, Any]] = None) -> Dict:
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        deadline, warned = time.monotonic() + self.patience, False
        while True:
            try:
                status, raw = self._http.request(method, path, payload, headers)
                answer = _json_object(raw)
                if status < 500 and answer is not None:
                    break
                # a 5xx, or an answer cut short by a server going down: try again
                problem = f"HTTP {status} with {raw[:100]!r}"
            except (OSError, http.client.HTTPException) as e:
                problem = str(e) or type(e).__name__
            self._http.close()  # a fresh connection for the next try
            if time.monotonic() > deadline:
                raise StateServerError(f"state server {self.url} unreachable for "
                                       f"{self.patience:g} s ({problem}); is it running, and "
                                       f"is it the ESync state server? (-ip/--state-server-ip, "
                                       f"-port/--state-server-port)")
            if not warned:
                log.warning("[esync] state server %s: %s; retrying for up to %g s", self.url,
                            problem, self.patience)
                warned = True
            self.check()  # give up at once if the job was aborted meanwhile
            time.sleep(RETRY_S)
        if status in (401, 403):
            hint = (f"this worker has no {TOKEN_ENV}: set it to the state server's token"
                    if self.token is None else
                    f"this worker's {TOKEN_ENV} is not the state server's token")
            raise StateServerError(f"state server {self.url} refused {method} {path}: "
                                   f"{_line(str(answer.get('error', status)))} ({hint})")
        if status >= 400:
            raise StateServerRefusal(f"state server {self.url} refused {method} {path}: "
                                     f"{_line(str(answer.get('error', status)))}")
        return answer

    def init_job(self, workers: int, max_local_steps: int,
                 resume_round: Optional[int] = None,
                 round_time: Optional[float] = None,
                 coordination_share: float = 0.0, least_speed: float = 0.0) -> Dict:
        """Worker 0, once: make the job known with its number of workers (and, with
        `round_time`, the seconds a round should take; none: the slowest device's time
        per iteration sets it, or the devices' coordination where it would take more
        than `coordination_share` of the round; with `least_speed`, devices slower
        than that share of the fastest's speed get budget 0). A job resumed from a checkpoint passes `resume_round`,
        the first round it will ask a budget for: the state server then accepts rounds
        from there on again."""
        body = {"workers": workers, "max_local_steps": max_local_steps}
        if round_time is not None:
            body["round_time"] = round_time
        if coordination_share:
            body["coordination_share"] = coordination_share
        if least_speed:
            body["least_speed"] = least_speed
        if resume_round is not None:
            body["resume_round"] = resume_round
        return self._call("POST", f"/jobs/{self.job}/", body)

    def budget(self, rank: int, round_: int, time_per_iteration: Optional[float],
               cap: Optional[int] = None, coordination: Optional[float] = None,
               interim: bool = False) -> Budget:
        """Report the measured time per local iteration (and the seconds the last round's
        synchronisation cost, where measured); this round's Budget: its local iterations,
        checked: an integer in 0..`cap` (0: the device sits the round out, being much
        slower than the fastest: --least-speed; `cap`: the worker's --max-local-steps; none:
        MAX_BUDGET), for this rank and round (StateServerRefusal naming the field
        otherwise), and whether the round measures and whether it is open (booleans;
        absent: false). `interim`: the time so far of the round in progress (an open
        one), which updates the device's time and nothing else; the round's budget is
        answered again."""
        path = f"/jobs/{self.job}/budget/"
        body = {"rank": rank, "round": round_, "time_per_iteration": time_per_iteration}
        if coordination is not None:
            body["coordination"] = coordination
        if interim:
            body["interim"] = True
        answer = self._call("POST", path, body)
        for name, expected in (("rank", rank), ("round", round_)):
            if not _whole(answer.get(name)) or answer.get(name) != expected:
                raise StateServerRefusal(
                    f"state server {self.url} answered POST {path} with field '{name}' "
                    f"{_shown(answer.get(name))}: expected {expected}, the {name} asked for")
        value, high = answer.get("budget"), cap or MAX_BUDGET
        if not _whole(value) or not 0 <= value <= high:
            bound = "this worker's --max-local-steps" if cap else "the state server's bound"
            raise StateServerRefusal(
                f"state server {self.url} answered POST {path} with field 'budget' "
                f"{_shown(value)} for round {round_}: expected an integer in 0..{high} "
                f"({bound})")
        flags = {name: answer.get(name, False) for name in ("measuring", "open")}
        for name, flag in flags.items():
            if not isinstance(flag, bool):
                raise StateServerRefusal(
                    f"state server {self.url} answered POST {path} with field '{name}' "
                    f"{_shown(flag)} for round {round_}: expected true or false")
        return Budget(value, **flags)

    def budget_later(self, rank: int, round_: int, time_per_iteration: Optional[float],
                     cap: Optional[int] = None, coordination: Optional[float] = None,
                     interim: bool = False) -> "PendingBudget":
        """`budget` in the client's background thread, so that the request overlaps other
        work; requests are sent one at a time, in order (the client has one connection).
        One thread for the client's life, not one per request: starting a thread made
        the caller wait for it to run, up to Python's switch interval (5 ms) while it
        built the request, 1.6 ms per round of a worker pushing its delta."""
        pending = PendingBudget(self, rank, round_, time_per_iteration, cap, coordination,
                                interim)
        if self._requester is None:
            self._requester = threading.Thread(target=self._answer, daemon=True,
                                               name="esync-budget")
            self._requester.start()
        self._requests.put(pending)
        return pending

    def _answer(self) -> None:
        """The requester thread: a daemon, it never holds up the process's exit."""
        while (pending := self._requests.get()) is not None:
            pending.run()

    def close(self) -> None:
        if self._requester is not None:
            self._requests.put(None)
            self._requester = None
        self._http.close()


class PendingBudget:
    """A budget request, answered by its client's requester thread (budget_later)."""

    def __init__(self, client: StateClient, *args):
        self.value: Optional[Budget] = None
        self.error: Optional[BaseException] = None
        self.seconds = 0.0  # the request's own duration, retries included
        self._client, self._args = client, args
        self._done = threading.Event()

    def run(self) -> None:
        start = time.perf_counter()
        try:
            self.value = self._client.budget(*self._args)
        except BaseException as e:  # handed to whoever waits for the result
            self.error = e
        self.seconds = time.perf_counter() - start
        self._done.set()

    def result(self) -> Budget:
        self._done.wait()
        if self.error is not None:
            raise self.error
        return self.value
