"""The scheduler's socket: one ROUTER on the job's address (DMLC_PS_ROOT_URI and
DMLC_PS_ROOT_PORT), guarded by the job key where there is one.

Every send is non-blocking: a peer whose queue is full does not read; a member's id is
kept (`stalled`) for the scheduler to drop it by the failure policy, a stranger's
answers are dropped. A peer that fails the CurveZMQ handshake (another job key) is
logged, at most every few seconds."""
from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import zmq

from esync.errors import UserError
from esync.transport.auth import Guard
from esync.transport.cluster import ClusterEnv, resolve
from esync.transport.handshake import Handshakes
from esync.transport.message import FRAME_SLACK, MAX_HEADER_BYTES, encode
from esync.transport.node import node_id
from esync.transport.quiet import Quiet

POLL_MS = 100
#: messages (ZeroMQ's SNDHWM) and bytes (the kernel's SO_SNDBUF) queued for one peer:
#: a peer that lets more pile up does not read (each message is ~100 bytes)
SEND_QUEUE, SEND_QUEUE_BYTES = 100, 64 << 10

log = logging.getLogger(__name__)


class Listener:
    def __init__(self, env: ClusterEnv, is_member: Callable[[str], bool] = lambda uid: False):
        self.env, self.is_member = env, is_member
        self.quiet = Quiet()  # strangers that do not read: logged at most this often
        #: members whose queue of messages from the scheduler is full: they do not read
        self.stalled: Set[str] = set()

    def listen(self) -> int:
        """Bind the job's socket (UserError if it cannot); the port."""
        # an address that does not resolve fails before any socket is open, which would
        # otherwise hold the process at exit
        self.host = f"tcp://{resolve(self.env.root_uri, 'DMLC_PS_ROOT_URI')}"
        self.context = zmq.Context()
        self.guard = Guard.from_environ(self.context, warn=False)  # warned once it listens
        self.sock = self.guard.serve(self.context.socket(zmq.ROUTER))
        self.sock.setsockopt(zmq.MAXMSGSIZE, MAX_HEADER_BYTES + FRAME_SLACK)  # headers only
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a node's fresh connection takes over
        self.sock.setsockopt(zmq.LINGER, 2000)
        # what a peer that does not read may hold queued here before it is dropped: its
        # node reads every answer at once, and a notice comes at most every heartbeat
        self.sock.setsockopt(zmq.SNDHWM, SEND_QUEUE)
        self.sock.setsockopt(zmq.SNDBUF, SEND_QUEUE_BYTES)
        self.handshakes = Handshakes(self.sock, self.guard.secure, listening=True)
        port = self.env.root_port
        try:
            if port == 0:  # DMLC_PS_ROOT_PORT=0: a free port, reported (esync.infra.ready)
                port = self.sock.bind_to_random_port(self.host)
            else:
                self.sock.bind(f"{self.host}:{port}")
        except zmq.ZMQError as e:
            self.close(linger=0)
            raise UserError(f"DMLC_PS_ROOT_URI/DMLC_PS_ROOT_PORT: cannot listen on "
                            f"{self.host}:{port}: {e}") from None
        return port

    @property
    def secure(self) -> bool:
        """The job key is required (CurveZMQ)."""
        return self.guard.secure

    def close(self, linger: Optional[int] = None) -> None:
        self.handshakes.close()
        self.sock.close(linger=linger)
        self.guard.close()
        self.context.term()

    def receive(self) -> Optional[Tuple[bytes, List[Any]]]:
        """The next message, as its sender's identity and its frames, if one comes
        within POLL_MS."""
        if not self.sock.poll(POLL_MS):
            return None
        identity, *frames = self.sock.recv_multipart(copy=False)
        return identity.bytes, frames

    def send(self, identity: bytes, header: Dict) -> None:
        """Never blocks: a peer whose queue is full does not read, and is dropped."""
        try:
            self.sock.send_multipart([identity, *encode({"sender": "scheduler", **header})],
                                     flags=zmq.NOBLOCK)
        except zmq.Again:
            uid = node_id(identity)
            if self.is_member(uid):
                self.stalled.add(uid)
            elif self.quiet.say("unread"):
                log.warning("[scheduler] a peer that is not a member (%r) does not read its "
                            "answers; dropping them", identity[:64])
        except zmq.ZMQError:  # the peer is gone (ROUTER_MANDATORY): nothing to tell it
            pass

    def pop_stalled(self) -> Optional[str]:
        """A member found not reading since the last call, taken off the list; None if
        there is none."""
        return self.stalled.pop() if self.stalled else None

    def tell(self, uid: str, channel: str, header: Dict) -> None:
        """Send to node `uid`'s socket `channel` ("ctl": its requests, "hb": its notices)."""
        self.send(f"{uid}/{channel}".encode(), header)

    def watch_handshakes(self) -> None:
        """Log the peers that failed to authenticate (at most every few seconds)."""
        for failed in self.handshakes.poll():
            line = self.handshakes.say(failed)
            if line is not None:
                log.warning("[scheduler] a node could not join: %s", line)

    def failed_handshakes(self) -> str:
        """"; 2 connection(s) failed to authenticate (last: ...)", or "" if none did."""
        if not self.handshakes.failures:
            return ""
        return f"; {self.handshakes.failures} connection(s) failed to authenticate " \
               f"(last: {self.handshakes.failure})"
