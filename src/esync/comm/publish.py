"""Lets the evaluator read a model that no parameter server holds (the DDP baseline's):
rank 0 answers the evaluator's `pull` as a one-shard server would (esync.comm.server), from a
snapshot it takes between two training steps.

The socket belongs to a background thread; the training thread only looks, once per
round, whether a pull is waiting (`offer`), and if so copies the weights and buffers
into the snapshot (a few hundred KB for lenet) and hands it over. A pull may carry the
evaluator's `stop`, which rank 0 reads through `stop_reason`.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import zmq
from torch import nn

from esync.comm.flat import floating_buffers, trainable
from esync.registry import EVALUATOR
from esync.comm.server import weights_header
from esync.transport.auth import Guard
from esync.transport.dispatch import Handlers
from esync.transport.message import (FRAME_SLACK, MAX_HEADER_BYTES, Message, MessageError,
                                     chunk_spans, encode)

log = logging.getLogger(__name__)

#: the key in DDP's rendezvous store holding rank 0's publisher address
STORE_ADDRESS = "esync/evaluator"
#: the key rank 0 sets there when the DDP job is over
STORE_FINISHED = "esync/finished"


class ModelPublisher:
    def __init__(self, model: nn.Module, host: str = "127.0.0.1", name: str = "ddp"):
        self.name = name  # the algorithm's, in the log's lines
        self.params = trainable(model)
        self.buffers = [b for _, _, b in floating_buffers(model)]
        self.sections = (np.empty(sum(p.numel() for p in self.params), np.float32),
                         np.empty(sum(b.numel() for b in self.buffers), np.float32))
        self.context = zmq.Context()
        self.guard = Guard.from_environ(self.context)
        self.sock = self.guard.serve(self.context.socket(zmq.ROUTER))
        self.sock.setsockopt(zmq.MAXMSGSIZE, MAX_HEADER_BYTES + FRAME_SLACK)  # pulls: headers
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.port = self.sock.bind_to_random_port(f"tcp://{host}")
        self.address = f"tcp://{host}:{self.port}"
        self.stop_reason: Optional[str] = None
        self._started = time.monotonic()
        self._waiting: List[bytes] = []          # identities of pulls not yet answered
        self._wanted = threading.Event()         # set while a pull waits
        self._ready: "queue.Queue[Tuple[List[bytes], int]]" = queue.Queue()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="publisher", daemon=True)
        self._thread.start()

    def restart_clock(self) -> None:
        """The training clock starts now (answers' `age`)."""
        self._started = time.monotonic()

    def offer(self, round_: int) -> None:
        """From the training thread, between steps: if a pull waits, snapshot the model."""
        if not self._wanted.is_set():
            return
        self._wanted.clear()
        with torch.no_grad():
            for tensors, out in zip((self.params, self.buffers), self.sections):
                if tensors:
                    torch.cat([t.detach().reshape(-1).cpu() for t in tensors],
                              out=torch.from_numpy(out))
        self._ready.put(round_)

    # --- the publisher's thread --------------------------------------------------------
    def _serve(self) -> None:
        while not self._closing.is_set():
            try:
                round_ = self._ready.get_nowait()
            except queue.Empty:
                round_ = None
            if round_ is not None:
                for identity in self._waiting:
                    self._answer(identity, round_)
                self._waiting.clear()
            if self.sock.poll(20):
                self._take(self.sock.recv_multipart(copy=False))

    def _take(self, frames) -> None:
        identity = frames[0].bytes
        try:
            REQUESTS(REQUESTS.decode(frames[1:]), self, identity)
        except MessageError as e:
            log.warning("[%s] publisher rejected a message: %s", self.name, e)
            self._send(identity, {"type": "error", "error": str(e)})

    def _on_pull(self, identity: bytes, msg: Message) -> None:
        """The evaluator's pull: answered with the next snapshot (`offer`)."""
        if msg.header.get("sender") != EVALUATOR:
            raise MessageError("only the evaluator pulls from the DDP baseline")
        stop = msg.header.get("stop")
        if isinstance(stop, str) and self.stop_reason is None:
            self.stop_reason = stop
            log.info("[%s] the evaluator ends the job: %s", self.name, stop)
        self._waiting.append(identity)
        self._wanted.set()

    def _answer(self, identity: bytes, round_: int) -> None:
        age = time.monotonic() - self._started
        for section, values in enumerate(self.sections):
            for offset, length in chunk_spans(len(values)):
                header = weights_header(0, 0, (section, offset), round_, age, self.stop_reason)
                self._send(identity, header, [values[offset:offset + length].copy()])

    def _send(self, identity: bytes, header: Dict, sections=()) -> None:
        try:
            self.sock.send_multipart([identity, *encode({"sender": "ddp0", **header},
                                                        sections)], copy=False)
        except zmq.ZMQError:
            pass

    def close(self) -> None:
        self._closing.set()
        self._thread.join(timeout=5)
        self.sock.close(linger=0)
        self.guard.close()
        self.context.term()


#: the publisher's one dispatch table: the evaluator only pulls
REQUESTS: Handlers[None] = Handlers({"pull": ModelPublisher._on_pull})
