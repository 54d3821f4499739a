"""`esync-run`: start a training script of your own as a job's workers, as torchrun
does, with everything else of the job beside them.

    esync-run --workers 4 -m esync --slowdown 1,1,4,4 --time-limit 60 train.py --lr 3e-4

Everything before the script (the first argument ending in `.py`) is esync-run's: the
launcher's flags (esync-launch's: --workers, --servers, --slowdown, --devices,
--bandwidth, --latency, --ray, --out, --no-auth, --restart-failed...) and the job's
(main.py's, esync.options: -m, --backend, --compress, stop criteria, checkpoints...);
everything after it is the script's own. The launcher starts the state server (ESync's
budgets and every mode's live page, whose address it prints), the scheduler, the
servers and the evaluator as for main.py, and N copies of the script, each with its
role's variables and the job's flags in ESYNC_ARGS, where `esync.init()` finds them;
supervision, logs (OUT/<script name>/<mode folder>/...), progress line and clean-up
are esync-launch's.

`esync-run --help` lists both sets of flags, generated from the two parsers by
`help_sections`, which the manual's page (docs/gen_reference.py) renders too. Job flags
that only main.py's built-in loop reads (BUILT_IN_LOOP_ONLY: its SGD, its batches, its
DataLoader) are marked, as are those the launcher sets itself.
"""
from __future__ import annotations

import argparse
import copy
import sys
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from esync.errors import UserError, command_main
from esync.launch.local import LAUNCHER_SETS, run
from esync.options import BUILT_IN_LOOP_ONLY
# the flags before the script are parsed by the launcher's parser (the manual's page of
# esync-run checks its flags against it: docs/gen_reference.py's parser_of)
from esync.launch.local import build_parser  # noqa: F401

PROG = "esync-run"

#: what a job flag that reads as the built-in loop's, but is not only its, does for a
#: script (its help in esync-run's lists starts with this)
FOR_A_SCRIPT = {
    "learning_rate": "[for a script: not its optimizer's learning rate, only the scale of "
                     "a sync/async step pushed as the gradient (w_start - w) / lr, which "
                     "DC-ASGD's compensation and --compress threshold:T see]",
}

USAGE = f"usage: {PROG} [launcher flags] [job flags] SCRIPT.py [script args]"
BUILT_IN_MARK = "[built-in loop only]"
LAUNCHER_MARK = "[set by the launcher]"
LOG_FOLDER = "OUT/<script name>/<mode folder>/<host>"


def description() -> List[str]:
    """What esync-run does, paragraph by paragraph (--help and the manual's page)."""
    return [
        "Start a training script of your own as the workers of a job, as torchrun does, "
        "with the rest of the job beside them: the state server (ESync's budgets and the "
        "job's live page, whose address it prints), the scheduler, the servers and, where "
        "the script's model is given as -n module:function (and its data as --dataset "
        "module:function), the evaluator. Each worker runs `python SCRIPT.py [script "
        "args]` with its role's variables and the job flags in ESYNC_ARGS, where "
        "esync.init() reads them.",
        "The script is the first argument ending in .py: the launcher flags and the job "
        "flags come before it, the script's own flags after it.",
        f"Example: {PROG} --workers 4 -m esync --slowdown 1,1,4,4 --time-limit 60 train.py "
        f"--lr 3e-4",
    ]


def log_lines() -> List[str]:
    """Where each process's output and the rounds' logs go (one path a line)."""
    return [
        "Where the output and the logs go (<device>: w<k>, or w<k>-x<F> with a --slowdown",
        "F; <mode folder>: the mode's, as esync-summary reads it):",
        f"  {LOG_FOLDER}/<device>/worker.log     each worker's output",
        f"  {LOG_FOLDER}/<device>/iter-<n>.json  its rounds' logs",
        f"  {LOG_FOLDER}/scheduler.log, server<k>.log, stateserver.log",
    ]


@dataclass
class FlagSection:
    """A group of esync-run's flags: copies of its parser's actions whose help carries
    their mark; `parser` is theirs (for defaults and %-expansions)."""

    title: str
    description: str
    parser: argparse.ArgumentParser
    actions: List[argparse.Action]


