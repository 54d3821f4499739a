"""The one exception type that reaches the user as a single line and exit code 2, and
the frame of every console command that reports it (`command_main`: esync,
esync-launch, esync-run, esync-hosts, esync-experiment, esync-summary, esync-draw,
esync-compare, esync-pack, esync-stalls). Imports nothing of esync: the launchers'
and the log tools' commands use it without the runtime."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, List, Optional, Sequence


class UserError(Exception):
    """Bad input from the user (a flag, a file, an environment variable).

    The message names what was wrong and what was expected; `command_main` prints it
    as one line and exits with status 2, without a traceback.
    """


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose bad input is a UserError: the command's one line
    (`prog: error: ...`, status 2), without argparse's usage lines."""

    def error(self, message: str):
        raise UserError(message)


def say_error(prog: str, error: UserError) -> None:
    """Bad input as the one line users get: `main.py: error: ...`."""
    print(f"{prog}: error: {error}", file=sys.stderr, flush=True)


def program_name(default: str) -> str:
    """The name this process's command was started by, for its messages: an installed
    console script's (esync-summary, or whatever it was linked as); `default`, the
    command's own name, when Python was given a file (`python compare.py`, `python -m
    esync.data.pack`: argv[0] is a .py file) or a string (`-c`)."""
    started = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return default if started in ("", "-c") or started.endswith(".py") else started


def command_main(body: Callable[[List[str], str], int], argv: Optional[Sequence[str]],
                 prog: Optional[str], default: str) -> int:
    """Run one command, `body(argv, prog)`, and return its exit status: every console
    main's frame. `argv` None: this process's command line, and `prog` (None) the name
    it was started by (`program_name`); a given `argv` is named `prog`, else `default`.
    A UserError is the one line `prog: error: ...` and status 2; Ctrl-C `prog:
    interrupted` and 130; a reader that left (`esync-hosts FILE | head`) ends it quietly
    with 0."""
    if prog is None:
        prog = program_name(default) if argv is None else default
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return body(argv, prog)
    except BrokenPipeError:  # nothing more can be written there: end quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except UserError as e:
        say_error(prog, e)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
