import fcntl
import json
import os
import signal
import sys
import warnings

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
torch.set_num_threads(1)

#: each test file's seconds in a whole run (`python -m pytest --write-durations`), so
#: that the longest files start first: pytest-xdist hands the files out in collection
#: order (--no-loadscope-reorder in pytest.ini), and a long file handed out last keeps
#: one process busy while the other has nothing left (longest-first scheduling)
DURATIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "durations.json")
#: the weight of a file not in DURATIONS yet (a new one): about a file's median
NEW_FILE_SECONDS = 10.0


def pytest_addoption(parser):
    parser.addoption("--write-durations", action="store_true",
                     help=f"write each test file's seconds in this run into {DURATIONS} "
                          "(the files not run keep theirs), "
                          "which orders the files of later runs, longest first")


def pytest_collection_modifyitems(config, items):
    try:
        with open(DURATIONS, encoding="utf-8") as f:
            seconds = json.load(f)
    except (OSError, ValueError):
        return
    def weight(item):
        return -float(seconds.get(item.nodeid.split("::")[0], NEW_FILE_SECONDS))
    items.sort(key=weight)  # stable: a file's tests keep their order


def pytest_configure(config):
    if config.getoption("--write-durations") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Durations(), "esync-durations")


class _Durations:
    """Sums each file's setup, call and teardown seconds (on the controlling process,
    which receives every worker's reports) and writes them at the end of the run."""

    def __init__(self):
        self.seconds = {}

    def pytest_runtest_logreport(self, report):
        path = report.nodeid.split("::")[0]
        self.seconds[path] = self.seconds.get(path, 0.0) + report.duration

    def pytest_sessionfinish(self, session, exitstatus):
        try:  # a run of some files updates theirs and keeps the others'
            with open(DURATIONS, encoding="utf-8") as f:
                known = json.load(f)
        except (OSError, ValueError):
            known = {}
        known.update((k, round(v, 1)) for k, v in self.seconds.items())
        ordered = dict(sorted(known.items(), key=lambda kv: -kv[1]))
        with open(DURATIONS, "w", encoding="utf-8") as f:
            json.dump(ordered, f, indent=1)
            f.write("\n")


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


_INTERRUPTS = {signal.SIGINT, signal.SIGTERM}
_last_test = [None]


@pytest.fixture(autouse=True)
def _interrupts_as_a_shell_leaves_them(request):
    """Every test starts its processes with SIGINT and SIGTERM unblocked and SIGINT at
    Python's default, as from an interactive shell. Children inherit an ignored SIGINT
    and a blocked mask: a test run started in the background (`pytest &` in a script,
    nohup) ignores SIGINT from the start, and then every launcher a Ctrl-C test starts
    ignores it too and the test times out (ten of them in one such run). If a test of
    this process left them otherwise, this also warns, naming it."""
    blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, _INTERRUPTS) & _INTERRUPTS
    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if (blocked or ignored) and _last_test[0] is not None:
        warnings.warn(f"after {_last_test[0]}: SIGINT/SIGTERM were "
                      f"{'blocked ' + str(sorted(blocked)) if blocked else ''}"
                      f"{' ignored' if ignored else ''}; restored")
    _last_test[0] = request.node.nodeid
    yield
