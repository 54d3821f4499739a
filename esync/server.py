"""A parameter server: owns one shard of the flat weight and buffer vectors.

Workers talk to it over one ROUTER socket:
- `init` (worker 0, once; one message): the shard's initial weights and buffers and
  the rule (mode, learning rate, momentum, ...), as MXNet's kvstore took its optimizer
  from the worker. Answered with `ack`.
- `pull` (header only): answered with the current weights and buffers as a stream of
  `weights` chunk messages (held until `init` came).
- `push`: one message per chunk of a round's gradient (section 0) or buffers
  (section 1), each `[header, values]` with the chunk's `section` and `offset`. Chunks
  are cut at multiples of CHUNK_VALUES within each section, the same on every worker.
  Each chunk is answered with its new values as soon as the rule has completed it
  (SSGD: when all workers pushed it; ASGD: at once), so computing and answering one
  chunk overlaps with receiving the next. A push may carry `stop` (worker 0's decision
  to end the job), which every later answer repeats.
Every `weights` answer says how many times the shard's first chunk was updated
(`updates`: rounds in SSGD and ESync, pushes in ASGD) and the seconds since training
started (`age`; 0 until then): worker 0 marks the start with a pull carrying `start`
once every worker has joined. The evaluator (sender `evaluator`) may only pull, never push or init; its pull
may carry `stop` (it saw the target accuracy held), which ends the job as worker 0's does.
Anything malformed is answered with `error` (and logged); the server goes on serving.
"""
from __future__ import annotations

import logging
from typing import Dict, List, Optional, Tuple

import numpy as np
import zmq

import time

from esync.registry import EVALUATOR
from esync.rules import WEIGHTS, Key, Rule, RuleConfig, make_rule
from esync.transport.cluster import ClusterEnv, advertised_address
from esync.transport.message import (CHUNK_VALUES, Message, MessageError, chunk_spans,
                                     decode, encode)
from esync.transport.node import Node

REQUESTS = ("init", "pull", "push")

log = logging.getLogger(__name__)


def weights_header(shard: int, round_: int, key: Key, updates: int, age: float,
                   stop: Optional[str]) -> Dict:
    """The header of a `weights` answer chunk (its values follow in one frame)."""
    section, offset = key
    header = {"type": "weights", "shard": shard, "round": round_, "section": section,
              "offset": offset, "updates": updates, "age": round(age, 6)}
    if stop is not None:
        header["stop"] = stop
    return header


