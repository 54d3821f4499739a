"""The scheduler: registration, ranks, the servers' address book, barriers, heartbeats,
failures, and the end of the job (ps-lite's scheduler node).

Besides DMLC_NUM_SERVER servers and DMLC_NUM_WORKER workers, any number of evaluators
(DMLC_ROLE=evaluator) may join, before the job starts or while it runs: they get the
servers' address book, are not waited for, and their death does not end the job; they
are shut down with the servers.

A job may have no servers (DMLC_NUM_SERVER=0: `--backend allreduce`, esync.comm.allreduce):
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
the CurveZMQ handshake (another job key) is logged, at most every few seconds.

The Scheduler owns the socket (`listener`), reads each message and hands it to its
handler (one table, `HANDLERS`); the parts keep their own state: the roster
(`membership`), `barriers`, the `rendezvous`, the job's file (`jobfile`), the block
leases (`leasing`), and the end of the job (`shutdown`: the servers' shutdown and the
start-up abort's linger). What one part's event means for the others (a death, an
abort, the ranks dealt) is decided here."""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

from esync import config
from esync.infra import ready
from esync.errors import UserError
from esync.registry import EVALUATOR
from esync.transport.auth import job_key
from esync.transport.barriers import Barriers
from esync.transport.cluster import ClusterEnv
from esync.transport.dispatch import Handlers
from esync.transport.jobfile import JobFile
from esync.transport.leasing import LeaseDesk
from esync.transport.listener import Listener
from esync.transport.membership import MAX_EVALUATORS, Member, Membership, member_from
from esync.transport.message import Message, MessageError, text_field
from esync.transport.node import PROGRESS_S, clock
from esync.transport.rendezvous import Rendezvous
from esync.transport.shutdown import Linger, Shutdown

__all__ = ["MAX_EVALUATORS", "Policy", "Scheduler", "tell_why"]

log = logging.getLogger(__name__)


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
        return cls(opts.on_worker_failure, opts.min_workers, server_patience(opts),
                   opts.checkpoint_dir, opts.resume,
                   opts.algorithm.synchronous, opts.start_timeout)


#: a handler of the scheduler's table: (scheduler, identity, sender's id, the sender if a
#: member, message) -> the job's exit code if the message ends it, else None
Handler = Callable[["Scheduler", bytes, str, Optional[Member], Message], Optional[int]]


def _members_only(handler: Callable[["Scheduler", bytes, Member, Message], Optional[int]]
                  ) -> Handler:
    """A request only a living member may make: from anyone else, answered `error`."""
    def checked(self: "Scheduler", identity: bytes, uid: str, member: Optional[Member],
                msg: Message) -> Optional[int]:
        if member is None or not member.alive:
            return self._not_registered(identity, uid)
        return handler(self, identity, member, msg)

    return checked


