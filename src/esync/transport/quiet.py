"""Lines about what peers keep doing (failed handshakes, unread answers), said at most
once per QUIET_S seconds for each kind, so that a peer repeating itself, or a hostile
one, cannot flood a log."""
from __future__ import annotations

import time
from typing import Dict, Hashable, Optional

#: seconds between two lines of the same kind
QUIET_S = 10.0


class Quiet:
    def __init__(self, period: float = QUIET_S):
        self.period = period
        self._said: Dict[Hashable, float] = {}
        self._unsaid: Dict[Hashable, int] = {}

    def say(self, kind: Hashable) -> Optional[int]:
        """One more event of `kind`: None to stay quiet, else how many there were since
        the line of this kind was last said (1: just this one)."""
        now = time.monotonic()
        self._unsaid[kind] = self._unsaid.get(kind, 0) + 1
        last = self._said.get(kind)
        if last is not None and now - last < self.period:
            return None
        self._said[kind] = now
        return self._unsaid.pop(kind)
