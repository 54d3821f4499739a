"""What a failed ZeroMQ handshake means, read from libzmq's socket monitor.

A CurveZMQ handshake that fails (a node with another job key, a node with a key talking
to a job without one, or the reverse) fails silently for the sockets themselves: the
connecting side reconnects for ever and the listening side drops the connection. Both
sides' monitors see it (ZMQ_EVENT_HANDSHAKE_FAILED_*), and `Handshakes` turns those
events into one line a user can act on: the node says why it cannot join and stops;
the scheduler says, at most every few seconds, that someone failed to authenticate.
"""
from __future__ import annotations

from typing import List, Optional

import zmq
from zmq.utils.monitor import recv_monitor_message

from esync.transport.quiet import Quiet

FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
          | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
#: the monitor events read here
EVENTS = zmq.EVENT_CONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED | FAILED
#: failed handshakes in a row, none of them telling its cause, before the connecting
#: side gives up (one that tells, a key mismatch, is enough)
VAGUE_FAILURES = 3


def why(event: int, value: int, keyed: bool, listening: bool) -> str:
    """A failed handshake's cause in words. `keyed`: this side has a job key;
    `listening`: this side binds (the scheduler), the peer connects (a node)."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL \
            and value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
        if listening:
            return "it has no job key, and this job requires one" if keyed else \
                "it has a job key, and this job runs without one"
        if keyed:
            return "the scheduler runs without a job key, and this node has one " \
                   "(ESYNC_JOB_KEY or ESYNC_JOB_KEY_FILE)"
        return "the scheduler requires a job key, and this node has none (set " \
               "ESYNC_JOB_KEY or ESYNC_JOB_KEY_FILE to the job's)"
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH \
            or value == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
        return "its job key differs from the job's" if listening else \
            "the scheduler refused our job key: the job's key differs from ours"
    if event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        if listening:
            return "it hung up during the handshake (its job key may differ from the " \
                   "job's, or it may have none)"
        if keyed:  # the scheduler could not open our HELLO: it hung up
            return "the scheduler refused our job key: the job's key differs from ours"
        return "the scheduler hangs up during the handshake: it may require a job key, " \
               "and this node has none (set ESYNC_JOB_KEY or ESYNC_JOB_KEY_FILE to the job's)"
    return f"the ZeroMQ handshake failed (event {event:#x}, {value:#x}): is the peer a " \
           f"node of an esync job?"


class Handshakes:
    """A socket's monitor, read without blocking (`poll`): whether it ever connected,
    and the last failed handshake's cause."""

    def __init__(self, sock: zmq.Socket, keyed: bool, listening: bool):
        self.keyed, self.listening = keyed, listening
        self.monitor = sock.get_monitor_socket(EVENTS)
        self.sock = sock
        self.connected = False  # a TCP connection was made (connecting side)
        self.failures = 0
        self.failure: Optional[str] = None
        self._vague = 0  # failures in a row that did not tell their cause
        self._quiet = Quiet()

    def poll(self) -> List[str]:
        """Read the pending events; the causes of the handshakes that failed among them.
        The connecting side hears of a failure once it tells its cause (a key mismatch),
        or after VAGUE_FAILURES in a row that do not (a peer hanging up)."""
        failed = []
        while self.monitor.poll(0):
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except (zmq.Again, ValueError):
                break
            kind, value = int(event["event"]), int(event["value"] or 0)
            if kind == zmq.EVENT_CONNECTED:
                self.connected = True
            elif kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._vague = 0
            elif kind & FAILED:
                cause = why(kind, value, self.keyed, self.listening)
                self.failures += 1
                self.failure = cause
                vague = kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                self._vague = self._vague + 1 if vague else 0
                if self.listening or not vague or self._vague >= VAGUE_FAILURES:
                    failed.append(cause)
        return failed

    def say(self, cause: str) -> Optional[str]:
        """The line to log for one more failure with `cause`, or None to stay quiet (the
        listening side: each cause at most once per QUIET_S, with the count since)."""
        count = self._quiet.say(cause)
        if count is None:
            return None
        return cause if count == 1 else \
            f"{cause} ({count} times in the last {self._quiet.period:g} s)"

    def close(self) -> None:
        try:
            self.sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self.monitor.close(linger=0)