class Scheduler:
    """Serves one job (`run`): owns the socket, dispatches each message, and says what
    an event of one part means for the others."""

    def __init__(self, env: ClusterEnv, policy: Optional[Policy] = None,
                 settings: Optional[Dict[str, str]] = None):
        self.env = env
        self.policy = policy = policy or Policy()
        #: settings: the scheduler's own, that the nodes' must agree with
        self.roster = Membership(env.num_servers, env.num_workers, settings)
        self.listener = Listener(env, lambda uid: uid in self.roster)
        self.barriers = Barriers()
        self.rendezvous = Rendezvous(env.num_servers)
        self.job_file = JobFile(policy.checkpoint_dir, policy.resume, env.num_servers,
                                env.num_workers)
        self.leases = LeaseDesk(env.num_workers, policy.checkpoint_dir, policy.resume)
        self.shutdown = Shutdown(env.heartbeat_interval, env.heartbeat_timeout)
        self.linger = Linger(env.num_servers + env.num_workers)
        self.aborted: Optional[str] = None  # why the job was aborted

    @property
    def job(self) -> str:
        """The job's id (esync.transport.jobfile)."""
        return self.job_file.job

    def run(self) -> int:
        """Serve the job until it ends: 0 when every worker finished, 1 when aborted."""
        self.job_file.name()
        self.job_file.open()
        port = self.listener.listen()
        self.listening_since = time.monotonic()
        self.next_progress = self.listening_since + PROGRESS_S
        log.info("[scheduler] listening on %s:%d for %d server(s) and %d worker(s)%s",
                 self.listener.host, port, self.env.num_servers, self.env.num_workers,
                 " (CurveZMQ: job key required)" if self.listener.secure else "")
        if not self.listener.secure:
            job_key()  # says once that the traffic is unauthenticated
        ready.announce(port)
        try:
            code = self._serve()
            for waiting in self.roster.drain_queued():  # they would wait until they time out
                self.listener.tell(waiting.uid, "hb", {
                    "type": "abort", "reason": self.aborted or "the job ended before a "
                    f"dead {waiting.role}'s place came free for {waiting.describe()}"})
            if self.aborted is not None and not self.roster.assigned:
                self.linger.tell_late_nodes(self.listener, self.aborted, REQUESTS)
        finally:
            self.listener.close()
        return code

    def _serve(self) -> Optional[int]:
        while True:
            received = self.listener.receive()
            if received is not None:
                code = self._handle(*received)
                if code is not None:
                    return code
            self.listener.watch_handshakes()
            code = self._drop_stalled() or self._wait_for_nodes()
            if code is not None:
                return code
            if self.shutdown.closing:
                code = self._close_down()
                if code is not None:
                    return code
                continue
            dead = self.roster.silent(self.env.heartbeat_timeout)
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
            msg = HANDLERS.decode(frames)
            uid = str(msg.header["sender"])[:256]
            member = self.roster.seen(uid)
            if msg.type != "heartbeat":
                log.debug("[scheduler] <- %s: %s", uid, msg.header)
            return HANDLERS(msg, self, identity, uid, member)
        except MessageError as e:
            log.warning("[scheduler] dropped a malformed message from %r: %s",
                        identity[:64], e)
            self.listener.send(identity, {"type": "error", "error": str(e)})
        except Exception as e:  # one message never ends the job
            log.exception("[scheduler] error handling a message from %r", identity[:64])
            self.listener.send(identity, {"type": "error",
                                          "error": f"internal error: {type(e).__name__}"})
        return None

    def _on_heartbeat(self, identity: bytes, uid: str, member: Optional[Member],
                      msg: Message) -> None:
        if member is not None and not member.alive and member.role == "worker":
            # declared dead, yet alive: it was left behind and cannot come back as is
            self.listener.send(identity, {"type": "abort", "reason": f"{member.describe()} "
                                          f"was left behind as dead; start it again to rejoin"})
        else:
            self.listener.send(identity, {"type": "ack"})

    def _on_abort(self, identity: bytes, uid: str, member: Optional[Member],
                  msg: Message) -> Optional[int]:
        """A node says it fails: before it could join, or as a member."""
        if member is None:  # failed before it could join
            if self.roster.assigned:  # the job runs: a node that cannot start does not end it
                log.warning("[scheduler] a node that is not a member could not start: %s",
                            text_field(msg.header, "reason", 2000, required=False))
                return None
            self.linger.heard(uid)  # it knows: it is the one that failed
            return self._abort(text_field(msg.header, "reason", 2000, required=False)
                               or f"{uid} failed")
        if not member.alive:
            return self._not_registered(identity, uid)
        reason = text_field(msg.header, "reason", 2000, required=False) or "failed"
        if msg.header.get("user_error") is True:  # the code's: a restart fails the same way
            return self._abort(reason, exclude=uid)
        return self._lost(member, f"failed: {reason}")

    def _not_registered(self, identity: bytes, uid: str) -> None:
        """A request only a living member may make, from `uid`, which is none."""
        self.listener.send(identity, {"type": "error", "error": f"{uid} is not registered"})

    @_members_only
    def _on_barrier(self, identity: bytes, member: Member, msg: Message) -> None:
        group = text_field(msg.header, "group", required=False) or "workers"
        if not self.barriers.enter(member.uid, group, self.roster.living_in(group)):
            self.listener.send(identity, {"type": "error",
                                          "error": f"not a member of group {group!r}"})
            return
        self._release_barriers()

    @_members_only
    def _on_finished(self, identity: bytes, member: Member, msg: Message) -> None:
        member.finished = True
        self.listener.send(identity, {"type": "ack"})
        self._maybe_closing()
        self._answer_others()

    @_members_only
    def _on_others(self, identity: bytes, member: Member, msg: Message) -> None:
        """A worker (ASGD's worker 0) waits for the other workers' last pushes."""
        if member.role != "worker":
            raise MessageError("only workers wait for the other workers")
        self.shutdown.wait_for_others(member.uid)
        self._answer_others()

    @_members_only
    def _on_bye(self, identity: bytes, member: Member, msg: Message) -> None:
        """A server confirms the shutdown."""
        member.finished = True

    @_members_only
    def _on_stalled(self, identity: bytes, server: Member, msg: Message) -> Optional[int]:
        """A server says a peer stopped reading its answers: lost, by the policy."""
        if server.role != "server":
            raise MessageError("only servers say that a peer stopped reading")
        peer = self.roster.get(text_field(msg.header, "uid"))
        if peer is None or not peer.alive or peer.finished or peer.role == "server":
            return None
        return self._lost(peer, f"stopped reading server {server.rank}'s answers")

    @_members_only
    def _on_who(self, identity: bytes, asker: Member, msg: Message) -> None:
        """A server asks who a peer is (the node id its socket carries)."""
        if asker.role != "server":
            raise MessageError("only servers may ask who a peer is")
        peer = self.roster.get(text_field(msg.header, "uid"))
        if peer is None or not peer.alive or peer.role not in ("worker", EVALUATOR):
            self.listener.send(identity, {"type": "error", "error": "not a member of the job"})
        else:
            self.listener.send(identity, {"type": "member", "role": peer.role,
                                          "rank": peer.rank})

    @_members_only
    def _on_rendezvous(self, identity: bytes, member: Member, msg: Message) -> None:
        """A job without servers (all-reduce): worker 0 says where the workers meet; the
        others, and evaluators, are told once it has."""
        if "store" in msg.header:
            waiters = self.rendezvous.publish(member, msg.header)
            self.listener.tell(member.uid, "ctl", {"type": "ack"})
        else:
            waiters = [member.uid] if self.rendezvous.ask(member) else []
        for uid in waiters:
            self.listener.tell(uid, "ctl", {"type": "rendezvous", **self.rendezvous.meeting})

    @_members_only
    def _on_lease(self, identity: bytes, member: Member, msg: Message) -> None:
        self._check_leasing(member)
        self.listener.send(identity, self.leases.request(member.rank, msg.header))

    @_members_only
    def _on_leases(self, identity: bytes, member: Member, msg: Message) -> None:
        self._check_leasing(member)
        self.leases.report(member.rank, msg.header)
        self.listener.send(identity, {"type": "ack"})

    @staticmethod
    def _check_leasing(member: Member) -> None:
        if member.role != "worker":
            raise MessageError("only workers lease blocks")

    # --- joining ----------------------------------------------------------------------
    def _on_register(self, identity: bytes, uid: str, member: Optional[Member],
                     msg: Message) -> Optional[int]:
        joining = member_from(uid, msg.header, self.env.num_workers,
                              registered=member is not None)
        if joining.role == EVALUATOR:  # an observer: it is compared, never compared with
            return self._register_evaluator(joining)
        differs = self.roster.disagreement(joining)
        if differs is not None:
            if self.roster.assigned:  # the job itself is well configured
                return self._refuse(joining, differs)
            self.listener.tell(uid, "ctl", {"type": "error", "error": differs})
            self.linger.heard(uid)
            return self._abort(f"the job's nodes disagree: {differs}")
        self.roster.agree(joining)
        if self.roster.assigned:
            return self._replace(joining)
        error = self.roster.place(joining)
        if error is not None:
            self.listener.tell(uid, "ctl", {"type": "error", "error": error})
            return None
        if self.roster.complete:
            return self._assign()
        return None

    def _refuse(self, member: Member, why: str) -> None:
        log.error("[scheduler] error: refused %s: %s", member.describe(), why)
        self.listener.tell(member.uid, "ctl", {"type": "error", "error": why})

    def _replace(self, member: Member) -> None:
        """A worker or server that registers once the job runs takes a dead one's rank,
        or waits for one."""
        if not self.roster.take_dead_place(member):
            if not self.roster.queue(member):
                self.listener.tell(member.uid, "ctl", {
                    "type": "error", "error": f"the job already has its living "
                    f"{member.role}s (DMLC_NUM_{member.role.upper()})"})
            return
        if member.role == "worker":
            log.info("[scheduler] %s rejoins as worker %d (device %r)", member.describe(),
                     member.rank, member.device)
            self._send_assignment(member, rejoin=True)
            return
        log.info("[scheduler] %s takes over shard %d at %s; telling the workers",
                 member.describe(), member.rank, member.address)
        self._send_assignment(member, restore=True)
        servers = self.roster.servers()
        for m in self.roster.of("worker", EVALUATOR, living=True):
            if not m.finished:
                self.listener.tell(m.uid, "hb", {"type": "servers", "servers": servers})

    def _register_evaluator(self, member: Member) -> None:
        """An evaluator joins at any time; it is answered once the servers are known (and
        its settings compared with the job's, which are all known then)."""
        error = self.roster.admit_evaluator(member)
        if error is not None:
            self.listener.tell(member.uid, "ctl", {"type": "error", "error": error})
        elif self.roster.assigned:
            self._assign_evaluator(member)

    def _assign_evaluator(self, member: Member) -> None:
        differs = self.roster.disagreement(member)
        if differs is None:
            self._send_assignment(member)
        else:
            self._refuse(member, differs)
            self._forget(member)

    def _assign(self) -> Optional[int]:
        """Every node has registered: deal the ranks and tell each its assignment (with
        --resume, each server the checkpoint rounds it may restore)."""
        restore: Dict[int, List[int]] = {}
        if self.policy.resume:
            try:
                restore = self.roster.restore_rounds(self.policy.synchronous,
                                                     self.policy.checkpoint_dir)
            except UserError as e:
                return self._abort(str(e))
        waiting = self.roster.deal_ranks(self.job_file.previous_ranks)
        self.job_file.keep_ranks(self.roster.worker_devices())
        for member in waiting:
            if member.role == "server" and self.policy.resume:
                self._send_assignment(member, restore=True, rounds=restore[member.rank])
            elif member.role == EVALUATOR:
                self._assign_evaluator(member)
            else:
                self._send_assignment(member)
        log.info("[scheduler] all %d nodes registered; ranks assigned; job id %s",
                 len(self.roster), self.job)
        return None

    def _send_assignment(self, member: Member, **extra) -> None:
        self.listener.tell(member.uid, "ctl", {
            "type": "assign", "rank": member.rank, "servers": self.roster.servers(),
            "job": self.job, "num_servers": self.env.num_servers,
            "num_workers": self.env.num_workers, "workers": self.roster.worker_ranks(),
            **extra})

    def _wait_for_nodes(self) -> Optional[int]:
        """Until the job is complete: who is missing, every PROGRESS_S seconds; the end
        of the job after --start-timeout."""
        if self.roster.assigned:
            return None
        now, timeout = time.monotonic(), self.policy.start_timeout
        if timeout and now - self.listening_since >= timeout:
            self.linger.cancel()  # the missing ones were waited for long enough
            return self._abort(f"the job did not start within --start-timeout {timeout:g} s: "
                               f"{self._missing()}")
        if now >= self.next_progress:
            log.info("[scheduler] waiting since %s: %s", clock(self.listening_since),
                     self._missing())
            self.next_progress = now + PROGRESS_S
        return None

    def _missing(self) -> str:
        return self.roster.missing() + self.listener.failed_handshakes()

    def _release_barriers(self) -> None:
        for group, waiters in self.barriers.release(self.roster.living_in):
            for waiter in waiters:
                self.listener.tell(waiter, "ctl", {"type": "barrier_done", "group": group})

    # --- failure ----------------------------------------------------------------------
    def _lost(self, member: Member, how: str) -> Optional[int]:
        """`member` died (`how`): go on without it if the policy allows, else end the job."""
        reason = f"{member.describe()} {how}"
        if member.role == EVALUATOR:  # an observer: the job goes on, and forgets it
            log.warning("[scheduler] %s; the job goes on without it", reason)
            self._forget(member)
            return None
        if not self.roster.assigned:
            return self._abort(reason, exclude=member.uid)
        if not self.env.num_servers and member.role == "worker":
            return self._abort(f"{reason}; an all-reduce job cannot go on without it",
                               exclude=member.uid)
        if member.role == "worker" and self.policy.on_worker_failure == "continue" \
                and self.barriers.started:  # before, the others wait for it (worker 0's init)
            member.dead_since = time.monotonic()
            living = self.roster.of("worker", living=True)
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
        self.roster.forget(member)
        self.barriers.forget(member.uid)
        self.rendezvous.forget(member.uid)
        self._tell_servers_left(member)

    def _tell_servers_left(self, member: Member) -> None:
        """The living servers forget `member` (a dead worker, an evaluator that left)."""
        for m in self.roster.of("server", living=True):
            self.listener.tell(m.uid, "hb", {"type": "left", "role": member.role,
                                             "rank": member.rank, "uid": member.uid})

    def _take_queued(self, role: str) -> None:
        """A node of `role` died: the first one waiting to replace one takes its place."""
        waiting = self.roster.next_queued(role)
        if waiting is not None:
            self._replace(waiting)

    def _server_patience(self) -> Optional[int]:
        m = self.roster.overdue_server(self.policy.server_patience)
        if m is None:
            return None
        return self._abort(f"{m.describe()} died and was not started again within "
                           f"--server-patience {self.policy.server_patience:g} s")

    def _drop_stalled(self) -> Optional[int]:
        """Lose, by the policy, each member that does not read the scheduler's messages."""
        uid = self.listener.pop_stalled()
        while uid is not None:
            member = self.roster.get(uid)
            if member is not None and member.alive and not member.finished:
                code = self._lost(member, "does not read the scheduler's messages")
                if code is not None:
                    return code
            uid = self.listener.pop_stalled()
        return None

    def _abort(self, reason: str, exclude: Optional[str] = None) -> int:
        log.error("[scheduler] error: aborting the job: %s", reason)
        self.aborted = reason
        if exclude is not None:
            self.linger.heard(exclude)
        for m in self.roster.of("server", "worker", EVALUATOR):
            if m.uid != exclude and not m.finished and m.alive:
                self.listener.tell(m.uid, "hb", {"type": "abort", "reason": reason})
                self.linger.heard(m.uid)
        return 1

    # --- the end ----------------------------------------------------------------------
    def _answer_others(self) -> None:
        """Answer each worker waiting for the others once every other living worker
        has finished (a dead one is not waited for)."""
        for uid in self.shutdown.others_done(self.roster.others_running):
            self.listener.tell(uid, "ctl", {"type": "ack"})

    def _maybe_closing(self) -> None:
        if not self.roster.assigned:
            return
        workers = self.roster.of("worker", living=True)
        self.shutdown.begin_if_done(len(workers), sum(1 for m in workers if m.finished),
                                    len(self.roster.of("worker")) - len(workers))

    def _close_down(self) -> Optional[int]:
        """Every worker finished: 0 once the servers and evaluators confirmed the
        shutdown (or had a heartbeat timeout to); until then, tell them again."""
        left = [m for m in self.roster.of("server", EVALUATOR, living=True) if not m.finished]
        if not left:
            if self.leases.granted():
                log.info("[scheduler] blocks leased per worker rank: %s",
                         json.dumps(self.leases.granted(), sort_keys=True))
            log.info("[scheduler] all %d nodes are done", len(self.roster))
            return 0
        if self.shutdown.overdue():
            log.warning("[scheduler] %s did not confirm the shutdown; leaving anyway",
                        ", ".join(m.describe() for m in left))
            return 0
        if self.shutdown.notice_due():
            for server in left:  # again, until each one confirms
                self.listener.tell(server.uid, "hb", {"type": "shutdown"})
        return None


