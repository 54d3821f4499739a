"""`esync-stalls`' arithmetic: a device's measured costs -> its stalls and what-ifs.
Pure arithmetic, no torch (esync.stalls.stallprobe measures; esync/launch/stalls.py prints).

Per batch of B samples, in seconds, measured on the device:

    F    its --slowdown, which scales the computing only (a slower accelerator; its
         storage and CPUs are as fast): F c is the computing with the slowdown's wait
    c0   forward, backward, update on a batch decoded in the training process
    c1   the same on a batch from DataLoader workers (it arrives in shared memory)
    r    receiving a batch from the workers: the typical wait when they keep up
    e    the rest of the waits for workers, per batch: new workers each epoch (a
         DataLoader starts its workers with each pass)
    o    the rest of the training loop (logging the round, ...)
    p0   decoding a batch in the training process
    w    a DataLoader worker's time per batch: decoding, collation into shared
         memory, receiving its samples (its period, where it is the bottleneck)
    fw   reading the batch's samples from shards in the page cache; fc from storage
    n    CPU cores of the machine

Stages: *fetch* (block reads) runs in the training process; *prep* (decoding) in the
training process (K = 0) or in K DataLoader workers, in parallel with compute; then
*compute*. A memory cache of a fraction x of the samples (MinIO's policy: a fixed x,
never fetched again after the first epoch) leaves f = (1-x) fc to read.

    loop(K, x) = o + F c0 + f + p0                         K = 0
               = o + F c1 s + f + r + e                    K >= 1
    cpu(K, x)  = o + c + (1-x) fw + (p0 if K=0 else w)     work on the n cores
    batch(K, x) = loop                                     K = 0
                = max(loop, w s / K, cpu / n)              K >= 1: the slowest stage

where s = q(K) / q(1), q(K) = max(1, (K + 1/F) / n), is how much slower computing and
decoding run than with one worker (c1 and w were measured so) once the K workers and
the training process (busy 1/F of its time: the slowdown's wait leaves its core free)
are more than the cores: they share them.

Communication, once a round of b local iterations, from the vector of N bytes the
round moves and the device's link (Mbit/s M, one-way latency L s; esync.comm.link's model):
parameter servers push u N bytes (u: 1, fp16 1/2, topk:R 2R) and pull N:
8 (u + 1) N / 1e6 M + 2 L; a ring all-reduce among W workers moves 2 (W-1)/W u N
each way in 2 (W-1) steps: 8 x 2 (W-1)/W u N / 1e6 M + 2 (W-1) L. An unpaced link
(no --bandwidth) costs its latency only here: loopback's own transfer is not modelled.
A round, its workers prefetching while it communicates:

    round = b loop + comm                                   K = 0
          = max(b loop + comm, b w s / K, b cpu / n)        K >= 1
    rate  = b B / round

b is 1 but under ESync, whose state server gives each device round(T_slowest / T)
local iterations (1..--max-local-steps;
esync.algorithms.esync.budget, the state server's rule), T the devices'
time per iteration: the paper's rule. (The state server's default also lengthens rounds
whose synchronisation would take more than --coordination-share of them; that is not
modelled here, so where comm is above about a ninth of b loop, real budgets are larger
than these.) Waiting for the other workers (SSGD) is not this device's stall
and is left out. Stall shares, as DS-Analyzer defines them, come from the measured
rates: with T_syn, T_cached, T_cold the seconds per batch of the three runs and
T = T_cold + comm / b, compute T_syn / T, prep (T_cached - T_syn) / T, fetch
(T_cold - T_cached) / T, communication (comm / b) / T (T_cached taken at least T_syn,
T_cold at least T_cached: a faster run than the one before is noise; with a cache of
x, the runs made without one, T_cold - T_cached is taken (1-x) times).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from esync.algorithms.esync import budget as budget_rule

#: a stall below this share of the time is not worth a recommendation
NOTICEABLE = 0.10
#: what-if settings within this share of the best rate count as "removing" a stall
CLOSE = 0.03
#: the share of a round that communication is brought down to by the link recommended
COMM_TARGET = 0.05


@dataclass(frozen=True)
class Costs:
    """One device's costs per batch (seconds; see the module)."""

    batch: int
    slowdown: float         # F
    compute: float          # c0
    compute_shared: float   # c1
    receive: float          # r
    respawn: float          # e
    other: float            # o
    prep: float             # p0
    worker: float           # w
    fetch_cached: float     # fw
    fetch_cold: float       # fc
    cores: int              # n
    loader: bool = True     # a DataLoader makes the batches (not a data set in memory)


@dataclass(frozen=True)
class Link:
    """A device's link: Mbit/s each way (None: not paced) and one-way latency in ms."""

    bandwidth: Optional[float] = None
    latency: float = 0.0