class ShardServer:
    def __init__(self, rank: int, num_workers: int, sock: zmq.Socket):
        self.rank, self.num_workers, self.sock = rank, num_workers, sock
        self.sections: Tuple[np.ndarray, ...] = ()
        self.rule: Optional[Rule] = None
        self.stop_reason: Optional[str] = None
        self.early_pulls: List[Tuple[bytes, int]] = []
        self.waiting: Dict[Key, List[Tuple[bytes, int, int]]] = {}  # (identity, worker, round)
        self.updates = 0  # completions of the first weight chunk: the model's round
        self.started_at: Optional[float] = None  # when worker 0 said training started

    # --- dispatch ---------------------------------------------------------------------
    def handle(self, frames: List[zmq.Frame]) -> None:
        identity = frames[0].bytes
        try:
            msg = decode(frames[1:], REQUESTS)
            worker = self._worker(msg)
            getattr(self, f"_on_{msg.type}")(identity, worker, msg)
        except MessageError as e:
            log.warning("[server %d] rejected a message from %r: %s", self.rank, identity, e)
            self._send(identity, {"type": "error", "error": str(e)})

    def _worker(self, msg: Message):
        worker, shard = msg.header["sender"], msg.header.get("shard")
        if worker == EVALUATOR:
            if msg.type != "pull":
                raise MessageError(f"the evaluator may only pull, not {msg.type}")
        elif not isinstance(worker, int) or isinstance(worker, bool) \
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
        chunks = msg.sections()
        if len(chunks) != 2:
            raise MessageError("init must carry 2 sections (weights, buffers)")
        try:
            config = RuleConfig.from_header(msg.header.get("rule"))
        except ValueError as e:
            raise MessageError(str(e)) from None
        if config.num_workers != self.num_workers:
            raise MessageError(f"rule is for {config.num_workers} workers, the job has "
                               f"{self.num_workers}")
        self.sections = tuple(self._gather(c, n) for c, n in zip(chunks, msg.header["lengths"]))
        self.rule = make_rule(*self.sections, config)
        log.info("[server %d] shard of %d weights and %d buffer values, rule %s", self.rank,
                 len(self.sections[0]), len(self.sections[1]), config.name)
        self._send(identity, {"type": "ack"})
        for waiter, pulling in self.early_pulls:
            self._answer_all(waiter, pulling, 0)
        self.early_pulls.clear()

    def _on_pull(self, identity: bytes, worker, msg: Message) -> None:
        self._take_stop(worker, msg.header)
        if msg.header.get("start") is True and worker != EVALUATOR and self.started_at is None:
            self.started_at = time.monotonic()
        if self.rule is None:
            self.early_pulls.append((identity, worker))
        else:
            self._answer_all(identity, worker, msg.header.get("round", 0))

    def _on_push(self, identity: bytes, worker: int, msg: Message) -> None:
        if self.rule is None:
            raise MessageError("push before init")
        header = msg.header
        round_, key, values = header.get("round"), self._chunk_key(msg), msg.sections()[0][0][1]
        if not isinstance(round_, int):
            raise MessageError("push lacks an integer 'round'")
        problem = self.rule.check(worker, round_, key)
        if problem:
            raise MessageError(problem)
        self._take_stop(worker, header)
        waiting = self.waiting.setdefault(key, [])
        waiting.append((identity, worker, round_))
        if self.rule.add(worker, key, values):
            if key == (WEIGHTS, 0):
                self.updates += 1
            for waiter, pusher, pushed_round in self.waiting.pop(key):
                self._answer(waiter, pusher, pushed_round, key, len(values))

    def _take_stop(self, sender, header: Dict) -> None:
        if isinstance(header.get("stop"), str) and self.stop_reason is None:
            self.stop_reason = header["stop"]
            who = "the evaluator" if sender == EVALUATOR else f"worker {sender}"
            log.info("[server %d] %s ends the job: %s", self.rank, who, self.stop_reason)

    def _chunk_key(self, msg: Message) -> Key:
        """(section, offset) of a pushed chunk, checked against the shard's chunk layout."""
        section, offset = msg.header.get("section"), msg.header.get("offset")
        lengths = msg.header.get("lengths")
        if section not in (0, 1) or not isinstance(offset, int) or lengths is None \
                or len(lengths) != 1 or msg.header.get("frames") != [1]:
            raise MessageError("push must carry one chunk, with 'section' 0 or 1 and an "
                               "integer 'offset'")
        size = len(self.sections[section])
        expected = min(CHUNK_VALUES, size - offset)
        if offset < 0 or offset % CHUNK_VALUES or offset >= size or lengths[0] != expected:
            raise MessageError(f"chunk of {lengths[0]} values at offset {offset} of section "
                               f"{section} does not fit the shard's {size} values in chunks "
                               f"of {CHUNK_VALUES}")
        return section, offset

    # --- answers ----------------------------------------------------------------------
    @staticmethod
    def _gather(chunks, length: int) -> np.ndarray:
        out = np.empty(length, dtype=np.float32)
        for offset, chunk in chunks:
            out[offset:offset + len(chunk)] = chunk
        return out

    def _answer_all(self, identity: bytes, worker, round_: int) -> None:
        for section, values in enumerate(self.sections):
            for offset, length in chunk_spans(len(values)):
                self._answer(identity, worker, round_, (section, offset), length)

    def _answer(self, identity: bytes, worker, round_: int, key: Key, length: int) -> None:
        section, offset = key
        age = 0.0 if self.started_at is None else time.monotonic() - self.started_at
        header = weights_header(self.rank, round_, key, self.updates, age, self.stop_reason)
        values = self.sections[section][offset:offset + length]
        if worker == EVALUATOR:  # it reads mid-round: never a view the rule may change
            self._send(identity, header, [values.copy()])
            return
        self._send(identity, header, [values.copy() if self.rule.snapshot_replies else values])
        self.rule.sent(worker, key, length)

    def _send(self, identity: bytes, header: Dict, sections=()) -> None:
        frames = encode({"sender": f"server{self.rank}", **header}, sections)
        try:
            self.sock.send_multipart([identity, *frames], copy=False)
        except zmq.ZMQError:  # the peer is gone (ROUTER_MANDATORY)
            pass


def run_server(env: ClusterEnv) -> int:
    """Join the job, then serve one shard until the scheduler says shut down."""
    with Node(env, "server") as node:
        sock = node.context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.LINGER, 1000)
        host = advertised_address(env)
        try:
            port = sock.bind_to_random_port(f"tcp://{host}")
            assignment = node.register(host=host, port=port)
            server = ShardServer(assignment["rank"], assignment["num_workers"], sock)
            log.info("[server %d] serving shard %d of %d at tcp://%s:%d", server.rank,
                     server.rank, assignment["num_servers"], host, port)
            while not node.shutdown_requested:
                node.check()
                if sock.poll(100):
                    server.handle(sock.recv_multipart(copy=False))
            log.info("[server %d] shut down by the scheduler", server.rank)
            return 0
        finally:
            sock.close()
