"""`esync-run`: start a training script of your own as a job's workers, as torchrun
does, with everything else of the job beside them.

    esync-run --workers 4 -m esync --slowdown 1,1,4,4 --time-limit 60 train.py --lr 3e-4

Everything before the script (the first argument ending in `.py`) is esync-launch's:
its own flags (--workers, --servers, --slowdown, --devices, --bandwidth, --latency,
--ray, --out, --no-auth, --restart-failed...) and main.py's, which set the job (-m,
--backend, --compress, stop criteria, checkpoints...); everything after it is the
script's own. The launcher starts the state server (ESync's budgets and every mode's
live page, whose address it prints), the scheduler, the servers and the evaluator as
for main.py, and N copies of the script, each with its role's
variables and main.py's flags in ESYNC_ARGS, where `esync.init()` finds them;
supervision, logs (OUT/<script name>/<mode>/...), progress line and clean-up are
esync-launch's.

The evaluator measures the global model only if it can build it: give the script's
model and test data as plug-ins, `-n module:function` (returns the nn.Module) and
`--dataset module:function` (returns the training and test data sets); without `-n`
there is no evaluator, and the script measures what it wants itself.
"""
from __future__ import annotations

import sys
from typing import List, Optional, Sequence, Tuple

from esync.launch.local import LaunchError, run

PROG = "esync-run"


def split(argv: Sequence[str]) -> Tuple[List[str], List[str]]:
    """(the launcher's arguments, the script and its arguments)."""
    for i, arg in enumerate(argv):
        if arg.endswith(".py") and not arg.startswith("-"):
            return list(argv[:i]), list(argv[i:])
    raise LaunchError("no training script: give it (a .py file) after esync-run's flags, "
                      "as in esync-run --workers 2 -m esync train.py")


def main(argv: Optional[Sequence[str]] = None, prog: str = PROG) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    try:
        ours, script = split(argv)
        return run(ours, prog=prog, script=script)
    except LaunchError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2


def console_main() -> int:
    """The `esync-run` command."""
    return main()


if __name__ == "__main__":
    sys.exit(main())
