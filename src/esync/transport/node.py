"""A server's or worker's membership of the job (ps-lite's postoffice, node side).

Two DEALER sockets talk to the scheduler: the control socket, used by the main thread
for requests (register, barrier, finished, abort), and the heartbeat socket, owned by a
background thread that sends a heartbeat every PS_HEARTBEAT_INTERVAL seconds, takes
the scheduler's notices (abort, shutdown) and sends the node's own (`tell`).

Joining: a node waits for a scheduler that has not started yet (nodes may start in any
order), saying every PROGRESS_S seconds what it waits for and since when, and gives up
after `--start-timeout` seconds (0: never), as torchrun's rendezvous does; a CurveZMQ
handshake that fails (another job key, or a key on one side only) ends the wait at once
with the cause (esync.transport.handshake). Both raise `JoinFailed`.

Once joined, if the scheduler says the job is aborted, or stops answering heartbeats for
PS_HEARTBEAT_TIMEOUT seconds once it has answered, the node is *aborted*: every wait in
this process (`Node.wait`) raises `JobAborted` with the reason, and a watchdog ends the
process if it has not ended by itself shortly after.
"""
from __future__ import annotations

import logging
import os
import queue
import secrets
import socket
import threading
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import zmq

from esync.errors import UserError
from esync.transport.auth import Guard
from esync.transport.cluster import ClusterEnv
from esync.transport.dispatch import Handlers
from esync.transport.handshake import Handshakes
from esync.transport.message import Message, MessageError, decode, encode

POLL_MS = 100
RECONNECT_S = 2.0
#: seconds between a waiting node's lines saying what it waits for
PROGRESS_S = 5.0
REPLIES = ("assign", "barrier_done", "ack", "error", "member", "rendezvous", "abort", "lease")

log = logging.getLogger(__name__)


def report_failed_start(env: ClusterEnv, reason: str) -> None:
    """A node that fails before it could join (a bad flag) tells the scheduler, so that
    the job ends instead of waiting for it; best effort, at most a second."""
    context = zmq.Context()
    try:
        sock = context.socket(zmq.DEALER)
        try:
            Guard.from_environ(context, warn=False).connect(sock)
        except UserError:  # a bad key: the scheduler would not hear this node anyway
            pass
        sock.connect(env.scheduler_address)
        who = f"{env.role} (pid {os.getpid()} on {socket.gethostname()})"
        sock.send_multipart(encode({"type": "abort", "sender": f"{env.role}-{os.getpid()}",
                                    "reason": f"{who} could not start: {reason}"}))
        sock.close(linger=1000)
    finally:
        context.term()


class JobAborted(Exception):
    """The job cannot go on (a node died, the scheduler is gone); the text says why."""


class JoinFailed(JobAborted):
    """This node cannot join the job (no scheduler within --start-timeout, a job key the
    scheduler refuses, settings that differ from the job's); the text says why."""


def clock(monotonic: float) -> str:
    """A time.monotonic() reading as this machine's wall-clock time, HH:MM:SS."""
    return time.strftime("%H:%M:%S", time.localtime(time.time() - time.monotonic() + monotonic))


def node_id(identity: bytes) -> str:
    """The node id a socket's ZeroMQ identity carries: "<node id>/<socket name>" (a node
    has several sockets; Node._connect names them)."""
    return identity.rsplit(b"/", 1)[0].decode("utf-8", "replace")


def describe(error: JobAborted) -> str:
    """The one line that says why this node ends."""
    return str(error) if isinstance(error, JoinFailed) else f"job aborted: {error}"


