"""A prepared data loader over shards (esync.runtime.api.prepare_data_loader of a ShardDataset).

Blocks are read in this process (esync.data.blocks) and decoded in the user's
DataLoader worker processes, through torchdata's StatefulDataLoader. Before each
round's synchronisation the loader's state as of the round's last batch goes to
data-<n>.json and the scheduler hears which leases the round finished; the round's
record gets that state too (`data`), the bytes and seconds its block reads took
(`read_bytes`, `read_seconds`; `skipped_samples` of corrupt blocks) and, with
--log-samples, its samples' ids per epoch (`sample_ids`: {epoch: [id, ...]}). So a dead
worker's
unfinished leases are trained once, from where its last round left them, and a worker
continuing the job goes on from the round its model has.

With --remote-prep F (esync.runtime.remoteprep) a worker whose rounds stall on preprocessing has
its batches made by Ray tasks instead of its DataLoader workers, from the batch after
those they hold: the sampler's passes are shared (`_Gate`), and each batch it emits
carries the sampler's state as of that batch, so that the state kept is the one as of
the last batch handed out, not of batches in flight (`sampler` in data-<n>.json instead
of the loader's state; either way a worker continues at its exact next sample). Each
round's record then says how many of its batches Ray tasks made (`remote_batches`).
"""
from __future__ import annotations

import logging
import time
import warnings
from collections import deque
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Tuple

import numpy as np
from torch.utils.data import DataLoader, RandomSampler
from torchdata.stateful_dataloader import StatefulDataLoader

from esync import config
from esync.data import WHOLE_NOT_FOR_SHARDS
from esync.data.blocks import BlockSampler
from esync.data.cache import SampleCache
from esync.data.leases import Lease, StaticLeases, blocks_per_lease, runs_of
from esync.data.order import DataSettings
from esync.data.partition import partition
from esync.data.timed import TimedCollate, TimedDataset, samples_in, to_device
from esync.errors import UserError
from esync.runtime.remoteprep import RemotePrep
from esync.runtime.session import Session

log = logging.getLogger(__name__)
# torchdata 0.11 calls torch.set_vital, which torch 2.13 deprecates: a warning per
# process that says nothing to a user
warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)


class RemoteLeases:
    """Leases from the job's scheduler (its LeaseBook), asked for by this worker's node."""

    def __init__(self, node, layout: Dict[str, Any], round_of: Callable[[], int]):
        self.node, self.layout, self.round_of = node, layout, round_of

    def _ask(self, **extra) -> Optional[Lease]:
        answer = self.node.lease({"layout": self.layout, "round": self.round_of(), **extra})
        return Lease.from_dict(answer["lease"]) if answer.get("lease") else None

    def next(self) -> Lease:
        return self._ask()

    def resume(self, lease: Lease) -> Optional[Lease]:
        return self._ask(resume=lease.to_dict())

    def report(self, done: List[str], at: Optional[Tuple[str, int]]) -> None:
        self.node.report_leases({"done": done, "at": list(at) if at else None,
                                 "round": self.round_of()})


def data_split(settings: DataSettings, session: Session) -> str:
    """--data-split, or its default: leased where a scheduler can lease (see config)."""
    if settings.split is not None:
        if settings.split == "whole":
            raise UserError(WHOLE_NOT_FOR_SHARDS)
        if settings.split == "leased" and session.node is None:
            raise UserError("--data-split leased needs the job's scheduler to lease blocks; "
                            "this worker has none (alone, or -m ddp): use --data-split static")
        return settings.split
    return "leased" if session.node is not None and not settings.split_by_class else "static"


class _Gate:
    """The sampler's batches, taken by the DataLoader (its batch sampler) until `closed`,
    and by `take` (remote preprocessing): one pass shared by both, and per batch taken
    the sampler's state just after it (`snapshots`, popped as batches are handed out)."""

    def __init__(self, sampler: BlockSampler):
        self.sampler = sampler
        self.closed = False
        self.current: Optional[Iterator[List[Any]]] = None  # the pass in progress
        self.snapshots: Deque[dict] = deque()

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[List[Any]]:
        while not self.closed:
            batch = self.take()
            if batch is None:
                return
            yield batch

    def take(self) -> Optional[List[Any]]:
        """The next batch of the pass (a new pass if none is in progress); None at its end."""
        if self.current is None:
            self.current = iter(self.sampler)
        try:
            batch = next(self.current)
        except StopIteration:
            self.current = None
            return None
        self.snapshots.append(self.sampler.state_dict())
        return batch

    def state_dict(self) -> dict:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state)
        self.current = None
        self.snapshots.clear()


