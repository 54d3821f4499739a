"""An emulated network link, so that one machine behaves like devices on slower or
farther links (`--bandwidth` Mbit/s, `--latency` ms, per worker).

The model, per worker and per direction (full duplex):
- **Bandwidth: a token bucket of `--bandwidth` Mbit/s with no burst.** A message of b
  bytes occupies its direction of the link for b * 8 / bandwidth seconds, after the
  messages before it. Sending blocks until the message would have left the worker (as
  a busy network card would), then hands it to the socket; a received message is handed
  to the caller once it would have finished arriving.
- **Latency: `--latency` ms one way.** The worker only ever receives answers to its own
  requests (push, pull), so an answer arriving now left the server one uplink latency
  late and travels one downlink latency back: it is held 2 * latency after its real
  arrival (answers that arrive together share that wait; they do not add up).
- **Collectives** (the DDP baseline's all-reduce, where the library has no byte-level
  hook): a ring all-reduce of n bytes among W ranks sends and receives 2(W-1)/W * n
  bytes in 2(W-1) steps, so it is held (2(W-1)/W * n * 8 / bandwidth) + 2(W-1) *
  latency before it starts; a ring all-gather of n bytes from each (the sparse codecs'
  all-reduce) sends and receives (W-1) * n in W-1 steps. A ring's every step waits for
  its slowest link, and so does this: the other ranks wait in the collective for a
  paced one.

Limits: only the worker's side is paced (servers, the scheduler and the state server's
HTTP are not); the wait is real time (time.sleep), so it is counted in the phase it
happens in (`global aggregate` / `global update`); a transfer on loopback still costs
its own real time on top, which is small beside the paced time on slow links; no loss,
jitter or congestion between workers sharing a link is modelled.
"""
from __future__ import annotations

import time
from typing import Optional


#: an answer read within this many seconds of the end of the previous one's hold is
#: taken to have waited in the queue during that hold (the sleep's overshoot and the
#: loop back to the socket take a few ms on a busy machine)
QUEUED_S = 0.02


class Link:
    def __init__(self, bandwidth_mbit: Optional[float] = None, latency_ms: float = 0.0):
        if bandwidth_mbit is not None and not bandwidth_mbit > 0:
            raise ValueError("bandwidth must be positive (Mbit/s)")
        if not latency_ms >= 0:
            raise ValueError("latency must be >= 0 (ms)")
        self.bytes_per_s = None if bandwidth_mbit is None else bandwidth_mbit * 1e6 / 8
        self.latency = latency_ms / 1000.0
        self._up_free = 0.0    # when the uplink has sent everything handed to it
        self._down_free = 0.0  # when the downlink has delivered everything it carried
        self._read_at: Optional[float] = None  # when the last answer was really read
        self._held_until = 0.0                 # and until when it was held
        self.waited = 0.0      # seconds spent waiting for the emulated link, in all

    @property
    def paced(self) -> bool:
        return self.bytes_per_s is not None or self.latency > 0

    def _transfer(self, nbytes: float) -> float:
        return 0.0 if self.bytes_per_s is None else nbytes / self.bytes_per_s

    def _sleep_until(self, moment: float) -> None:
        wait = moment - time.monotonic()
        if wait > 0:
            time.sleep(wait)
            self.waited += wait

    def sending(self, nbytes: int) -> None:
        """Call before handing a message of `nbytes` to the socket: returns when it would
        have left the worker."""
        if self.bytes_per_s is None:
            return
        self._up_free = max(time.monotonic(), self._up_free) + self._transfer(nbytes)
        self._sleep_until(self._up_free)

    def received(self, nbytes: int) -> None:
        """Call when an answer of `nbytes` has been read: returns when it would have
        arrived. An answer read straight after the previous one's hold came in during
        that hold, at the latest when the previous one was read: it counts from then, so
        that answers arriving together share one round trip of latency."""
        if not self.paced:
            return
        now = time.monotonic()
        arrived = now
        if self._read_at is not None and now - self._held_until < QUEUED_S:
            arrived = self._read_at
        start = max(arrived + 2 * self.latency, self._down_free)
        self._down_free = start + self._transfer(nbytes)
        self._read_at, self._held_until = arrived, self._down_free
        self._sleep_until(self._down_free)

    @staticmethod
    def ring_allreduce_bytes(nbytes: int, world: int) -> int:
        """Bytes each rank sends (and receives) in a ring all-reduce of `nbytes`."""
        return 0 if world < 2 else int(2 * (world - 1) * nbytes / world)

    @staticmethod
    def ring_allgather_bytes(nbytes: int, world: int) -> int:
        """Bytes each rank sends (and receives) in a ring all-gather of `nbytes` each."""
        return 0 if world < 2 else (world - 1) * nbytes

    def before_allreduce(self, nbytes: int, world: int) -> None:
        """Hold a ring all-reduce of `nbytes` among `world` ranks for its link time."""
        self._hold(self.ring_allreduce_bytes(nbytes, world), 2 * (world - 1))

    def before_allgather(self, nbytes: int, world: int) -> None:
        """Hold a ring all-gather of `nbytes` from each of `world` ranks (W-1 steps)."""
        self._hold(self.ring_allgather_bytes(nbytes, world), world - 1)

    def _hold(self, each_way: int, steps: int) -> None:
        if not self.paced or steps < 1:
            return
        start = max(time.monotonic(), self._up_free, self._down_free)
        done = start + self._transfer(each_way) + steps * self.latency
        self._up_free = self._down_free = done
        self._sleep_until(done)


def link_of(opts) -> Link:
    """The link of a worker's options (esync.options.Options: --bandwidth, --latency)."""
    return Link(opts.bandwidth, opts.latency)
