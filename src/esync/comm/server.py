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
  to end the job), which every later answer repeats. A weight chunk may come compressed
  (`codec`: fp16, sparse indices and values, or a slice, esync.comm.compress; decoded, every
  index checked, before the rule sees it; a section with no values has no frame), and
  an ESync push may carry its `steps` (the worker's local steps, for --average steps
  and normalized).
Every `weights` answer says how many times the shard's first chunk was updated
(`updates`: rounds in SSGD and ESync, pushes in ASGD) and the seconds since training
started (`age`; 0 until then): worker 0 marks the start with a pull carrying `start`
once every worker has joined. The evaluator (sender `evaluator`) may only pull, never
push or init; a pull that comes mid-round (SSGD, ESync) is answered once the round is
done, so that it sees one round's weights and statistics; its pull may carry `stop` (it
saw the target accuracy held), which ends the job as worker 0's does.
Anything malformed is answered with `error` (and logged); the server goes on serving.

Only peers the scheduler registered are served: a worker's or evaluator's socket carries
its node id as its ZeroMQ identity (`<node id>/<socket name>`), and the server asks the scheduler (`who`) the first
time it sees one; anything else is answered with `error` and changes nothing.

Failures: the scheduler tells the server when a worker died (`left`); the rule then
aggregates the living workers. A worker that comes back asks to `join` at a later round
and pulls with `at_round`, answered once that round may start. With --checkpoint-dir,
the shard is checkpointed (esync.comm.checkpoint) between rounds every --checkpoint-every
rounds or seconds; a server started in place of a dead one, or for `--resume`, restores
its shard from the newest whole checkpoint.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import zmq

from esync.comm.checkpoint import Checkpoints, survey
from esync.errors import UserError
from esync.registry import EVALUATOR
from esync.comm.compress import CompressionError, decode_chunk
from esync.algorithms.rules import WEIGHTS, Key, Rule, RuleConfig, make_rule
from esync.transport.cluster import ClusterEnv, advertised_address
from esync.transport.dispatch import Handlers
from esync.transport.message import (CHUNK_BYTES, CHUNK_VALUES, FRAME_SLACK, Message,
                                     MessageError, chunk_spans, encode, integer_field)
from esync.transport.node import JobAborted, Node
from esync.transport.peers import Peers, Stalled, Who, asking, telling
from esync.transport.quiet import Quiet

EVALUATOR_PULLS = 64  # evaluators' pulls waiting for a round's end (bounded)
#: milliseconds a send may wait once a member's queue is full (ZeroMQ's SNDHWM messages
#: unread): then it does not read, and is dropped
SEND_TIMEOUT_MS = 1000

log = logging.getLogger(__name__)