#: the scheduler's one dispatch table: its keys are the requests it accepts (`decode`
#: refuses any other type, answered `error` in `_handle`)
HANDLERS: Handlers[Optional[int]] = Handlers({
    "register": Scheduler._on_register,
    "heartbeat": Scheduler._on_heartbeat,
    "barrier": Scheduler._on_barrier,
    "finished": Scheduler._on_finished,
    "abort": Scheduler._on_abort,
    "bye": Scheduler._on_bye,
    "who": Scheduler._on_who,
    "rendezvous": Scheduler._on_rendezvous,
    "stalled": Scheduler._on_stalled,
    "lease": Scheduler._on_lease,
    "leases": Scheduler._on_leases,
    "others": Scheduler._on_others,
})
REQUESTS = HANDLERS.types


def tell_why(env: ClusterEnv, reason: str) -> None:
    """A scheduler that cannot run its job (bad input): listen on the job's address
    anyway, for up to ABORT_LINGER seconds, to tell the nodes that come why, so that
    none waits for a scheduler that has gone. Nothing to do where nobody knows the
    address (DMLC_PS_ROOT_PORT=0: a launcher's, which ends the job itself) or where it
    cannot listen."""
    if env.root_port == 0:
        return
    listener = Listener(env)
    try:
        listener.listen()
    except UserError:
        return
    try:
        Linger(env.num_servers + env.num_workers).tell_late_nodes(listener, reason, REQUESTS)
    finally:
        listener.close()


def server_patience(opts: Any) -> float:
    """--server-patience, or its default: only a checkpointed shard can be restored."""
    if opts.server_patience is not None:
        return opts.server_patience
    return config.SERVER_PATIENCE if opts.checkpoint_dir else 0.0
