"""Measuring one device of a job for `esync-stalls` (esync/launch/stalls.py): short runs of the
built-in loop in this process, alone (`-m local`), through the real loader and the real
model, with the device's --slowdown, each logging its rounds into a temporary folder
whose records (their `breakdown`, `prep_seconds`, `read_seconds`) are read back.

Three runs, as DS-Analyzer's differential analysis makes them:
- *synthetic*: one real batch of the job's shape repeated, no loader: the rate the
  device's computing allows (the maximum ingestion rate);
- *cached*: the job's loader, its shards read once first so that the page cache holds
  them, and no emulated storage (--disk-bandwidth off): what decoding costs; made with
  0 and with 1 DataLoader workers too (where the job's --loader-workers is another
  number), from which the model takes its costs (`costs`: esync.stalls.stallmodel's c0, p0,
  c1, w);
- *cold*: the same with the shards evicted from the page cache before the run
  (posix_fadvise(POSIX_FADV_DONTNEED) per file, no root needed, checked with mincore;
  failing that, /proc/sys/vm/drop_caches, which needs root: the whole machine's clean
  pages) and the job's --disk-bandwidth, for at most one pass over the data (a later
  pass could find it in the page cache): what reading from storage costs. Which
  eviction took effect, if any, is said.

After each run its DataLoader worker processes, which the stopped loop leaves waiting,
are ended (`end_loader_workers`).

A run's first WARMUP share of its rounds' time (the DataLoader's workers starting,
the first batches) is left out of its figures. A sample cache (--cache-fraction) is
off in all three: the prediction puts it back (esync.stalls.stallmodel).
"""
from __future__ import annotations

import dataclasses
import gc
import glob
import json
import logging
import multiprocessing
import os
import statistics
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence

import torch

from esync.data import IN_MEMORY, SHARDS_PREFIX
from esync.data.pagecache import Residency, drop_caches, fadvise_dontneed
from esync.options import Options
from esync.stalls.stallmodel import Costs

#: share of a run's time (from its start) left out as warm-up
WARMUP = 0.25
#: a share of the shards' pages still cached above this: the eviction did not work
STILL_CACHED = 0.05
#: a run with one DataLoader worker is bound by it (its period is the run's) where the
#: typical batch waits this share of the period and the worker decodes at least
#: WORKER_BUSY of it (else the wait is receiving the batch)
PREP_BOUND = 0.05
WORKER_BUSY = 0.5


