"""How esync's processes speak to their user: log lines on the standard streams, and
the one line a bad input gets (esync.errors' `say_error`, and `command_main`, which
runs every console command). Used by the command line (esync.cli) and the API's
`init` alike.

Every module logs to its own logger (`logging.getLogger(__name__)`); here the lines go
to stdout (errors and warnings to stderr) as plain messages; PS_VERBOSE=1 adds the
transport's control messages.
"""
from __future__ import annotations

import logging
import sys

#: the handlers this module installs, so that configuring again replaces them
_HANDLERS: list = []


class _StandardStream(logging.StreamHandler):
    """A handler writing to whatever sys.stdout / sys.stderr is when a line is logged
    (main() may run in a process that swaps them, as pytest's capture does)."""

    def __init__(self, name: str):
        self.name_of_stream = name
        super().__init__()

    @property
    def stream(self):
        return getattr(sys, self.name_of_stream)

    @stream.setter
    def stream(self, value) -> None:
        pass  # always the current standard stream


class _Below(logging.Filter):
    def __init__(self, level: int):
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < self.level


def configure_logging(verbose: bool = False) -> None:
    """esync's messages as plain lines: INFO and DEBUG to stdout, WARNING and above to
    stderr; `verbose` (PS_VERBOSE) turns on the transport's DEBUG lines."""
    root = logging.getLogger("esync")
    for handler in _HANDLERS:
        root.removeHandler(handler)
    _HANDLERS.clear()
    out = _StandardStream("stdout")
    out.addFilter(_Below(logging.WARNING))
    err = _StandardStream("stderr")
    err.setLevel(logging.WARNING)
    for handler in (out, err):
        handler.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(handler)
        _HANDLERS.append(handler)
    root.setLevel(logging.INFO)
    logging.getLogger("esync.transport").setLevel(logging.DEBUG if verbose else logging.NOTSET)
