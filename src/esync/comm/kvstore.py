"""The worker's side of the parameter servers: push and pull of the flat vectors.

The weight vector and the buffer vector are each cut into one contiguous shard per
server, balanced by bytes. A push streams each shard to its server as one message per
chunk (esync.transport.message.chunk_spans), to every server before awaiting any
answer, so shards move in parallel; each answer chunk is received straight into the worker's vector
(`recv_into`), with no copy in between. Pushed weight chunks are compressed as
`--compress` says (esync.comm.compress); buffers and answers travel as float32.

Each socket carries the node's id as its ZeroMQ identity, `<node id>/kv-<random>` (servers serve
only the scheduler's members) and, with a job key, proves the key (CurveZMQ). When the scheduler
says a server moved (a dead server was started again, `Node.servers`), the socket is
pointed at the new address and the operation under way is sent to it again.
"""
from __future__ import annotations

import secrets
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import zmq

from esync.comm.compress import Compression, Compressor
from esync.comm.link import Link
from esync.transport.message import (DTYPE, MessageError, check_payload, chunk_spans,
                                     decode_header, encode, frame_bytes)
from esync.transport.node import POLL_MS, JobAborted, Node

ANSWERS = ("weights", "ack", "error")


def shard_bounds(length: int, num_shards: int) -> List[Tuple[int, int]]:
    """[start, end) of each shard: contiguous, sizes differing by at most one element."""
    cuts = [length * i // num_shards for i in range(num_shards + 1)]
    return list(zip(cuts[:-1], cuts[1:]))




class KVStore:
    """`rank` is the worker's rank, or EVALUATOR for the read-only evaluator; `link`
    paces every byte sent and received (esync.comm.link) when the worker's link is emulated."""

    def __init__(self, node: Node, servers: Sequence[str], rank: Union[int, str],
                 num_params: int, num_buffers: int, link: Optional[Link] = None,
                 compression: Compression = Compression()):
        self.node, self.rank = node, rank
        self.link = link or Link()
        self.compressor = Compressor(compression, num_params)
        self.shards = list(zip(shard_bounds(num_params, len(servers)),
                               shard_bounds(num_buffers, len(servers))))
        self.addresses = list(servers)
        self._version = getattr(node, "servers_version", 0)
        self._outstanding: Dict[int, List[Tuple[Dict, Sequence]]] = {}
        self.sockets = []
        guard, uid = getattr(node, "guard", None), getattr(node, "uid", None)
        name = secrets.token_hex(3)  # a node may hold several stores: distinct identities
        for address in servers:
            sock = node.context.socket(zmq.DEALER)
            if guard is not None:
                guard.connect(sock)
            if uid is not None:  # "<node id>/<socket>": the server asks who the node is
                sock.setsockopt(zmq.IDENTITY, f"{uid}/kv-{name}".encode())
            sock.setsockopt(zmq.LINGER, 1000)
            sock.connect(address)
            self.sockets.append(sock)
        self.poller = zmq.Poller()
        for sock in self.sockets:
            self.poller.register(sock, zmq.POLLIN)
        self.bytes_sent = 0
        self.bytes_received = 0
        self.stop_reason: Optional[str] = None
        #: from server 0's latest answer: the model's round (its updates so far) and the
        #: seconds since it was initialised (the job's training clock, near enough)
        self.model_round: Optional[int] = None
        self.model_age: Optional[float] = None
        #: the training clock when the answered model's round was done (None: not said)
        self.round_age: Optional[float] = None
        #: per server, its latest answer's `updates` (its rounds so far)
        self.server_updates: List[Optional[int]] = [None] * len(servers)
        #: seconds the last push waited at the servers for the other workers' (the most
        #: any of its chunks waited, as the servers said)
        self.waited = 0.0
        #: from server 0's latest answer: the samples the job's pushes trained so far
        self.job_samples = 0
        #: the newest checkpoint round any server's answers named (see `checkpoints`)
        self.checkpoint_round: Optional[int] = None
        self._new_checkpoints: List[int] = []

    # --- sending ------------------------------------------------------------------------
    def _send(self, sock: zmq.Socket, header: Dict, sections=()) -> None:
        frames = encode({"sender": self.rank, **header}, sections)
        size = sum(frame_bytes(f) for f in frames)
        self.link.sending(size)
        sock.send_multipart(frames, copy=False)
        self.bytes_sent += size

    def _slices(self, server: int, params: np.ndarray, buffers: np.ndarray):
        (p0, p1), (b0, b1) = self.shards[server]
        return params[p0:p1], buffers[b0:b1]

    # --- receiving ----------------------------------------------------------------------
    def _receive_one(self, server: int, targets: Tuple[np.ndarray, np.ndarray]) -> Dict:
        """One answer from `server`; a `weights` chunk lands in its place in `targets`."""
        sock = self.sockets[server]
        raw = sock.recv(copy=False)
        self.bytes_received += frame_bytes(raw)
        try:
            header = decode_header(raw, ANSWERS)
            if header["type"] == "error":
                raise JobAborted(f"server {server} refused a request: {header.get('error')}")
            if header["type"] != "weights":
                check_payload(header, [])
                self.link.received(frame_bytes(raw))
                return header
            if header.get("dtype") != DTYPE:
                raise MessageError("answer chunk is not float32")
            section, offset = header.get("section"), header.get("offset")
            length = (header.get("lengths") or [None])[0]
            if section not in (0, 1) or not isinstance(offset, int) or not isinstance(length, int) \
                    or offset < 0 or offset + length > len(targets[section]) \
                    or not sock.getsockopt(zmq.RCVMORE):
                raise MessageError(f"answer chunk {section}/{offset}/{length} does not fit "
                                   f"the shard")
            view = memoryview(targets[section][offset:offset + length]).cast("B")
            got = sock.recv_into(view)
            self.bytes_received += got
            check_payload(header, [got])
            if sock.getsockopt(zmq.RCVMORE):
                raise MessageError("answer chunk has extra frames")
        except MessageError as e:
            raise JobAborted(f"server {server} sent a malformed answer: {e}") from None
        self.link.received(frame_bytes(raw) + got)
        if "stop" in header:
            self.stop_reason = str(header["stop"])
        waited = header.get("waited")
        if isinstance(waited, (int, float)) and 0 <= waited < 1e9:
            self.waited = max(self.waited, float(waited))
        if isinstance(header.get("updates"), int):
            self.server_updates[server] = header["updates"]
        if server == 0 and isinstance(header.get("updates"), int):
            self.model_round = header["updates"]
            age, done = header.get("age"), header.get("round_age")
            self.model_age = float(age) if isinstance(age, (int, float)) else None
            self.round_age = float(done) if isinstance(done, (int, float)) else None
            trained = header.get("trained")
            if type(trained) is int and trained >= 0:
                self.job_samples = trained
        checkpoint = header.get("checkpoint")
        if type(checkpoint) is int and checkpoint > (self.checkpoint_round or 0):
            self.checkpoint_round = checkpoint
            self._new_checkpoints.append(checkpoint)
        return header

    def checkpoints(self) -> List[int]:
        """The checkpoint rounds the servers' answers named for the first time since the
        last call (oldest first): a worker keeps its own state of each."""
        new, self._new_checkpoints = self._new_checkpoints, []
        return new

    def _receive(self, expected: List[int], params=None, buffers=None) -> None:
        """Receive until each server has sent `expected[s]` values (or one header-only
        answer where expected is 0)."""
        remaining = list(expected)
        pending = {s for s in range(len(self.sockets))}
        while pending:
            ready = dict(self.poller.poll(POLL_MS))
            if getattr(self.node, "servers_version", 0) != self._version:
                for s in self._follow_servers():
                    remaining[s] = expected[s]
                    pending.add(s)
                continue
            if not ready:
                self.node.check()
                continue
            for s in list(pending):
                if self.sockets[s] not in ready:
                    continue
                targets = self._slices(s, params, buffers) if params is not None else ((), ())
                header = self._receive_one(s, targets)
                if header["type"] == "weights":
                    remaining[s] -= header["lengths"][0]
                if remaining[s] <= 0:
                    pending.discard(s)

    def _follow_servers(self) -> List[int]:
        """Point the sockets of servers that moved at their new address and send them
        the operation under way again; the servers that moved."""
        self._version = self.node.servers_version
        moved = [s for s, address in enumerate(self.node.servers)
                 if s < len(self.addresses) and address and address != self.addresses[s]]
        for s in moved:
            sock = self.sockets[s]
            sock.disconnect(self.addresses[s])
            self.addresses[s] = self.node.servers[s]
            sock.connect(self.addresses[s])
            while sock.poll(0):  # what the dead server sent before it died
                sock.recv_multipart()
            for header, sections in self._outstanding.get(s, []):
                self._send(sock, header, sections)
        return moved

    def _request(self, server: int, header: Dict, sections=()) -> None:
        """Send a request, remembered until the operation ends (a moved server gets
        it again)."""
        self._outstanding.setdefault(server, []).append((header, sections))
        self._send(self.sockets[server], header, sections)

    def _values(self, server: int) -> int:
        (p0, p1), (b0, b1) = self.shards[server]
        return p1 - p0 + b1 - b0

    # --- the operations -----------------------------------------------------------------
    def init(self, rule: Dict, params: np.ndarray, buffers: np.ndarray) -> None:
        """Worker 0: give each server its shard's initial values and the rule."""
        self._outstanding = {}
        for s in range(len(self.sockets)):
            self._request(s, {"type": "init", "shard": s, "rule": rule},
                          self._slices(s, params, buffers))
        self._receive([0] * len(self.sockets))

    def pull(self, params: np.ndarray, buffers: np.ndarray, round_: int = 0,
             stop: Optional[str] = None, start: bool = False,
             at_round: Optional[int] = None) -> None:
        """Write the servers' current weights and buffers into `params` and `buffers`.
        `stop` (the evaluator's decision to end the job) is passed on to the workers;
        `start` (worker 0) tells the servers that training starts now (their clock);
        `at_round` (a worker coming back) waits until that round may start."""
        header = {"type": "pull", "round": round_, **({"stop": stop} if stop else {}),
                  **({"start": True} if start else {}),
                  **({"at_round": at_round} if at_round is not None else {})}
        self._outstanding = {}
        for s in range(len(self.sockets)):
            self._request(s, {**header, "shard": s})
        self._receive([self._values(s) for s in range(len(self.sockets))], params, buffers)

    def push_pull(self, round_: int, grads: np.ndarray, buffers: np.ndarray,
                  params_out: Optional[np.ndarray], buffers_out: Optional[np.ndarray],
                  stop: Optional[str] = None, steps: Optional[int] = None,
                  samples: int = 0) -> None:
        """Push this round's gradient (or delta) and buffers; receive the new weights and
        buffers into `params_out` and `buffers_out` (which may be `buffers` itself), or,
        with `params_out` None, leave the answers for receive_answers.
        The weight chunks are compressed as `--compress` says; `steps` (ESync with
        --average steps or normalized) is the worker's number of local steps
        of the round; `samples`, the samples it trained in the round (the servers count
        the job's: `job_samples`)."""
        header = {"type": "push", "round": round_}
        if samples:
            header["samples"] = samples
        self.waited = 0.0
        self.compressor.begin(round_)
        if stop is not None:
            header["stop"] = stop
        if steps is not None:
            header["steps"] = steps
        self._outstanding = {}
        for s in range(len(self.sockets)):
            for section, values in enumerate(self._slices(s, grads, buffers)):
                for offset, length in chunk_spans(len(values)):
                    chunk = values[offset:offset + length]
                    fields, sections = ({}, [chunk]) if section else \
                        self.compressor.encode(self.shards[s][0][0] + offset, chunk)
                    self._request(s, {**header, **fields, "shard": s, "section": section,
                                      "offset": offset}, sections)
        if params_out is not None:
            self.receive_answers(params_out, buffers_out)

    def receive_answers(self, params_out: np.ndarray, buffers_out: np.ndarray) -> None:
        """The answers to the last push (push_pull with `params_out` None sent it and
        left them on the sockets): the new weights and buffers."""
        self._receive([self._values(s) for s in range(len(self.sockets))], params_out,
                      buffers_out)

    def answers_ready(self) -> bool:
        """Whether every server's answer to the last push (left on the sockets) has
        begun to arrive; nothing is received. A server that moved meanwhile answers
        only once receive_answers sent it the push again: until then, False."""
        return all(sock.poll(0) for sock in self.sockets)

    @property
    def pushed_values(self) -> int:
        """The weights' values the last push carried (compressed: those sent)."""
        return self.compressor.sent_values

    def _ask_all(self, header: Dict) -> List[Dict]:
        """A header-only request to every server; their answers, by server."""
        self._outstanding = {}
        for s in range(len(self.sockets)):
            self._request(s, {**header, "shard": s})
        answers = []
        for s, sock in enumerate(self.sockets):  # one header-only answer each
            while not sock.poll(POLL_MS):
                self.node.check()
            answers.append(self._receive_one(s, ((), ())))
        return answers

    def join(self, round_: int) -> bool:
        """A worker coming back asks every server to count it from round `round_` on;
        if one refuses (that round is under way), the others are told to forget it."""
        accepted = [a.get("accepted") is True for a in self._ask_all(
            {"type": "join", "round": round_})]
        if all(accepted):
            return True
        self._ask_all({"type": "leave"})
        return False

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()
