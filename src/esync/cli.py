"""`python main.py` / `esync`: parse the settings, pick the role, start it.

The role comes from DMLC_ROLE (ps-lite's variables); without it the process trains
alone. The start-up (flags, role, checks, logging) is esync.runtime.startup's, the one a user's
script goes through too (esync.init); the one-line errors are esync.infra.console's.
"""
from __future__ import annotations

import gc
import logging
import os
from typing import TYPE_CHECKING, Optional, Sequence

from esync.infra.console import configure_logging
from esync.errors import UserError, command_main, say_error

if TYPE_CHECKING:
    from esync.runtime.startup import Start


def _scheduler_cannot_start(prog: str, error: UserError) -> int:
    """A scheduler with bad input: say so, then stay a while to tell the nodes that come
    why (they would otherwise wait for it); exit status 2."""
    from esync.transport.cluster import ClusterEnv
    from esync.transport.scheduler import tell_why

    say_error(prog, error)  # now: what follows may take a while
    try:
        env = ClusterEnv.from_environ()
    except UserError:
        return 2
    configure_logging(verbose=env.verbose)
    tell_why(env, f"the scheduler could not start: {error}")
    return 2


def _run(argv: Optional[Sequence[str]], prog: str) -> int:
    from esync.runtime.startup import start

    try:
        begun = start(argv, prog)
    except UserError as e:
        if os.environ.get("DMLC_ROLE") == "scheduler":
            return _scheduler_cannot_start(prog, e)
        raise
    opts, env = begun.opts, begun.env
    if begun.role == "scheduler":
        from esync.transport.scheduler import Policy, Scheduler

        try:
            return Scheduler(env, Policy.from_options(opts), settings=begun.settings).run()
        except UserError as e:
            return _scheduler_cannot_start(prog, e)
    if begun.ddp:
        return _run_ddp(begun)
    if env is None:
        from esync.runtime.worker import run_standalone

        return run_standalone(begun.plan)
    from esync.transport.node import JobAborted, describe

    try:
        if env.role == "server":
            from esync.comm.server import run_server

            return run_server(env, opts, begun.settings)
        if env.role == "evaluator":
            from esync.runtime.evaluator import run_ps_evaluator

            return run_ps_evaluator(opts, begun.device, env, begun.settings)
        from esync.runtime.worker import run_cluster_worker

        return run_cluster_worker(begun.plan, env, begun.settings)
    except JobAborted as e:
        logging.getLogger(__name__).error("esync: error: %s", describe(e))
        return 1


def _run_ddp(begun: "Start") -> int:
    """`-m ddp`: a rank of the DDP baseline (torch.distributed's variables), or its
    evaluator (DMLC_ROLE=evaluator)."""
    if begun.role == "evaluator":
        from esync.runtime.evaluator import run_ddp_evaluator

        return run_ddp_evaluator(begun.opts, begun.device, begun.env)
    from esync.runtime.worker import run_ddp_worker

    return run_ddp_worker(begun.plan, begun.env)


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    # SIGPIPE stays ignored (Python's default): a peer that hangs up (the state server
    # restarting) must be an error to handle, not a signal that kills the process
    return command_main(_run, argv, prog, "main.py")


def console_main(prog: Optional[str] = None) -> int:
    """`esync`, `python main.py`, `python -m esync`: main() in a process of its own. At
    its end the process skips Python's last garbage collection over torch's heap of
    objects (gc.freeze; 0.5 s a process, 2 s when a job's processes end together on 2
    cores): everything it wrote is closed by then, and the operating system reclaims
    the rest."""
    try:
        return main(prog=prog)
    finally:
        gc.freeze()
