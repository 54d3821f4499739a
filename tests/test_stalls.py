"""Where a round's time goes (esync.logs.breakdown), attributed right: a user's script whose
transform sleeps a known time per sample is prep-stalled by that time (decoded in the
training process or in a DataLoader worker, which times it and sends it back with the
batch); the same script on emulated slow storage is fetch-stalled by the time its reads
take; and in a synchronous job the fast worker's time waiting for the slow one is
`wait`, as the server measured it, not communication. The injected delays are known;
the measured stalls must come within 20% of them (the issue's bound)."""
import glob
import json
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO, assert_breakdown
from tests.test_shard_data import write_shards

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
SCRIPT = os.path.join(REPO, "tests", "stall_script.py")
ROUNDS = 40
BATCH = 16  # stall_script.py's


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("stall_shards"), n_train=600)


def run_alone(shards, out, delay_ms, workers, *flags):
    """stall_script.py alone (-m local) for ROUNDS rounds of one batch; its records."""
    done = subprocess.run(
        [sys.executable, SCRIPT, shards, str(delay_ms), str(workers), "-m", "local",
         "--max-rounds", str(ROUNDS), "--num-threads", "1", "-ld", str(out), *flags],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    paths = glob.glob(os.path.join(str(out), "*", "*", "iter-*.json"))
    records = sorted((json.load(open(p)) for p in paths), key=lambda r: r["num_iters"])
    assert len(records) == ROUNDS
    assert_breakdown(records)
    return records


def total(records, category):
    return sum(r["breakdown"][category] for r in records)


_baselines = {}


def baseline(shards, tmp_path, workers):
    """The same script with no delay and no slow storage (once per loader, in the first
    test that asks, so under its `alone`): the decoding's own time, which a slower
    machine makes longer (about 1 ms a sample on one CI machine, as much as a fifth of
    the injected delay), to be taken off what a test measures."""
    if workers not in _baselines:
        _baselines[workers] = run_alone(shards, tmp_path / "baseline", 0, workers)
    return _baselines[workers]


# the stalls measured against the delays injected: another test's load on the shared cores
# would add to them (CI's 2 cores: 37% more prep, a fetch run's prep at 23% of its fetch)
@pytest.mark.alone
@pytest.mark.parametrize("workers", [0, 1])
def test_a_slow_transform_is_a_prep_stall(shards, tmp_path, workers):
    """6 ms a sample: 40 batches of 16 wait 3.84 s more for decoding than with no delay,
    in this process or in the DataLoader's worker (which the tiny model cannot keep
    busy: it waits)."""
    plain = baseline(shards, tmp_path, workers)
    records = run_alone(shards, tmp_path, 6, workers)
    injected = ROUNDS * BATCH * 0.006
    assert total(records, "prep") - total(plain, "prep") == pytest.approx(injected, rel=0.2)
    # the work, timed where it ran and carried back with each batch
    work = sum(r["prep_seconds"] for r in records) - sum(r["prep_seconds"] for r in plain)
    assert work == pytest.approx(injected, rel=0.2)
    assert total(records, "fetch") < 0.2 * injected


@pytest.mark.alone
def test_slow_storage_is_a_fetch_stall(shards, tmp_path):
    """--disk-bandwidth 0.5: every block read takes its bytes over 0.5 MB/s; decoding
    takes no longer than without it."""
    plain = baseline(shards, tmp_path, 0)
    records = run_alone(shards, tmp_path, 0, 0, "--disk-bandwidth", "0.5")
    read = sum(r["read_bytes"] for r in records)
    injected = read / 0.5e6
    assert injected > 0.5  # enough to measure
    assert total(records, "fetch") == pytest.approx(injected, rel=0.2)
    assert sum(r["read_seconds"] for r in records) == pytest.approx(injected, rel=0.2)
    assert total(records, "prep") < total(plain, "prep") + 0.2 * injected


def test_the_fast_worker_of_a_synchronous_job_waits_for_the_slow_one(tmp_path):
    """SSGD at --slowdown 1,3: each round the fast worker waits at the server for the
    slow one's push, the slow one less. Both rounds end together, so the fast one's
    extra wait is the slow one's extra busy time: its computing (3 times as long), but
    also its fetch, communication and bookkeeping, which beside LeNet's few ms of
    computing are no small part (a CI run measured a wait of 0.86 s for 0.55 s of
    extra computing alone)."""
    done = subprocess.run(
        [sys.executable, os.path.join(REPO, "src", "esync", "launch", "local.py"), "-m", "sync",
         "--workers", "2", "--servers", "1", "--slowdown", "1,3", "-n", "lenet",
         "--num-threads", "1", "--max-rounds", "60", "--no-progress", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    def records(device):
        paths = glob.glob(os.path.join(str(tmp_path), "lenet", "sync", "*", device, "iter-*.json"))
        return sorted((json.load(open(p)) for p in paths), key=lambda r: r["num_iters"])[5:]

    fast, slow = records("w0"), records("w1-x3")
    assert_breakdown(fast, waits=True)
    assert_breakdown(slow)
    def busy(records):
        return sum(v for r in records for k, v in r["breakdown"].items() if k != "wait")

    assert total(slow, "compute") > total(fast, "compute")
    behind = busy(slow) - busy(fast)
    assert behind > 0
    # the slow one waits less by that much: its own wait is the server's aggregation
    # and, on a loaded machine, its scheduling, which is no fixed share of the fast
    # one's (CI measured 0.09 s against 0.32 s, and 0.19 s against 0.31 s)
    assert 0.75 * behind < total(fast, "wait") - total(slow, "wait") < 1.25 * behind