@dataclass(frozen=True)
class Job:
    """What decides a round's communication: `backend` "ps", "allreduce" or "none"
    (alone), the workers, the vector's bytes, the pushed share u, and ESync's cap on
    local iterations (None: one a round)."""

    backend: str
    workers: int
    model_bytes: int
    push_share: float = 1.0
    max_local_steps: Optional[int] = None


def sharing(c: Costs, workers: int) -> float:
    """s: how much slower work runs with `workers` DataLoader workers than with one,
    the processes sharing the cores."""
    def q(k: int) -> float:
        return max(1.0, (k + 1.0 / c.slowdown) / max(1, c.cores))
    return q(workers) / q(1)


def loop_seconds(c: Costs, workers: int, cache: float, cold: bool = True) -> float:
    """The training process's own time per batch (it waits for no DataLoader worker)."""
    fetch = (1.0 - cache) * (c.fetch_cold if cold else c.fetch_cached)
    if workers == 0:
        return c.other + c.slowdown * c.compute + fetch + c.prep
    return c.other + c.slowdown * c.compute_shared * sharing(c, workers) + fetch + \
        c.receive + c.respawn


def cpu_seconds(c: Costs, workers: int, cache: float) -> float:
    """CPU work per batch, all processes together."""
    compute = c.compute if workers == 0 else c.compute_shared
    return c.other + compute + (1.0 - cache) * c.fetch_cached + \
        (c.prep if workers == 0 else c.worker)


def round_seconds(c: Costs, workers: int, cache: float, steps: int = 1,
                  comm: float = 0.0, cold: bool = True) -> float:
    """A round of `steps` local iterations and `comm` seconds of communication."""
    busy = steps * loop_seconds(c, workers, cache, cold) + comm
    if workers == 0:
        return busy
    return max(busy, steps * c.worker * sharing(c, workers) / workers,
               steps * cpu_seconds(c, workers, cache) / max(1, c.cores))


def batch_seconds(c: Costs, workers: int, cache: float, cold: bool = True) -> float:
    """Seconds per local iteration, communication aside."""
    return round_seconds(c, workers, cache, 1, 0.0, cold)


def communication_seconds(job: Job, link: Link) -> float:
    """Seconds of one round's synchronisation on `link` (see the module)."""
    if job.backend == "none":
        return 0.0
    per_bit = 0.0 if link.bandwidth is None else 8.0 / (link.bandwidth * 1e6)
    latency = link.latency / 1e3
    if job.backend == "allreduce":
        share = 2.0 * (job.workers - 1) / job.workers
        return share * job.push_share * job.model_bytes * per_bit + 2 * (job.workers - 1) * latency
    return (job.push_share + 1.0) * job.model_bytes * per_bit + 2 * latency


def budget(mine: float, everyone: Sequence[float], cap: Optional[int]) -> int:
    """Local iterations a round: 1 without a cap (not ESync), else ESync's budget by the
    paper's rule (esync.algorithms.esync.budget, --coordination-share 0)."""
    if cap is None or mine <= 0:
        return 1
    return budget_rule.budget(mine, everyone, cap)


def steps(c: Costs, workers: int, cache: float, job: Job, others: Sequence[float]) -> int:
    """This device's local iterations a round, the other devices' seconds per
    iteration `others` staying as they are."""
    mine = batch_seconds(c, workers, cache)
    return budget(mine, [mine, *others], job.max_local_steps)


def rate(c: Costs, workers: int, cache: float, job: Job, link: Link,
         others: Sequence[float] = ()) -> float:
    """Samples per second, reading from storage (the cache aside), communicating over
    `link` once a round."""
    b = steps(c, workers, cache, job, others)
    return b * c.batch / round_seconds(c, workers, cache, b, communication_seconds(job, link))


def shares(synthetic: float, cached: float, cold: float, comm_per_batch: float,
           cache: float = 0.0) -> Dict[str, float]:
    """Where the device's time goes (DS-Analyzer's differential shares), from the
    seconds per batch of the three runs, the communication per batch and the job's
    cache fraction (it spares that share of the cold run's reads)."""
    cached = max(cached, synthetic)  # a slower run is noise, not a negative stall
    cold = cached + (1.0 - cache) * max(0.0, cold - cached)
    total = cold + comm_per_batch
    if total <= 0:
        return {"compute": 0.0, "prep": 0.0, "fetch": 0.0, "communication": 0.0}
    return {"compute": synthetic / total, "prep": (cached - synthetic) / total,
            "fetch": (cold - cached) / total, "communication": comm_per_batch / total}


