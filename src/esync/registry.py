"""The algorithms, each described once: how the command line spells it, which server
rule and worker class run it, and how logs, summaries and figures name it.

A leaf module (standard library only, nothing heavy is imported): the CLI, the launchers
and the log tools all read names from here and keep no copies. The classes are named by
`module:attribute` strings and imported only when a process runs the algorithm (its
policy, torch-free, when flags are checked). Adding an algorithm means one entry below
plus its unit under esync/algorithms/: policy, worker hooks and server rule, if any.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Optional, Tuple


#: log-folder suffix of a run on split-by-class (non-IID) partitions: esync-niid
NIID_FOLDER_SUFFIX = "-niid"
#: summary-file suffix of such a run: ESync-Non-IID.json
NIID_SUMMARY_SUFFIX = "-Non-IID"
#: display-name suffix of such a run in figures and tables: ESync (non-IID)
NIID_DISPLAY_SUFFIX = " (non-IID)"

#: --average: how ESync's rule averages the round's deltas -> the RuleConfig switches
AVERAGES: Dict[str, Dict[str, bool]] = {
    "mean": {},                    # each delta the same (the paper's)
    "steps": {"by_steps": True},   # weighted by each delta's local steps (its samples)
    "normalized": {"normalize": True},  # each divided by its steps, times the mean steps
    # weighted by steps, scaled so the move is as long as the fastest device's own
    "anchored": {"by_steps": True, "anchored": True},
}


#: the package of the algorithms' units
_A = "esync.algorithms."


@dataclass(frozen=True)
class Algorithm:
    """One algorithm as the rest of the project knows it."""

    key: str                 # the registry key; also the rule name workers send servers
    mode: str                # its `-m` value
    policy: str              # module:class of its settings (esync.algorithms.policy.Policy)
    worker: str              # module:class of its hooks (esync.algorithms.base.Algorithm)
    folder: str              # its log folder under OUT/<network>/
    summary: str             # esync/logs_tools/summary.py writes <summary>.json
    display: str             # its name in figures and tables
    rule: Optional[str] = None  # module:class of its server rule (None: no servers)
    dcasgd: bool = False     # with `-dcasgd 1` (the original's DC-ASGD: `-m async -dcasgd 1`)
    synchronous: bool = False   # every worker waits for all in each round
    state_server: bool = False  # needs the ESync state server
    backend: Optional[str] = "ps"  # how workers talk: "ps" (scheduler, servers and
    #                                workers: DMLC_* variables), "ddp" (torch.distributed:
    #                                RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), None
    #                                (one process trains alone)

    all_reduce: bool = False  # may aggregate by all-reduce among the workers instead of
    #                           through servers (`--backend allreduce`)
    balance_batches: bool = False  # with `--balance-batches 1` (DDP with each worker's
    #                                batch in proportion to its speed: LB-BSP)
    compared: bool = True  # among the runs esync-experiment makes and esync-draw draws
    #                        (all_folders); False: run it by its -m (a baseline on call)

    @property
    def distributed(self) -> bool:
        """Runs as several processes (else: one process trains alone)."""
        return self.backend is not None

    @property
    def parameter_server(self) -> bool:
        """Runs as a ps-lite cluster: scheduler, servers (with its rule) and workers."""
        return self.backend == "ps"

    @property
    def flags(self) -> Tuple[str, ...]:
        """main.py's flags that select it."""
        return ("-m", self.mode, *(("-dcasgd", "1") if self.dcasgd else ()),
                *(("--balance-batches", "1") if self.balance_batches else ()))

    def log_folder(self, split_by_class: bool = False) -> str:
        return self.folder + (NIID_FOLDER_SUFFIX if split_by_class else "")

    def summary_name(self, split_by_class: bool = False) -> str:
        return self.summary + (NIID_SUMMARY_SUFFIX if split_by_class else "")

    def display_name(self, split_by_class: bool = False) -> str:
        return self.display + (NIID_DISPLAY_SUFFIX if split_by_class else "")

    def worker_class(self) -> Any:
        return _load(self.worker)

    def policy_class(self) -> Any:
        return _load(self.policy)

    def rule_class(self) -> Any:
        if self.rule is None:
            raise ValueError(f"{self.key} has no server rule")
        return _load(self.rule)


