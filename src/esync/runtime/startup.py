"""The one start-up sequence of every esync process: main.py and `esync` (esync.cli, all
roles) and a user's training script (esync.runtime.api.init, a worker).

Parse the flags, read the role's variables (DMLC_ROLE and the ps-lite cluster's, or
torch.distributed's under -m ddp, or none: alone), check what can be wrong before
anything starts (a training process: esync.runtime.join.check; an evaluator: its device), then
configure logging and say what must agree with the job's other nodes. A bad input
raises UserError (the caller says it in one line, exit status 2); a node of a cluster
tells the job's scheduler first, which ends the job rather than wait for it.

torch is imported only to check a training process or an evaluator, so that a scheduler
starts, and a bad flag is refused, without it.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Optional, Sequence, Set, Union

from esync.infra.console import configure_logging
from esync.errors import UserError
from esync.data import IN_MEMORY, SHARDS_PREFIX, WHOLE_NOT_FOR_SHARDS
from esync.options import Options, flags_given, parse_options
from esync.infra.plugin import is_spec
from esync.transport.cluster import ClusterEnv, DDPEnv
from esync.transport.node import report_failed_start

if TYPE_CHECKING:
    import torch

    from esync.runtime.join import WorkerPlan


@dataclass(frozen=True)
class Start:
    """A process checked and ready to start its role."""

    opts: Options
    #: the ps-lite cluster's variables, torch.distributed's (-m ddp), or None (alone)
    env: Union[ClusterEnv, DDPEnv, None]
    #: scheduler, server, evaluator or worker (a process alone, or a DDP rank: worker)
    role: str
    #: the settings the command line gave itself (Options field names)
    given: Set[str]
    #: a training process's plan (esync.runtime.join.check); None for the other roles
    plan: Optional["WorkerPlan"] = None
    #: an evaluator's device; None for the other roles
    device: Optional["torch.device"] = None
    #: what must agree with the job's other nodes (a cluster's node only)
    settings: Optional[Dict[str, str]] = None

    @property
    def ddp(self) -> bool:
        """A rank of -m ddp, or its evaluator (torch.distributed's variables)."""
        return isinstance(self.env, DDPEnv)


def start(argv: Optional[Sequence[str]], prog: str, script: bool = False) -> Start:
    """Parse `argv` (None: the command line's), pick the role, check it (see the
    module). `script`: a user's training script (esync.init), which is a worker only."""
    role = os.environ.get("DMLC_ROLE")
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        opts = parse_options(argv, prog)
    except UserError as e:
        if role:
            try:
                _report_failed_start(ClusterEnv.from_environ(), e)
            except UserError:  # wrong cluster variables: there is nobody to tell
                pass
        raise
    env = _environment(opts, role, script)
    cluster = env if isinstance(env, ClusterEnv) else None
    name = cluster.role if cluster is not None else role or "worker"
    plan = device = None
    try:
        if name == "worker":
            from esync.runtime import join  # torch: after the cheap checks

            plan = join.check(opts, cluster)
            check_plugins(opts)  # last: it may load a plug-in and run it on two samples
        elif name == "evaluator":
            from esync.runtime.join import select_device

            device = select_device(opts)
    except UserError as e:
        _report_failed_start(cluster, e)
        raise
    configure_logging(verbose=cluster is not None and cluster.verbose)
    given = flags_given(argv, prog)
    settings = None if cluster is None else \
        agreed_settings(opts, name, given, cluster.num_workers, cluster.num_servers)
    return Start(opts, env, name, given, plan, device, settings)


def _environment(opts: Options, role: Optional[str], script: bool
                 ) -> Union[ClusterEnv, DDPEnv, None]:
    """The variables of the job `opts` and DMLC_ROLE (`role`) say this process is in."""
    if opts.algorithm.backend == "ddp":
        if role not in (None, "evaluator"):
            raise UserError(f"DMLC_ROLE={role}: -m ddp runs with torch.distributed's "
                            f"variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); only "
                            f"DMLC_ROLE=evaluator goes with it")
        if script and role:
            _not_a_worker(role)
        return DDPEnv.from_environ(evaluator=role == "evaluator")
    if not role:
        return None
    env = ClusterEnv.from_environ()  # wrong cluster variables: there is nobody to tell
    if script and env.role != "worker":
        _not_a_worker(role)
    return env


def _not_a_worker(role: str) -> None:
    raise UserError(f"DMLC_ROLE={role}: a training script is a worker; the scheduler, "
                    f"servers and evaluator are started as `esync` processes (esync-run "
                    f"does)")


def _report_failed_start(env: Optional["ClusterEnv"], error: UserError) -> None:
    """Bad input before joining a parameter-server job: tell its scheduler, which ends
    the job rather than wait for this node (nodes that joined tell it themselves:
    Node.fail). Best effort: with wrong cluster variables there is nobody to tell."""
    if env is not None and env.role not in ("scheduler", "evaluator"):
        report_failed_start(env, str(error))


#: the settings that must agree across a job's nodes: Options field -> its flag
AGREED = {"mode": "-m", "use_dcasgd": "-dcasgd", "backend": "--backend", "network": "-n",
          "dataset": "--dataset", "compress": "--compress"}
#: per role, the settings it runs with whether given or not; a role compares the others
#: only where its command line gives them (the scheduler's -m, say)
USED_BY_ROLE = {"worker": tuple(AGREED), "evaluator": ("network", "dataset")}


def agreed_settings(opts: Options, role: str, given: Set[str], num_workers: int,
                    num_servers: int) -> Dict[str, str]:
    """What this node says the job is, for the scheduler to compare at registration:
    {"DMLC_NUM_WORKER": "4", "-m": "esync", ...}."""
    out = {"DMLC_NUM_WORKER": str(num_workers), "DMLC_NUM_SERVER": str(num_servers)}
    for name, flag in AGREED.items():
        if name in given or name in USED_BY_ROLE.get(role, ()):
            value = getattr(opts, name)
            out[flag] = ("1" if value else "0") if isinstance(value, bool) else str(value)
    return out


def check_plugins(opts: Options) -> None:
    """What the user plugs in, before anything starts: a plug-in network, data set or
    loss (`module:function`), or data on disk, is loaded and the network run on two
    training samples and the loss computed (UserError, one line naming the flag, if
    anything fails: esync.runtime.task); the targets go with the metric; --tensorboard needs
    the tensorboard package. Built-in names need nothing; torch is imported only for a
    plug-in."""
    if opts.tensorboard is not None:
        from esync.logs.scalars import check_installed

        check_installed()
    if opts.target_accuracy is not None and opts.metric != "accuracy":
        raise UserError(f"--target-accuracy needs --metric accuracy, not {opts.metric} "
                        f"(with --metric loss, give --target-loss)")
    if opts.target_loss is not None and opts.metric != "loss":
        raise UserError(f"--target-loss needs --metric loss, not {opts.metric}")
    if opts.data_split == "leased" and not opts.dataset.startswith(SHARDS_PREFIX):
        raise UserError(f"--data-split leased leases blocks of shards: give --dataset "
                        f"{SHARDS_PREFIX}DIR (written by esync-pack), not {opts.dataset}")
    if opts.data_split in ("leased", "whole") and opts.split_by_class:
        raise UserError(f"--data-split {opts.data_split} moves data between workers; -s 1 "
                        f"keeps each worker's classes on it: use --data-split static with -s 1")
    if opts.data_split == "whole" and opts.algorithm.backend == "ddp":
        raise UserError("--data-split whole: -m ddp trains its ranks in lockstep, each on "
                        "its own share (use --data-split static)")
    if opts.data_split == "whole" and opts.dataset.startswith(SHARDS_PREFIX):
        raise UserError(WHOLE_NOT_FOR_SHARDS)
    if (is_spec(opts.network) or opts.dataset not in IN_MEMORY or opts.loss != "cross_entropy"
            or opts.evaluate is not None):
        from esync.runtime.task import task_of

        task_of(opts).check(opts.network)
