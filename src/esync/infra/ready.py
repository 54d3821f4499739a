"""Readiness: how a process started by a supervisor says where it listens.

A supervisor that wants to know when a child is ready, and on which port, passes it the
write end of a pipe and its number in ESYNC_READY_FD. Once the child listens, it
writes its port as one line (`12345\n`) to that descriptor and closes it; a child that
dies first closes it with nothing written. So a child can bind port 0 (the OS picks a
free port) and report it, instead of being handed a port that someone else may take
between the supervisor's check and the child's bind. Without ESYNC_READY_FD nothing
is written. The scheduler (`DMLC_PS_ROOT_PORT=0`) and the state server's `runserver`
(port 0) report this way; `launch.supervisor` reads it.
"""
from __future__ import annotations

import os

ENV = "ESYNC_READY_FD"


def announce(port: int) -> None:
    """Tell the supervisor (if any) that this process listens on `port`; once."""
    fd = os.environ.pop(ENV, None)
    if fd is None:
        return
    try:
        os.write(int(fd), f"{port}\n".encode())
        os.close(int(fd))
    except (OSError, ValueError):
        pass  # no supervisor listening: nothing to tell
