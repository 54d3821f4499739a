"""The algorithms, each described once: how the command line spells it, which server
rule and worker class run it, and how logs, summaries and figures name it.

A leaf module (standard library only, nothing heavy is imported): the CLI, the launchers
and the log tools all read names from here and keep no copies. The classes are named by
`module:attribute` strings and imported only when a process runs the algorithm. Adding
an algorithm means one entry below plus its worker class (and server rule, if any).
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
}


@dataclass(frozen=True)
class Algorithm:
    """One algorithm as the rest of the project knows it."""

    key: str                 # the registry key; also the rule name workers send servers
    mode: str                # its `-m` value
    dcasgd: bool             # with `-dcasgd 1` (the original spells DC-ASGD `-m async -dcasgd 1`)
    worker: str              # module:class of its esync.algorithms.base.Algorithm
    rule: Optional[str]      # module:class of its server rule (None: no servers)
    folder: str              # its log folder under OUT/<network>/
    summary: str             # esync/logs_tools/summary.py writes <summary>.json
    display: str             # its name in figures and tables
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

    def rule_class(self) -> Any:
        if self.rule is None:
            raise ValueError(f"{self.key} has no server rule")
        return _load(self.rule)


ALGORITHMS: Dict[str, Algorithm] = {a.key: a for a in (
    Algorithm("esync", "esync", False, "esync.algorithms.esync:ESync",
              "esync.rules:ESyncRule", "esync", "ESync", "ESync",
              synchronous=True, state_server=True, all_reduce=True),
    Algorithm("sync", "sync", False, "esync.algorithms.pushpull:PushPull",
              "esync.rules:SyncRule", "sync", "Sync", "SSGD", synchronous=True,
              all_reduce=True),
    Algorithm("async", "async", False, "esync.algorithms.pushpull:PushPull",
              "esync.rules:AsyncRule", "async", "Async", "ASGD"),
    Algorithm("dcasgd", "async", True, "esync.algorithms.pushpull:PushPull",
              "esync.rules:DCASGDRule", "dcasgd", "DCASGD", "DC-ASGD"),
    Algorithm("ddp", "ddp", False, "esync.algorithms.ddp:DDP", None, "ddp", "DDP", "DDP",
              synchronous=True, backend="ddp"),
    Algorithm("ddp-balanced", "ddp", False, "esync.algorithms.balanced:BalancedDDP", None,
              "ddp-balanced", "DDP-Balanced", "Balanced DDP", synchronous=True,
              backend="ddp", balance_batches=True),
    Algorithm("local", "local", False, "esync.algorithms.standalone:StandaloneSGD", None,
              "local", "Local", "Standalone", backend=None),
    Algorithm(key="localsgd", mode="localsgd", dcasgd=False,
              worker="esync.algorithms.localsgd:LocalSGD", rule="esync.rules:ESyncRule",
              folder="localsgd", summary="LocalSGD", display="Local SGD", synchronous=True,
              all_reduce=True, compared=False),
)}

#: the speedup table's baseline: other algorithms' times are divided by its time
BASELINE = "sync"
#: the algorithm of one device training alone (the figures' dashed line)
STANDALONE = "local"

#: the evaluator (esync.evaluator): its DMLC_ROLE, the device label of its log folder
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
