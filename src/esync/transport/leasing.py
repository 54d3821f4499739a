"""The scheduler's side of block leases (`--data-split leased`): the job's LeaseBook
(esync.data.leases), built from the first worker's layout of the shards, and the
checks of every field a worker sends (a malformed message raises MessageError and is
answered with `error`, like any other).

With --checkpoint-dir the book's history is kept in `DIR/leases.json` (rewritten,
atomically, at every worker's report), and a job resumed with --resume 1 takes the
book back as it was at the round its first worker continues from."""
from __future__ import annotations

import json
import logging
import os
from typing import Any, Dict, Optional

from esync.data import SHUFFLES
from esync.data.leases import Lease, LeaseBook, blocks_of
from esync.errors import UserError
from esync.transport.message import MessageError

log = logging.getLogger(__name__)
LEASES_FILE = "leases.json"
#: the most shards a layout may list, and samples per block or per lease
MAX_SHARDS, MAX_BLOCK = 1 << 20, 1 << 24


def _whole(x: Any, low: int = 0, high: int = 1 << 62) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and low <= x <= high


def _layout(value: Any) -> Dict[str, Any]:
    """A worker's layout of the shards: {"starts": first sample of each shard and the
    number of samples, "block_size", "per_lease", "seed", "shuffle"}."""
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
    if value.get("shuffle") not in SHUFFLES:
        raise MessageError(f"layout 'shuffle' must be one of {', '.join(SHUFFLES)}")
    return {k: value[k] for k in ("starts", "block_size", "per_lease", "seed", "shuffle")}


def _round(header: Dict[str, Any]) -> int:
    value = header.get("round", 0)
    if not _whole(value):
        raise MessageError("field 'round' must be a whole number")
    return value


class LeaseDesk:
    """Answers the workers' `lease` requests and `leases` reports."""

    def __init__(self, num_workers: int, folder: Optional[str] = None, resume: bool = False):
        self.num_workers = num_workers
        self.book: Optional[LeaseBook] = None
        self.layout: Optional[Dict[str, Any]] = None
        self.path = os.path.join(folder, LEASES_FILE) if folder else None
        self.saved: Optional[dict] = self._load() if resume and self.path else None

    def _load(self) -> Optional[dict]:
        """The history a resumed job's book is rebuilt from (None: no leases yet)."""
        if not os.path.exists(self.path):
            return None
        try:
            with open(self.path) as f:
                saved = json.load(f)
            if not isinstance(saved, dict) or not isinstance(saved.get("layout"), dict) \
                    or not isinstance(saved.get("book"), dict):
                raise ValueError("not a lease book")
        except (OSError, ValueError) as e:
            raise UserError(f"--resume: cannot read the block leases from {self.path}: "
                            f"{e}") from None
        return saved

    def _save(self) -> None:
        if self.path and self.book is not None:
            try:
                with open(self.path + ".partial", "w") as f:
                    json.dump({"layout": self.layout, "book": self.book.state()}, f)
                os.replace(self.path + ".partial", self.path)
            except OSError as e:
                log.warning("[scheduler] cannot keep the block leases in %s: %s", self.path,
                            e.strerror or e)

    def request(self, rank: int, header: Dict[str, Any]) -> Dict[str, Any]:
        """The answer to worker `rank`'s `lease` request: its next lease, or the one it
        asks to resume (`resume`: a lease with `skip` at its saved position; the
        answer's lease is null if others have it now)."""
        layout = _layout(header.get("layout"))
        if self.book is None:
            self.layout = layout
            blocks = blocks_of(layout["starts"], layout["block_size"])
            if self.saved is not None and self.saved["layout"] == layout:
                try:
                    self.book = LeaseBook.restored(blocks, layout["per_lease"],
                                                   [layout["seed"]], self.num_workers,
                                                   self.saved["book"], _round(header),
                                                   layout["shuffle"])
                except (KeyError, TypeError, ValueError, AttributeError) as e:
                    raise MessageError(f"--resume: {self.path} is damaged "
                                       f"({type(e).__name__}: {e})") from None
                log.info("[scheduler] block leases as of round %d, from %s", _round(header),
                         self.path)
            else:
                if self.saved is not None:
                    log.warning("[scheduler] the shards or their settings changed since %s: "
                                "the block leases start again", self.path)
                self.book = LeaseBook(blocks, layout["per_lease"], [layout["seed"]],
                                      self.num_workers, shuffle=layout["shuffle"])
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
            self.book.report(rank, done, tuple(at) if at else None, _round(header))
            self._save()

    def lost(self, rank: int) -> None:
        if self.book is not None:
            self.book.lost(rank)

    def granted(self) -> Dict[int, int]:
        """Blocks dealt so far, per worker rank."""
        return dict(self.book.granted) if self.book else {}
