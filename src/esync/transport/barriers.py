"""The scheduler's barriers: a group's members ("workers", "servers", "all") wait until
every living member of the group has come; the dead are not waited for."""
from __future__ import annotations

from typing import Callable, Dict, List, Set, Tuple


class Barriers:
    def __init__(self) -> None:
        #: per group, the node ids waiting at its barrier, in the order they came
        self._waiting: Dict[str, List[str]] = {}
        self.started = False  # the workers passed their first barrier: training runs

    def enter(self, uid: str, group: str, members: Set[str]) -> bool:
        """`uid` waits at `group`'s barrier, whose living members are `members`; False
        (and nothing kept) where it is not one of them."""
        if uid not in members:
            return False
        self._waiting.setdefault(group, []).append(uid)
        return True

    def release(self, members_of: Callable[[str], Set[str]]) -> List[Tuple[str, List[str]]]:
        """Each barrier whose living members (`members_of(group)`) are all waiting ends
        (also after a death); the groups released with the members that waited."""
        released = []
        for group in list(self._waiting):
            members = members_of(group)
            waiting = [u for u in self._waiting[group] if u in members]
            if members <= set(waiting):
                del self._waiting[group]
                if group == "workers":
                    self.started = True
                released.append((group, waiting))
        return released

    def forget(self, uid: str) -> None:
        """A member that left waits nowhere."""
        for group in self._waiting:
            self._waiting[group] = [u for u in self._waiting[group] if u != uid]