class ShardLoader:
    """Batches of this worker's blocks or leases (see the module)."""

    def __init__(self, loader: DataLoader, session: Session, settings: DataSettings):
        if loader.batch_size is None:
            raise UserError("prepare_data_loader: the loader has no batch_size (a "
                            "batch_sampler of its own): give it a batch_size")
        session.loader_prepared(loader.batch_size)
        shards = loader.dataset.shards
        self.session, self.settings = session, settings
        blocks = shards.blocks(settings.block_size)
        self.share = len(shards) // session.num_workers
        if self.share == 0 or len(blocks) < session.num_workers:
            raise UserError(f"prepare_data_loader: {len(shards)} samples in {len(blocks)} "
                            f"blocks of {shards.folder} cannot be shared by "
                            f"{session.num_workers} workers: use a smaller --block-size")
        mean_block = shards.read_bytes_total / len(blocks)
        per_lease = blocks_per_lease(self.share, len(blocks) // session.num_workers,
                                     settings.buffer_ratio, settings.block_size,
                                     int(config.BUFFER_MAX_MB * 2**20 // max(1, mean_block)))
        if per_lease == 1 and len(blocks) > session.num_workers:
            log.warning("a CorgiPile buffer of %s holds one block of %d samples: samples "
                        "mix only within a block (on shards packed class by class, give a "
                        "smaller --block-size or a larger --buffer-ratio, or pack them with "
                        "esync-pack --order shuffle)", shards.folder, settings.block_size)
        # --shuffle's order, if the user's loader shuffles; the stored order if not
        shuffle = settings.shuffle if isinstance(loader.sampler, RandomSampler) else "none"
        self.split = data_split(settings, session)
        if self.split == "leased":
            self.source = RemoteLeases(session.node, {
                "starts": shards.starts.tolist(), "block_size": settings.block_size,
                "per_lease": per_lease, "seed": settings.seed, "shuffle": shuffle},
                lambda: session.round)
        else:
            self.source = StaticLeases(self._own_blocks(shards, blocks), per_lease,
                                       [settings.seed, session.rank], shuffle,
                                       prefix=f"r{session.rank}:")
        cache = SampleCache(shards, settings.cache_fraction, settings.block_size,
                            [settings.seed, session.rank],
                            int(settings.cache_fraction * shards.read_bytes_total
                                / session.num_workers)) if settings.cache_fraction else None
        self.sampler = BlockSampler(
            shards, self.source, lambda: session.algorithm.batch_size() or loader.batch_size,
            loader.drop_last, self.share, cache=cache, disk_bandwidth=settings.disk_bandwidth)
        self.gate = _Gate(self.sampler)
        self.loader = StatefulDataLoader(
            TimedDataset(loader.dataset), batch_sampler=self.gate,
            num_workers=loader.num_workers, collate_fn=TimedCollate(loader.collate_fn),
            pin_memory=loader.pin_memory,
            timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
            prefetch_factor=loader.prefetch_factor if loader.num_workers else None,
            snapshot_every_n_steps=1)
        self.trained = 0       # samples handed to the training loop
        self.place = 0.0       # where in the job's data (epochs) the last of them lay
        self._done: List[str] = []
        self._at: Optional[Tuple[str, int]] = None
        self._ids: Dict[str, List[int]] = {}  # per epoch: samples handed out (--log-samples)
        self._read = (0, 0.0, 0, 0, 0)  # so far: block reads' bytes, seconds, skipped
        #                                 samples, cache hits and their bytes
        self.remote = None  # esync.runtime.remoteprep.RemotePrep, with --remote-prep
        if settings.remote_prep is not None:
            self.remote = RemotePrep(loader.dataset, loader.collate_fn, settings.remote_prep)
        self._remote_batches = 0  # of the round, made by Ray tasks
        saved = session.resume_data or {}
        if isinstance(saved.get("sampler"), dict):  # kept by a worker with --remote-prep
            self.gate.load_state_dict(saved["sampler"])
        elif isinstance(saved.get("loader"), dict):
            self.loader.load_state_dict(saved["loader"])
        if saved:
            self.trained = int(self.sampler.drawn)
            self.place = self.sampler.lease.place if self.sampler.lease else 0.0
        # with --remote-prep: where the loader is, as of the last batch handed out
        self._position = {"loader": saved["loader"]} if isinstance(saved.get("loader"), dict) \
            else {"sampler": self.sampler.state_dict()}
        self._state: Dict[str, Any] = {}
        # epochs: of this worker's own blocks (static), of the job's data (leased)
        session.follow_data(lambda: self.place, self._before_push, self._round_fields)

    def _own_blocks(self, shards, blocks: np.ndarray) -> np.ndarray:
        """This worker's share of the blocks, dealt in a seeded order (the first
        `blocks % workers` ranks get one more), or, with -s 1, its equal share of the
        samples sorted by class."""
        s, settings = self.session, self.settings
        if settings.split_by_class:
            labels = shards.labels
            if labels is None:
                raise UserError(f"-s 1 splits by class, but the shards in {shards.folder} "
                                f"have no labels")
            ids = partition(labels, s.num_workers, s.rank, True, settings.seed)
            return runs_of(ids, shards.starts.tolist(), settings.block_size)
        dealt = np.random.default_rng(settings.seed).permutation(len(blocks))
        return blocks[np.sort(dealt[s.rank::s.num_workers])]  # every block is someone's

    def _before_push(self) -> None:
        """The round's last batch is handed out: keep where the loader is (data-<n>.json)
        and tell the scheduler which leases the round finished, before the round is
        pushed, so that any checkpoint of the round has both."""
        where = self._position if self.remote is not None else \
            {"loader": self.loader.state_dict()}
        self._state = {**where, "split": self.split, "rank": self.session.rank}
        self.session.recorder.write_data(self.session.round, self._state)
        self.source.report(self._done, self._at)
        self._done = []

    def _round_fields(self) -> Dict[str, Any]:
        sampler = self.sampler
        read = (sampler.read_bytes, sampler.read_seconds, sampler.skipped, sampler.cache_hits,
                sampler.cache_hit_bytes)
        fields = {"data": self._state,
                  "read_bytes": read[0] - self._read[0],
                  "read_seconds": round(read[1] - self._read[1], 6)}
        if read[2] - self._read[2]:
            fields["skipped_samples"] = read[2] - self._read[2]
        if sampler.cache is not None:  # samples (and their shards' bytes) not read
            fields["cache_hits"] = read[3] - self._read[3]
            fields["cache_bytes"] = read[4] - self._read[4]
        self._read = read
        if self.settings.log_samples:
            fields["sample_ids"], self._ids = self._ids, {}
        if self.remote is not None:
            fields["remote_batches"], self._remote_batches = self._remote_batches, 0
        return fields

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[Any]:
        if self.session.stop_reason is not None:
            self.session.pass_after_stop()
            return
        with self.session.data_pass():
            yield from self._pass()

    def _pass(self) -> Iterator[Any]:
        started, read = time.perf_counter(), self.sampler.read_seconds
        batches = self._batches()  # the DataLoader's workers' first batches are read here
        while True:
            try:
                batch, prep, remote = next(batches)
            except StopIteration:
                return
            emitted = self.sampler.emitted.popleft()
            self._position = {"sampler": self.gate.snapshots.popleft()}
            self._remote_batches += remote
            self._done += emitted.done
            self._at = emitted.at or self._at
            if self.settings.log_samples:
                for sample, epoch in zip(emitted.ids, emitted.epochs):
                    self._ids.setdefault(str(epoch), []).append(sample)
            self.trained += len(emitted.ids)
            self.place = emitted.place
            self.session.batch_fetched(time.perf_counter() - started,
                                       samples_in(batch) or len(emitted.ids),
                                       read=self.sampler.read_seconds - read, prep=prep)
            yield to_device(batch, self.session.device)
            if self.session.stop_reason is not None:
                return
            started, read = time.perf_counter(), self.sampler.read_seconds

    def _batches(self) -> Iterator[Tuple[Any, float, bool]]:
        """The pass's batches in the sampler's order, each with the seconds it took to
        make and whether a Ray task made it: from the DataLoader, or, once rounds stall
        on preprocessing, from Ray tasks (after the DataLoader hands out those it holds),
        and from the DataLoader again if the cluster falls behind."""
        remote = self.remote
        while True:
            if remote is not None and (remote.active or remote.out):
                prepared = remote.next(self.gate.take)
                if prepared is not None:
                    yield prepared
                    continue
                if self.gate.current is None:  # the pass is over
                    return
            self.gate.closed = False
            local = iter(self.loader)
            while True:
                if remote is not None and not self.gate.closed and \
                        remote.should_start(self.session.last_breakdown):
                    self.gate.closed = True  # the DataLoader takes no more batches
                try:
                    batch, prep = next(local)
                except StopIteration:
                    break
                yield batch, prep, False
            if self.gate.current is None or not self.gate.closed:
                return