def fewest_workers(c: Costs, now: int, cache: float, job: Job, link: Link,
                   others: Sequence[float], most: int) -> int:
    """The fewest DataLoader workers (from `now` up to `most`) whose rate is within
    CLOSE of the best of 0..most (`now` if none is)."""
    rates = [rate(c, k, cache, job, link, others) for k in range(most + 1)]
    best = max(rates)
    return next((k for k in range(now, most + 1) if rates[k] >= (1 - CLOSE) * best), now)


def smallest_cache(c: Costs, workers: int, job: Job, link: Link,
                   others: Sequence[float]) -> float:
    """The smallest cache fraction (in tenths) whose rate is within CLOSE of a full
    cache's."""
    full = rate(c, workers, 1.0, job, link, others)
    return next(x / 10 for x in range(11)
                if rate(c, workers, x / 10, job, link, others) >= (1 - CLOSE) * full)


def link_for(job: Job, link: Link, share: float, busy: float) -> Optional[float]:
    """Mbit/s that brings communication down to `share` of a round whose other work
    takes `busy` seconds (None: the latency alone takes more)."""
    target = share / (1 - share) * busy
    latency = communication_seconds(job, Link(None, link.latency))
    bit_seconds = communication_seconds(job, Link(1e-6, 0.0))  # at 1 bit/s
    if target <= latency or not bit_seconds:
        return None
    return bit_seconds / (target - latency) / 1e6


def recommend(label: str, share: Dict[str, float], c: Costs, workers: int, cache: float,
              job: Job, link: Link, others: Sequence[float] = ()) -> str:
    """One line: the device's largest stall and what would remove it."""
    stall = max(("prep", "fetch", "communication"), key=lambda k: share[k])
    head = f"device {label}: {100 * share[stall]:.0f}% {stall}-stalled"
    if share[stall] < NOTICEABLE:
        return (f"device {label}: compute-bound ({100 * share['compute']:.0f}% computing): "
                f"a faster accelerator is what helps")
    remedy = {"prep": _more_workers, "fetch": _cache_for,
              "communication": _link_for_rounds}[stall]
    return head + remedy(share[stall], c, workers, cache, job, link, others)


def _more_workers(stalled, c, workers, cache, job, link, others) -> str:
    if not c.loader:
        return " making its batches in memory, in the training process"
    k = fewest_workers(c, workers, cache, job, link, others, _most(c, workers))
    if k <= workers:
        return (f"; more DataLoader workers would not help on {c.cores} cores: decoding "
                f"elsewhere (--remote-prep, on Ray) or less would")
    more = k - workers
    return (f"; {more} more DataLoader worker{'s' if more > 1 else ''} "
            f"(--loader-workers {k}) would remove it")


def _cache_for(stalled, c, workers, cache, job, link, others) -> str:
    x = smallest_cache(c, workers, job, link, others)
    if x <= cache:
        return "; faster storage would help"
    return (f"; a memory cache of {100 * x:.0f}% of its samples (--cache-fraction {x:g}) "
            f"would remove it")


def _link_for_rounds(stalled, c, workers, cache, job, link, others) -> str:
    busy = round_seconds(c, workers, cache, steps(c, workers, cache, job, others))
    latency = communication_seconds(job, Link(None, link.latency))
    floor = latency / (busy + latency)  # what no bandwidth removes
    needed = link_for(job, link, floor + COMM_TARGET, busy)
    if floor >= stalled / 2 or needed is None:
        return (f", mostly by its link's latency ({1e3 * latency:.0f} ms a round; a faster "
                f"link would leave {100 * floor:.0f}%): fewer, longer rounds would help")
    kept = f" (its {link.latency:g} ms latency keeps {100 * floor:.0f}%)" \
        if floor >= COMM_TARGET / 2 else ""
    return (f"; a link of {needed:,.0f} Mbit/s would cut it to "
            f"{100 * (floor + COMM_TARGET):.0f}%{kept}")


def _most(c: Costs, workers: int) -> int:
    """The most DataLoader workers a what-if tries: the cores (none for data in memory)."""
    return max(c.cores, workers) if c.loader else 0


def what_ifs(c: Costs, workers: int, cache: float, job: Job, link: Link,
             others: Sequence[float], fractions: Sequence[float],
             links: Sequence[Optional[float]]) -> Dict[str, List[dict]]:
    """Predicted samples/s for DataLoader workers 0..cores, each cache fraction and
    each link's Mbit/s (None: unpaced), the job's other settings kept."""
    return {
        "loader_workers": [{"workers": k, "rate": rate(c, k, cache, job, link, others)}
                           for k in range(_most(c, workers) + 1)],
        "cache_fraction": [{"fraction": x, "rate": rate(c, workers, x, job, link, others)}
                           for x in fractions] if c.loader else [],
        "link": [] if job.backend == "none" else [
            {"bandwidth": m, "rate": rate(c, workers, cache, job, Link(m, link.latency), others)}
            for m in links]}