def _marked(action: argparse.Action, mark: str) -> argparse.Action:
    marked = copy.copy(action)
    marked.help = f"{mark} {action.help or ''}".strip()
    return marked


def _names(actions: Sequence[argparse.Action]) -> str:
    return ", ".join("/".join(a.option_strings) for a in actions)


def help_sections(prog: str = PROG) -> List[FlagSection]:
    """esync-run's flags, from the launcher's parser (esync.launch.local) and the job's
    (esync.options), with the job's flags marked as the launcher and a script use them:
    what both `esync-run --help` and the manual's page list."""
    from esync.launch import local
    from esync.options import build_parser as job_parser

    launcher = local.build_parser(prog)
    job = job_parser(prog)
    shown = {s for a in launcher._actions for s in a.option_strings}
    launchers = [a for a in job._actions if a.option_strings
                 and set(a.option_strings) <= shown and a.dest != "help"]
    actions = []
    for action in job._actions:
        if not action.option_strings or set(action.option_strings) <= shown:
            continue  # -h, and the launcher's own spelling of -m, --slowdown...
        if action.dest in BUILT_IN_LOOP_ONLY:
            action = _marked(action, BUILT_IN_MARK)
        elif action.dest in LAUNCHER_SETS:
            action = _marked(action, LAUNCHER_MARK)
        elif action.dest in FOR_A_SCRIPT:
            action = _marked(action, FOR_A_SCRIPT[action.dest])
        actions.append(action)
    return [
        FlagSection("launcher flags (esync-launch's)",
                    "The job's processes and simulated devices.", launcher,
                    [a for a in launcher._actions if a.option_strings]),
        FlagSection("job flags (main.py's)",
                    f"The job's settings, passed to every worker in ESYNC_ARGS (and those "
                    f"of checkpoints and failures to the scheduler and the servers). "
                    f"{BUILT_IN_MARK}: read by main.py's built-in loop only (its SGD, its "
                    f"batches, its DataLoader); a script's own optimizer and DataLoader "
                    f"take their place. {LAUNCHER_MARK}: each worker's is the launcher's "
                    f"(its log folder and label from --out and --slowdown, the state "
                    f"server's address). The job's {_names(launchers)} are the launcher "
                    f"flags of those names above, one value per worker where they take "
                    f"a list.", job, actions),
    ]


def format_help(prog: str = PROG) -> str:
    """`esync-run --help`: the usage, what it does, then every flag, marked."""
    sections = help_sections(prog)
    formatter = sections[0].parser.formatter_class(prog=prog)
    for paragraph in description():
        formatter.add_text(paragraph)
    intro = formatter.format_help()
    formatter = sections[0].parser.formatter_class(prog=prog)
    for section in sections:
        formatter.start_section(section.title)
        formatter.add_text(section.description)
        formatter.add_arguments(section.actions)
        formatter.end_section()
    formatter.add_text(sections[0].parser.epilog)
    logs = "\n".join(log_lines())
    return f"{USAGE}\n\n{intro}\n{logs}\n\n{formatter.format_help()}"


def asks_help(argv: Sequence[str]) -> bool:
    """Whether -h/--help is among esync-run's own arguments (before the script)."""
    try:
        ours, _ = split(argv)
    except UserError:
        ours = list(argv)
    return any(arg in ("-h", "--help") for arg in ours)


def split(argv: Sequence[str]) -> Tuple[List[str], List[str]]:
    """(the launcher's arguments, the script and its arguments)."""
    for i, arg in enumerate(argv):
        if arg.endswith(".py") and not arg.startswith("-"):
            return list(argv[:i]), list(argv[i:])
    raise UserError("no training script: give it (a .py file) after esync-run's flags, "
                    "as in esync-run --workers 2 -m esync train.py")


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    """The `esync-run` command (see the module's docstring)."""
    return command_main(_main, argv, prog, PROG)


def _main(argv: List[str], prog: str) -> int:
    if asks_help(argv):
        sys.stdout.write(format_help(prog))
        return 0
    ours, script = split(argv)
    return run(ours, prog=prog, script=script)


def console_main() -> int:
    """The `esync-run` command."""
    return main()


if __name__ == "__main__":
    sys.exit(main())
