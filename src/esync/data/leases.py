"""Block leases: which blocks of a sharded data set a device trains, epoch after epoch.

A block is a run of consecutive samples of one shard (`ShardSet.blocks`). A lease is a
few whole blocks, one CorgiPile buffer: its samples are trained in the order of a
seeded permutation (`Lease.order`), from `skip` on (a lease taken over after its holder
died, with part of it trained).

`--data-split static` (the original's): each device owns an equal share of the blocks
and leases itself its own blocks in a seeded order per epoch (`StaticLeases`).
`--data-split leased`: the scheduler holds one `LeaseBook` for the job; each epoch it
deals the blocks out in a seeded order, to whichever device asks next, so a device
eight times faster takes about eight times more blocks and every sample is trained
once per epoch whatever the devices' speeds. The epoch's last blocks go out one by one,
then halved, so that no device waits long for a slow device's last lease.

A device that dies keeps its unfinished leases reserved while its epoch has other
blocks to deal: restarted, it gets them back and continues at its exact next sample.
Once the epoch has nothing else, they are dealt to others from the sample where the
dead device's last finished round left them: trained once, not lost, not doubled.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np


@dataclass
class Lease:
    """Blocks `ranges` ([first sample, samples] each) of `epoch`, trained in the order
    of a permutation drawn from `seed`, from its `skip`-th sample on."""

    id: str
    epoch: int
    ranges: List[Tuple[int, int]]
    seed: List[int]
    skip: int = 0
    of: int = 1  # leases in its epoch

    @property
    def place(self) -> float:
        """Where the lease lies in the job's data, in epochs: its epoch plus its number
        among the epoch's leases (the end of its id) over their count."""
        return self.epoch + int(self.id.rsplit(".", 1)[-1]) / max(1, self.of)

    @property
    def size(self) -> int:
        return sum(count for _, count in self.ranges)

    def order(self) -> np.ndarray:
        """The lease's sample ids in its buffer's seeded order (all of them; the first
        `skip` were trained already); without a seed, in stored order."""
        ids = np.concatenate([np.arange(first, first + count) for first, count in self.ranges])
        return np.random.default_rng(self.seed).permutation(ids) if self.seed else ids

    def to_dict(self) -> dict:
        return {"id": self.id, "epoch": self.epoch, "ranges": [list(r) for r in self.ranges],
                "seed": list(self.seed), "skip": self.skip, "of": self.of}

    @classmethod
    def from_dict(cls, d) -> "Lease":
        """A lease from a message or a log record (ValueError if malformed)."""
        def whole(x) -> bool:
            return isinstance(x, int) and not isinstance(x, bool) and x >= 0
        if not isinstance(d, dict) or not isinstance(d.get("id"), str) or len(d["id"]) > 64 \
                or not d["id"].rsplit(".", 1)[-1].isdigit() or not whole(d.get("epoch")) \
                or not whole(d.get("skip", 0)) or not whole(d.get("of", 1)):
            raise ValueError("a lease needs an id (ending in .<number>), an epoch and a skip")
        ranges, seed = d.get("ranges"), d.get("seed")
        if not isinstance(ranges, list) or not 0 < len(ranges) <= 4096 or not all(
                isinstance(r, list) and len(r) == 2 and whole(r[0]) and whole(r[1]) and r[1] > 0
                for r in ranges):
            raise ValueError("a lease's ranges must be [first, count] pairs")
        if not isinstance(seed, list) or len(seed) > 8 or not all(whole(s) for s in seed):
            raise ValueError("a lease's seed must be a few whole numbers")
        lease = cls(d["id"], d["epoch"], [(r[0], r[1]) for r in ranges], seed,
                    d.get("skip", 0), d.get("of", 1))
        if lease.skip > lease.size:
            raise ValueError("a lease cannot skip more samples than it has")
        return lease


def blocks_of(starts: Sequence[int], block_size: int) -> np.ndarray:
    """[first sample, samples] of each block of shards whose first samples are `starts`
    (the last entry: the number of samples): runs of `block_size` consecutive samples,
    fewer at a shard's end, never crossing a shard."""
    out = [(s, min(block_size, int(end) - s)) for first, end in zip(starts, starts[1:])
           for s in range(int(first), int(end), block_size)]
    return np.array(out, dtype=np.int64).reshape(-1, 2)


def runs_of(ids: np.ndarray, starts: Sequence[int], block_size: int) -> np.ndarray:
    """Blocks ([first, samples]) of the samples `ids` (in their order): runs of
    consecutive ids within one shard, cut to `block_size`."""
    ids = np.asarray(ids, dtype=np.int64)
    if not len(ids):
        return np.zeros((0, 2), np.int64)
    shard = np.searchsorted(np.asarray(starts), ids, side="right")
    cuts = np.flatnonzero((np.diff(ids) != 1) | (np.diff(shard) != 0)) + 1
    out = []
    for run in np.split(ids, cuts):
        out += [(int(run[i]), min(block_size, len(run) - i)) for i in range(0, len(run), block_size)]
    return np.array(out, dtype=np.int64).reshape(-1, 2)


