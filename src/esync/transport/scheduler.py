"""The scheduler: registration, ranks, the servers' address book, barriers, heartbeats,
failures, and the end of the job (ps-lite's scheduler node).

Besides DMLC_NUM_SERVER servers and DMLC_NUM_WORKER workers, any number of evaluators
(DMLC_ROLE=evaluator) may join, before the job starts or while it runs: they get the
servers' address book, are not waited for, and their death does not end the job; they
are shut down with the servers.

A job may have no servers (DMLC_NUM_SERVER=0: `--backend allreduce`, esync.allreduce):
its workers meet through the scheduler (`rendezvous`: worker 0 says where its
torch.distributed store and its model publisher are; the others and the evaluators are
told), and a worker that dies ends it.

Failures (`Policy`, from main.py's flags):
- a worker that dies (no heartbeat for PS_HEARTBEAT_TIMEOUT, or interrupted) is
  left behind (`--on-worker-failure continue`, the default): the servers are told
  (`left`), so that synchronous rounds go on with the living workers. Fewer than
  `--min-workers` living workers end the job. A worker started again with the same
  variables takes a dead worker's rank (the one with its --device-name and host, if
  any) and rejoins (`rejoin` in its assignment). A worker that fails with an error of
  its own (bad input, or an exception in its training code: `user_error` in its abort)
  ends the job: a restart would fail the same way, and a bug must not pass for a lost
  machine.
- a server that dies is waited for `--server-patience` seconds: a server started again
  takes its rank, restores its shard from its latest checkpoint (`restore`), and every
  worker and evaluator is told the new address (`servers`). Otherwise the job ends.
- the job's id is kept in --checkpoint-dir/job.json, so that `--resume 1` continues
  the same job (the ESync state server's rows): the scheduler then picks the round
  every shard restores (the newest that all shards have in synchronous modes).

Starting (`Policy.start_timeout`, --start-timeout): until every server and worker has
registered, the scheduler says every few seconds who is missing, and gives up after
--start-timeout seconds (0: never). The settings that must agree across the job's nodes
(DMLC_NUM_WORKER, DMLC_NUM_SERVER, the mode, backend, network, ...: each node's
`settings` at registration, the scheduler's own included) are compared as nodes
register: a node that differs is refused with the values and whose they are, and,
before the job runs, the job is aborted rather than started half-configured. A job
aborted while it gathers its nodes stays up to ABORT_LINGER seconds to tell the nodes
that come later why (until every node it expected has been told), so that none waits
for a scheduler that has gone.

Every field of every message is checked before use; a message that is malformed, or
whose handling fails, is logged and answered with `error`, and never ends the job. Only
registered members' state is kept (bounded memory whatever strangers send): at most
MAX_EVALUATORS evaluators, dropped like any member when their heartbeats stop. Every
send is non-blocking: a peer whose queue is full does not read, and is dropped (a member
is lost, by the failure policy) instead of stalling the scheduler. A peer that fails
the CurveZMQ handshake (another job key) is logged, at most every few seconds."""
from __future__ import annotations

import json
import logging
import os
import secrets
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

import zmq

from esync import config
from esync import ready
from esync.live import JOB_ID, JOB_ID_ENV, JOB_ID_FORM
from esync.errors import UserError
from esync.registry import EVALUATOR
from esync.transport.auth import Guard, job_key
from esync.transport.cluster import ClusterEnv, resolve
from esync.transport.handshake import Handshakes
from esync.transport.leasing import LeaseDesk
from esync.transport.message import (FRAME_SLACK, MAX_HEADER_BYTES, MessageError, decode,
                                     encode, integer_field, text_field)
from esync.transport.node import PROGRESS_S, clock, node_id
from esync.transport.quiet import Quiet

POLL_MS = 100
REQUESTS = ("register", "heartbeat", "barrier", "finished", "abort", "bye", "who",
            "rendezvous", "stalled", "lease", "leases", "others")
ROLES = ("server", "worker", EVALUATOR)
QUEUED = 16
JOB_FILE = "job.json"
#: evaluators a job admits at once (each is served the whole model)
MAX_EVALUATORS = 8
#: seconds a job aborted during start-up stays to tell late nodes why
ABORT_LINGER = 60.0
#: messages (ZeroMQ's SNDHWM) and bytes (the kernel's SO_SNDBUF) queued for one peer:
#: a peer that lets more pile up does not read (each message is ~100 bytes)
SEND_QUEUE, SEND_QUEUE_BYTES = 100, 64 << 10
#: a node's settings at registration: at most this many, of these sizes
MAX_SETTINGS, MAX_SETTING_CHARS = 32, 256


@dataclass(frozen=True)
class Policy:
    """What the job does when a node dies (see the module's docstring)."""

    on_worker_failure: str = "abort"
    min_workers: int = 1
    server_patience: float = 0.0
    checkpoint_dir: Optional[str] = None
    resume: bool = False
    synchronous: bool = True
    start_timeout: float = config.START_TIMEOUT  # 0: wait for the nodes for ever

    @classmethod
    def from_options(cls, opts) -> "Policy":
        from esync.options import server_patience

        return cls(opts.on_worker_failure, opts.min_workers, server_patience(opts),
                   opts.checkpoint_dir, opts.resume,
                   opts.algorithm.synchronous, opts.start_timeout)


