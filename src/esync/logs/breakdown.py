"""Where a round's time went, by cause: the `breakdown` of each round's log record.

    fetch          blocked reading shards (block reads, in the training process)
    prep           blocked waiting for decoding, transforms and collation (in the
                   DataLoader's worker processes, on Ray tasks, or in the training
                   process itself)
    compute        forward, backward and the local update (with a simulated --slowdown's
                   wait: it stands for a slower accelerator)
    communication  moving the round's vectors: push and pull, or the all-reduce
    wait           waiting for the other workers in a synchronous round, as the servers
                   (or the all-reduce's first, small vector) measured it
    state_server   ESync: waiting for the round's budget
    other          the rest of the round's wall time (the user's own code between steps,
                   hooks, logging, an evaluation in the training process)

The values sum to the round's wall time, from the end of the previous round. Fetch and
prep are *stalls*, time the training loop was blocked, as DS-Analyzer measures them;
the work behind them (seconds of block reads, `read_seconds`; of decoding, wherever it
ran, `prep_seconds`) is logged beside them. A time the algorithm cannot tell apart is
where it happens: DDP waits for the others inside its all-reduce, so its `wait` is 0
and its communication holds it. Pure arithmetic, no torch: the log tools may use it.
"""
from __future__ import annotations

from typing import Dict, Iterable, Mapping

CATEGORIES = ("fetch", "prep", "compute", "communication", "wait", "state_server", "other")

#: each phase of a round's `time` records (esync.runtime.session, esync.algorithms) -> category;
#: `get_batch` is split into fetch and prep by the loader's own measurements
PHASE_CATEGORY = {
    "forward and backward": "compute",
    "local update": "compute",
    "slowdown": "compute",
    "global aggregate": "communication",  # SSGD, ASGD, DC-ASGD, DDP's all-reduce
    "global update": "communication",     # ESync
    "balance batches": "communication",   # speed-balanced DDP
    "state server": "state_server",
}


def breakdown(times: Iterable[Mapping[str, float]], fetch: float, prep: float,
              waited: float, wall: float) -> Dict[str, float]:
    """The round's seconds by category, from its phases per local iteration (`times`),
    its stalls on data (`fetch`, `prep`), the synchronisation's wait for the others
    (`waited`, taken out of communication) and its wall time (the rest is `other`)."""
    out = dict.fromkeys(CATEGORIES, 0.0)
    out["fetch"], out["prep"] = fetch, prep
    for phases in times:
        for phase, seconds in phases.items():
            category = PHASE_CATEGORY.get(phase)
            if category is not None:
                out[category] += seconds
    out["wait"] = min(max(0.0, waited), out["communication"])
    out["communication"] -= out["wait"]
    out["other"] = max(0.0, wall - sum(out.values()))
    return {k: round(v, 6) for k, v in out.items()}
