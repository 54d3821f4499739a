"""esync.runtime.remoteprep's decisions, in process, with tasks on a thread pool in place of
Ray's (the `Tasks` a launcher names in ESYNC_RAY_TASKS; test_remote_prep.py runs Ray's,
esync/launch/rayprep.py, in real jobs): batches come back in the order they were taken
whatever order the tasks finish in, the start needs a stall beyond the threshold and a
free CPU, a late task makes the worker fall back to making its batches itself (in order,
none lost), and the data set's own exception reaches the loop as it is."""
from __future__ import annotations

import concurrent.futures
import threading

import pytest
import torch

from esync.runtime import remoteprep
from esync.errors import UserError
from esync.data.timed import prepare_batch
from esync.runtime.remoteprep import RemotePrep, TaskLate

BATCH = 4


class Samples(torch.utils.data.Dataset):
    """Sample i is the tensor [i]; those in `slow` wait for `release` where a task makes
    them (not in the test's own thread, the worker's); `broken` raises the data set's
    own error."""

    def __init__(self, size=64, slow=(), broken=()):
        self.size, self.slow, self.broken = size, set(slow), set(broken)
        self.release = threading.Event()

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        if i in self.broken:
            raise KeyError(f"sample {i} is unreadable")
        if i in self.slow and threading.current_thread() is not threading.main_thread():
            self.release.wait(10)
        return torch.tensor([i])


class ThreadTasks:
    """remoteprep.Tasks on a thread pool of `cpus` threads."""

    def __init__(self, dataset, collate, cpus=2):
        self.dataset, self.collate, self.cpus = dataset, collate, cpus
        self.pool = concurrent.futures.ThreadPoolExecutor(max(cpus, 1))
        self.sent, self.cancelled = [], []

    def submit(self, items):
        future = self.pool.submit(prepare_batch, self.dataset, items, self.collate)
        self.sent.append(future)
        return future

    def ready(self, handles):
        return {h for h in handles if h.done()}

    def result(self, handle, timeout):
        try:
            return handle.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TaskLate() from None

    def cancel(self, handle):
        self.cancelled.append(handle)
        handle.cancel()

    def free_cpus(self):
        return self.cpus - sum(not f.done() for f in self.sent)


def sampler(size, batch=BATCH):
    """`take` over 0..size-1 in batches, and the list of what it handed out."""
    batches = [list(range(i, min(i + batch, size))) for i in range(0, size, batch)]
    taken = []

    def take():
        if len(taken) == len(batches):
            return None
        taken.append(batches[len(taken)])
        return taken[-1]
    return take, taken


def drain(prep, take):
    out = []
    while True:
        prepared = prep.next(take)
        if prepared is None:
            return out
        out.append(prepared)


def stalled(prep, prep_s=0.8, wall_s=1.2):
    """Tell `prep` of a round that stalled `prep_s` of `wall_s` seconds on prep."""
    return prep.should_start({"prep": prep_s, "compute": wall_s - prep_s})


def test_a_stall_beyond_the_threshold_over_a_second_starts_it_once_and_needs_a_free_cpu():
    data = Samples()
    prep = RemotePrep(data, torch.utils.data.default_collate, 0.5,
                      tasks=ThreadTasks(data, torch.utils.data.default_collate))
    assert not stalled(prep, 0.2, 0.5)        # half a second of rounds: not judged yet
    assert not prep.active
    assert stalled(prep, 0.5, 0.6)            # 0.7 of 1.1 s stalled > 0.5
    assert prep.active and not stalled(prep)  # once
    calm = RemotePrep(data, torch.utils.data.default_collate, 0.5,
                      tasks=ThreadTasks(data, torch.utils.data.default_collate))
    assert not stalled(calm, 0.4, 1.2)        # a third: under the threshold
    full = RemotePrep(data, torch.utils.data.default_collate, 0.5,
                      tasks=ThreadTasks(data, torch.utils.data.default_collate, cpus=0))
    assert not stalled(full) and not full.active  # no CPU free in the cluster


