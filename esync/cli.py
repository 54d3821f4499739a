"""`python main.py` / `esync`: parse the settings, pick the role, start it."""
from __future__ import annotations

import os
import sys
from typing import Optional, Sequence

from esync.errors import UserError


def _run(argv: Optional[Sequence[str]], prog: str) -> int:
    from esync.options import parse_options  # imports torch: after the cheap checks

    if "DMLC_ROLE" not in os.environ:
        opts = parse_options(argv, prog)
        if opts.mode != "local":
            from esync.transport.cluster import REQUIRED

            missing = ", ".join(v for v in REQUIRED if v not in os.environ)
            raise UserError(f"-m/--mode {opts.mode} runs in a cluster: set {missing} "
                            f"(or use -m local)")
        from esync.worker import select_device

        select_device(opts)  # a GPU asked for where there is none is a bad flag: fail now
        return _run_local(opts)
    from esync.transport.cluster import ClusterEnv

    env = ClusterEnv.from_environ()  # wrong cluster variables: there is nobody to tell
    if env.role == "scheduler":
        parse_options(argv, prog)
        from esync.transport.scheduler import Scheduler

        return Scheduler(env, log=_log).run()
    try:
        opts = _node_options(argv, prog, env.role)
    except UserError as e:
        # bad input before joining: tell the scheduler, which ends the job rather than
        # wait for this node (nodes that joined tell it themselves, through Node.fail)
        from esync.transport.node import report_failed_start

        report_failed_start(env, str(e))
        raise
    return _run_node(opts, env)


def _node_options(argv: Optional[Sequence[str]], prog: str, role: str):
    from esync.options import parse_options
    from esync.worker import select_device

    opts = parse_options(argv, prog)
    if role == "worker":
        select_device(opts)
        if opts.mode == "local":
            raise UserError("-m/--mode local trains alone: unset DMLC_ROLE, or pick a "
                            "distributed mode (sync, async, esync)")
        if opts.mode == "esync":
            _patience()  # a bad value fails before joining
    return opts


def _log(line: str) -> None:
    print(line, flush=True)


def _run_local(opts) -> int:
    from esync.algorithms import LocalSGD
    from esync.worker import run_worker

    result = run_worker(opts, LocalSGD(opts.learning_rate, opts.momentum, opts.weight_decay,
                                       opts.eval_duration))
    return 1 if result.diverged else 0


def _run_node(opts, env) -> int:
    """A server or worker: join the job, do the role's work, leave cleanly or fail loudly."""
    from esync.transport.node import JobAborted, Node

    node = Node(env, env.role, log=_log)
    try:
        if env.role == "server":
            from esync.server import run_server

            return run_server(node, log=_log)
        return _run_cluster_worker(opts, node)
    except JobAborted as e:
        print(f"esync: error: job aborted: {e}", file=sys.stderr, flush=True)
        return 1
    except UserError as e:
        node.fail(str(e))
        raise
    except BaseException as e:
        node.fail(f"{type(e).__name__}: {e}")
        raise
    finally:
        node.close()


def _patience() -> float:
    """How long a worker retries an unreachable state server (ESYNC_STATE_SERVER_PATIENCE)."""
    from esync.stateclient import PATIENCE_S

    raw = os.environ.get("ESYNC_STATE_SERVER_PATIENCE", str(PATIENCE_S))
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise UserError(f"ESYNC_STATE_SERVER_PATIENCE must be a number of seconds >= 0, "
                        f"got {raw!r}")
    return value


def _cluster_algorithm(opts, node, assignment, rule_name: str):
    if rule_name == "esync":
        from esync.algorithms.esync import ESync
        from esync.stateclient import StateClient

        state = StateClient(opts.state_server_ip, opts.state_server_port, assignment["job"],
                            patience=_patience(), check=node.check, log=_log)
        if assignment["rank"] == 0:
            _log(f"[esync] job {assignment['job']}; budgets at {state.url}/jobs/"
                 f"{assignment['job']}/")
        return ESync(node, assignment, state, opts.local_lr, opts.momentum, opts.weight_decay,
                     opts.global_lr, opts.max_local_steps, opts.eval_duration)
    from esync.algorithms.pushpull import GradientPushPull
    from esync.rules import RuleConfig

    rule = RuleConfig(rule_name, assignment["num_workers"], opts.learning_rate, opts.momentum,
                      opts.weight_decay, opts.dcasgd_lamda if rule_name == "dcasgd" else 0.0)
    return GradientPushPull(rule, node, assignment, opts.eval_duration)


def _run_cluster_worker(opts, node) -> int:
    from esync.worker import run_worker

    rule_name = "dcasgd" if opts.mode == "async" and opts.use_dcasgd else opts.mode
    assignment = node.register(mode=rule_name, network=opts.network)
    algorithm = _cluster_algorithm(opts, node, assignment, rule_name)
    result = run_worker(opts, algorithm, assignment["rank"], assignment["num_workers"])
    node.finish()
    return 1 if result.diverged else 0


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
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