@dataclass
class Run:
    """A run's steady part: per batch (seconds), its wall time, the breakdown's
    categories, and the work behind the stalls."""

    batches: int
    samples: int
    seconds: float                  # wall time of those batches
    breakdown: Dict[str, float]     # seconds, summed over them
    prep_seconds: float             # decoding work, wherever it ran
    read_seconds: float             # block reads (storage, or the page cache)
    read_bytes: int
    slept: float                    # the --slowdown's waits (in `compute`)
    typical_prep: float             # the median round's prep stall

    @property
    def rate(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    def per_batch(self, seconds: float) -> float:
        return seconds / max(1, self.batches)


def steady(records: Sequence[dict]) -> Run:
    """The run's rounds after the warm-up (at least the last half of them), cut to
    whole periods of its block reads, which come a lease (several batches) at a time:
    from the first round that read blocks up to the last one, where there are two."""
    if not records:
        raise RuntimeError("the run logged no rounds")
    records = sorted(records, key=lambda r: r["num_iters"])
    end = records[-1]["total_time"]
    start = min(WARMUP * end, records[len(records) // 2 - 1]["total_time"]
                if len(records) > 1 else 0.0)
    kept = [r for r in records if r["total_time"] > start] or records[-1:]
    reads = [i for i, r in enumerate(kept) if r.get("read_bytes")]
    if len(reads) >= 2:
        kept = kept[reads[0]:reads[-1]]
    breakdown: Dict[str, float] = {}
    for r in kept:
        for k, v in r.get("breakdown", {}).items():
            breakdown[k] = breakdown.get(k, 0.0) + v
    return Run(batches=sum(len(r.get("time", {})) or 1 for r in kept),
               samples=sum(r["num_samples"] for r in kept),
               seconds=sum(breakdown.values()),
               breakdown=breakdown,
               prep_seconds=sum(r.get("prep_seconds", 0.0) for r in kept),
               read_seconds=sum(r.get("read_seconds", 0.0) for r in kept),
               read_bytes=sum(r.get("read_bytes", 0) for r in kept),
               slept=sum(t.get("slowdown", 0.0) for r in kept for t in r.get("time", {}).values()),
               typical_prep=statistics.median(
                   r.get("breakdown", {}).get("prep", 0.0) / max(1, len(r.get("time", {})))
                   for r in kept))


def read_records(log_dir: str) -> List[dict]:
    out = []
    for path in glob.glob(os.path.join(log_dir, "*", "*", "iter-*.json")):
        with open(path) as f:
            out.append(json.load(f))
    return out


def _repeated(session, inputs: torch.Tensor, targets: torch.Tensor) -> Iterator:
    """One real batch over and over, on the session's device (the synthetic run)."""
    inputs, targets = inputs.to(session.device), targets.to(session.device)
    while session.stop_reason is None:
        session.batch_size()
        session.batch_fetched(0.0, len(targets))
        yield inputs, targets


def train_alone(opts: Options, synthetic: bool = False) -> Run:
    """`opts` (alone, with a --time-limit and a log folder) trained by the built-in loop
    in this process; its steady part. `synthetic`: on one batch repeated."""
    from esync.runtime import join
    from esync.runtime.task import task_of
    from esync.runtime.train import train

    plan = join.check(opts, None)
    task = task_of(opts)
    with join.join(plan, None) as session:
        model = task.build_model(opts.network)
        feed = _repeated(session, *task.sample(opts.batch_size)) if synthetic else None
        train(session, model, task, opts.batch_size, session.algorithm.learning_rate(opts),
              opts.momentum, opts.weight_decay, feed=feed)
    end_loader_workers()
    return steady(read_records(opts.log_dir))


def end_loader_workers() -> None:
    """End the DataLoader worker processes a stopped run left waiting for work, then
    collect their loader. Left to the garbage collector, whose cycles hold the loader,
    each would be joined for 5 s (torch's MP_STATUS_CHECK_INTERVAL: the None that
    tells it to stop does not reach it) in the middle of the next run."""
    for child in multiprocessing.active_children():
        child.terminate()
        child.join()
    gc.collect()


def model_bytes(opts: Options) -> int:
    """Bytes of the vector a round moves: the parameters that learn and the
    floating-point buffers, in float32 (esync.comm.flat)."""
    from esync.runtime.task import task_of

    model = task_of(opts).build_model(opts.network)
    count = sum(p.numel() for p in model.parameters() if p.requires_grad)
    count += sum(b.numel() for b in model.buffers() if b.is_floating_point())
    return 4 * count


# --- the page cache ------------------------------------------------------------------------
def shard_paths(opts: Options) -> List[str]:
    """The training shards' files ([] for data sets not on shards)."""
    if not opts.dataset.startswith(SHARDS_PREFIX):
        return []
    from esync.data.shards import ShardSet

    return [f.path for f in ShardSet(opts.dataset[len(SHARDS_PREFIX):], "train").files]


def read_through(paths: Sequence[str]) -> None:
    """Read every file once, so that the page cache holds it."""
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.read(8 << 20):
                pass


def evict(paths: Sequence[str]) -> str:
    """Drop `paths` from the page cache (see the module); what took effect."""
    if not paths:
        return "nothing to evict (the data are not on shards)"
    residency = Residency()
    error = fadvise_dontneed(paths)
    left = residency.share(paths)
    if not error and (left is None or left <= STILL_CACHED):
        checked = "unchecked" if left is None else f"{100 * left:.0f}% left cached"
        return f"evicted by posix_fadvise(DONTNEED) ({checked})"
    why = error or f"{100 * left:.0f}% left cached"
    dropped = drop_caches()
    left = residency.share(paths)
    if not dropped and (left is None or left <= STILL_CACHED):
        return f"evicted by /proc/sys/vm/drop_caches (posix_fadvise: {why})"
    return (f"not evicted: neither took effect (posix_fadvise: {why}; drop_caches: "
            f"{dropped or 'pages still cached'}), so cold = cached")


# --- one device -------------------------------------------------------------------------
def run_options(opts: Options, label: str, slowdown: float, log_dir: str, seconds: float,
                threads: int, disk_bandwidth: Optional[float]) -> Options:
    """The job's worker settings as one short run alone: the device's slowdown, no link,
    no cache, no evaluation, no other stop criterion than the time."""
    return dataclasses.replace(
        opts, mode="local", backend="ps", use_dcasgd=False, balance_batches=False,
        compress="none", data_split=None if opts.data_split != "static" else "static",
        cache_fraction=0.0, disk_bandwidth=disk_bandwidth, remote_prep=None,
        slowdown=slowdown, bandwidth=None, latency=0.0, device_name=label,
        log_dir=log_dir, tensorboard=None, eval_every=0, eval_interval=1e12,
        num_threads=threads, epochs=None, max_rounds=None, time_limit=seconds,
        target_accuracy=None, target_loss=None, checkpoint_dir=None, resume=False,
        log_samples=False)


@dataclass
class Measured:
    """A device's runs: `synthetic`, `cached` and `cold` at the job's --loader-workers
    K, and the cached runs at K = 0 and K = 1 the model needs (`cached_by_workers`)."""

    synthetic: Run
    cached: Run
    cold: Run
    cached_by_workers: Dict[int, Run]
    eviction: str
    batch_bytes: float = 0.0  # a batch's bytes in the shards, on average (0: no shards)


def measure(opts: Options, label: str, slowdown: float, work_dir: str, seconds: float,
            threads: int) -> Measured:
    """The device's runs (see the module)."""
    quiet = logging.getLogger("esync")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        def run(kind: str, workers: int, disk: Optional[float] = None,
                synthetic: bool = False, first_pass: bool = False) -> Run:
            folder = os.path.join(work_dir, label, kind)
            settings = run_options(dataclasses.replace(opts, loader_workers=workers), label,
                                   slowdown, folder, seconds, threads, disk)
            if first_pass:  # what it reads later, the page cache may hold
                settings = dataclasses.replace(settings, epochs=1.0)
            try:
                return train_alone(settings, synthetic)
            except RuntimeError as e:
                raise RuntimeError(f"device {label}, {kind} run: {e}") from None

        synthetic = run("synthetic", 0, synthetic=True)
        if opts.dataset in IN_MEMORY:  # no loader, nothing on disk
            cached = {0: run("cached-0", 0)}
            return Measured(synthetic, cached[0], cached[0], cached,
                            "nothing to evict: the data set is held in memory")
        paths = shard_paths(opts)
        batch_bytes = opts.batch_size * _sample_bytes(opts)
        read_through(paths)
        job = opts.loader_workers
        cached = {k: run(f"cached-{k}", k) for k in sorted({0, 1, job})}
        eviction = evict(paths)
        cold = run("cold", job, opts.disk_bandwidth, first_pass=True)
    finally:
        quiet.setLevel(level)
    return Measured(synthetic, cached[job], cold, cached, eviction, batch_bytes)


def _sample_bytes(opts: Options) -> float:
    """The mean bytes of a training sample in the shards (0: not on shards)."""
    if not opts.dataset.startswith(SHARDS_PREFIX):
        return 0.0
    from esync.data.shards import ShardSet

    shards = ShardSet(opts.dataset[len(SHARDS_PREFIX):], "train")
    return shards.read_bytes_total / len(shards)


def costs(m: Measured, batch: int, slowdown: float, cores: int) -> Costs:
    """The model's costs per batch (esync.stalls.stallmodel) from a device's runs."""
    own = m.cached_by_workers[0]
    shared = m.cached_by_workers.get(1, own)  # none: a data set held in memory

    def per(run: Run, seconds: float) -> float:
        return run.per_batch(seconds)

    def compute(run: Run) -> float:  # forward, backward, update, without the slowdown's wait
        return per(run, run.breakdown.get("compute", 0.0) - run.slept)

    def fetch(run: Run) -> float:
        """A batch's reads at the run's speed: a run's few batches may hold more or
        fewer of the reads, which come a lease (several batches) at a time."""
        if not (m.batch_bytes and run.read_bytes):
            return per(run, run.read_seconds)
        return run.read_seconds / run.read_bytes * m.batch_bytes

    period = per(shared, shared.seconds)
    work = per(shared, shared.prep_seconds)
    waited = per(shared, shared.breakdown.get("prep", 0.0))
    if shared.typical_prep >= PREP_BOUND * period and work >= WORKER_BUSY * period:
        worker, receive, respawn = period, 0.0, 0.0  # the worker is the bottleneck
    else:  # the loop is: its typical wait is receiving a batch, the rest new workers'
        worker, receive = work, shared.typical_prep
        respawn = max(0.0, waited - receive)
    return Costs(batch=batch, slowdown=slowdown, compute=compute(own),
                 compute_shared=compute(shared), receive=receive, respawn=respawn,
                 other=per(own, own.seconds - sum(own.breakdown.get(k, 0.0) for k in (
                     "fetch", "prep", "compute"))),
                 prep=per(own, own.prep_seconds), worker=worker,
                 fetch_cached=fetch(own), fetch_cold=fetch(m.cold), cores=cores,
                 loader=1 in m.cached_by_workers)
