"""Where the workers of a job without servers meet (`--backend allreduce`,
DMLC_NUM_SERVER=0): worker 0 says where its torch.distributed store and its model
publisher are; the other workers and the evaluators are told, at once or once it has."""
from __future__ import annotations

from typing import Dict, List, Optional

from esync.transport.membership import Member
from esync.transport.message import MessageError, text_field

#: what worker 0 publishes: its store (host:port) and its model publisher's address
PUBLISHED = ("store", "evaluator")


class Rendezvous:
    def __init__(self, num_servers: int):
        self.num_servers = num_servers
        #: where the workers meet, once worker 0 said so
        self.meeting: Optional[Dict[str, str]] = None
        self._waiters: List[str] = []  # node ids waiting to hear it

    def publish(self, member: Member, header: Dict) -> List[str]:
        """Worker 0 says where the workers meet (every field checked: MessageError); the
        node ids that waited to hear it."""
        self._check()
        if member.role != "worker" or member.rank != 0:
            raise MessageError("only worker 0 says where the workers meet")
        self.meeting = {k: text_field(header, k) for k in PUBLISHED}
        waiters, self._waiters = self._waiters, []
        return waiters

    def ask(self, member: Member) -> bool:
        """`member` asks where the workers meet: True if it may be told now, else it
        waits for worker 0 (told by `publish`'s list)."""
        self._check()
        if self.meeting is None:
            if member.uid not in self._waiters:
                self._waiters.append(member.uid)
            return False
        return True

    def _check(self) -> None:
        if self.num_servers:
            raise MessageError("rendezvous is for jobs without servers (DMLC_NUM_SERVER=0)")

    def forget(self, uid: str) -> None:
        """A member that left waits for nothing."""
        self._waiters = [u for u in self._waiters if u != uid]
