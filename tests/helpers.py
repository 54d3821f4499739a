"""Shared by the tests: a hand-rolled IDX writer, a runner for real `main.py` processes,
waiting for an event, the evaluator's accuracy in a job's logs, and processes' outputs
without a traceback."""
from __future__ import annotations

import glob
import gzip
import json
import os
import struct
import subprocess
import sys
import time
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAIN = os.path.join(REPO, "main.py")
#: the variables that make main.py a node of a cluster (tests start from none of them)
CLUSTER_VARIABLES = ("DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER",
                     "DMLC_NUM_WORKER", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                     "TORCHELASTIC_RUN_ID")
IDX_NAMES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


def idx_bytes(array: np.ndarray, magic: Optional[bytes] = None) -> bytes:
    """The IDX encoding of a uint8 array, written here independently of esync's reader."""
    array = np.asarray(array, dtype=np.uint8)
    head = magic if magic is not None else bytes([0, 0, 0x08, array.ndim])
    return head + b"".join(struct.pack(">I", d) for d in array.shape) + array.tobytes()


def write_idx(path: str, array: np.ndarray, gz: bool = True, **kw) -> str:
    data = idx_bytes(array, **kw)
    if gz:
        path += ".gz"
        data = gzip.compress(data)
    with open(path, "wb") as f:
        f.write(data)
    return path


def make_idx_dataset(root: str, name: str = "fashion-mnist", n_train: int = 300,
                     n_test: int = 100, gz: bool = True, seed: int = 0) -> str:
    """A small learnable IDX data set under root/name: class k is a bright bar at row 2k+4."""
    rng = np.random.default_rng(seed)
    folder = os.path.join(root, name)
    os.makedirs(folder, exist_ok=True)
    for part, n in (("train", n_train), ("test", n_test)):
        labels = rng.integers(0, 10, n).astype(np.uint8)
        images = rng.integers(0, 60, (n, 28, 28)).astype(np.uint8)
        for i, k in enumerate(labels):
            images[i, 2 * k + 4:2 * k + 6, 4:24] = 250
        write_idx(os.path.join(folder, IDX_NAMES[f"{part}_images"]), images, gz)
        write_idx(os.path.join(folder, IDX_NAMES[f"{part}_labels"]), labels, gz)
    return folder


def alive(pid):
    """Whether process `pid` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def run_main(args: Sequence[str], timeout: float = 240, env: Optional[dict] = None,
             cwd: Optional[str] = None) -> subprocess.CompletedProcess:
    """Run `python main.py ARGS` as a new process (one torch thread) and wait for it."""
    full_env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    for var in CLUSTER_VARIABLES:
        full_env.pop(var, None)
    full_env.update(env or {})
    return subprocess.run([sys.executable, MAIN, *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=cwd or REPO)


def wait_until(predicate: Callable[[], object], what: str, timeout: float = 30.0,
               poll: float = 0.02):
    """predicate()'s first true value, polled until the deadline (AssertionError then)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out ({timeout:g} s) waiting for {what}"
        time.sleep(poll)


def evaluator_accuracy(out: str, mode_folder: str, network: str = "lenet") -> float:
    """The best test accuracy the evaluator logged under OUT/NETWORK/MODE_FOLDER/*."""
    records = [json.load(open(f)) for f in glob.glob(
        os.path.join(out, network, mode_folder, "*", "evaluator", "iter-*.json"))]
    assert records, f"no evaluator logs under {out}"
    return max(r["accuracy"] for r in records if r.get("accuracy") is not None)


def assert_no_traceback(outputs: Mapping[str, str]) -> None:
    """No process's output ({name: output}) holds a traceback."""
    for name, output in outputs.items():
        assert "Traceback" not in output, (name, output[-3000:])


def assert_breakdown(records: Sequence[dict], waits: bool = False) -> None:
    """Each round's record says where its time went (esync.logs.breakdown): every category,
    none negative, computing in every round the device did not sit out, and the
    categories add up to the job's time between the first and last record (within 10%,
    and 0.2 s). `waits`: a
    synchronous job whose workers differ in speed, where some round waited for others."""
    from esync.logs.breakdown import CATEGORIES

    assert records, "no round records"
    for r in records:
        assert set(r["breakdown"]) == set(CATEGORIES), r["breakdown"]
        assert min(r["breakdown"].values()) >= 0, r["breakdown"]
        assert r["prep_seconds"] >= 0
    # computing in every round but one sat out (ESync's budget 0: a device measured
    # below --least-speed, which a loaded machine can make of one at 1/4 for a round)
    assert all(r["breakdown"]["compute"] > 0 for r in records[1:] if r.get("budget") != 0)
    spent = sum(sum(r["breakdown"].values()) for r in records[1:])
    elapsed = records[-1]["total_time"] - records[0]["total_time"]
    assert abs(spent - elapsed) <= 0.1 * elapsed + 0.2, (spent, elapsed)
    if waits:
        assert sum(r["breakdown"]["wait"] for r in records) > 0