def blocks_per_lease(samples: int, blocks: int, ratio: float, block_size: int,
                     max_blocks: Optional[int] = None) -> int:
    """Whole blocks in one buffer: `ratio` of a device's `samples` (at least one; at most
    `max_blocks`, the byte bound)."""
    count = max(1, int(ratio * samples) // block_size)
    return max(1, min(count, blocks, max_blocks or count))


def epoch_leases(blocks: np.ndarray, per_lease: int, seed: Sequence[int], epoch: int,
                 prefix: str = "", tail: int = 0, shuffle: str = "corgipile") -> List[Lease]:
    """One epoch's leases of `blocks` ([first, count] rows): the blocks in a seeded order,
    `per_lease` at a time; the last `tail` blocks one at a time, the very last of them
    (up to `tail // 2`) halved. `shuffle` (--shuffle): `corgipile` (and `random`, which
    shards, read block by block, cannot do sample by sample) draws a new order of
    blocks and of each buffer every epoch, `once` keeps the first epoch's, `none` keeps
    the stored order."""
    drawn = 0 if shuffle == "once" else epoch
    rng = np.random.default_rng([*seed, drawn])
    picked = range(len(blocks)) if shuffle == "none" else rng.permutation(len(blocks))
    order = [tuple(int(v) for v in blocks[i]) for i in picked]
    tail = min(tail, len(order))
    head, rest = order[:len(order) - tail], order[len(order) - tail:]
    groups = [head[i:i + per_lease] for i in range(0, len(head), per_lease)]
    singles = rest[:len(rest) - tail // 2]
    groups += [[b] for b in singles]
    for first, count in rest[len(singles):]:
        half = (count + 1) // 2
        groups += [[(first, half)]] + ([[(first + half, count - half)]] if count > half else [])
    return [Lease(f"{prefix}{epoch}.{i}", epoch, g,
                  [] if shuffle == "none" else [*seed, drawn, i], 0, len(groups))
            for i, g in enumerate(groups)]


class StaticLeases:
    """A device's own share of the blocks, leased to itself in a seeded order per epoch
    (--data-split static)."""

    def __init__(self, blocks: np.ndarray, per_lease: int, seed: Sequence[int],
                 shuffle: str = "corgipile", prefix: str = ""):
        self.blocks, self.per_lease, self.seed = blocks, per_lease, list(seed)
        self.shuffle, self.prefix = shuffle, prefix  # prefix: whose leases (their ids)
        self._epoch, self._leases, self._next = -1, [], 0

    def _load(self, epoch: int) -> None:
        if epoch != self._epoch:
            self._epoch = epoch
            self._leases = epoch_leases(self.blocks, self.per_lease, self.seed, epoch,
                                        self.prefix, shuffle=self.shuffle)

    def next(self) -> Lease:
        if self._epoch < 0 or self._next >= len(self._leases):
            self._load(self._epoch + 1)
            self._next = 0
        self._next += 1
        return self._leases[self._next - 1]

    def resume(self, lease: Lease) -> Optional[Lease]:
        """Go on from `lease` (a saved position): it, then the ones after it (None, and
        the epoch from its start, if this device's epoch has no such lease)."""
        self._load(lease.epoch)
        found = [i for i, mine in enumerate(self._leases) if mine.id == lease.id]
        self._next = found[0] + 1 if found else 0
        return lease if found else None

    def report(self, done: Sequence[str], at: Optional[Tuple[str, int]]) -> None:
        pass  # nobody else takes a static device's blocks


@dataclass
class _Held:
    lease: Lease
    rank: int
    trained: int  # samples of its order trained in finished rounds (from lease.skip)


#: reports kept per lease in the book's history (the newest), and fully trained epochs
#: kept behind the newest one, so that a resumed job finds its checkpoint round in it
KEEP_REPORTS, KEEP_EPOCHS = 16, 2


@dataclass
class LeaseBook:
    """The job's leases, kept by the scheduler (--data-split leased). `history` says,
    per lease dealt, its epoch, holder, the round that finished it and where the rounds
    left it, so that a job resumed from a checkpoint of round R gets the book as of R
    (`restored`)."""

    blocks: np.ndarray
    per_lease: int
    seed: List[int]
    num_workers: int
    epoch: int = -1
    queue: List[Lease] = field(default_factory=list)
    held: Dict[str, _Held] = field(default_factory=dict)
    #: a dead device's unfinished leases, kept for it while its epoch has other blocks
    reserved: Dict[int, List[_Held]] = field(default_factory=dict)
    granted: Dict[int, int] = field(default_factory=dict)  # blocks dealt, per rank
    history: Dict[str, dict] = field(default_factory=dict)
    shuffle: str = "corgipile"

    def _epoch_leases(self, epoch: int) -> List[Lease]:
        return epoch_leases(self.blocks, self.per_lease, self.seed, epoch,
                            tail=2 * self.num_workers, shuffle=self.shuffle)

    def grant(self, rank: int) -> Lease:
        """The next lease for device `rank`."""
        while not self.queue:
            waiting = [h for hs in self.reserved.values() for h in hs]
            if waiting:  # the epoch has nothing else: the dead devices' leases go out
                self.reserved = {}
                self.queue = [_rest(h) for h in waiting]
                break
            self.epoch += 1
            self.queue = self._epoch_leases(self.epoch)
        return self._hold(self.queue.pop(0), rank, None)

    def _hold(self, lease: Lease, rank: int, trained: Optional[int]) -> Lease:
        self.held[lease.id] = _Held(lease, rank, lease.skip if trained is None else trained)
        self.granted[rank] = self.granted.get(rank, 0) + len(lease.ranges)
        entry = self.history.setdefault(lease.id, {"epoch": lease.epoch, "done": None, "at": []})
        entry["rank"] = rank
        return lease

    def report(self, rank: int, done: Sequence[str], at: Optional[Tuple[str, int]],
               round_: int = 0) -> None:
        """Device `rank` finished round `round_`: leases `done` are trained, and lease
        `at[0]` up to sample `at[1]` of its order. (Reports of leases it no longer
        holds, as a late report of a device declared dead, are ignored.)"""
        for lease_id in done:
            if lease_id in self.held and self.held[lease_id].rank == rank:
                del self.held[lease_id]
                self.history[lease_id]["done"] = round_
        if at is not None:
            held = self.held.get(at[0])
            if held is not None and held.rank == rank and 0 <= at[1] <= held.lease.size:
                held.trained = max(held.trained, at[1])
                reports = self.history[at[0]]["at"]
                reports.append([round_, held.trained])
                del reports[:-KEEP_REPORTS]
        self._forget_old_epochs()

    def _forget_old_epochs(self) -> None:
        unfinished = [e["epoch"] for e in self.history.values() if e["done"] is None]
        oldest = min(unfinished, default=self.epoch) - KEEP_EPOCHS
        if any(e["epoch"] < oldest for e in self.history.values()):
            self.history = {i: e for i, e in self.history.items() if e["epoch"] >= oldest}

    def lost(self, rank: int) -> None:
        """Device `rank` died: its unfinished leases wait for it (see the module)."""
        mine = [h for h in self.held.values() if h.rank == rank]
        for h in mine:
            del self.held[h.lease.id]
        self.reserved.setdefault(rank, []).extend(mine)

    def resume(self, rank: int, lease: Lease, position: int) -> Optional[Lease]:
        """Device `rank`, restarted, asks to go on with `lease` at `position` (its saved
        state): the lease, if it is still reserved for it or not dealt again (its other
        reserved leases go back to the queue's front); None if others have it now."""
        mine = self.reserved.pop(rank, [])
        found = next((h for h in mine if h.lease.id == lease.id), None)
        self.queue[:0] = [_rest(h) for h in mine if h is not found]
        if found is None:
            queued = next((q for q in self.queue if q.id == lease.id), None)
            if queued is None:
                return None
            self.queue.remove(queued)
            found = _Held(queued, rank, queued.skip)
        if not found.lease.skip <= position <= found.lease.size:
            self.queue.insert(0, _rest(found))
            return None
        return self._hold(Lease(**{**found.lease.__dict__, "skip": position}), rank, position)

    def state(self) -> dict:
        """What `restored` needs (JSON): the epoch and the history."""
        return {"epoch": self.epoch, "history": self.history}

    @classmethod
    def restored(cls, blocks: np.ndarray, per_lease: int, seed: List[int], num_workers: int,
                 state: dict, round_: int, shuffle: str = "corgipile") -> "LeaseBook":
        """The book as it was when round `round_` ended (the checkpoint a resumed job
        restores): leases trained by then are done; those its holders were in the middle
        of are reserved for them at their place; every other lease dealt since goes back
        to the queue, in its epoch's order."""
        book = cls(blocks, per_lease, seed, num_workers, shuffle=shuffle)
        history = state.get("history", {})
        epochs = sorted({e["epoch"] for e in history.values()})
        for epoch in epochs:
            for lease in book._epoch_leases(epoch):
                entry = history.get(lease.id)
                if entry is not None and entry["done"] is not None and entry["done"] <= round_:
                    book.history[lease.id] = {**entry, "at": []}
                    continue
                reports = [pos for r, pos in (entry or {}).get("at", []) if r <= round_]
                if reports and reports[-1] > 0:
                    book.reserved.setdefault(entry["rank"], []).append(
                        _Held(lease, entry["rank"], reports[-1]))
                else:
                    book.queue.append(lease)
        book.epoch = epochs[-1] if epochs else -1
        return book


def _rest(held: _Held) -> Lease:
    """What is left of a lease: the same order, from the first sample not trained."""
    return Lease(**{**held.lease.__dict__, "skip": held.trained})