class Node:
    """Use as a context manager: leaving the block closes the node, and leaving it on an
    error first tells the scheduler (`fail`), which ends the job for everyone."""

    def __init__(self, env: ClusterEnv, role: str, label: Optional[str] = None):
        self.env = env
        self.role = role
        self.label = label  # how it is called until it has a rank (its --device-name)
        self.uid = f"{role}-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.context = zmq.Context()
        # sockets that set no LINGER of their own get 0, so that closing the context can
        # never wait for ever on messages a forgotten socket still holds
        self.context.set(zmq.BLOCKY, 0)
        self.rank: Optional[int] = None
        self._aborted: Optional[JobAborted] = None
        self._answered = threading.Event()  # the scheduler answered a heartbeat
        self._connected = False  # a TCP connection to the scheduler was made
        self._outbox: "queue.Queue[Dict[str, Any]]" = queue.Queue()  # notices to send
        self._shutdown = threading.Event()
        self._closing = threading.Event()
        #: the scheduler's notices for the main thread: "left" (a worker died; servers)
        self.notices: "queue.Queue[Dict[str, Any]]" = queue.Queue()
        #: the servers' addresses, as the assignment and later "servers" notices say
        #: (a restarted server serves at a new address); the version counts the changes
        self.servers: List[str] = []
        self.servers_version = 0
        self.guard = Guard.from_environ(self.context)
        self._control = self._connect("ctl")
        self._heartbeats = threading.Thread(target=self._heartbeat_loop, name="heartbeat",
                                            daemon=True)
        self._heartbeats.start()

    # --- state seen by the main thread ------------------------------------------------
    @property
    def name(self) -> str:
        if self.rank is not None:
            return f"{self.role} {self.rank}"
        return f"{self.role} {self.label}" if self.label else f"{self.role} (pid {os.getpid()})"

    @property
    def shutdown_requested(self) -> bool:
        return self._shutdown.is_set()

    def check(self) -> None:
        if self._aborted is not None:
            raise type(self._aborted)(str(self._aborted))

    def wait(self, sock: zmq.Socket, types: Sequence[str],
             idle: Optional[Callable[[], None]] = None) -> Message:
        """The next message on `sock` (blocking), unless the job is aborted meanwhile;
        `idle` is called every POLL_MS while none comes."""
        while not sock.poll(POLL_MS):
            self.check()
            if idle is not None:
                idle()
        return decode(sock.recv_multipart(copy=False), types)

    # --- requests to the scheduler ----------------------------------------------------
    def _request(self, header: Dict[str, Any],
                 idle: Optional[Callable[[], None]] = None) -> Message:
        log.debug("[ps %s] -> scheduler %s", self.name, header)
        self._control.send_multipart(encode({"sender": self.uid, **header}))
        reply = self.wait(self._control, REPLIES, idle)
        log.debug("[ps %s] <- scheduler %s", self.name, reply.header)
        return self._answer(header["type"], reply)

    def _answer(self, request: str, reply: Message) -> Message:
        if reply.type == "abort":  # the job ended before this node could take part
            raise JobAborted(str(reply.header.get("reason", "aborted by the scheduler"))[:2000])
        if reply.type == "error":
            error = reply.header.get("error")
            if request == "register":
                raise JoinFailed(f"the scheduler refused this {self.role}: {error}")
            raise JobAborted(f"the scheduler refused {request}: {error}")
        return reply

    def register(self, start_timeout: float = 0.0, **info) -> Dict[str, Any]:
        """Join the job; returns the assignment once every node has joined:
        {"rank", "num_workers", "num_servers", "servers": [address of server 0, ...],
        "job": the job id the scheduler drew}. Says every PROGRESS_S seconds what it
        waits for; `start_timeout` > 0: JoinFailed once it has waited that long."""
        started = time.monotonic()
        next_line = [started + PROGRESS_S]

        def idle() -> None:
            now = time.monotonic()
            if start_timeout and now - started >= start_timeout:
                reason = f"gave up after --start-timeout {start_timeout:g} s " \
                         f"{self.waiting_for()}"
                if self._answered.is_set():  # the others would wait for this node: end it
                    self.fail(reason, user_error=True)
                raise JoinFailed(f"{self.name}: {reason}")
            if now >= next_line[0]:
                log.info("[%s] %s since %s (%d s)", self.name, self.waiting_for(),
                         clock(started), now - started)
                next_line[0] = now + PROGRESS_S

        reply = self._request({"type": "register", "role": self.role, "pid": os.getpid(),
                               "hostname": socket.gethostname(), **info}, idle)
        self.rank = reply.header["rank"]
        self.servers = list(reply.header.get("servers", []))
        return reply.header

    def waiting_for(self) -> str:
        """What a node that has not joined yet waits for, in words."""
        where = self.env.scheduler_address
        if self._answered.is_set():
            return f"waiting for the job's other nodes to register with the scheduler at " \
                   f"{where} (or, once the job runs, for a dead node's place)"
        if self._connected:
            return f"waiting for the scheduler at {where} to answer (connected, no answer yet)"
        return f"waiting for the scheduler at {where}: nothing listens there (not started " \
               f"yet, or ended; are DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT right?)"

    def tell(self, header: Dict[str, Any]) -> None:
        """Send the scheduler a notice that wants no answer (from any thread)."""
        self._outbox.put(header)

    def who(self, uid: str) -> Optional[Dict[str, Any]]:
        """A server asks who a peer is: {"role", "rank"} of a registered, living
        worker or evaluator whose node id is `uid`, else None."""
        self._control.send_multipart(encode({"sender": self.uid, "type": "who", "uid": uid}))
        reply = self.wait(self._control, REPLIES)
        return reply.header if reply.type == "member" else None

    def rendezvous(self, **published: str) -> Dict[str, Any]:
        """A job without servers (`--backend allreduce`): worker 0 leaves where the others
        meet it (`store`: torch's TCPStore, host:port; `evaluator`: its model publisher);
        the others (workers, evaluators) get that once it is there."""
        return self._request({"type": "rendezvous", **published}).header

    def lease(self, header: Dict[str, Any]) -> Dict[str, Any]:
        """A worker asks for its next block lease, or to resume one (`--data-split
        leased`; esync.transport.leasing says the fields)."""
        return self._request({"type": "lease", **header}).header

    def report_leases(self, header: Dict[str, Any]) -> None:
        """A worker's round ended: the leases it finished and where it is, told before
        the round's record is written (answered, so that the scheduler knows)."""
        self._request({"type": "leases", **header})

    def barrier(self, group: str = "workers") -> None:
        self._request({"type": "barrier", "group": group})

    def finish(self) -> None:
        """A worker is done; when all are, the scheduler shuts the servers down."""
        self._request({"type": "finished"})

    def wait_for_others(self) -> None:
        """A worker that has stopped waits until every other living worker has finished
        (their last pushes are in: ASGD's worker 0 then takes the job's final model)."""
        self._request({"type": "others"})

    def fail(self, reason: str, user_error: bool = False) -> None:
        """Tell the scheduler this node cannot go on. `user_error`: the failure is the
        code's or its input's (bad input, an exception in the training script), which a
        restart would repeat: the job ends for everyone. Otherwise (interrupted: the node
        is lost as a machine is) the scheduler may go on without a worker."""
        try:
            self._control.send_multipart(encode({"sender": self.uid, "type": "abort",
                                                 "reason": f"{self.name} failed: {reason}",
                                                 "user_error": user_error}))
        except zmq.ZMQError:
            pass

    # --- heartbeats and notices -------------------------------------------------------
    def _socket(self, channel: str) -> zmq.Socket:
        sock = self.guard.connect(self.context.socket(zmq.DEALER))
        sock.setsockopt(zmq.IDENTITY, f"{self.uid}/{channel}".encode())
        sock.setsockopt(zmq.LINGER, 1000)
        return sock

    def _connect(self, channel: str) -> zmq.Socket:
        sock = self._socket(channel)
        sock.connect(self.env.scheduler_address)
        return sock

    def _connect_watched(self, channel: str) -> Tuple[zmq.Socket, Handshakes]:
        """`_connect` with the handshakes' monitor attached before the connection starts:
        libzmq drops the events sent before a monitor listens, and a failed handshake is
        not retried (the session ends), so a monitor attached after `connect` could miss
        the one event that says why this node cannot join."""
        sock = self._socket(channel)
        handshakes = Handshakes(sock, self.guard.secure, listening=False)
        sock.connect(self.env.scheduler_address)
        return sock, handshakes

    def _heartbeat_loop(self) -> None:
        sock, handshakes = self._connect_watched("hb")
        interval, timeout = self.env.heartbeat_interval, self.env.heartbeat_timeout
        # Until the scheduler first answers, wait for it however long it takes to start
        # (nodes may be started in any order); after that, silence means it is gone.
        last_answer, next_beat = None, time.monotonic()
        connected_at = next_beat
        try:
            while not self._closing.is_set():
                now = time.monotonic()
                if last_answer is None and now - connected_at > RECONNECT_S:
                    # no answer yet: start a fresh connection rather than trust one that
                    # may never complete (seen rarely when nodes start before the scheduler)
                    handshakes.close()
                    sock.close(linger=0)
                    (sock, handshakes), connected_at = self._connect_watched("hb"), now
                if now >= next_beat:
                    sock.send_multipart(encode({"type": "heartbeat", "sender": self.uid}))
                    next_beat = now + interval
                while not self._outbox.empty():
                    sock.send_multipart(encode({"sender": self.uid, **self._outbox.get()}))
                failed = handshakes.poll()
                self._connected = self._connected or handshakes.connected
                if failed:
                    self._abort(f"{self.name}: {failed[-1]}", JoinFailed)
                if sock.poll(int(min(interval, POLL_MS / 1000) * 1000)):
                    try:
                        notice = NOTICES.decode(sock.recv_multipart(copy=False))
                    except MessageError as e:
                        log.warning("[%s] dropped a bad notice from the scheduler: %s",
                                    self.name, e)
                        continue
                    last_answer = time.monotonic()
                    self._answered.set()
                    NOTICES(notice, self, sock)
                if last_answer is not None and time.monotonic() - last_answer > timeout \
                        and self._aborted is None and not self._shutdown.is_set():
                    self._abort(f"lost the scheduler at {self.env.scheduler_address}: no answer "
                                f"to heartbeats for {timeout:g} s")
        finally:
            handshakes.close()
            sock.close(linger=0)

    # the scheduler's notices, each with the heartbeat socket (NOTICES)
    def _on_ack(self, sock: zmq.Socket, notice: Message) -> None:
        """A heartbeat's answer: the scheduler is there (nothing else to do)."""

    def _on_abort(self, sock: zmq.Socket, notice: Message) -> None:
        self._abort(str(notice.header.get("reason", "aborted by the scheduler")))

    def _on_servers(self, sock: zmq.Socket, notice: Message) -> None:
        """A server was started again: the servers' address book changed."""
        self._servers_moved(notice.header.get("servers"))

    def _on_left(self, sock: zmq.Socket, notice: Message) -> None:
        """A worker died (servers): for the main thread, esync.comm.server's `notice`."""
        self.notices.put(notice.header)

    def _on_shutdown(self, sock: zmq.Socket, notice: Message) -> None:
        log.debug("[ps %s] <- scheduler shutdown", self.name)
        sock.send_multipart(encode({"type": "bye", "sender": self.uid}))
        self._shutdown.set()

    def _servers_moved(self, servers) -> None:
        if isinstance(servers, list) and all(isinstance(a, str) for a in servers) \
                and servers != self.servers:
            log.info("[%s] the servers are now at %s", self.name, ", ".join(servers))
            self.servers = list(servers)
            self.servers_version += 1

    def _abort(self, reason: str, kind: type = JobAborted) -> None:
        if self._aborted is not None:
            return
        self._aborted = kind(reason)
        grace = max(5.0, 2 * self.env.heartbeat_timeout)

        def watchdog():
            if not self._closing.wait(grace):
                log.error("esync: error: %s (%s did not end within %g s, exiting)",
                          describe(self._aborted), self.name, grace)
                logging.shutdown()  # flush the handlers: os._exit skips it
                os._exit(1)

        threading.Thread(target=watchdog, name="abort-watchdog", daemon=True).start()

    def close(self) -> None:
        """Stop heartbeats and close every socket of this node's context (also those a
        caller left open), giving unsent messages up to a second: never hangs."""
        self._closing.set()
        self._heartbeats.join(timeout=5)
        self.guard.close()
        self.context.destroy(linger=1000)

    def __enter__(self) -> "Node":
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if error is not None and not isinstance(error, JobAborted):
            self.fail(str(error) if isinstance(error, UserError) else failure_line(error),
                      user_error=not isinstance(error, (KeyboardInterrupt, SystemExit)))
        self.close()


#: the scheduler's notices a node takes on its heartbeat socket, one handler each (their
#: keys are the only types accepted: any other is logged and dropped)
NOTICES: Handlers[None] = Handlers({
    "ack": Node._on_ack,
    "abort": Node._on_abort,
    "shutdown": Node._on_shutdown,
    "left": Node._on_left,
    "servers": Node._on_servers,
})


def failure_line(error: BaseException) -> str:
    """`ValueError: bad thing (train.py, line 12)`: an exception and where the code that
    raised it is (its innermost frame outside esync and torch, else its innermost)."""
    where = ""
    frames = traceback.extract_tb(error.__traceback__) if error.__traceback__ else []
    own = [f for f in frames if not any(part in f.filename for part in (
        f"{os.sep}esync{os.sep}", f"{os.sep}torch{os.sep}", f"{os.sep}zmq{os.sep}"))]
    frame = (own or frames or [None])[-1]
    if frame is not None:
        where = f" ({os.path.basename(frame.filename)}, line {frame.lineno})"
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}{': ' + text[0] if text else ''}{where}"