def _checkpoint_rounds(header: Dict) -> Dict[int, List[int]]:
    """A server's report of the checkpoints it sees: {"<shard>": [round, ...]}."""
    value = header.get("checkpoints")
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > 4096:
        raise MessageError("field 'checkpoints' must be a map of shard to rounds")
    out = {}
    for shard, rounds in value.items():
        if not isinstance(shard, str) or not shard.isdigit() or not isinstance(rounds, list) \
                or len(rounds) > 4096 or not all(isinstance(r, int) and not isinstance(r, bool)
                                                 and r >= 0 for r in rounds):
            raise MessageError("field 'checkpoints' must be a map of shard to rounds")
        out[int(shard)] = rounds
    return out


def _settings(header: Dict) -> Dict[str, str]:
    """A node's settings that must agree across the job: {name: value}, both text."""
    value = header.get("settings")
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > MAX_SETTINGS or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= MAX_SETTING_CHARS
            and len(v) <= MAX_SETTING_CHARS for k, v in value.items()):
        raise MessageError(f"field 'settings' must be a map of at most {MAX_SETTINGS} "
                           f"names to values, as text")
    return dict(value)

log = logging.getLogger(__name__)


@dataclass
class Member:
    uid: str
    role: str
    hostname: str
    pid: int
    address: Optional[str]
    settings: Dict[str, str]
    device: str = ""
    rank: Optional[int] = None
    wanted_rank: Optional[int] = None  # a worker's DMLC_WORKER_ID
    finished: bool = False
    dead_since: Optional[float] = None  # left behind (worker) or awaited (server)
    checkpoints: Dict[int, List[int]] = field(default_factory=dict)

    @property
    def alive(self) -> bool:
        return self.dead_since is None

    def describe(self) -> str:
        """"worker 2 (pid 123 on host)"; before it has a rank, its device label."""
        name = self.rank if self.rank is not None else self.device
        return f"{self.role}{f' {name}' if name != '' else ''} (pid {self.pid} on " \
               f"{self.hostname})"