def test_batches_come_back_in_the_order_taken_whatever_order_the_tasks_finish_in():
    data = Samples(size=40, slow=range(0, 4))  # the first batch's task finishes last
    tasks = ThreadTasks(data, torch.utils.data.default_collate, cpus=3)
    prep = RemotePrep(data, torch.utils.data.default_collate, 0.3, tasks=tasks)
    assert stalled(prep)
    take, taken = sampler(40)
    threading.Timer(0.3, data.release.set).start()
    out = drain(prep, take)
    assert [b.flatten().tolist() for b, _, _ in out] == taken
    assert sorted(i for b, _, _ in out for i in b.flatten().tolist()) == list(range(40))
    assert all(remote for _, _, remote in out) and len(tasks.sent) == 10
    assert all(seconds > 0 for _, seconds, _ in out)  # the tasks' own, carried back


def test_a_task_not_back_in_time_falls_back_to_this_worker_in_order(monkeypatch):
    monkeypatch.setattr(remoteprep, "PATIENCE_S", 0.2)
    data = Samples(size=32, slow=[13])  # the fourth batch's task hangs
    tasks = ThreadTasks(data, torch.utils.data.default_collate, cpus=4)
    prep = RemotePrep(data, torch.utils.data.default_collate, 0.3, tasks=tasks)
    assert stalled(prep)
    take, taken = sampler(32)
    out = []
    while len(out) < 4:
        out.append(prep.next(take))
    assert [r for _, _, r in out] == [True, True, True, False]  # the late one made here
    assert not prep.active and tasks.cancelled
    data.release.set()  # made here too (its hang ends): nothing is lost
    out += drain(prep, take)  # those already out; then it would be the DataLoader's turn
    assert [b.flatten().tolist() for b, _, _ in out] == taken[:len(out)]
    # those back before the fall back are used; the others were cancelled, made here
    assert sum(not r for _, _, r in out[4:]) == len(tasks.cancelled) - 1


def test_the_data_sets_own_error_reaches_the_loop_as_it_is():
    data = Samples(size=16, broken=[5])
    prep = RemotePrep(data, torch.utils.data.default_collate, 0.3,
                      tasks=ThreadTasks(data, torch.utils.data.default_collate))
    assert stalled(prep)
    take, _ = sampler(16)
    assert prep.next(take)[0].flatten().tolist() == [0, 1, 2, 3]
    with pytest.raises(KeyError, match="sample 5 is unreadable"):
        prep.next(take)


def test_the_tasks_are_those_esync_ray_tasks_names(monkeypatch):
    """A launcher names the tasks as a plug-in; without a cluster's address, or with
    none named, one line naming what is missing."""
    data = Samples()
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    monkeypatch.setenv(remoteprep.TASKS_ENV, f"{__name__}:ThreadTasks")
    prep = RemotePrep(data, torch.utils.data.default_collate, 0.3)
    assert isinstance(prep.tasks, ThreadTasks) and prep.tasks.dataset is data
    monkeypatch.delenv(remoteprep.TASKS_ENV)
    with pytest.raises(UserError, match=r"^--remote-prep needs ESYNC_RAY_TASKS, "):
        RemotePrep(data, torch.utils.data.default_collate, 0.3)
    monkeypatch.delenv("RAY_ADDRESS")
    monkeypatch.delenv(remoteprep.ADDRESS_ENV, raising=False)
    with pytest.raises(UserError, match=r"^--remote-prep needs a Ray cluster: start the job "
                                        r"with esync-launch --ray \(this worker has no "):
        RemotePrep(data, torch.utils.data.default_collate, 0.3)
    monkeypatch.setenv(remoteprep.ADDRESS_ENV, "127.0.0.1:1")
    monkeypatch.setenv(remoteprep.TASKS_ENV, f"{__name__}:Samples.no_such")
    with pytest.raises(UserError, match=r"^ESYNC_RAY_TASKS tests\.test_remote_prep_policy:"
                                        r"Samples\.no_such: "):
        RemotePrep(data, torch.utils.data.default_collate, 0.3)
