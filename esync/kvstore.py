"""The worker's side of the parameter servers: push and pull of the flat vectors.

The weight vector and the buffer vector are each cut into one contiguous shard per
server, balanced by bytes; a push or pull is one message per server, sent to all
servers before any answer is awaited, so the shards move in parallel.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import zmq

from esync.transport.message import Message, encode, frame_bytes
from esync.transport.node import JobAborted, Node

ANSWERS = ("weights", "ack", "error")


def shard_bounds(length: int, num_shards: int) -> List[Tuple[int, int]]:
    """[start, end) of each shard: contiguous, sizes differing by at most one element."""
    cuts = [length * i // num_shards for i in range(num_shards + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


class KVStore:
    def __init__(self, node: Node, servers: Sequence[str], rank: int, num_params: int,
                 num_buffers: int):
        self.node, self.rank = node, rank
        self.param_shards = shard_bounds(num_params, len(servers))
        self.buffer_shards = shard_bounds(num_buffers, len(servers))
        self.sockets = []
        for address in servers:
            sock = node.context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 1000)
            sock.connect(address)
            self.sockets.append(sock)
        self.bytes_sent = 0
        self.bytes_received = 0
        self.stop_reason: Optional[str] = None

    def _shards(self, params: np.ndarray, buffers: np.ndarray):
        for s, ((p0, p1), (b0, b1)) in enumerate(zip(self.param_shards, self.buffer_shards)):
            yield s, params[p0:p1], buffers[b0:b1]

    def _exchange(self, header: Dict, params: Optional[np.ndarray],
                  buffers: Optional[np.ndarray]) -> List[Message]:
        """Send one message to every server (with its shards, if given); await every answer."""
        for s, sock in enumerate(self.sockets):
            sections = ()
            if params is not None:
                (p0, p1), (b0, b1) = self.param_shards[s], self.buffer_shards[s]
                sections = (params[p0:p1], buffers[b0:b1])
            frames = encode({"sender": self.rank, "shard": s, **header}, sections)
            sock.send_multipart(frames, copy=False)
            self.bytes_sent += sum(frame_bytes(f) for f in frames)
        answers = []
        for s, sock in enumerate(self.sockets):
            answer = self.node.wait(sock, ANSWERS)
            self.bytes_received += answer.nbytes()
            if answer.type == "error":
                raise JobAborted(f"server {s} refused {header['type']}: {answer.header['error']}")
            answers.append(answer)
        return answers

    def _store(self, answers: List[Message], params: np.ndarray, buffers: np.ndarray) -> None:
        for s, answer in enumerate(answers):
            (p0, p1), (b0, b1) = self.param_shards[s], self.buffer_shards[s]
            weights, stats = answer.sections()
            if answer.header["lengths"] != [p1 - p0, b1 - b0]:
                raise JobAborted(f"server {s} answered {answer.header['lengths']} values, "
                                 f"expected {[p1 - p0, b1 - b0]}")
            for offset, chunk in weights:
                params[p0 + offset:p0 + offset + len(chunk)] = chunk
            for offset, chunk in stats:
                buffers[b0 + offset:b0 + offset + len(chunk)] = chunk
            if "stop" in answer.header:
                self.stop_reason = str(answer.header["stop"])

    def init(self, rule: Dict, params: np.ndarray, buffers: np.ndarray) -> None:
        """Worker 0: give each server its shard's initial values and the rule."""
        self._exchange({"type": "init", "rule": rule}, params, buffers)

    def pull(self, params: np.ndarray, buffers: np.ndarray, round_: int = 0) -> None:
        """Write the servers' current weights and buffers into `params` and `buffers`."""
        self._store(self._exchange({"type": "pull", "round": round_}, None, None),
                    params, buffers)

    def push_pull(self, round_: int, grads: np.ndarray, buffers: np.ndarray,
                  params_out: np.ndarray, buffers_out: np.ndarray,
                  stop: Optional[str] = None) -> None:
        """Push this round's gradient (or delta) and buffers; store the answered weights."""
        header = {"type": "push", "round": round_}
        if stop is not None:
            header["stop"] = stop
        self._store(self._exchange(header, grads, buffers), params_out, buffers_out)

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()
