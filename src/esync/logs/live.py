"""Reports to the live job page (the state server's /jobs/<job>/, stateserver/budgets/live.py).

With ESYNC_LIVE_URL set (`http://HOST:PORT/jobs/<job>/`; the launchers set it for every
process they start), a process of a job reports a few figures to it from a daemon
thread: a worker and the evaluator what their round records say (esync.logs.recorder
hands each record to `add`: round, budget, samples and their rate, the round's time
breakdown, bytes, loss, the metric), the launcher the job's state and its processes'
(`update`). A report goes once something changed, at most every INTERVAL_S seconds, and
every KEEPALIVE_S seconds when nothing did (the page then still reads the process as
running): a worker reports about once a round, not every second (at 16 workers, the
state server answered 17 reports a second, a tenth of a core, for rounds of 6 s). The
last report, as the process ends (`close`), says it is no longer alive.

The page is an observer: a report that cannot be sent (the state server gone or
refusing) is logged once and tried again at the next interval; training never waits
for it. Reports go over one kept-alive connection and carry ESYNC_STATE_TOKEN, as the
budget requests do (esync.infra.stateclient).
"""
from __future__ import annotations

import http.client
import json
import logging
import os
import re
import threading
import time
from typing import Any, Dict, Mapping, Optional
from urllib.parse import urlsplit

from esync.errors import UserError
from esync.infra.stateclient import KeptAlive, token_from_environ

URL_ENV = "ESYNC_LIVE_URL"
#: the job's id, given by a launcher to every process (the scheduler takes it as the
#: job's, instead of drawing one), so that the live page and the budgets share a name
JOB_ID_ENV = "ESYNC_JOB_ID"
#: the least seconds between two reports of a process
INTERVAL_S = 1.0
#: the most seconds between two reports of a process that has nothing new: well under
#: the page's STALE_S (10 s, stateserver/budgets/live.py), after which it reads "silent"
KEEPALIVE_S = 4.0
#: seconds a report may take (the page is not worth more of a worker's time)
TIMEOUT_S = 3.0
#: the metrics a round record may carry (esync.data.METRIC_RECORD's values)
METRICS = ("accuracy", "val_loss")
#: what a job's id may be: its name on the state server and in a live page's URL
JOB_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")
#: what a job's id must look like, said in its errors
JOB_ID_FORM = "1 to 64 letters, digits, '.', '_' or '-'"
_URL = re.compile(rf"/jobs/({JOB_ID.pattern})/")

log = logging.getLogger(__name__)


def page_url(host: str, port: int, job: str) -> str:
    """The live page of `job` on the state server at host:port (ESYNC_LIVE_URL's form)."""
    return f"http://{host}:{port}/jobs/{job}/"


def parse_url(url: str) -> tuple:
    """(host, port, job) of a live page's URL; UserError naming ESYNC_LIVE_URL if it is
    not of the form http://HOST:PORT/jobs/<job>/."""
    parts = urlsplit(url)
    match = _URL.fullmatch(parts.path)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or port is None or match is None:
        raise UserError(f"{URL_ENV}={url!r}: expected http://HOST:PORT/jobs/<job>/ (a job id "
                        f"of {JOB_ID_FORM})")
    return parts.hostname, port, match.group(1)


