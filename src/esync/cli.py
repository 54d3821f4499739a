"""`python main.py` / `esync`: parse the settings, pick the role, start it.

The role comes from DMLC_ROLE (ps-lite's variables); without it the process trains
alone. Logging and the one-line errors are esync.console's.
"""
from __future__ import annotations

import gc
import logging
import os
import sys
from typing import Optional, Sequence

from esync.console import configure_logging, report_failed_start, say_error
from esync.errors import UserError


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
    from esync.options import agreed_settings, flags_given, parse_options
    from esync.transport.cluster import ClusterEnv

    role = os.environ.get("DMLC_ROLE")
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        opts = parse_options(argv, prog)
    except UserError as e:
        if role == "scheduler":
            return _scheduler_cannot_start(prog, e)
        if role:
            try:
                report_failed_start(ClusterEnv.from_environ(), e)
            except UserError:
                pass
        raise
    if opts.algorithm.backend == "ddp":
        return _run_ddp(opts, role)
    # wrong cluster variables: there is nobody to tell
    env = ClusterEnv.from_environ() if role else None
    try:
        if env is None or env.role == "worker":
            from esync import worker  # imports torch: after the cheap checks

            plan = worker.check(opts, env)
        elif env.role == "evaluator":
            from esync.worker import select_device

            device = select_device(opts)
    except UserError as e:
        report_failed_start(env, e)
        raise
    configure_logging(verbose=env is not None and env.verbose)
    if env is None:
        return worker.run_standalone(plan)
    settings = agreed_settings(opts, env.role, flags_given(argv, prog), env.num_workers,
                               env.num_servers)
    if env.role == "scheduler":
        from esync.transport.scheduler import Policy, Scheduler

        try:
            return Scheduler(env, Policy.from_options(opts), settings=settings).run()
        except UserError as e:
            return _scheduler_cannot_start(prog, e)
    from esync.transport.node import JobAborted, describe

    try:
        if env.role == "server":
            from esync.server import run_server

            return run_server(env, opts, settings)
        if env.role == "evaluator":
            from esync.evaluator import run_ps_evaluator

            return run_ps_evaluator(opts, device, env, settings)
        return worker.run_cluster_worker(plan, env, settings)
    except JobAborted as e:
        logging.getLogger(__name__).error("esync: error: %s", describe(e))
        return 1


def _run_ddp(opts, role: Optional[str]) -> int:
    """`-m ddp`: a rank of the DDP baseline (torch.distributed's variables), or its
    evaluator (DMLC_ROLE=evaluator)."""
    from esync.transport.cluster import DDPEnv

    if role not in (None, "evaluator"):
        raise UserError(f"DMLC_ROLE={role}: -m ddp runs with torch.distributed's variables "
                        f"(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); only "
                        f"DMLC_ROLE=evaluator goes with it")
    env = DDPEnv.from_environ(evaluator=role == "evaluator")
    from esync import worker

    configure_logging()
    if role == "evaluator":
        from esync.evaluator import run_ddp_evaluator

        return run_ddp_evaluator(opts, worker.select_device(opts), env)
    return worker.run_ddp_worker(worker.check(opts, None), env)


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    prog = prog or os.path.basename(sys.argv[0]) or "esync"
    # SIGPIPE stays ignored (Python's default): a peer that hangs up (the state server
    # restarting) must be an error to handle, not a signal that kills the process
    try:
        return _run(argv, prog)
    except BrokenPipeError:  # `esync | head`: the reader left; end quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except UserError as e:
        say_error(prog, e)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


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
