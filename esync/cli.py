"""`python main.py` / `esync`: parse the settings, pick the role, start it."""
from __future__ import annotations

import os
import signal
import sys
from typing import Optional, Sequence

from esync.errors import UserError

CLUSTER_VARS = ("DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER",
                "DMLC_NUM_WORKER")


def _run(argv: Optional[Sequence[str]], prog: str) -> int:
    from esync.options import parse_options  # imports torch: after the cheap checks
    from esync.worker import run_worker, select_device

    opts = parse_options(argv, prog)
    select_device(opts)  # a GPU asked for where there is none is a bad flag: fail now
    role = os.environ.get("DMLC_ROLE")
    if role is None:
        if opts.mode != "local":
            missing = ", ".join(v for v in CLUSTER_VARS if v not in os.environ)
            raise UserError(f"-m/--mode {opts.mode} runs in a cluster: set {missing} "
                            f"(or use -m local)")
        from esync.algorithms import LocalSGD

        result = run_worker(opts, LocalSGD(opts.learning_rate, opts.momentum,
                                           opts.weight_decay, opts.eval_duration))
        return 1 if result.diverged else 0
    raise UserError(f"DMLC_ROLE={role}: the cluster roles (scheduler, server, worker) are "
                    f"not part of this version yet; unset DMLC_ROLE and use -m local")


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    prog = prog or os.path.basename(sys.argv[0]) or "esync"
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `esync | head` ends quietly
    try:
        return _run(argv, prog)
    except UserError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