ALGORITHMS: Dict[str, Algorithm] = {a.key: a for a in (
    Algorithm(key="esync", mode="esync", policy=_A + "esync:ESync",
              worker=_A + "esync.worker:ESyncWorker", rule=_A + "esync.rule:ESyncRule",
              folder="esync", summary="ESync", display="ESync", synchronous=True,
              state_server=True, all_reduce=True),
    Algorithm(key="sync", mode="sync", policy=_A + "sync:SSGD",
              worker=_A + "pushpull:PushPull", rule=_A + "rules:SyncRule",
              folder="sync", summary="Sync", display="SSGD", synchronous=True,
              all_reduce=True),
    Algorithm(key="async", mode="async", policy=_A + "asynchronous:ASGD",
              worker=_A + "pushpull:PushPull", rule=_A + "rules:AsyncRule",
              folder="async", summary="Async", display="ASGD"),
    Algorithm(key="dcasgd", mode="async", dcasgd=True, policy=_A + "asynchronous:DCASGD",
              worker=_A + "pushpull:PushPull", rule=_A + "rules:DCASGDRule",
              folder="dcasgd", summary="DCASGD", display="DC-ASGD"),
    Algorithm(key="ddp", mode="ddp", policy=_A + "ddp:DDP", worker=_A + "ddp.worker:DDPWorker",
              folder="ddp", summary="DDP", display="DDP", synchronous=True, backend="ddp"),
    Algorithm(key="ddp-balanced", mode="ddp", balance_batches=True,
              policy=_A + "ddp:BalancedDDP", worker=_A + "ddp.balanced:BalancedDDPWorker",
              folder="ddp-balanced", summary="DDP-Balanced", display="Balanced DDP",
              synchronous=True, backend="ddp"),
    Algorithm(key="local", mode="local", policy=_A + "standalone:Standalone",
              worker=_A + "standalone.worker:StandaloneSGD", folder="local",
              summary="Local", display="Standalone", backend=None),
    Algorithm(key="localsgd", mode="localsgd", policy=_A + "localsgd:LocalSGD",
              worker=_A + "localsgd.worker:LocalSGDWorker", rule=_A + "esync.rule:ESyncRule",
              folder="localsgd", summary="LocalSGD", display="Local SGD", synchronous=True,
              all_reduce=True, compared=False),
)}

#: the speedup table's baseline: other algorithms' times are divided by its time
BASELINE = "sync"
#: the algorithm of one device training alone (the figures' dashed line)
STANDALONE = "local"

#: the evaluator (esync.runtime.evaluator): its DMLC_ROLE, the device label of its log folder
#: (LOG_DIR/<host>/evaluator/) and the `sender` of its pulls. It logs the global model's
#: test accuracy; it trains on nothing and is no worker
EVALUATOR = "evaluator"

#: the values `--backend` takes: "ps" (through the parameter servers) or "allreduce"
#: (torch.distributed among the workers; algorithms with `all_reduce` only)
BACKENDS: Tuple[str, ...] = ("ps", "allreduce")

#: the values `-m` takes, in registry order
MODES: Tuple[str, ...] = tuple(dict.fromkeys(a.mode for a in ALGORITHMS.values()))


def resolve(mode: str, dcasgd: bool = False, balance_batches: bool = False) -> Algorithm:
    """The algorithm that `-m MODE [-dcasgd 1] [--balance-batches 1]` runs. A variant's
    flag matters only where the mode has that variant (`-dcasgd`: async, as in the
    original; `--balance-batches`: ddp, other modes refuse it, esync.options)."""
    fallback = None
    for algorithm in ALGORITHMS.values():
        if algorithm.mode == mode:
            if (algorithm.dcasgd, algorithm.balance_batches) == (dcasgd, balance_batches):
                return algorithm
            if not (algorithm.dcasgd or algorithm.balance_batches):
                fallback = algorithm
    if fallback is None:
        raise KeyError(f"unknown mode {mode!r} (expected one of {', '.join(MODES)})")
    return fallback


def of_options(opts: Any) -> Algorithm:
    """The algorithm of parsed main.py options (esync.options.Options)."""
    return resolve(opts.mode, opts.use_dcasgd, opts.balance_batches)


def with_rules() -> Iterator[Algorithm]:
    return (a for a in ALGORITHMS.values() if a.rule is not None)


def from_folder(folder: str) -> Optional[Tuple[Algorithm, bool]]:
    """(algorithm, split by class) of a log folder name such as `esync-niid`; None if
    the name is no algorithm's."""
    split = folder.endswith(NIID_FOLDER_SUFFIX)
    base = folder[:-len(NIID_FOLDER_SUFFIX)] if split else folder
    for algorithm in ALGORITHMS.values():
        if algorithm.folder == base:
            return algorithm, split
    return None


def all_folders() -> Iterator[Tuple[Algorithm, bool]]:
    """Every (algorithm, split by class) run the experiment knows, in its order: the
    distributed algorithms on IID data, then on split-by-class data, then standalone."""
    compared = [a for a in ALGORITHMS.values() if a.compared]
    distributed = [a for a in compared if a.distributed]
    yield from ((a, False) for a in distributed)
    yield from ((a, True) for a in distributed)
    yield from ((a, False) for a in compared if not a.distributed)


def _load(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)
