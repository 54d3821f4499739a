"""Who a server's peers are: only peers the scheduler registered are served. A worker's
or evaluator's socket carries its node id as its ZeroMQ identity (`<node id>/<socket
name>`); the server asks the scheduler (`who`) the first time it sees one, and remembers
the answer, or that the identity is a stranger (the newest STRANGERS of them: bounded
memory whatever strangers send)."""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Dict, Optional, Tuple

from esync.registry import EVALUATOR
from esync.transport.node import Node, node_id

STRANGERS = 1024  # identities remembered as not members (bounded)

#: who a peer is, from its ZeroMQ identity: ("worker", rank), ("evaluator", k) or None
Who = Callable[[bytes], Optional[Tuple[str, int]]]
#: tells the scheduler that the peer with this identity stopped reading
Stalled = Callable[[bytes], None]


class Peers:
    def __init__(self, who: Who):
        self.who = who
        self._known: Dict[bytes, Tuple[str, int]] = {}
        self._strangers: "OrderedDict[bytes, None]" = OrderedDict()

    def __contains__(self, identity: bytes) -> bool:
        """`identity` is a member's, known as such."""
        return identity in self._known

    def lookup(self, identity: bytes) -> Optional[Tuple[str, int]]:
        """(role, rank) of the peer with `identity`, None for a stranger (the scheduler
        is asked once per identity)."""
        if identity in self._known:
            return self._known[identity]
        if identity in self._strangers:
            return None
        peer = self.who(identity)
        if peer is None:
            self._stranger(identity)
        else:
            self._known[identity] = peer
        return peer

    def drop(self, identity: bytes) -> Tuple[str, int]:
        """A member that does not read: from now on a stranger; who it was."""
        peer = self._known.pop(identity)
        self._stranger(identity)
        return peer

    def forget(self, role: str, rank: int) -> None:
        """The member (`role`, `rank`) left (a dead worker, an evaluator that left): its
        identities are asked about again if they come back."""
        for identity in [i for i, p in self._known.items() if p == (role, rank)]:
            del self._known[identity]

    def _stranger(self, identity: bytes) -> None:
        """Remember `identity` as not a member (the newest STRANGERS of them)."""
        self._strangers[identity] = None
        while len(self._strangers) > STRANGERS:
            self._strangers.popitem(last=False)


def asking(node: Node) -> Who:
    """A server's `who`: ask the scheduler through the server's node."""
    def who(identity: bytes) -> Optional[Tuple[str, int]]:
        """A peer's identity is "<node id>/<socket name>" (a node may have several)."""
        if len(identity) > 256 or b"/" not in identity:
            return None
        answer = node.who(node_id(identity))
        if answer is None or answer.get("role") not in ("worker", EVALUATOR) \
                or type(answer.get("rank")) is not int:
            return None
        return answer["role"], answer["rank"]

    return who


def telling(node: Node) -> Stalled:
    """A server's `stalled`: tell the scheduler through the server's node."""
    def stalled(identity: bytes) -> None:
        node.tell({"type": "stalled", "uid": node_id(identity)})

    return stalled
