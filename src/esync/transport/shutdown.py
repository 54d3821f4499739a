"""The end of a job, on the scheduler's side.

- `Shutdown`: once every living worker has finished, the servers and evaluators are
  told to shut down (again every heartbeat interval, until each confirms, for at most a
  heartbeat timeout); a worker may first wait until every other one has finished (ASGD's
  worker 0 takes the final model once the last pushes are in: `others`).
- `Linger`: a job aborted while it gathers its nodes stays up to ABORT_LINGER seconds
  to tell the nodes that come later why (until every node it expected has been told),
  so that none waits for a scheduler that has gone."""
from __future__ import annotations

import logging
import time
from typing import Callable, List, Optional, Sequence, Set

from esync.transport.listener import Listener
from esync.transport.message import MessageError, decode, text_field

#: seconds a job aborted during start-up stays to tell late nodes why
ABORT_LINGER = 60.0

log = logging.getLogger(__name__)


class Shutdown:
    def __init__(self, heartbeat_interval: float, heartbeat_timeout: float):
        self.interval, self.timeout = heartbeat_interval, heartbeat_timeout
        self.closing_since: Optional[float] = None  # when every living worker had finished
        self._last_notice = 0.0
        #: workers waiting for every other worker to have finished or died (`others`)
        self._waiting_for_others: List[str] = []

    @property
    def closing(self) -> bool:
        return self.closing_since is not None

    def begin_if_done(self, living: int, done: int, dead: int) -> None:
        """Every one of the `living` workers is `done` (`dead` were left behind): close."""
        if self.closing_since is None and living and done == living:
            self.closing_since = time.monotonic()
            log.info("[scheduler] all %d workers finished%s; shutting the servers down",
                     living, f" ({dead} left behind dead)" if dead else "")

    def overdue(self) -> bool:
        """The servers and evaluators had a heartbeat timeout to confirm."""
        return time.monotonic() - self.closing_since > self.timeout

    def notice_due(self) -> bool:
        """Time to tell the unconfirmed ones again (once every heartbeat interval)."""
        now = time.monotonic()
        if now - self._last_notice < self.interval:
            return False
        self._last_notice = now
        return True

    def wait_for_others(self, uid: str) -> None:
        self._waiting_for_others.append(uid)

    def others_done(self, others_running: Callable[[str], bool]) -> List[str]:
        """The waiting workers for whom no other living worker is still running
        (`others_running(uid)`), taken off the wait."""
        done = [uid for uid in self._waiting_for_others if not others_running(uid)]
        self._waiting_for_others = [u for u in self._waiting_for_others if u not in done]
        return done


class Linger:
    def __init__(self, expected: int, linger: float = ABORT_LINGER):
        self.expected = expected  # the servers and workers the job wanted
        self.linger = linger
        #: the nodes told why the job was aborted (their ids)
        self.told: Set[str] = set()

    def heard(self, uid: str) -> None:
        """Node `uid` knows why the job was aborted (told, or the one that failed)."""
        self.told.add(uid)

    def cancel(self) -> None:
        """The missing nodes were waited for long enough: nobody is waited for now."""
        self.linger = 0.0

    def tell_late_nodes(self, listener: Listener, reason: str, types: Sequence[str]) -> None:
        """After an abort during start-up: answer whoever comes (with a message of one of
        `types`) with `reason`, for up to `linger` seconds or until every server and
        worker the job expected was told."""
        expected = self.expected
        if self.linger <= 0 or len(self.told) >= expected:
            return
        log.info("[scheduler] staying up to %g s to tell the nodes that have not heard why "
                 "(%d of %d told)", self.linger, len(self.told), expected)
        deadline = time.monotonic() + self.linger
        while time.monotonic() < deadline and len(self.told) < expected:
            listener.watch_handshakes()
            received = listener.receive()
            if received is None:
                continue
            identity, frames = received
            try:
                sender = text_field(decode(frames, types).header, "sender")
            except MessageError:
                continue
            listener.send(identity, {"type": "abort", "reason": reason})
            if len(self.told) < 4 * expected:
                self.told.add(sender)
