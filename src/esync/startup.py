"""The one start-up sequence of every esync process: main.py and `esync` (esync.cli, all
roles) and a user's training script (esync.api.init, a worker).

Parse the flags, read the role's variables (DMLC_ROLE and the ps-lite cluster's, or
torch.distributed's under -m ddp, or none: alone), check what can be wrong before
anything starts (a training process: esync.join.check; an evaluator: its device), then
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

from esync.console import configure_logging, report_failed_start
from esync.errors import UserError
from esync.options import Options, agreed_settings, flags_given, parse_options
from esync.transport.cluster import ClusterEnv, DDPEnv

if TYPE_CHECKING:
    import torch

    from esync.join import WorkerPlan


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
    #: a training process's plan (esync.join.check); None for the other roles
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
                report_failed_start(ClusterEnv.from_environ(), e)
            except UserError:  # wrong cluster variables: there is nobody to tell
                pass
        raise
    env = _environment(opts, role, script)
    cluster = env if isinstance(env, ClusterEnv) else None
    name = cluster.role if cluster is not None else role or "worker"
    plan = device = None
    try:
        if name == "worker":
            from esync import join  # torch: after the cheap checks

            plan = join.check(opts, cluster)
        elif name == "evaluator":
            from esync.join import select_device

            device = select_device(opts)
    except UserError as e:
        report_failed_start(cluster, e)
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
