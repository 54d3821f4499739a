"""A parameter server: owns one shard of the flat weight and buffer vectors.

Workers talk to it over one ROUTER socket with three requests:
- `init` (worker 0, once): the shard's initial weights and buffers, and the rule
  (mode, learning rate, momentum, ...), as MXNet's kvstore took its optimizer from
  the worker. Answered with `ack`.
- `pull`: answered with the current weights and buffers (held until `init` came).
- `push`: a gradient and buffers for a round, answered with the weights once the rule
  has completed the round (SSGD: when all workers pushed; ASGD: at once). A push may
  carry `stop` (worker 0's decision to end the job), which every later answer repeats.
Anything malformed is answered with `error` (and logged); the server goes on serving.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import zmq

from esync.rules import Rule, RuleConfig, make_rule
from esync.transport.message import Message, MessageError, decode, encode

REQUESTS = ("init", "pull", "push")


class ShardServer:
    def __init__(self, rank: int, num_workers: int, sock: zmq.Socket,
                 log: Callable[[str], None] = print):
        self.rank, self.num_workers, self.sock, self.log = rank, num_workers, sock, log
        self.weights: Optional[np.ndarray] = None
        self.buffers: Optional[np.ndarray] = None
        self.rule: Optional[Rule] = None
        self.stop_reason: Optional[str] = None
        self.early_pulls: List[Tuple[bytes, int]] = []
        self.waiting: List[Tuple[bytes, int, int]] = []  # (identity, worker, round)

    # --- dispatch ---------------------------------------------------------------------
    def handle(self, frames: List[zmq.Frame]) -> None:
        identity = frames[0].bytes
        try:
            msg = decode(frames[1:], REQUESTS)
            worker = self._worker(msg)
            getattr(self, f"_on_{msg.type}")(identity, worker, msg)
        except MessageError as e:
            self.log(f"[server {self.rank}] rejected a message from {identity!r}: {e}")
            self._send(identity, {"type": "error", "error": str(e)})

    def _worker(self, msg: Message) -> int:
        worker, shard = msg.header["sender"], msg.header.get("shard")
        if not isinstance(worker, int) or isinstance(worker, bool) \
                or not 0 <= worker < self.num_workers:
            raise MessageError(f"sender {worker!r} is not a worker rank in "
                               f"0..{self.num_workers - 1}")
        if shard != self.rank:
            raise MessageError(f"shard {shard!r} does not exist on server {self.rank}")
        return worker

    # --- requests ---------------------------------------------------------------------
    def _on_init(self, identity: bytes, worker: int, msg: Message) -> None:
        if self.rule is not None:
            raise MessageError(f"shard {self.rank} is already initialised")
        sections = msg.sections()
        if len(sections) != 2:
            raise MessageError("init must carry 2 sections (weights, buffers)")
        try:
            config = RuleConfig.from_header(msg.header.get("rule"))
        except ValueError as e:
            raise MessageError(str(e)) from None
        if config.num_workers != self.num_workers:
            raise MessageError(f"rule is for {config.num_workers} workers, the job has "
                               f"{self.num_workers}")
        self.weights, self.buffers = (self._gather(s, n) for s, n in
                                      zip(sections, msg.header["lengths"]))
        self.rule = make_rule(self.weights, self.buffers, config)
        self.log(f"[server {self.rank}] shard of {len(self.weights)} weights and "
                 f"{len(self.buffers)} buffer values, rule {config.name}")
        self._send(identity, {"type": "ack"})
        for waiter, pulling in self.early_pulls:
            self._reply_weights(waiter, pulling, 0)
        self.early_pulls.clear()

    def _on_pull(self, identity: bytes, worker: int, msg: Message) -> None:
        if self.rule is None:
            self.early_pulls.append((identity, worker))
        else:
            self._reply_weights(identity, worker, msg.header.get("round", 0))

    def _on_push(self, identity: bytes, worker: int, msg: Message) -> None:
        if self.rule is None:
            raise MessageError("push before init")
        round_ = msg.header.get("round")
        if not isinstance(round_, int):
            raise MessageError("push lacks an integer 'round'")
        sections = msg.sections()
        expected = [len(self.weights), len(self.buffers)]
        if len(sections) != 2 or msg.header["lengths"] != expected:
            raise MessageError(f"push must carry 2 sections of {expected} float32 values, "
                               f"got {msg.header.get('lengths')}")
        problem = self.rule.check(worker, round_)
        if problem:
            raise MessageError(problem)
        for offset, chunk in sections[0]:
            self.rule.add(worker, offset, chunk)
        for offset, chunk in sections[1]:
            self.rule.add_buffers(worker, offset, chunk)
        self.rule.pushed(worker)
        stop = msg.header.get("stop")
        if isinstance(stop, str) and self.stop_reason is None:
            self.stop_reason = stop
            self.log(f"[server {self.rank}] worker {worker} ends the job: {stop}")
        self.waiting.append((identity, worker, round_))
        if self.rule.ready():
            self.rule.complete()
            for waiter, pusher, pushed_round in self.waiting:
                self._reply_weights(waiter, pusher, pushed_round)
            self.waiting.clear()

    # --- helpers ----------------------------------------------------------------------
    @staticmethod
    def _gather(chunks, length: int) -> np.ndarray:
        out = np.empty(length, dtype=np.float32)
        for offset, chunk in chunks:
            out[offset:offset + len(chunk)] = chunk
        return out

    def _reply_weights(self, identity: bytes, worker: int, round_: int) -> None:
        header: Dict = {"type": "weights", "shard": self.rank, "round": round_}
        if self.stop_reason is not None:
            header["stop"] = self.stop_reason
        weights, buffers = self.weights, self.buffers
        if self.rule.snapshot_replies:
            weights, buffers = weights.copy(), buffers.copy()
        self._send(identity, header, [weights, buffers])
        self.rule.sent(worker)

    def _send(self, identity: bytes, header: Dict, sections=()) -> None:
        try:
            self.sock.send_multipart([identity, *encode({"sender": f"server{self.rank}", **header},
                                                        sections)], copy=False)
        except zmq.ZMQError:  # the peer is gone (ROUTER_MANDATORY)
            pass


def run_server(node, log: Callable[[str], None] = print) -> int:
    """Register with the scheduler, then serve one shard until it says shut down."""
    from esync.transport.cluster import advertised_address

    sock = node.context.socket(zmq.ROUTER)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.LINGER, 1000)
    host = advertised_address(node.env)
    try:
        port = sock.bind_to_random_port(f"tcp://{host}")
        assignment = node.register(host=host, port=port)
        server = ShardServer(assignment["rank"], assignment["num_workers"], sock, log)
        log(f"[server {server.rank}] serving shard {server.rank} of "
            f"{assignment['num_servers']} at tcp://{host}:{port}")
        while not node.shutdown_requested:
            node.check()
            if sock.poll(100):
                server.handle(sock.recv_multipart(copy=False))
        log(f"[server {server.rank}] shut down by the scheduler")
        return 0
    finally:
        sock.close()