@dataclass
class Scheduler:
    env: ClusterEnv
    policy: Policy = field(default_factory=Policy)
    members: Dict[str, Member] = field(default_factory=dict)
    last_seen: Dict[str, float] = field(default_factory=dict)
    barriers: Dict[str, List[str]] = field(default_factory=dict)
    assigned: bool = False
    started: bool = False  # the workers passed their first barrier: training runs
    #: nodes that registered to replace one not yet known to be dead (bounded)
    queued: List[Member] = field(default_factory=list)
    closing_since: Optional[float] = None  # when every living worker had finished
    #: a job without servers: where its workers meet (worker 0's `rendezvous`), and the
    #: members waiting to hear it
    meeting: Optional[Dict[str, str]] = None
    meeting_waiters: List[str] = field(default_factory=list)
    #: names the job where several share a service (the ESync state server)
    job: str = field(default_factory=lambda: time.strftime("job-%Y%m%d-%H%M%S-")
                     + secrets.token_hex(3))
    #: the scheduler's own settings that the nodes' must agree with (see _settings)
    settings: Dict[str, str] = field(default_factory=dict)
    #: per setting: the value the job runs with, and whose it was
    agreed: Dict[str, Tuple[str, str]] = field(default_factory=dict)
    evaluators: int = 0  # evaluators that ever joined (their ranks)
    #: members whose queue of messages from the scheduler is full: they do not read
    stalled: Set[str] = field(default_factory=set)
    aborted: Optional[str] = None  # why the job was aborted
    #: a start-up abort: nodes told why (their ids), and how long to tell late ones
    told: Set[str] = field(default_factory=set)
    linger: float = ABORT_LINGER
    quiet: Quiet = field(default_factory=Quiet)  # strangers that do not read: logged
    #                                                at most this often
    leases: Optional[LeaseDesk] = None  # blocks of shards leased to the workers
    #: --resume: the worker rank each device (label@host) had (job.json)
    previous_ranks: Dict[str, int] = field(default_factory=dict)
    #: workers waiting for every other worker to have finished or died (`others`)
    waiting_for_others: List[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.agreed = {name: (value, "the scheduler") for name, value in self.settings.items()}
        self.leases = LeaseDesk(self.env.num_workers, self.policy.checkpoint_dir,
                                self.policy.resume)

    def run(self) -> int:
        """Serve the job until it ends: 0 when every worker finished, 1 when aborted."""
        self._name_job()
        self._job_file()
        port = self._listen()
        log.info("[scheduler] listening on %s:%d for %d server(s) and %d worker(s)%s",
                 self.host, port, self.env.num_servers, self.env.num_workers,
                 " (CurveZMQ: job key required)" if self.guard.secure else "")
        if not self.guard.secure:
            job_key()  # says once that the traffic is unauthenticated
        ready.announce(port)
        try:
            code = self._serve()
            for waiting in self.queued:  # they would wait for a place until they time out
                self._send(f"{waiting.uid}/hb".encode(), {
                    "type": "abort", "reason": self.aborted or "the job ended before a "
                    f"dead {waiting.role}'s place came free for {waiting.describe()}"})
            if self.aborted is not None and not self.assigned:
                self._tell_late_nodes()
        finally:
            self._close()
        return code

    def _listen(self) -> int:
        """Bind the job's socket (UserError if it cannot); the port. (Also used by
        tell_why: no job state is touched.)"""
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
        self.host = f"tcp://{resolve(self.env.root_uri, 'DMLC_PS_ROOT_URI')}"
        port = self.env.root_port
        try:
            if port == 0:  # DMLC_PS_ROOT_PORT=0: a free port, reported (esync.ready)
                port = self.sock.bind_to_random_port(self.host)
            else:
                self.sock.bind(f"{self.host}:{port}")
        except zmq.ZMQError as e:
            self._close(linger=0)
            raise UserError(f"DMLC_PS_ROOT_URI/DMLC_PS_ROOT_PORT: cannot listen on "
                            f"{self.host}:{port}: {e}") from None
        self.listening_since = self.next_progress = time.monotonic()
        self.next_progress += PROGRESS_S
        return port

    def _close(self, linger: Optional[int] = None) -> None:
        self.handshakes.close()
        self.sock.close(linger=linger)
        self.guard.close()
        self.context.term()

    def _in_rank_order(self, role: str) -> List[Member]:
        """The members of `role` in the order of their ranks: a worker that asks for a
        rank (DMLC_WORKER_ID: a launcher's worker k is rank k in every run, so that rank
        0, the names and the data are the same each time) has it; in a resumed job a
        worker takes the rank its device (--device-name and host) had, so that it goes
        on with its own data (job.json's `ranks`); the others fill the ranks left in the
        order they registered."""
        members = [m for m in self.members.values() if m.role == role]
        if role != "worker":
            return members
        order: List[Optional[Member]] = [None] * len(members)
        others = []
        for m in members:
            rank = m.wanted_rank
            if rank is None:
                rank = self.previous_ranks.get(f"{m.device}@{m.hostname}")
            if isinstance(rank, int) and 0 <= rank < len(order) and order[rank] is None:
                order[rank] = m
            else:
                others.append(m)
        return [m if m is not None else others.pop(0) for m in order]

    def _keep_ranks(self) -> None:
        """With --checkpoint-dir: which device had which worker rank, in job.json."""
        if not self.policy.checkpoint_dir:
            return
        path = os.path.join(self.policy.checkpoint_dir, JOB_FILE)
        ranks = {f"{m.device}@{m.hostname}": m.rank for m in self.members.values()
                 if m.role == "worker"}
        try:
            with open(path) as f:
                job = json.load(f)
            with open(path + ".partial", "w") as f:
                json.dump({**job, "ranks": ranks}, f)
            os.replace(path + ".partial", path)
        except (OSError, ValueError) as e:
            log.warning("[scheduler] cannot keep the workers' ranks in %s: %s", path, e)

    def _name_job(self, environ=os.environ) -> None:
        """The job's id from ESYNC_JOB_ID where a launcher gave one (its live page is
        named so too); else the one drawn. A job resumed takes its saved id instead."""
        given = environ.get(JOB_ID_ENV, "")
        if not given:
            return
        if not JOB_ID.fullmatch(given):
            raise UserError(f"{JOB_ID_ENV}={given[:80]!r}: expected {JOB_ID_FORM}")
        self.job = given

    def _job_file(self) -> None:
        """With --checkpoint-dir: keep the job id there; with --resume, take it back."""
        folder = self.policy.checkpoint_dir
        if not folder:
            if self.policy.resume:
                raise UserError("--resume needs --checkpoint-dir (where the job's "
                                "checkpoints are)")
            return
        path = os.path.join(folder, JOB_FILE)
        if self.policy.resume:
            try:
                with open(path) as f:
                    saved = json.load(f)
                job = saved.get("job")
                ranks = saved.get("ranks")
            except (OSError, ValueError, AttributeError) as e:
                raise UserError(f"--resume: cannot read the job id from {path}: "
                                f"{getattr(e, 'strerror', None) or e}") from None
            if not isinstance(job, str) or not job:
                raise UserError(f"--resume: {path} names no job")
            self.job = job
            self.previous_ranks = ranks if isinstance(ranks, dict) else {}
            log.info("[scheduler] resuming job %s from %s", job, folder)
            return
        try:
            os.makedirs(folder, exist_ok=True)
            with open(path + ".partial", "w") as f:
                json.dump({"job": self.job, "num_servers": self.env.num_servers,
                           "num_workers": self.env.num_workers}, f)
            os.replace(path + ".partial", path)
        except OSError as e:
            raise UserError(f"--checkpoint-dir {folder}: cannot write {JOB_FILE}: "
                            f"{e.strerror}") from None

    def _serve(self) -> Optional[int]:
        last_notice = 0.0
        while True:
            if self.sock.poll(POLL_MS):
                identity, *frames = self.sock.recv_multipart(copy=False)
                code = self._handle(identity.bytes, frames)
                if code is not None:
                    return code
            self._watch_handshakes()
            code = self._drop_stalled() or self._wait_for_nodes()
            if code is not None:
                return code
            if self.closing_since is not None:
                now = time.monotonic()
                left = [m for m in self.members.values()
                        if m.role in ("server", EVALUATOR) and not m.finished and m.alive]
                if not left:
                    if self.leases.granted():
                        log.info("[scheduler] blocks leased per worker rank: %s",
                                 json.dumps(self.leases.granted(), sort_keys=True))
                    log.info("[scheduler] all %d nodes are done", len(self.members))
                    return 0
                if now - self.closing_since > self.env.heartbeat_timeout:
                    log.warning("[scheduler] %s did not confirm the shutdown; leaving anyway",
                                ", ".join(m.describe() for m in left))
                    return 0
                if now - last_notice >= self.env.heartbeat_interval:
                    for server in left:  # again, until each one confirms
                        self._send(f"{server.uid}/hb".encode(), {"type": "shutdown"})
                    last_notice = now
                continue
            dead = self._dead_member()
            if dead is not None:
                code = self._lost(dead, f"sent no heartbeat for "
                                        f"{self.env.heartbeat_timeout:g} s")
                if code is not None:
                    return code
            code = self._server_patience()
            if code is not None:
                return code

    # --- messages ---------------------------------------------------------------------
    def _handle(self, identity: bytes, frames) -> Optional[int]:
        try:
            msg = decode(frames, REQUESTS)
            return self._dispatch(identity, str(msg.header["sender"])[:256], msg)
        except MessageError as e:
            log.warning("[scheduler] dropped a malformed message from %r: %s",
                        identity[:64], e)
            self._send(identity, {"type": "error", "error": str(e)})
        except Exception as e:  # one message never ends the job
            log.exception("[scheduler] error handling a message from %r", identity[:64])
            self._send(identity, {"type": "error",
                                  "error": f"internal error: {type(e).__name__}"})
        return None

    def _dispatch(self, identity: bytes, uid: str, msg) -> Optional[int]:
        member = self.members.get(uid)
        if member is not None:
            self.last_seen[uid] = time.monotonic()
        if msg.type == "heartbeat":
            if member is not None and not member.alive and member.role == "worker":
                # declared dead, yet alive: it was left behind and cannot come back as is
                self._send(identity, {"type": "abort", "reason": f"{member.describe()} was "
                                      f"left behind as dead; start it again to rejoin"})
            else:
                self._send(identity, {"type": "ack"})
            return None
        log.debug("[scheduler] <- %s: %s", uid, msg.header)
        if msg.type == "register":
            return self._register(identity, uid, msg.header)
        if msg.type == "abort" and member is None:  # failed before it could join
            if self.assigned:  # the job runs: a node that cannot start does not end it
                log.warning("[scheduler] a node that is not a member could not start: %s",
                            text_field(msg.header, "reason", 2000, required=False))
                return None
            self.told.add(uid)  # it knows: it is the one that failed
            return self._abort(text_field(msg.header, "reason", 2000, required=False)
                               or f"{uid} failed")
        if member is None or not member.alive:
            self._send(identity, {"type": "error", "error": f"{uid} is not registered"})
            return None
        if msg.type == "who":
            return self._who(identity, member, msg.header)
        if msg.type == "rendezvous":
            return self._rendezvous(member, msg.header)
        if msg.type == "barrier":
            group = text_field(msg.header, "group", required=False) or "workers"
            return self._barrier(identity, uid, group)
        if msg.type == "finished":
            member.finished = True
            self._send(identity, {"type": "ack"})
            self._maybe_closing()
            self._answer_others()
            return None
        if msg.type == "others":  # a worker (ASGD's worker 0) waits for the last pushes
            if member.role != "worker":
                raise MessageError("only workers wait for the other workers")
            self.waiting_for_others.append(uid)
            self._answer_others()
            return None
        if msg.type == "bye":  # a server confirms the shutdown
            member.finished = True
            return None
        if msg.type == "stalled":
            return self._stalled_at_server(member, msg.header)
        if msg.type in ("lease", "leases"):
            if member.role != "worker":
                raise MessageError("only workers lease blocks")
            if msg.type == "lease":
                self._send(identity, self.leases.request(member.rank, msg.header))
            else:
                self.leases.report(member.rank, msg.header)
                self._send(identity, {"type": "ack"})
            return None
        reason = text_field(msg.header, "reason", 2000, required=False) or "failed"
        if msg.header.get("user_error") is True:  # the code's: a restart fails the same way
            return self._abort(reason, exclude=uid)
        return self._lost(member, f"failed: {reason}")

    def _stalled_at_server(self, server: Member, header: Dict) -> Optional[int]:
        """A server says a peer stopped reading its answers: lost, by the policy."""
        if server.role != "server":
            raise MessageError("only servers say that a peer stopped reading")
        peer = self.members.get(text_field(header, "uid"))
        if peer is None or not peer.alive or peer.finished or peer.role == "server":
            return None
        return self._lost(peer, f"stopped reading server {server.rank}'s answers")

    def _who(self, identity: bytes, asker: Member, header: Dict) -> None:
        """A server asks who a peer is (the node id its socket carries)."""
        if asker.role != "server":
            raise MessageError("only servers may ask who a peer is")
        peer = self.members.get(text_field(header, "uid"))
        if peer is None or not peer.alive or peer.role not in ("worker", EVALUATOR):
            self._send(identity, {"type": "error", "error": "not a member of the job"})
        else:
            self._send(identity, {"type": "member", "role": peer.role, "rank": peer.rank})
        return None

    def _rendezvous(self, member: Member, header: Dict) -> None:
        """A job without servers (all-reduce): worker 0 says where the workers meet; the
        others, and evaluators, are told once it has."""
        if self.env.num_servers:
            raise MessageError("rendezvous is for jobs without servers (DMLC_NUM_SERVER=0)")
        if "store" in header:
            if member.role != "worker" or member.rank != 0:
                raise MessageError("only worker 0 says where the workers meet")
            self.meeting = {k: text_field(header, k) for k in ("store", "evaluator")}
            self._send(f"{member.uid}/ctl".encode(), {"type": "ack"})
            waiters, self.meeting_waiters = self.meeting_waiters, []
        else:
            waiters = [member.uid]
            if self.meeting is None:
                if member.uid not in self.meeting_waiters:
                    self.meeting_waiters.append(member.uid)
                return None
        for uid in waiters:
            self._send(f"{uid}/ctl".encode(), {"type": "rendezvous", **self.meeting})
        return None

    def _register(self, identity: bytes, uid: str, header: Dict) -> Optional[int]:
        role = text_field(header, "role")
        if role not in ROLES:
            raise MessageError(f"unknown role {role!r}")
        if uid in self.members:
            raise MessageError(f"{uid} is already registered")
        port = integer_field(header, "port", 1, 65535, required=False)
        host = text_field(header, "host", required=False)
        member = Member(uid, role, text_field(header, "hostname", required=False) or "?",
                        integer_field(header, "pid", 0, 2**31, required=False) or 0,
                        f"tcp://{host}:{port}" if port and host else None,
                        _settings(header),
                        text_field(header, "device", required=False) or "",
                        checkpoints=_checkpoint_rounds(header))
        if role == "worker":
            member.wanted_rank = integer_field(header, "rank", 0, self.env.num_workers - 1,
                                               required=False)
        if role == "server" and member.address is None:
            raise MessageError("a server registers with its 'host' and 'port'")
        if role == EVALUATOR:  # an observer: it is compared, never compared with
            return self._register_evaluator(member)
        differs = self._disagreement(member)
        if differs is not None:
            if self.assigned:  # the job itself is well configured
                return self._refuse(member, differs)
            self._send(f"{uid}/ctl".encode(), {"type": "error", "error": differs})
            self.told.add(uid)
            return self._abort(f"the job's nodes disagree: {differs}")
        for name, value in member.settings.items():
            self.agreed.setdefault(name, (value, member.describe()))
        if self.assigned:
            return self._replace(member)
        wanted = {"server": self.env.num_servers, "worker": self.env.num_workers}
        count = sum(1 for m in self.members.values() if m.role == role)
        if count >= wanted[role]:
            self._send(f"{uid}/ctl".encode(), {
                "type": "error", "error": f"the job already has its {wanted[role]} "
                f"{role}(s) (DMLC_NUM_{role.upper()})"})
            return None
        self.members[uid] = member
        self.last_seen[uid] = time.monotonic()
        self.barriers.setdefault("register", []).append(uid)
        log.info("[scheduler] %s registered: pid %d on %s%s", role, member.pid,
                 member.hostname, f", serving at {member.address}" if member.address else "")
        if all(sum(1 for m in self.members.values() if m.role == r) == n
               for r, n in wanted.items()):
            return self._assign()
        return None

    def _refuse(self, member: Member, why: str) -> None:
        log.error("[scheduler] error: refused %s: %s", member.describe(), why)
        self._send(f"{member.uid}/ctl".encode(), {"type": "error", "error": why})

    def _disagreement(self, member: Member) -> Optional[str]:
        """Which of `member`'s settings differs from the job's, and from whose; None if
        all agree (the scheduler's own come first, then the first node to give one)."""
        for name, value in member.settings.items():
            theirs, whose = self.agreed.get(name, (value, ""))
            if value != theirs:
                return f"{name} is {value} for {member.describe()} but {theirs} for {whose}"
        return None

    def _replace(self, member: Member) -> Optional[int]:
        """A worker or server that registers once the job runs takes a dead one's rank:
        the one with its device label and host if there is one."""
        dead = [m for m in self.members.values() if m.role == member.role and not m.alive]
        dead.sort(key=lambda m: (member.wanted_rank is not None and m.rank != member.wanted_rank,
                                 m.device != member.device or m.hostname != member.hostname,
                                 m.rank))
        if not dead:  # perhaps the one it replaces is not yet known to be dead: wait
            if len(self.queued) >= QUEUED:
                self._send(f"{member.uid}/ctl".encode(), {
                    "type": "error", "error": f"the job already has its living "
                    f"{member.role}s (DMLC_NUM_{member.role.upper()})"})
            else:
                log.info("[scheduler] %s waits for a dead %s's place", member.describe(),
                         member.role)
                self.queued.append(member)
            return None
        old = dead[0]
        del self.members[old.uid]
        self.last_seen.pop(old.uid, None)
        member.rank = old.rank
        self.members[member.uid] = member
        self.last_seen[member.uid] = time.monotonic()
        if member.role == "worker":
            log.info("[scheduler] %s rejoins as worker %d (device %r)", member.describe(),
                     member.rank, member.device)
            self._send_assignment(member, rejoin=True)
            return None
        log.info("[scheduler] %s takes over shard %d at %s; telling the workers",
                 member.describe(), member.rank, member.address)
        self._send_assignment(member, restore=True)
        servers = self._servers()
        for m in self.members.values():
            if m.role in ("worker", EVALUATOR) and m.alive and not m.finished:
                self._send(f"{m.uid}/hb".encode(), {"type": "servers", "servers": servers})
        return None

    def _register_evaluator(self, member: Member) -> None:
        """An evaluator joins at any time; it is answered once the servers are known (and
        its settings compared with the job's, which are all known then)."""
        if sum(1 for m in self.members.values() if m.role == EVALUATOR) >= MAX_EVALUATORS:
            self._send(f"{member.uid}/ctl".encode(), {
                "type": "error", "error": f"the job already has {MAX_EVALUATORS} evaluators, "
                f"the most it admits"})
            return None
        member.rank, self.evaluators = self.evaluators, self.evaluators + 1
        self.members[member.uid] = member
        self.last_seen[member.uid] = time.monotonic()
        log.info("[scheduler] evaluator registered: pid %d on %s", member.pid, member.hostname)
        if self.assigned:
            self._assign_evaluator(member)
        else:
            self.barriers.setdefault("register", []).append(member.uid)
        return None

    def _assign_evaluator(self, member: Member) -> None:
        differs = self._disagreement(member)
        if differs is None:
            self._send_assignment(member)
        else:
            self._refuse(member, differs)
            self._forget(member)

    def _servers(self) -> List[Optional[str]]:
        ranked = sorted((m for m in self.members.values() if m.role == "server"),
                        key=lambda m: m.rank)
        return [m.address for m in ranked]

    def _send_assignment(self, member: Member, **extra) -> None:
        self._send(f"{member.uid}/ctl".encode(), {
            "type": "assign", "rank": member.rank, "servers": self._servers(), "job": self.job,
            "num_servers": self.env.num_servers, "num_workers": self.env.num_workers,
            "workers": sorted(m.rank for m in self.members.values()
                              if m.role == "worker" and m.alive), **extra})

    def _restore_rounds(self) -> Dict[int, List[int]]:
        """--resume: per shard, the checkpoint rounds it may restore, best first (in
        synchronous modes, only rounds that every shard has)."""
        seen: Dict[int, set] = {}
        for m in self.members.values():
            for shard, rounds in m.checkpoints.items():
                seen.setdefault(shard, set()).update(rounds)
        missing = [k for k in range(self.env.num_servers) if not seen.get(k)]
        if missing:
            raise UserError(f"--resume: no checkpoint of shard {missing[0]} in "
                            f"{self.policy.checkpoint_dir}")
        if self.policy.synchronous:
            common = set.intersection(*(seen[k] for k in range(self.env.num_servers)))
            if common:
                return {k: sorted(common, reverse=True) for k in range(self.env.num_servers)}
            log.warning("[scheduler] --resume: the shards have no checkpoint round in "
                        "common; each restores its newest")
        return {k: sorted(seen[k], reverse=True) for k in range(self.env.num_servers)}

    def _assign(self) -> Optional[int]:
        restore: Dict[int, List[int]] = {}
        if self.policy.resume:
            try:
                restore = self._restore_rounds()
            except UserError as e:
                return self._abort(str(e))
        for role in ("server", "worker"):
            for rank, m in enumerate(self._in_rank_order(role)):
                m.rank = rank
        self._keep_ranks()
        for uid in self.barriers.pop("register"):
            member = self.members[uid]
            if member.role == "server" and self.policy.resume:
                self._send_assignment(member, restore=True, rounds=restore[member.rank])
            elif member.role == EVALUATOR:
                self._assign_evaluator(member)
            else:
                self._send_assignment(member)
        self.assigned = True
        log.info("[scheduler] all %d nodes registered; ranks assigned; job id %s",
                 len(self.members), self.job)
        return None

    def _barrier(self, identity: bytes, uid: str, group: str) -> None:
        role = {"workers": "worker", "servers": "server"}.get(group)
        members = [m.uid for m in self.members.values()
                   if (group == "all" or m.role == role) and m.alive]
        if uid not in members:
            self._send(identity, {"type": "error", "error": f"not a member of group {group!r}"})
            return None
        waiting = self.barriers.setdefault(f"barrier:{group}", [])
        waiting.append(uid)
        self._release_barriers()
        return None

    def _release_barriers(self) -> None:
        """Release each barrier whose living members are all waiting (also after a
        death: the dead are not waited for)."""
        for name in [n for n in self.barriers if n.startswith("barrier:")]:
            group = name.split(":", 1)[1]
            role = {"workers": "worker", "servers": "server"}.get(group)
            members = {m.uid for m in self.members.values()
                       if (group == "all" or m.role == role) and m.alive}
            waiting = [u for u in self.barriers[name] if u in members]
            if members <= set(waiting):
                del self.barriers[name]
                if group == "workers":
                    self.started = True
                for waiter in waiting:
                    self._send(f"{waiter}/ctl".encode(), {"type": "barrier_done",
                                                          "group": group})

    # --- failure ----------------------------------------------------------------------
    def _dead_member(self) -> Optional[Member]:
        now = time.monotonic()
        for m in self.members.values():
            if not m.finished and m.alive and \
                    now - self.last_seen.get(m.uid, now) > self.env.heartbeat_timeout:
                return m
        return None

    def _lost(self, member: Member, how: str) -> Optional[int]:
        """`member` died (`how`): go on without it if the policy allows, else end the job."""
        reason = f"{member.describe()} {how}"
        if member.role == EVALUATOR:  # an observer: the job goes on, and forgets it
            log.warning("[scheduler] %s; the job goes on without it", reason)
            self._forget(member)
            return None
        if not self.assigned:
            return self._abort(reason, exclude=member.uid)
        if not self.env.num_servers and member.role == "worker":
            return self._abort(f"{reason}; an all-reduce job cannot go on without it",
                               exclude=member.uid)
        if member.role == "worker" and self.policy.on_worker_failure == "continue" \
                and self.started:  # before, the others wait for it (worker 0's init)
            member.dead_since = time.monotonic()
            living = [m for m in self.members.values() if m.role == "worker" and m.alive]
            if len(living) < self.policy.min_workers:
                return self._abort(f"{reason}; {len(living)} living worker(s) left, fewer "
                                   f"than --min-workers {self.policy.min_workers}",
                                   exclude=member.uid)
            log.warning("[scheduler] %s; the job goes on with %d worker(s) (start it again "
                        "to rejoin)", reason, len(living))
            self.leases.lost(member.rank)
            self._tell_servers_left(member)
            self._release_barriers()
            self._take_queued("worker")
            self._maybe_closing()
            self._answer_others()
            return None
        if member.role == "server" and self.policy.server_patience > 0:
            member.dead_since = time.monotonic()
            log.warning("[scheduler] %s; waiting up to %g s for it to be started again "
                        "(the same DMLC_* variables and --checkpoint-dir)", reason,
                        self.policy.server_patience)
            self._take_queued("server")
            return None
        return self._abort(reason, exclude=member.uid)

    def _forget(self, member: Member) -> None:
        """Drop an evaluator that left: it no longer counts, and the servers forget it."""
        del self.members[member.uid]
        self.last_seen.pop(member.uid, None)
        for name in list(self.barriers):
            self.barriers[name] = [u for u in self.barriers[name] if u != member.uid]
        self.meeting_waiters = [u for u in self.meeting_waiters if u != member.uid]
        self._tell_servers_left(member)

    def _tell_servers_left(self, member: Member) -> None:
        """The living servers forget `member` (a dead worker, an evaluator that left)."""
        for m in self.members.values():
            if m.role == "server" and m.alive:
                self._send(f"{m.uid}/hb".encode(), {"type": "left", "role": member.role,
                                                    "rank": member.rank, "uid": member.uid})

    def _take_queued(self, role: str) -> None:
        """A node of `role` died: the first one waiting to replace one takes its place."""
        for waiting in [m for m in self.queued if m.role == role]:
            self.queued.remove(waiting)
            self._replace(waiting)
            return

    def _server_patience(self) -> Optional[int]:
        now = time.monotonic()
        for m in self.members.values():
            if m.role == "server" and not m.alive and \
                    now - m.dead_since > self.policy.server_patience:
                return self._abort(f"{m.describe()} died and was not started again within "
                                   f"--server-patience {self.policy.server_patience:g} s")
        return None

    def _answer_others(self) -> None:
        """Answer each worker waiting for the others once every other living worker
        has finished (a dead one is not waited for)."""
        for uid in list(self.waiting_for_others):
            others = [m for m in self.members.values() if m.role == "worker" and m.alive
                      and m.uid != uid and not m.finished]
            if not others:
                self.waiting_for_others.remove(uid)
                self._send(f"{uid}/ctl".encode(), {"type": "ack"})

    def _maybe_closing(self) -> None:
        workers = [m for m in self.members.values() if m.role == "worker" and m.alive]
        if self.assigned and self.closing_since is None and workers and \
                all(m.finished for m in workers):
            self.closing_since = time.monotonic()
            dead = sum(1 for m in self.members.values() if m.role == "worker" and not m.alive)
            log.info("[scheduler] all %d workers finished%s; shutting the servers down",
                     len(workers), f" ({dead} left behind dead)" if dead else "")

    def _abort(self, reason: str, exclude: Optional[str] = None) -> int:
        log.error("[scheduler] error: aborting the job: %s", reason)
        self.aborted = reason
        if exclude is not None:
            self.told.add(exclude)
        for m in self.members.values():
            if m.uid != exclude and not m.finished and m.alive:
                self._send(f"{m.uid}/hb".encode(), {"type": "abort", "reason": reason})
                self.told.add(m.uid)
        return 1

    # --- starting ---------------------------------------------------------------------
    def _wait_for_nodes(self) -> Optional[int]:
        """Until the job is complete: who is missing, every PROGRESS_S seconds; the end
        of the job after --start-timeout."""
        if self.assigned:
            return None
        now, timeout = time.monotonic(), self.policy.start_timeout
        if timeout and now - self.listening_since >= timeout:
            self.linger = 0.0  # the missing ones were waited for long enough
            return self._abort(f"the job did not start within --start-timeout {timeout:g} s: "
                               f"{self._missing()}")
        if now >= self.next_progress:
            log.info("[scheduler] waiting since %s: %s", clock(self.listening_since),
                     self._missing())
            self.next_progress = now + PROGRESS_S
        return None

    def _missing(self) -> str:
        """"1 of 1 server and 2 of 3 workers registered, waiting for 1 more worker ..."."""
        have, missing = [], []
        for role, wanted in (("server", self.env.num_servers), ("worker", self.env.num_workers)):
            count = sum(1 for m in self.members.values() if m.role == role)
            have.append(f"{count} of {wanted} {role}{'s' if wanted != 1 else ''}")
            if count < wanted:
                more = wanted - count
                missing.append(f"{more} more {role}{'s' if more != 1 else ''} "
                               f"(DMLC_NUM_{role.upper()}={wanted})")
        text = f"{' and '.join(have)} registered, waiting for {' and '.join(missing)}"
        registered = [m.describe() for m in self.members.values() if m.role != EVALUATOR]
        if registered:
            text += f"; registered: {', '.join(registered)}"
        if self.handshakes.failures:
            text += f"; {self.handshakes.failures} connection(s) failed to authenticate " \
                    f"(last: {self.handshakes.failure})"
        return text

    def _tell_late_nodes(self) -> None:
        """After an abort during start-up: answer whoever comes with the reason, for up
        to `linger` seconds or until every server and worker the job expected was told."""
        expected = self.env.num_servers + self.env.num_workers
        if self.linger <= 0 or len(self.told) >= expected:
            return
        log.info("[scheduler] staying up to %g s to tell the nodes that have not heard why "
                 "(%d of %d told)", self.linger, len(self.told), expected)
        deadline = time.monotonic() + self.linger
        while time.monotonic() < deadline and len(self.told) < expected:
            self._watch_handshakes()
            if not self.sock.poll(POLL_MS):
                continue
            identity, *frames = self.sock.recv_multipart(copy=False)
            try:
                sender = text_field(decode(frames, REQUESTS).header, "sender")
            except MessageError:
                continue
            self._send(identity.bytes, {"type": "abort", "reason": self.aborted})
            if len(self.told) < 4 * expected:
                self.told.add(sender)

    # --- peers that cannot authenticate, or do not read ---------------------------------
    def _watch_handshakes(self) -> None:
        for failed in self.handshakes.poll():
            line = self.handshakes.say(failed)
            if line is not None:
                log.warning("[scheduler] a node could not join: %s", line)

    def _drop_stalled(self) -> Optional[int]:
        while self.stalled:
            member = self.members.get(self.stalled.pop())
            if member is not None and member.alive and not member.finished:
                code = self._lost(member, "does not read the scheduler's messages")
                if code is not None:
                    return code
        return None

    def _send(self, identity: bytes, header: Dict) -> None:
        """Never blocks: a peer whose queue is full does not read, and is dropped."""
        try:
            self.sock.send_multipart([identity, *encode({"sender": "scheduler", **header})],
                                     flags=zmq.NOBLOCK)
        except zmq.Again:
            uid = node_id(identity)
            if uid in self.members:
                self.stalled.add(uid)
            elif self.quiet.say("unread"):
                log.warning("[scheduler] a peer that is not a member (%r) does not read its "
                            "answers; dropping them", identity[:64])
        except zmq.ZMQError:  # the peer is gone (ROUTER_MANDATORY): nothing to tell it
            pass


def tell_why(env: ClusterEnv, reason: str) -> None:
    """A scheduler that cannot run its job (bad input): listen on the job's address
    anyway, for up to ABORT_LINGER seconds, to tell the nodes that come why, so that
    none waits for a scheduler that has gone. Nothing to do where nobody knows the
    address (DMLC_PS_ROOT_PORT=0: a launcher's, which ends the job itself) or where it
    cannot listen."""
    if env.root_port == 0:
        return
    scheduler = Scheduler(env)
    try:
        scheduler._listen()
    except UserError:
        return
    try:
        scheduler.aborted = reason
        scheduler._tell_late_nodes()
    finally:
        scheduler._close()
