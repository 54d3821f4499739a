import fcntl
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def _machine_locks(tmp_path_factory):
    """Two lock files shared by the session's test processes (pytest-xdist's workers
    share the parent of their temporary folders): a turnstile and the machine."""
    folder = tmp_path_factory.getbasetemp().parent
    files = [open(folder / name, "a") for name in ("turnstile.lock", "machine.lock")]
    yield files
    for f in files:
        f.close()


@pytest.fixture(autouse=True)
def _share_the_machine(request, _machine_locks):
    """A test marked `alone` measures how the simulated devices share the CPU, which the
    other test process's load would distort: it waits until the running tests end and
    keeps new ones from starting until it ends. Every other test holds the machine
    shared. The turnstile keeps a stream of shared holders from starving it."""
    turnstile, machine = _machine_locks
    alone = request.node.get_closest_marker("alone") is not None
    fcntl.flock(turnstile, fcntl.LOCK_EX)
    try:
        fcntl.flock(machine, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
    except BaseException:
        fcntl.flock(turnstile, fcntl.LOCK_UN)
        raise
    if not alone:
        fcntl.flock(turnstile, fcntl.LOCK_UN)
    try:
        yield
    finally:
        fcntl.flock(machine, fcntl.LOCK_UN)
        if alone:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
