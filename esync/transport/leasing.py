"""The scheduler's side of block leases (`--data-split leased`): the job's LeaseBook
(esync.data.leases), built from the first worker's layout of the shards, and the
checks of every field a worker sends (a malformed message raises MessageError and is
answered with `error`, like any other)."""
from __future__ import annotations

from typing import Any, Dict, Optional

from esync.data.leases import Lease, LeaseBook, blocks_of
from esync.transport.message import MessageError

#: the most shards a layout may list, and samples per block or per lease
MAX_SHARDS, MAX_BLOCK = 1 << 20, 1 << 24


def _whole(x: Any, low: int = 0, high: int = 1 << 62) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and low <= x <= high


def _layout(value: Any) -> Dict[str, Any]:
    """A worker's layout of the shards: {"starts": first sample of each shard and the
    number of samples, "block_size", "per_lease", "seed"}."""
    if not isinstance(value, dict):
        raise MessageError("field 'layout' must describe the shards")
    starts = value.get("starts")
    if not isinstance(starts, list) or not 2 <= len(starts) <= MAX_SHARDS + 1 or not all(
            _whole(s) for s in starts) or any(b <= a for a, b in zip(starts, starts[1:])) \
            or starts[0] != 0:
        raise MessageError("layout 'starts' must be increasing sample numbers from 0")
    for name in ("block_size", "per_lease"):
        if not _whole(value.get(name), 1, MAX_BLOCK):
            raise MessageError(f"layout {name!r} must be a positive whole number")
    if not _whole(value.get("seed")):
        raise MessageError("layout 'seed' must be a whole number")
    return {k: value[k] for k in ("starts", "block_size", "per_lease", "seed")}


class LeaseDesk:
    """Answers the workers' `lease` requests and `leases` reports."""

    def __init__(self, num_workers: int):
        self.num_workers = num_workers
        self.book: Optional[LeaseBook] = None
        self.layout: Optional[Dict[str, Any]] = None

    def request(self, rank: int, header: Dict[str, Any]) -> Dict[str, Any]:
        """The answer to worker `rank`'s `lease` request: its next lease, or the one it
        asks to resume (`resume`: a lease with `skip` at its saved position; the
        answer's lease is null if others have it now)."""
        layout = _layout(header.get("layout"))
        if self.book is None:
            self.layout = layout
            self.book = LeaseBook(blocks_of(layout["starts"], layout["block_size"]),
                                  layout["per_lease"], [layout["seed"]], self.num_workers)
        elif layout != self.layout:
            raise MessageError("this worker's shards, --block-size, buffer or --seed differ "
                               "from the first worker's: every worker must read the same "
                               "shards with the same settings")
        if header.get("resume") is not None:
            try:
                saved = Lease.from_dict(header["resume"])
            except ValueError as e:
                raise MessageError(f"field 'resume': {e}") from None
            lease = self.book.resume(rank, saved, saved.skip)
        else:
            lease = self.book.grant(rank)
        return {"type": "lease", "lease": lease.to_dict() if lease else None}

    def report(self, rank: int, header: Dict[str, Any]) -> None:
        """Worker `rank` ended a round: the leases it finished, and where it is."""
        done, at = header.get("done"), header.get("at")
        if not isinstance(done, list) or len(done) > 1 << 16 or not all(
                isinstance(d, str) and len(d) <= 64 for d in done):
            raise MessageError("field 'done' must list lease ids")
        if at is not None and not (isinstance(at, list) and len(at) == 2 and
                                   isinstance(at[0], str) and _whole(at[1])):
            raise MessageError("field 'at' must be [lease id, position]")
        if self.book is not None:
            self.book.report(rank, done, tuple(at) if at else None)

    def lost(self, rank: int) -> None:
        if self.book is not None:
            self.book.lost(rank)

    def granted(self) -> Dict[int, int]:
        """Blocks dealt so far, per worker rank."""
        return dict(self.book.granted) if self.book else {}
