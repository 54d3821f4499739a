"""A user's DataLoader over this worker's partition (esync.runtime.api.prepare_data_loader):
the same data set, batch size, workers and collate function, sampled in the worker's
order (its partition, in --shuffle's order, resumable at its exact next sample), in
batches of the size the algorithm asks for, moved to the device, and timed for the
round's log record.

Shards (a ShardDataset) are read block by block instead (esync.data.blocks): this
worker's own blocks, or blocks the scheduler leases to it (`--data-split`), through
torchdata's StatefulDataLoader, whose state as of the last batch handed out goes into
each round's record, so that a worker continuing a job goes on at its exact next
sample."""
from __future__ import annotations

import math
import time
from typing import Any, Iterator, List, Optional, Tuple

import torch
from torch.utils.data import DataLoader, RandomSampler

from esync.data.decode import ShardDataset
from esync.data.order import DataSettings, WorkerOrder, draws_whole, labels_of
from esync.data.timed import TimedCollate, TimedDataset, samples_in, to_device
from esync.errors import UserError
from esync.runtime.session import Session


class _Batches(torch.utils.data.Sampler):
    """The rest of the current epoch of a worker's order, in batches of the loader's
    size, or of the size the algorithm asks for; with `endless`, the epochs after it
    too, for as long as the loader takes batches (a pass that is an epoch of the job's:
    SampleLoader)."""

    def __init__(self, order: WorkerOrder, batch_size: int, drop_last: bool,
                 session: Session, endless: bool = False):
        self.order, self.batch_size, self.drop_last = order, batch_size, drop_last
        self.session, self.endless = session, endless

    def __iter__(self) -> Iterator[List[int]]:
        epoch, start = divmod(self.order.samples_drawn, len(self.order))
        while True:
            rest = self.order.order.order(epoch).tolist()
            while start < len(rest):
                size = self.session.algorithm.batch_size() or self.batch_size
                batch = rest[start:start + size]
                if len(batch) < size and self.drop_last:
                    break
                yield batch
                start += size
            if not self.endless:
                return
            epoch, start = epoch + 1, 0

    def __len__(self) -> int:
        whole, part = divmod(self.order.share, self.batch_size)
        return whole + (1 if part and not self.drop_last else 0)


class _SharedBatches(torch.utils.data.Sampler):
    """Speed-balanced DDP: each local iteration takes the next global batch of an order
    of the whole data set (the same on every rank), this rank the part of it the
    algorithm says (`batch_slice`: in proportion to its speed), so that every rank takes
    as many local iterations in a pass (a pass ends with the epoch's last whole global
    batch) and every sample is trained once in it, whatever the batches."""

    def __init__(self, order: WorkerOrder, session: Session):
        self.order, self.session = order, session

    def __iter__(self) -> Iterator[List[int]]:
        epoch, start = divmod(self.order.samples_drawn, len(self.order))
        ids = self.order.order.order(epoch).tolist()
        while True:
            offset, size, whole = self.session.algorithm.batch_slice()
            if start + whole > len(ids):
                return
            yield ids[start + offset:start + offset + size]
            start += whole

    def __len__(self) -> int:
        return len(self.order) // self.session.algorithm.batch_slice()[2]


def job_loader(loader: DataLoader, session: Session, settings: DataSettings):
    """A data loader over this worker's partition (prepare_data_loader)."""
    if isinstance(loader.dataset, ShardDataset):
        # torchdata's StatefulDataLoader: imported only where shards are read
        from esync.runtime.shardloader import ShardLoader

        return ShardLoader(loader, session, settings)
    return SampleLoader(loader, session, settings)


