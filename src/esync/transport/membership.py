"""The scheduler's roster: who registered, their ranks, the servers' address book, who
still sends heartbeats, and who waits for a dead node's place (esync.transport.scheduler
says the policy; this module keeps the members and answers questions about them).

A registration is checked field by field (`member_from`): a malformed one raises
MessageError. Only registered members are kept (bounded memory whatever strangers send):
at most MAX_EVALUATORS evaluators and QUEUED nodes waiting for a place."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

from esync.errors import UserError
from esync.registry import EVALUATOR
from esync.transport.message import MessageError, integer_field, text_field

ROLES = ("server", "worker", EVALUATOR)
#: nodes that registered to replace one not yet known to be dead, at most
QUEUED = 16
#: evaluators a job admits at once (each is served the whole model)
MAX_EVALUATORS = 8
#: a node's settings at registration: at most this many, of these sizes
MAX_SETTINGS, MAX_SETTING_CHARS = 32, 256
#: a barrier's group, by the role of its members (group "all": every role)
GROUP_ROLES = {"workers": "worker", "servers": "server"}

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


def member_from(uid: str, header: Dict, num_workers: int, registered: bool) -> Member:
    """The member a `register` message describes, every field checked (MessageError);
    `registered`: `uid` is a member already, which may not register again."""
    role = text_field(header, "role")
    if role not in ROLES:
        raise MessageError(f"unknown role {role!r}")
    if registered:
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
        member.wanted_rank = integer_field(header, "rank", 0, num_workers - 1,
                                           required=False)
    if role == "server" and member.address is None:
        raise MessageError("a server registers with its 'host' and 'port'")
    return member


class Membership:
    """The job's members by node id, with the settings they must agree on."""

    def __init__(self, num_servers: int, num_workers: int,
                 settings: Optional[Dict[str, str]] = None):
        self.wanted = {"server": num_servers, "worker": num_workers}
        self._members: Dict[str, Member] = {}
        self._last_seen: Dict[str, float] = {}
        #: nodes that registered before the ranks were dealt, in order (their assignment)
        self._unassigned: List[str] = []
        #: nodes that registered to replace one not yet known to be dead (bounded)
        self._queued: List[Member] = []
        self._evaluators = 0  # evaluators that ever joined (their ranks)
        #: per setting: the value the job runs with, and whose it was (the scheduler's
        #: own settings come first)
        self._agreed: Dict[str, Tuple[str, str]] = {
            name: (value, "the scheduler") for name, value in (settings or {}).items()}
        self.assigned = False  # the ranks were dealt: the job runs

    # --- looking members up -------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, uid: str) -> bool:
        return uid in self._members

    def get(self, uid: str) -> Optional[Member]:
        return self._members.get(uid)

    def seen(self, uid: str) -> Optional[Member]:
        """The member `uid`, whose message just came (its heartbeat clock restarts)."""
        member = self._members.get(uid)
        if member is not None:
            self._last_seen[uid] = time.monotonic()
        return member

    def of(self, *roles: str, living: bool = False) -> List[Member]:
        """The members of `roles` (living ones only if `living`), in registration order."""
        return [m for m in self._members.values()
                if m.role in roles and (m.alive or not living)]

    def living_in(self, group: str) -> Set[str]:
        """The living members of a barrier's `group` ("workers", "servers", "all")."""
        role = GROUP_ROLES.get(group)
        return {m.uid for m in self._members.values()
                if (group == "all" or m.role == role) and m.alive}

    def others_running(self, uid: str) -> bool:
        """Whether a living worker other than `uid` has not finished yet."""
        return any(m.role == "worker" and m.alive and m.uid != uid and not m.finished
                   for m in self._members.values())

    def servers(self) -> List[Optional[str]]:
        """The address book: server k's address at index k."""
        ranked = sorted(self.of("server"), key=lambda m: m.rank)
        return [m.address for m in ranked]

    def worker_ranks(self) -> List[int]:
        """The living workers' ranks, in order."""
        return sorted(m.rank for m in self.of("worker", living=True))

    def silent(self, timeout: float) -> Optional[Member]:
        """A living, unfinished member that sent nothing for `timeout` seconds, if any."""
        now = time.monotonic()
        for m in self._members.values():
            if not m.finished and m.alive and \
                    now - self._last_seen.get(m.uid, now) > timeout:
                return m
        return None

    def missing(self) -> str:
        """"1 of 1 server and 2 of 3 workers registered, waiting for 1 more worker ..."."""
        have, missing = [], []
        for role, wanted in self.wanted.items():
            count = len(self.of(role))
            have.append(f"{count} of {wanted} {role}{'s' if wanted != 1 else ''}")
            if count < wanted:
                more = wanted - count
                missing.append(f"{more} more {role}{'s' if more != 1 else ''} "
                               f"(DMLC_NUM_{role.upper()}={wanted})")
        text = f"{' and '.join(have)} registered, waiting for {' and '.join(missing)}"
        registered = [m.describe() for m in self._members.values() if m.role != EVALUATOR]
        if registered:
            text += f"; registered: {', '.join(registered)}"
        return text

    # --- the settings that must agree ---------------------------------------------------
    def disagreement(self, member: Member) -> Optional[str]:
        """Which of `member`'s settings differs from the job's, and from whose; None if
        all agree (the scheduler's own come first, then the first node to give one)."""
        for name, value in member.settings.items():
            theirs, whose = self._agreed.get(name, (value, ""))
            if value != theirs:
                return f"{name} is {value} for {member.describe()} but {theirs} for {whose}"
        return None

    def agree(self, member: Member) -> None:
        """`member`'s settings are the job's where no node gave one before."""
        for name, value in member.settings.items():
            self._agreed.setdefault(name, (value, member.describe()))

    # --- joining ------------------------------------------------------------------------
    def place(self, member: Member) -> Optional[str]:
        """A server or worker joins before the job runs; the error to answer if the job
        already has all of its role."""
        wanted = self.wanted[member.role]
        if len(self.of(member.role)) >= wanted:
            return f"the job already has its {wanted} {member.role}(s) " \
                   f"(DMLC_NUM_{member.role.upper()})"
        self._add(member)
        self._unassigned.append(member.uid)
        log.info("[scheduler] %s registered: pid %d on %s%s", member.role, member.pid,
                 member.hostname, f", serving at {member.address}" if member.address else "")
        return None

    @property
    def complete(self) -> bool:
        """Every server and worker the job wants has registered."""
        return all(len(self.of(role)) == n for role, n in self.wanted.items())

    def admit_evaluator(self, member: Member) -> Optional[str]:
        """An evaluator joins at any time; the error to answer if the job has as many as
        it admits. Before the ranks are dealt it waits for its assignment with the others."""
        if len(self.of(EVALUATOR)) >= MAX_EVALUATORS:
            return f"the job already has {MAX_EVALUATORS} evaluators, the most it admits"
        member.rank, self._evaluators = self._evaluators, self._evaluators + 1
        self._add(member)
        log.info("[scheduler] evaluator registered: pid %d on %s", member.pid, member.hostname)
        if not self.assigned:
            self._unassigned.append(member.uid)
        return None

    def deal_ranks(self, previous: Dict[str, int]) -> List[Member]:
        """Every node has registered: deal the servers' and workers' ranks (see
        `_in_rank_order`; `previous`: a resumed job's worker rank per device, label@host)
        and return the members waiting for their assignment, in the order they came."""
        for role in ("server", "worker"):
            for rank, m in enumerate(self._in_rank_order(role, previous)):
                m.rank = rank
        waiting, self._unassigned = self._unassigned, []
        self.assigned = True
        return [self._members[uid] for uid in waiting]

    def _in_rank_order(self, role: str, previous: Dict[str, int]) -> List[Member]:
        """The members of `role` in the order of their ranks: a worker that asks for a
        rank (DMLC_WORKER_ID: a launcher's worker k is rank k in every run, so that rank
        0, the names and the data are the same each time) has it; in a resumed job a
        worker takes the rank its device (--device-name and host) had, so that it goes
        on with its own data (job.json's `ranks`); the others fill the ranks left in the
        order they registered."""
        members = self.of(role)
        if role != "worker":
            return members
        order: List[Optional[Member]] = [None] * len(members)
        others = []
        for m in members:
            rank = m.wanted_rank
            if rank is None:
                rank = previous.get(f"{m.device}@{m.hostname}")
            if isinstance(rank, int) and 0 <= rank < len(order) and order[rank] is None:
                order[rank] = m
            else:
                others.append(m)
        return [m if m is not None else others.pop(0) for m in order]

    def worker_devices(self) -> Dict[str, Optional[int]]:
        """Which device (label@host) has which worker rank (job.json's `ranks`)."""
        return {f"{m.device}@{m.hostname}": m.rank for m in self.of("worker")}

    def restore_rounds(self, synchronous: bool, folder: Optional[str]) -> Dict[int, List[int]]:
        """--resume: per shard, the checkpoint rounds it may restore, best first (in
        synchronous modes, only rounds that every shard has); UserError where a shard has
        no checkpoint in `folder`."""
        seen: Dict[int, set] = {}
        for m in self._members.values():
            for shard, rounds in m.checkpoints.items():
                seen.setdefault(shard, set()).update(rounds)
        shards = range(self.wanted["server"])
        missing = [k for k in shards if not seen.get(k)]
        if missing:
            raise UserError(f"--resume: no checkpoint of shard {missing[0]} in {folder}")
        if synchronous:
            common = set.intersection(*(seen[k] for k in shards))
            if common:
                return {k: sorted(common, reverse=True) for k in shards}
            log.warning("[scheduler] --resume: the shards have no checkpoint round in "
                        "common; each restores its newest")
        return {k: sorted(seen[k], reverse=True) for k in shards}

    # --- deaths and replacements --------------------------------------------------------
    def take_dead_place(self, member: Member) -> bool:
        """A worker or server that registers once the job runs takes a dead one's rank
        (the one it asks for, else the one with its device label and host, else the
        lowest); False where none of its role is dead (yet)."""
        dead = [m for m in self._members.values() if m.role == member.role and not m.alive]
        dead.sort(key=lambda m: (member.wanted_rank is not None and m.rank != member.wanted_rank,
                                 m.device != member.device or m.hostname != member.hostname,
                                 m.rank))
        if not dead:
            return False
        old = dead[0]
        del self._members[old.uid]
        self._last_seen.pop(old.uid, None)
        member.rank = old.rank
        self._add(member)
        return True

    def queue(self, member: Member) -> bool:
        """`member` waits for a dead one's place (perhaps the one it replaces is not yet
        known to be dead); False where QUEUED nodes wait already."""
        if len(self._queued) >= QUEUED:
            return False
        log.info("[scheduler] %s waits for a dead %s's place", member.describe(), member.role)
        self._queued.append(member)
        return True

    def next_queued(self, role: str) -> Optional[Member]:
        """The first node waiting for a dead `role`'s place, taken off the queue."""
        for waiting in self._queued:
            if waiting.role == role:
                self._queued.remove(waiting)
                return waiting
        return None

    def drain_queued(self) -> List[Member]:
        """The nodes still waiting for a place as the job ends, taken off the queue."""
        queued, self._queued = self._queued, []
        return queued

    def forget(self, member: Member) -> None:
        """Drop a member that left (an evaluator): it no longer counts."""
        del self._members[member.uid]
        self._last_seen.pop(member.uid, None)
        self._unassigned = [u for u in self._unassigned if u != member.uid]

    def overdue_server(self, patience: float) -> Optional[Member]:
        """A dead server not replaced within `patience` seconds, if any."""
        now = time.monotonic()
        for m in self._members.values():
            if m.role == "server" and not m.alive and now - m.dead_since > patience:
                return m
        return None

    def _add(self, member: Member) -> None:
        self._members[member.uid] = member
        self._last_seen[member.uid] = time.monotonic()