def _short(value: Any) -> str:
    """A peer's value in an error message and the log: repr, cut to 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


#: the shortest wait a push's answer reports (the push that completed a round, or any
#: under ASGD, waited for nobody: their answers stay as short as before)
WAIT_REPORTED = 1e-4


def weights_header(shard: int, round_: int, key: Key, updates: int, age: float,
                   stop: Optional[str], waited: Optional[float] = None, trained: int = 0,
                   checkpoint: Optional[int] = None,
                   round_age: Optional[float] = None) -> Dict:
    """The header of a `weights` answer chunk (its values follow in one frame);
    `age`: the training clock now; `round_age` (the evaluator's answers only): the clock
    when the shard's model was last updated (its round done), the training time that
    model has behind it;
    `waited`: the seconds the answered push waited here for the other workers' (the
    round's *wait*, measured on one clock: the server's); `trained`: the samples the
    job's pushes have trained so far (all workers'); `checkpoint`: the round of the
    shard's latest checkpoint (each worker keeps its optimizer's state of that round)."""
    section, offset = key
    header = {"type": "weights", "shard": shard, "round": round_, "section": section,
              "offset": offset, "updates": updates, "age": round(age, 6),
              "trained": trained}
    if round_age is not None:
        header["round_age"] = round(round_age, 6)
    if stop is not None:
        header["stop"] = stop
    if waited is not None and waited >= WAIT_REPORTED:
        header["waited"] = round(waited, 6)
    if checkpoint is not None:
        header["checkpoint"] = checkpoint
    return header


class Checkpointing:
    """When a shard is checkpointed (with --checkpoint-dir): between rounds, every
    --checkpoint-every rounds or seconds, never twice for one round; and the round of
    its latest checkpoint, which every answer names."""

    def __init__(self, store: Optional[Checkpoints],
                 every: Tuple[Optional[int], Optional[float]] = (None, None)):
        self.store = store
        self.every_rounds, self.every_seconds = every
        self.saved_updates, self.saved_at = 0, time.monotonic()
        self.latest: Optional[int] = None  # the round of the latest checkpoint

    def due(self, updates: int, at_boundary: bool) -> bool:
        """Whether the shard, at round `updates`, is to be checkpointed now."""
        if self.store is None or updates == self.saved_updates or not at_boundary:
            return False
        return (self.every_rounds is not None and updates % self.every_rounds == 0) or \
            (self.every_seconds is not None
             and time.monotonic() - self.saved_at >= self.every_seconds)

    def saved(self, updates: int) -> None:
        """The checkpoint of round `updates` is written."""
        self.saved_updates, self.saved_at = updates, time.monotonic()
        self.latest = updates

    def restored(self, updates: int) -> None:
        """The shard was taken back from its checkpoint of round `updates`."""
        self.saved_updates = self.latest = updates


class ShardServer:
    """Serves one shard (see the module's docstring): `handle` takes each message,
    `notice` the scheduler's; who its peers are is `peers`' to say, when to checkpoint
    `checkpointing`'s."""

    def __init__(self, rank: int, num_workers: int, sock: zmq.Socket, who: Who,
                 checkpoints: Optional[Checkpoints] = None,
                 every: Tuple[Optional[int], Optional[float]] = (None, None),
                 stalled: Stalled = lambda identity: None):
        self.rank, self.num_workers, self.sock = rank, num_workers, sock
        self.stalled = stalled
        self.quiet = Quiet()  # strangers that do not read: logged at most this often
        self.peers = Peers(who)  # who is who: only the scheduler's members are served
        self.sections: Tuple[np.ndarray, ...] = ()
        self.rule: Optional[Rule] = None
        self.stop_reason: Optional[str] = None
        self.early_pulls: List[Tuple[bytes, int]] = []
        self.round_pulls: List[Tuple[bytes, int, int]] = []  # (identity, worker, round)
        #: the evaluator's pulls that came mid-round, answered once the round is done
        self.evaluator_pulls: List[Tuple[bytes, int]] = []  # (identity, round)
        #: pushes waiting for their round: (identity, worker, round, time it arrived)
        self.waiting: Dict[Key, List[Tuple[bytes, int, int, float]]] = {}
        self.started_at: Optional[float] = None  # when worker 0 said training started
        self.age_offset = 0.0  # a restored shard's training clock at its checkpoint
        #: the training clock when the model was last updated (`updates`), and that count
        self.round_age, self._aged_updates = 0.0, 0
        self.checkpointing = Checkpointing(checkpoints, every)
        #: samples the job's pushes trained so far (each push says its own: `samples`)
        self.trained = 0

    @property
    def updates(self) -> int:
        """The model's round (esync.algorithms.rules.Rule.updates); 0 before `init`."""
        return 0 if self.rule is None else self.rule.updates

    # --- dispatch ---------------------------------------------------------------------
    def handle(self, frames: List[zmq.Frame]) -> None:
        identity = frames[0].bytes if hasattr(frames[0], "bytes") else bytes(frames[0])
        try:
            msg = HANDLERS.decode(frames[1:])
            HANDLERS(msg, self, identity, self._worker(identity, msg))
        except MessageError as e:
            log.warning("[server %d] rejected a message from %r: %s", self.rank,
                        identity[:64], e)
            self._send(identity, {"type": "error", "error": str(e)})
        except JobAborted:  # the job ended while this message was handled (asking the
            raise           # scheduler who sent it): the server ends, as the job has
        except Exception as e:  # one message never stops the server
            log.exception("[server %d] error handling a message from %r", self.rank,
                          identity[:64])
            self._send(identity, {"type": "error",
                                  "error": f"internal error: {type(e).__name__}"})

    def _worker(self, identity: bytes, msg: Message):
        peer = self.peers.lookup(identity)
        if peer is None:
            raise MessageError("not a member of this job (unknown sender)")
        role, rank = peer
        sender, shard = msg.header["sender"], msg.header.get("shard")
        if role == EVALUATOR:
            if msg.type != "pull":
                raise MessageError(f"the evaluator may only pull, not {msg.type}")
            if sender != EVALUATOR:
                raise MessageError(f"sender {_short(sender)} is the evaluator")
            worker = EVALUATOR
        elif type(sender) is not int or sender != rank:
            raise MessageError(f"sender {_short(sender)} is worker {rank}")
        else:
            worker = rank
        if type(shard) is not int or shard != self.rank:
            raise MessageError(f"shard {_short(shard)} does not exist on server {self.rank}")
        return worker

    @staticmethod
    def _round(header: Dict, name: str = "round", default: Optional[int] = 0) -> int:
        """A round field (`default` if absent)."""
        return integer_field(header, name, 0, 2**62) if name in header else default

    # --- requests ---------------------------------------------------------------------
    def _on_init(self, identity: bytes, worker: int, msg: Message) -> None:
        try:
            config = RuleConfig.from_header(msg.header.get("rule"))
        except ValueError as e:
            config, problem = None, str(e)
        if self.rule is not None:
            if config is None or (config.name, config.num_workers) != (
                    self.rule.config.name, self.rule.config.num_workers):
                raise MessageError(f"shard {self.rank} is already initialised for "
                                   f"{self.rule.config.name} with "
                                   f"{self.rule.config.num_workers} workers")
            self._send(identity, {"type": "ack"})  # restored from a checkpoint: keep it
            return
        if config is None:
            raise MessageError(problem)
        chunks = msg.sections()
        lengths = msg.header.get("lengths")
        if len(chunks) != 2 or not isinstance(lengths, list) or len(lengths) != 2:
            raise MessageError("init must carry 2 sections (weights, buffers)")
        if config.num_workers != self.num_workers:
            raise MessageError(f"rule is for {config.num_workers} workers, the job has "
                               f"{self.num_workers}")
        self.sections = tuple(self._gather(c, n) for c, n in zip(chunks, lengths))
        self.rule = make_rule(*self.sections, config)
        log.info("[server %d] shard of %d weights and %d buffer values, rule %s", self.rank,
                 len(self.sections[0]), len(self.sections[1]), config.name)
        self._send(identity, {"type": "ack"})
        self._answer_early_pulls()

    def _answer_early_pulls(self) -> None:
        for waiter, pulling in self.early_pulls:
            self._answer_all(waiter, pulling, 0)
        self.early_pulls.clear()

    def _on_pull(self, identity: bytes, worker, msg: Message) -> None:
        round_ = self._round(msg.header)
        at = self._round(msg.header, "at_round", None)
        self._take_stop(worker, msg.header)  # only once the pull is known to be good
        if msg.header.get("start") is True and worker != EVALUATOR and self.started_at is None:
            self.started_at = time.monotonic() - self.age_offset
        if self.rule is None:
            if len(self.early_pulls) < 4 * self.num_workers + 64:
                self.early_pulls.append((identity, worker))
            else:
                raise MessageError("too many pulls before init")
        elif at is not None and worker != EVALUATOR and not self.rule.joined(worker, at):
            self.round_pulls = [p for p in self.round_pulls if p[1] != worker]
            self.round_pulls.append((identity, worker, at))
        elif worker == EVALUATOR and not self.rule.at_boundary:
            # mid-round, the shard mixes two rounds (weights of the next one, statistics
            # of the last): the evaluator sees a round's model, whole, once it is done
            if len(self.evaluator_pulls) >= EVALUATOR_PULLS:
                raise MessageError("too many evaluator pulls waiting for the round's end")
            self.evaluator_pulls.append((identity, round_))
        else:
            self._answer_all(identity, worker, round_)

    def _on_join(self, identity: bytes, worker: int, msg: Message) -> None:
        """A worker that comes back asks to take part from round `round` on."""
        if self.rule is None:
            raise MessageError("join before init")
        round_ = self._round(msg.header)
        accepted = self.rule.join(worker, round_)
        if accepted:
            log.info("[server %d] worker %d takes part again from round %d", self.rank,
                     worker, round_)
        self._send(identity, {"type": "ack", "round": round_, "accepted": accepted})

    def _on_leave(self, identity: bytes, worker: int, msg: Message) -> None:
        """A worker withdraws (a join that other servers refused)."""
        if self.rule is not None:
            self._left(worker)
        self._send(identity, {"type": "ack"})

    def _on_push(self, identity: bytes, worker: int, msg: Message) -> None:
        if self.rule is None:
            raise MessageError("push before init")
        header = msg.header
        round_, (key, values) = self._round(header), self._chunk(msg)
        if self.rule.late(worker, round_):  # that round went on without it: catch up
            self._answer(identity, worker, round_, key, len(values))
            return
        problem = self.rule.check(worker, round_, key)
        if problem:
            raise MessageError(problem)
        # averaged by steps, 0 is a round sat out (ESync's --least-speed): it weighs nothing
        steps = integer_field(header, "steps", 0 if self.rule.config.by_steps else 1, 2**31,
                              required=False)
        samples = integer_field(header, "samples", 0, 2**40, required=False)
        self._take_stop(worker, header)
        for stale in self.rule.move_to(round_):
            self._answer_waiting(stale)
        complete = self.rule.add(worker, key, values, steps)
        if key == (WEIGHTS, 0) and samples:  # once per push
            self.trained += samples
        self.waiting.setdefault(key, []).append((identity, worker, round_, time.monotonic()))
        if complete:
            self._maybe_checkpoint()  # a round's end: its answers say it is checkpointed
            self._answer_waiting(key)
        self._after_change()

    def _answer_waiting(self, key: Key) -> None:
        length = min(CHUNK_VALUES, len(self.sections[key[0]]) - key[1])
        now = time.monotonic()
        for waiter, pusher, pushed_round, pushed_at in self.waiting.pop(key, []):
            self._answer(waiter, pusher, pushed_round, key, length, waited=now - pushed_at)

    def _after_change(self) -> None:
        """Answer the pulls of workers coming back whose round may start, and the
        evaluator's that waited for the round's end; checkpoint."""
        if self.updates != self._aged_updates:  # a round done: the model's age
            self.round_age, self._aged_updates = self._clock(), self.updates
        if self.evaluator_pulls and self.rule.at_boundary:
            for identity, round_ in self.evaluator_pulls:
                self._answer_all(identity, EVALUATOR, round_)
            self.evaluator_pulls.clear()
        if self.round_pulls:
            ready = [p for p in self.round_pulls if self.rule.joined(p[1], p[2])]
            self.round_pulls = [p for p in self.round_pulls if p not in ready]
            for identity, worker, at in ready:
                self._answer_all(identity, worker, at)
        self._maybe_checkpoint()

    def _take_stop(self, sender, header: Dict) -> None:
        if isinstance(header.get("stop"), str) and self.stop_reason is None:
            self.stop_reason = header["stop"][:500]
            who = "the evaluator" if sender == EVALUATOR else f"worker {sender}"
            log.info("[server %d] %s ends the job: %s", self.rank, who, self.stop_reason)

    def _chunk(self, msg: Message) -> Tuple[Key, np.ndarray]:
        """(section, offset) of a pushed chunk, checked against the shard's chunk layout,
        and its values as dense float32 (a compressed chunk decoded: esync.comm.compress)."""
        section, offset = msg.header.get("section"), msg.header.get("offset")
        lengths, frames = msg.header.get("lengths"), msg.header.get("frames")
        if type(section) is not int or section not in (0, 1) or type(offset) is not int \
                or not isinstance(lengths, list) or not 1 <= len(lengths) <= 2 \
                or frames != [min(1, n) if type(n) is int else 1 for n in lengths]:
            raise MessageError("push must carry one chunk, with 'section' 0 or 1 and an "
                               "integer 'offset'")
        size = len(self.sections[section])
        expected = min(CHUNK_VALUES, size - offset)
        if offset < 0 or offset % CHUNK_VALUES or offset >= size or \
                (msg.header.get("codec") is None and lengths[0] != expected):
            raise MessageError(f"chunk of {lengths[0]} values at offset {offset} of section "
                               f"{section} does not fit the shard's {size} values in chunks "
                               f"of {CHUNK_VALUES}")
        if section != WEIGHTS and msg.header.get("codec") is not None:
            raise MessageError("only weight chunks (section 0) may be compressed")
        try:
            values = decode_chunk(msg.header, msg.arrays(), expected)
        except CompressionError as e:
            raise MessageError(str(e)) from None
        return (section, offset), values

    # --- membership ---------------------------------------------------------------------
    def notice(self, header: Dict[str, Any]) -> None:
        """A notice from the scheduler: a worker died, or an evaluator left (`left`)."""
        rank, role = header.get("rank"), header.get("role", "worker")
        if header.get("type") != "left" or type(rank) is not int \
                or role not in ("worker", EVALUATOR):
            return
        self.peers.forget(role, rank)
        if role == EVALUATOR:
            return
        log.warning("[server %d] worker %d died; going on with the others", self.rank, rank)
        if self.rule is not None:
            self._left(rank)

    def _left(self, worker: int) -> None:
        for key in list(self.waiting):
            self.waiting[key] = [w for w in self.waiting[key] if w[1] != worker]
        self.round_pulls = [p for p in self.round_pulls if p[1] != worker]
        for key in self.rule.leave(worker):
            self._answer_waiting(key)
        self._after_change()

    # --- checkpoints --------------------------------------------------------------------
    def _clock(self) -> float:
        """The training clock: seconds since worker 0 said training started (0 until)."""
        return 0.0 if self.started_at is None else time.monotonic() - self.started_at

    def _maybe_checkpoint(self) -> None:
        if self.checkpointing.due(self.updates, self.rule.at_boundary):
            self.save_checkpoint()

    def save_checkpoint(self) -> None:
        tensors, meta = self.rule.state()
        tensors = dict(tensors, weights=self.sections[0], buffers=self.sections[1])
        self.checkpointing.store.save(self.updates, tensors, dict(
            meta, rule=self.rule.config.to_header(), updates=self.updates,
            age=round(self._clock(), 6),
            shard=self.rank, trained=self.trained))
        self.checkpointing.saved(self.updates)
        log.debug("[server %d] checkpoint of round %d", self.rank, self.updates)

    def restore(self, rounds: Optional[List[int]], members: List[int], resumed: bool) -> None:
        """Take the shard back from its newest whole checkpoint (among `rounds`)."""
        store = self.checkpointing.store
        tensors, meta = store.load_newest(rounds)
        try:
            config = RuleConfig.from_header(meta.get("rule"))
        except ValueError as e:
            raise UserError(f"{store.path}: bad rule in the checkpoint: {e}") from None
        if config.num_workers != self.num_workers:
            raise UserError(f"{store.path}: the checkpoint is of a job with "
                            f"{config.num_workers} workers, this one has {self.num_workers}")
        self.sections = (tensors.pop("weights").copy(), tensors.pop("buffers").copy())
        self.rule = make_rule(*self.sections, config)
        self.rule.restore(tensors, meta, members)
        self.checkpointing.restored(self.updates)
        trained = meta.get("trained", 0)
        self.trained = trained if isinstance(trained, int) and trained >= 0 else 0
        self.age_offset = float(meta.get("age", 0.0))
        self.round_age, self._aged_updates = self.age_offset, self.updates
        if not resumed:  # the others train on: the clock runs
            self.started_at = time.monotonic() - self.age_offset
        log.info("[server %d] restored shard %d from round %d of %s (%d weights, rule %s)",
                 self.rank, self.rank, meta["round"], store.path,
                 len(self.sections[0]), config.name)
        self._answer_early_pulls()

    # --- answers ----------------------------------------------------------------------
    @staticmethod
    def _gather(chunks, length) -> np.ndarray:
        if not isinstance(length, int) or isinstance(length, bool) or length < 0:
            raise MessageError("init lengths must be integers >= 0")
        out = np.empty(length, dtype=np.float32)
        for offset, chunk in chunks:
            out[offset:offset + len(chunk)] = chunk
        return out

    def _answer_all(self, identity: bytes, worker, round_: int) -> None:
        for section, values in enumerate(self.sections):
            for offset, length in chunk_spans(len(values)):
                self._answer(identity, worker, round_, (section, offset), length)

    def _answer(self, identity: bytes, worker, round_: int, key: Key, length: int,
                waited: Optional[float] = None) -> None:
        section, offset = key
        header = weights_header(self.rank, round_, key, self.updates, self._clock(),
                                self.stop_reason, waited, self.trained,
                                self.checkpointing.latest,
                                self.round_age if worker == EVALUATOR else None)
        values = self.sections[section][offset:offset + length]
        if worker == EVALUATOR:  # it reads mid-round: never a view the rule may change
            self._send(identity, header, [values.copy()])
            return
        self._send(identity, header, [values.copy() if self.rule.snapshot_replies else values])
        self.rule.sent(worker, key, length)

    def _send(self, identity: bytes, header: Dict, sections=()) -> None:
        """Never blocks for long: a peer whose queue is full is waited for at most
        SEND_TIMEOUT_MS (a member) or not at all (a stranger), then dropped."""
        frames = [identity, *encode({"sender": f"server{self.rank}", **header}, sections)]
        try:
            self.sock.send_multipart(frames, copy=False, flags=zmq.NOBLOCK)
        except zmq.Again:
            self._not_reading(identity, frames)
        except zmq.ZMQError:  # the peer is gone (ROUTER_MANDATORY)
            pass

    def _not_reading(self, identity: bytes, frames: List) -> None:
        if identity in self.peers:
            self.sock.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)
            try:
                self.sock.send_multipart(frames, copy=False)
                return
            except zmq.ZMQError:
                pass
            finally:
                self.sock.setsockopt(zmq.SNDTIMEO, -1)
            role, rank = self.peers.drop(identity)
            log.warning("[server %d] %s %d does not read its answers; dropping it", self.rank,
                        role, rank)
            self.stalled(identity)
        elif self.quiet.say("unread"):
            log.warning("[server %d] a peer that is not a member (%r) does not read its "
                        "answers; dropping them", self.rank, identity[:64])