class SampleLoader:
    """A data loader over this worker's partition of a map-style data set.

    A pass is, in order of the algorithm's kind:
    - speed-balanced DDP (`batch_slice`): one epoch of the whole data set in global
      batches that the ranks share (_SharedBatches);
    - where the job counts the samples it trains (`job_epochs`: the parameter-server
      and all-reduce modes), one epoch of the job's: it ends after the round in which
      every worker together has trained as many samples as one pass over every
      partition holds, this worker's order going on past its partition's end as
      needed (--data-split whole: its order is of the whole data set, so that a device
      that trains more than its share, or alone, does not go round its own share),
      so that devices of different speeds end their passes, and an epoch loop, after
      the same round (under SSGD, exactly a pass over the partition);
    - otherwise (plain DDP, one device alone) one epoch of this worker's partition.
    In a job with a scheduler, where it is (the samples drawn from its order) goes into
    data-<n>.json before each round's synchronisation, so that a worker continuing the
    job (rejoining it, or resuming it) goes on at its next sample."""

    def __init__(self, loader: DataLoader, session: Session, settings: DataSettings):
        dataset = loader.dataset
        if loader.batch_size is None:
            raise UserError("prepare_data_loader: the loader has no batch_size (a "
                            "batch_sampler of its own): give it a batch_size")
        algorithm = session.algorithm
        #: the training loader (the first prepared): it says where the job's data is
        self.primary = session.loader_prepared(loader.batch_size)
        # (-s 1 keeps each rank on its own classes: its own partition, as plain DDP's)
        shared = self.primary and algorithm.batch_slice() is not None \
            and not settings.split_by_class
        shuffle = isinstance(loader.sampler, RandomSampler)
        self.job_epochs = self.primary and algorithm.job_epochs and not shared
        try:
            self.order = WorkerOrder(labels_of(dataset), 0 if shared else session.rank,
                                     1 if shared else session.num_workers, settings, shuffle,
                                     whole=draws_whole(settings, self.job_epochs))
        except ValueError as e:
            raise UserError(f"prepare_data_loader: {e}") from None
        saved = (session.resume_data or {}) if self.primary else {}
        if isinstance(saved.get("drawn"), int) and saved["drawn"] >= 0:
            self.order.samples_drawn = saved["drawn"]
        elif self.primary:  # a log from before data-<n>.json held the position
            self.order.skip_to(session.resume_epoch)
        self.session, self.shared = session, shared
        share = self.order.share
        per_pass = share - (share % loader.batch_size if loader.drop_last else 0)
        #: the samples of one epoch of the job's: a pass over every partition
        self.epoch_samples = max(1, per_pass * session.num_workers)
        if self.primary:  # where a worker can rejoin the job, or resume it: its position
            session.follow_data(self.epochs_done, before_push=self._keep_position
                                if session.node is not None else None)
        sampler = _SharedBatches(self.order, session) if shared else \
            _Batches(self.order, loader.batch_size, loader.drop_last, session,
                     endless=self.job_epochs)
        self.batch_size, self.drop_last = loader.batch_size, loader.drop_last
        #: a batch fetched as the job's epoch ended while this device sat rounds out:
        #: the next pass trains it first
        self._held: Optional[Tuple[Any, Any, Optional[int]]] = None
        self.loader = DataLoader(
            TimedDataset(dataset), batch_sampler=sampler,
            num_workers=loader.num_workers, collate_fn=TimedCollate(loader.collate_fn),
            pin_memory=loader.pin_memory, timeout=loader.timeout,
            worker_init_fn=loader.worker_init_fn,
            prefetch_factor=loader.prefetch_factor if loader.num_workers else None,
            persistent_workers=False)

    def epochs_done(self) -> float:
        """Epochs trained: the job's (job_epochs), else of this worker's order."""
        if self.job_epochs:
            return self.session.job_samples() / self.epoch_samples
        return self.order.epochs_done

    def _keep_position(self) -> None:
        self.session.recorder.write_data(self.session.round,
                                         {"drawn": self.order.samples_drawn})

    def __len__(self) -> int:
        """Local iterations of a pass over this worker's partition (speed-balanced DDP:
        of the data set's global batches): what a plain loop over this worker's
        DataLoader would take, the number a schedule sized in steps (epochs times
        len(loader)) counts with (prepare_scheduler)."""
        return len(self.loader.batch_sampler) if self.shared else \
            len(_Batches(self.order, self.batch_size, self.drop_last, self.session))

    def __iter__(self) -> Iterator[Any]:
        session = self.session
        if session.stop_reason is not None:
            session.pass_after_stop()
            return
        if not self.primary:
            yield from self._pass()
            return
        ends = (math.floor(self.epochs_done() + 1e-9) + 1) * self.epoch_samples
        with session.data_pass(ends if self.job_epochs else None):
            yield from self._pass()

    def _epoch_trained(self) -> bool:
        """Job epochs: the job's epoch is trained, no round is under way and the job goes
        on; every worker ends its pass here (Session.pass_ended). Once the job stopped the
        batch in hand is yielded, as at any stop: its step is not taken, and the script's
        scheduler.step() after it comes to the job's last round."""
        session = self.session
        return self.job_epochs and session.stop_reason is None and session.pass_ended() \
            and not session.in_round

    def _pass(self) -> Iterator[Any]:
        session = self.session
        started = time.perf_counter()  # starting the workers counts as the first wait
        for batch, prep, count in self._fetched():
            session.batch_fetched(time.perf_counter() - started, count, prep=prep)
            if self._epoch_trained():  # while this device sat rounds out: the batch is
                self._held = (batch, prep, count)  # the next pass's first
                return
            yield to_device(batch, session.device)
            if session.stop_reason is not None or self._epoch_trained():
                return
            started = time.perf_counter()
        if self.shared or not self.job_epochs:
            self.order.next_epoch()  # a loader dropping its last batch: skip the rest

    def _fetched(self) -> Iterator[Tuple[Any, Any, Optional[int]]]:
        """(batch, prep, samples) of the pass: first a batch held from the last pass
        (fetched as its epoch ended), then the loader's, each counted as drawn."""
        if self._held is not None:
            held, self._held = self._held, None
            yield held
        for batch, prep in self.loader:
            count = samples_in(batch)
            self._drawn(count or 0)
            yield batch, prep, count

    def _drawn(self, count: int) -> None:
        """Count a batch handed out; where the order's epoch ends with fewer samples
        than a batch and the loader drops them, skip them (as the sampler does)."""
        if self.shared:
            self.order.samples_drawn += self.session.algorithm.batch_slice()[2]
            return
        self.order.samples_drawn += count
        left = len(self.order) - self.order.samples_drawn % len(self.order)
        if self.job_epochs and self.drop_last and left < self.batch_size:
            self.order.next_epoch()