class LiveReporter:
    """One process's reports: `identity` (role, rank, device, mode) goes with each."""

    def __init__(self, url: str, identity: Mapping[str, Any],
                 token: Optional[str] = None, interval: float = INTERVAL_S,
                 keepalive: float = KEEPALIVE_S):
        self.url = url
        self.host, self.port, self.job = parse_url(url)
        self.path = f"/jobs/{self.job}/report/"
        self.token, self.interval, self.keepalive = token, interval, keepalive
        self.figures: Dict[str, Any] = {k: v for k, v in identity.items() if v is not None}
        self._lock = threading.Lock()
        self._samples_sent_at = (0, time.monotonic())  # samples, when: the rate's start
        self._changed = True  # figures not yet sent (the first report: it is alive)
        self._sent_at = float("-inf")  # when the last report was sent (monotonic)
        self._complained: Any = None  # the kind of failure last said (None: none)
        self._closed = threading.Event()
        # one kept-alive connection (a new one per report cost the state server 1-2 ms
        # of CPU more a report, and a thread), used by one sender at a time: `close`
        # sends the last report after waiting TIMEOUT_S at most for the thread's
        self._http = KeptAlive(self.host, self.port, timeout=TIMEOUT_S)
        self._sending = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="esync-live", daemon=True)
        self._thread.start()

    @classmethod
    def from_environ(cls, role: str, **identity) -> Optional["LiveReporter"]:
        """A reporter to ESYNC_LIVE_URL, or None where it is unset or empty."""
        url = os.environ.get(URL_ENV, "")
        if not url:
            return None
        return cls(url, {"role": role, **identity}, token_from_environ())

    # --- what the process says ------------------------------------------------------
    def add(self, record: Mapping[str, Any]) -> None:
        """A round record (esync.logs.recorder's): its figures go into the next report."""
        with self._lock:
            self._changed = True
            f = self.figures
            f["round"] = record.get("round", record.get("num_iters"))
            f["samples"] = f.get("samples", 0) + int(record.get("num_samples") or 0)
            f["bytes_sent"] = f.get("bytes_sent", 0) + int(record.get("bytes_sent") or 0)
            f["bytes_received"] = f.get("bytes_received", 0) + \
                int(record.get("bytes_received") or 0)
            for name in ("budget", "loss"):
                if isinstance(record.get(name), (int, float)):
                    f[name] = record[name]
            if isinstance(record.get("breakdown"), Mapping):
                f["breakdown"] = dict(record["breakdown"])
            for name in METRICS:
                if isinstance(record.get(name), (int, float)):
                    f["metric"], f["metric_name"] = record[name], name

    def update(self, **figures: Any) -> None:
        """Figures of the next report as they are given (the launcher's)."""
        with self._lock:
            if any(self.figures.get(k) != v for k, v in figures.items()):
                self._changed = True
                self.figures.update(figures)

    def close(self, state: Optional[str] = None) -> None:
        """The last report, now (it says the process is no longer alive; a launcher's
        also the job's `state`), then no more."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._thread.join(timeout=TIMEOUT_S)
        with self._lock:
            if state is not None:
                self.figures["state"] = state
            if self.figures.get("role") != "launcher":
                self.figures["alive"] = False
        self._send()
        with self._sending:
            self._http.close()

    # --- sending ----------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._closed.wait(self.interval):
            if self._changed or time.monotonic() - self._sent_at >= self.keepalive:
                self._send()

    def _report(self) -> Dict[str, Any]:
        with self._lock:
            self._changed = False  # a failed send sets it again: tried next interval
            report = dict(self.figures)
            if "samples" in report:
                samples, since = self._samples_sent_at
                now = time.monotonic()
                report["samples_per_second"] = max(0.0, report["samples"] - samples) / \
                    max(now - since, 1e-6)
                self._samples_sent_at = (report["samples"], now)
        return report

    def _send(self) -> None:
        body = json.dumps(self._report()).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            with self._sending:
                status, answer = self._http.request("POST", self.path, body, headers)
        except (OSError, http.client.HTTPException) as e:
            self._complain("unreachable", f"cannot reach it ({e or type(e).__name__})")
            return
        self._sent_at = time.monotonic()
        if status in (401, 403):
            self._complain(status, f"HTTP {status}: its token is not this process's "
                                   f"ESYNC_STATE_TOKEN")
        elif status >= 300:
            self._complain(status, f"HTTP {status}: "
                                   f"{answer.decode(errors='replace')[:200]}")
        else:
            self._complained = None  # sent again: a later failure is said again

    def _complain(self, kind, problem: str) -> None:
        """A warning for the first failure of a kind in a row; training goes on, and the
        report is tried again at the next interval."""
        self._changed = True
        if kind != self._complained:
            self._complained = kind
            log.warning("live page %s: %s; training goes on, reports are tried again "
                        "every %g s", self.url, problem, self.interval)