#: the server's one dispatch table: its keys are the requests it accepts (`decode` refuses
#: any other type, answered `error` in `ShardServer.handle`)
HANDLERS: Handlers[None] = Handlers({
    "init": ShardServer._on_init,
    "pull": ShardServer._on_pull,
    "push": ShardServer._on_push,
    "join": ShardServer._on_join,
    "leave": ShardServer._on_leave,
})
REQUESTS = HANDLERS.types


def run_server(env: ClusterEnv, opts: Any = None,
               settings: Optional[Dict[str, str]] = None) -> int:
    """Join the job, then serve one shard until the scheduler says shut down.
    `settings`: what must agree with the job's other nodes (esync.runtime.startup.agreed_settings)."""
    from esync.options import parse_options

    opts = opts or parse_options([])
    folder = opts.checkpoint_dir
    with Node(env, "server") as node:
        sock = node.guard.serve(node.context.socket(zmq.ROUTER))
        # a frame bigger than a chunk (and CurveZMQ's box around it): the peer is cut off
        sock.setsockopt(zmq.MAXMSGSIZE, CHUNK_BYTES + FRAME_SLACK)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.LINGER, 1000)
        host = advertised_address(env)
        try:
            port = sock.bind_to_random_port(f"tcp://{host}")
            found = survey(folder) if folder and opts.resume else {}
            assignment = node.register(opts.start_timeout, host=host, port=port,
                                       checkpoints=found, settings=settings or {})
            rank = assignment["rank"]
            checkpoints = Checkpoints(folder, rank, opts.keep_checkpoints) if folder else None
            server = ShardServer(rank, assignment["num_workers"], sock, asking(node),
                                 checkpoints, checkpoint_every(opts), telling(node))
            if assignment.get("restore"):
                if checkpoints is None:
                    raise UserError(f"server {rank} replaces a dead one but has no "
                                    f"--checkpoint-dir to restore its shard from")
                server.restore(assignment.get("rounds"), assignment.get("workers", []),
                               resumed="rounds" in assignment)
            log.info("[server %d] serving shard %d of %d at tcp://%s:%d", server.rank,
                     server.rank, assignment["num_servers"], host, port)
            while not node.shutdown_requested:
                node.check()
                if sock.poll(100):
                    server.handle(sock.recv_multipart(copy=False))
                while not node.notices.empty():
                    server.notice(node.notices.get())
            log.info("[server %d] shut down by the scheduler", server.rank)
            return 0
        finally:
            sock.close()


def checkpoint_every(opts: Any) -> tuple:
    """(rounds, seconds) between checkpoints: one of them is None."""
    text = opts.checkpoint_every
    return (None, float(text[:-1])) if text.endswith("s") else (int(text), None)
