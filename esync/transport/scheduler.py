"""The scheduler: registration, ranks, the servers' address book, barriers, heartbeats,
and the end of the job (ps-lite's scheduler node).

Besides DMLC_NUM_SERVER servers and DMLC_NUM_WORKER workers, any number of evaluators
(DMLC_ROLE=evaluator) may join, before the job starts or while it runs: they get the
servers' address book, are not waited for, and their death does not end the job; they
are shut down with the servers."""
from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import zmq

from esync import ready
from esync.errors import UserError
from esync.registry import EVALUATOR
from esync.transport.cluster import ClusterEnv, resolve
from esync.transport.message import MessageError, decode, encode

POLL_MS = 100
REQUESTS = ("register", "heartbeat", "barrier", "finished", "abort", "bye")

log = logging.getLogger(__name__)


@dataclass
class Member:
    uid: str
    role: str
    hostname: str
    pid: int
    address: Optional[str]
    info: Dict
    rank: Optional[int] = None
    finished: bool = False

    def describe(self) -> str:
        rank = "?" if self.rank is None else self.rank
        return f"{self.role} {rank} (pid {self.pid} on {self.hostname})"


@dataclass
class Scheduler:
    env: ClusterEnv
    members: Dict[str, Member] = field(default_factory=dict)
    last_seen: Dict[str, float] = field(default_factory=dict)
    barriers: Dict[str, List[str]] = field(default_factory=dict)
    assigned: bool = False
    closing_since: Optional[float] = None  # when every worker had finished
    #: names the job where several share a service (the ESync state server)
    job: str = field(default_factory=lambda: time.strftime("job-%Y%m%d-%H%M%S-")
                     + secrets.token_hex(3))

    def run(self) -> int:
        """Serve the job until it ends: 0 when every worker finished, 1 when aborted."""
        context = zmq.Context()
        self.sock = context.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a node's fresh connection takes over
        self.sock.setsockopt(zmq.LINGER, 2000)
        host = f"tcp://{resolve(self.env.root_uri, 'DMLC_PS_ROOT_URI')}"
        port = self.env.root_port
        try:
            if port == 0:  # DMLC_PS_ROOT_PORT=0: a free port, reported (esync.ready)
                port = self.sock.bind_to_random_port(host)
            else:
                self.sock.bind(f"{host}:{port}")
        except zmq.ZMQError as e:
            self.sock.close(linger=0)
            context.term()
            raise UserError(f"DMLC_PS_ROOT_URI/DMLC_PS_ROOT_PORT: cannot listen on "
                            f"{host}:{port}: {e}") from None
        log.info("[scheduler] listening on %s:%d for %d server(s) and %d worker(s)", host,
                 port, self.env.num_servers, self.env.num_workers)
        ready.announce(port)
        try:
            code = self._serve()
        finally:
            self.sock.close()
            context.term()
        return code

    def _serve(self) -> Optional[int]:
        last_notice = 0.0
        while True:
            if self.sock.poll(POLL_MS):
                identity, *frames = self.sock.recv_multipart(copy=False)
                code = self._handle(identity.bytes, frames)
                if code is not None:
                    return code
            if self.closing_since is not None:
                now = time.monotonic()
                left = [m for m in self.members.values()
                        if m.role in ("server", EVALUATOR) and not m.finished]
                if not left:
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
            if dead is not None and dead.role == EVALUATOR:  # an observer: the job goes on
                log.warning("[scheduler] %s sent no heartbeat for %g s; the job goes on "
                            "without it", dead.describe(), self.env.heartbeat_timeout)
                dead.finished = True
            elif dead is not None:
                return self._abort(f"{dead.describe()} sent no heartbeat for "
                                   f"{self.env.heartbeat_timeout:g} s", exclude=dead.uid)

    # --- messages ---------------------------------------------------------------------
    def _handle(self, identity: bytes, frames) -> Optional[int]:
        try:
            msg = decode(frames, REQUESTS)
        except MessageError as e:
            log.warning("[scheduler] dropped a malformed message from %r: %s", identity, e)
            return None
        uid = str(msg.header["sender"])
        self.last_seen[uid] = time.monotonic()
        if msg.type == "heartbeat":
            self._send(identity, {"type": "ack"})
            return None
        log.debug("[scheduler] <- %s: %s", uid, msg.header)
        if msg.type == "register":
            return self._register(identity, uid, msg.header)
        if msg.type == "abort" and uid not in self.members:  # failed before it could join
            return self._abort(str(msg.header.get("reason", f"{uid} failed")))
        if uid not in self.members:
            self._send(identity, {"type": "error", "error": f"{uid} is not registered"})
            return None
        member = self.members[uid]
        if msg.type == "barrier":
            return self._barrier(identity, uid, str(msg.header.get("group", "workers")))
        if msg.type == "finished":
            member.finished = True
            self._send(identity, {"type": "ack"})
            workers = [m for m in self.members.values() if m.role == "worker"]
            if self.assigned and all(m.finished for m in workers):
                self.closing_since = time.monotonic()
                log.info("[scheduler] all %d workers finished; shutting the servers down",
                         len(workers))
            return None
        if msg.type == "bye":  # a server confirms the shutdown
            member.finished = True
            return None
        if member.role == EVALUATOR:  # an observer failed: the job goes on without it
            log.warning("[scheduler] %s left: %s", member.describe(),
                        msg.header.get("reason", "failed"))
            member.finished = True
            return None
        # abort: a node failed and asks to end the job
        return self._abort(str(msg.header.get("reason", f"{member.describe()} failed")),
                           exclude=uid)

    def _register(self, identity: bytes, uid: str, header: Dict) -> Optional[int]:
        role = header.get("role")
        wanted = {"server": self.env.num_servers, "worker": self.env.num_workers}
        if role == EVALUATOR:
            return self._register_evaluator(identity, uid, header)
        if role not in wanted:
            self._send(identity, {"type": "error", "error": f"unknown role {role!r}"})
            return None
        count = sum(1 for m in self.members.values() if m.role == role)
        if self.assigned or count >= wanted[role]:
            self._send(identity, {"type": "error", "error": f"the job already has its "
                                  f"{wanted[role]} {role}(s) (DMLC_NUM_{role.upper()})"})
            return None
        port = header.get("port")
        address = f"tcp://{header.get('host')}:{port}" if port else None
        member = Member(uid, role, str(header.get("hostname", "?")), int(header.get("pid", 0)),
                        address, {k: header.get(k) for k in ("mode", "network")})
        workers = [m for m in self.members.values() if m.role == "worker"]
        if role == "worker" and workers and member.info != workers[0].info:
            self.members[uid] = member
            return self._abort(f"workers disagree: {workers[0].describe()} runs "
                               f"{workers[0].info} but {member.describe()} runs {member.info}")
        self.members[uid] = member
        self.barriers.setdefault("register", []).append(uid)
        log.info("[scheduler] %s registered: pid %d on %s%s", role, member.pid,
                 member.hostname, f", serving at {address}" if address else "")
        if all(sum(1 for m in self.members.values() if m.role == r) == n
               for r, n in wanted.items()):
            self._assign()
        return None

    def _register_evaluator(self, identity: bytes, uid: str, header: Dict) -> None:
        """An evaluator joins at any time; it is answered once the servers are known."""
        member = Member(uid, EVALUATOR, str(header.get("hostname", "?")),
                        int(header.get("pid", 0)) if isinstance(header.get("pid"), int) else 0,
                        None, {k: header.get(k) for k in ("mode", "network")},
                        rank=sum(1 for m in self.members.values() if m.role == EVALUATOR))
        self.members[uid] = member
        log.info("[scheduler] evaluator registered: pid %d on %s", member.pid, member.hostname)
        if self.assigned:
            self._send_assignment(member)
        else:
            self.barriers.setdefault("register", []).append(uid)
        return None

    def _send_assignment(self, member: Member) -> None:
        servers = [m.address for m in self.members.values() if m.role == "server"]
        self._send(f"{member.uid}/ctl".encode(), {
            "type": "assign", "rank": member.rank, "servers": servers, "job": self.job,
            "num_servers": self.env.num_servers, "num_workers": self.env.num_workers})

    def _assign(self) -> None:
        for role in ("server", "worker"):
            for rank, m in enumerate(m for m in self.members.values() if m.role == role):
                m.rank = rank
        for uid in self.barriers.pop("register"):
            self._send_assignment(self.members[uid])
        self.assigned = True
        log.info("[scheduler] all %d nodes registered; ranks assigned; job id %s",
                 len(self.members), self.job)

    def _barrier(self, identity: bytes, uid: str, group: str) -> None:
        role = {"workers": "worker", "servers": "server"}.get(group)
        members = [m.uid for m in self.members.values() if group == "all" or m.role == role]
        if uid not in members:
            self._send(identity, {"type": "error", "error": f"not a member of group {group!r}"})
            return None
        waiting = self.barriers.setdefault(f"barrier:{group}", [])
        waiting.append(uid)
        if set(members) <= set(waiting):
            for waiter in self.barriers.pop(f"barrier:{group}"):
                self._send(f"{waiter}/ctl".encode(), {"type": "barrier_done", "group": group})
        return None

    # --- failure ----------------------------------------------------------------------
    def _dead_member(self) -> Optional[Member]:
        now = time.monotonic()
        for m in self.members.values():
            if not m.finished and now - self.last_seen.get(m.uid, now) > self.env.heartbeat_timeout:
                return m
        return None

    def _abort(self, reason: str, exclude: Optional[str] = None) -> int:
        log.error("[scheduler] error: aborting the job: %s", reason)
        for m in self.members.values():
            if m.uid != exclude and not m.finished:
                self._send(f"{m.uid}/hb".encode(), {"type": "abort", "reason": reason})
        return 1

    def _send(self, identity: bytes, header: Dict) -> None:
        try:
            self.sock.send_multipart([identity, *encode({"sender": "scheduler", **header})])
        except zmq.ZMQError:  # the peer is gone (ROUTER_MANDATORY): nothing to tell it
            pass
