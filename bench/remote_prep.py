"""One worker of one CPU with heavy augmentation: its samples per second with and
without --remote-prep (preprocessing on Ray tasks where the cluster has CPUs free).

    python bench/remote_prep.py [--runs 3] [--seconds 30] [--aug-ms 2] [--batch 32]
                                [--samples 2000] [--remote-prep 0.1] [--dir DIR] [--out DIR]

The machine's cores are split: the worker's process (this file, run by esync-run as the
user's script) pins itself to the first core this process may use (os.sched_setaffinity,
before its DataLoader worker process starts, which inherits it), and a Ray head of the
benchmark's own runs on the others (`ray start --head` under `taskset`, so Ray's daemons,
actors and task workers are there; `--num-cpus` = those cores + the worker's one CPU, so
that the job's one bundle leaves the other cores free for tasks; its own temporary folder,
ports and token; stopped at the end with every process it started).

Data: --samples 32x32 RGB PNG images of 10 classes in shards (esync.data.shards'
ShardWriter, in --dir, reused while they match). The script: esync.ShardDataset with a
transform that spends --aug-ms of its thread's CPU time per sample (a stand-in for heavy
augmentation: the work is fixed whoever shares the core), in a DataLoader of one worker
process, batches of --batch, a small CNN (two convolutions and a linear layer, one thread)
trained with SGD.

Jobs: `esync-run --ray HEAD -m local -e 4 --num-threads 1 --time-limit SECONDS
[--remote-prep F] bench/remote_prep.py ...`, the baseline (no --remote-prep) and the
remote one in each run, alternating which goes first. From the worker's round records:
samples/s over the rounds of the second half of the job's time (the switch to Ray tasks
and Ray's worker start-up done), the prep stall's share of that time and the share of
batches Ray tasks made. The threshold is low (0.1) because on one core the DataLoader
worker's decoding mostly shows as slower compute, not as a stall: the two share the core. Printed: a line per job, then median [min-max] over the runs of
each, and of the ratio remote/baseline taken within each run. Timings, not test
material: they vary with the machine's load.
"""
from __future__ import annotations

import argparse
import glob
import io
import json
import os
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT_FLAG = "--as-script"
#: `ray start` flags of ports with a fixed default: each gets a free one
PORT_FLAGS = ("--port", "--ray-client-server-port", "--dashboard-agent-listen-port",
              "--dashboard-agent-grpc-port", "--metrics-export-port",
              "--runtime-env-agent-port", "--node-manager-port", "--object-manager-port")


# --- the user's script (run by esync-run: this file with SCRIPT_FLAG) -------------------

def _script(shards: str, aug_ms: float, batch: int, core: int) -> None:
    import torch
    from torch.utils.data import DataLoader

    import esync

    os.sched_setaffinity(0, {core})  # one CPU, its DataLoader worker with it
    torch.set_num_threads(1)
    esync.init()
    model = esync.prepare_model(torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(4),
        torch.nn.Flatten(), torch.nn.Linear(64 * 8 * 8, 10)))
    loader = esync.prepare_data_loader(DataLoader(
        esync.ShardDataset(shards, transform=Augment(aug_ms)), batch_size=batch,
        shuffle=True, num_workers=1))
    optimizer = esync.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01))
    while not esync.should_stop():
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(inputs), targets)
            esync.report(loss.item())
            loss.backward()
            optimizer.step()


class Augment:
    """Heavy augmentation's stand-in: `ms` of this thread's CPU time per sample, then a
    random horizontal flip."""

    def __init__(self, ms: float):
        self.seconds = ms / 1000.0

    def __call__(self, image):
        import torch

        end = time.thread_time() + self.seconds
        while time.thread_time() < end:
            pass
        return torch.flip(image, dims=[2]) if torch.rand(()) < 0.5 else image


# --- data ---------------------------------------------------------------------------

def write_shards(folder: str, samples: int) -> str:
    """--samples 32x32 RGB PNGs of 10 classes (a class's colour plus noise), reused
    while its description matches."""
    import numpy as np
    from PIL import Image

    from esync.data.shards import ShardWriter, write_index

    stamp = os.path.join(folder, "bench.json")
    described = {"samples": samples, "kind": "rgb32-png"}
    if os.path.exists(stamp) and json.load(open(stamp)) == described:
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    rng = np.random.default_rng(0)
    splits = {}
    for split, n in (("train", samples), ("test", max(10, samples // 10))):
        writer = ShardWriter(folder, split, 4 << 20)
        for k in range(n):
            label = int(rng.integers(10))
            pixels = rng.integers(0, 64, (32, 32, 3)) + np.array([label * 19, 100, 200 - label * 19])
            png = io.BytesIO()
            Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(png, "PNG")
            writer.write({"png": png.getvalue()}, label)
        splits[split] = writer.close()
    write_index(folder, splits, "png", "cls", [str(k) for k in range(10)])
    json.dump(described, open(stamp, "w"))
    return folder


# --- the Ray head ------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _session_pids(session: int, root: str) -> List[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace")
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and (int(fields[3]) == session or root in argv):
            found.append(int(entry))
    return found


class Head:
    """`ray start --head` on `cores`, of `cpus` logical CPUs, in a folder of its own."""

    def __init__(self, cores: Sequence[int], cpus: int):
        self.root = tempfile.mkdtemp(prefix="esrp-", dir="/tmp")  # short socket paths
        os.makedirs(os.path.join(self.root, "tmp"))
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("RAY_", "DMLC_", "ESYNC_"))}
        self.env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32),
                        RAY_USAGE_STATS_ENABLED="0", TMPDIR=os.path.join(self.root, "tmp"))
        ray = os.path.join(os.path.dirname(sys.executable), "ray")
        argv = ["taskset", "-c", ",".join(map(str, cores)),
                ray if os.path.exists(ray) else "ray", "start", "--head",
                f"--num-cpus={cpus}", "--num-gpus=0", f"--temp-dir={self.root}",
                "--min-worker-port=0", "--max-worker-port=0", "--disable-usage-stats",
                "--include-dashboard=false", "--log-style=record",
                *(f"{flag}={_free_port()}" for flag in PORT_FLAGS)]
        starter = subprocess.Popen(argv, env=self.env, cwd=self.root, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        self.session = starter.pid
        out, _ = starter.communicate(timeout=180)
        found = re.search(r"ray start --address='([^']+)'", out)
        if starter.returncode != 0 or not found:
            self.stop()
            raise SystemExit(f"bench/remote_prep.py: ray start failed:\n{out[-2000:]}")
        self.address = found.group(1)

    def stop(self) -> None:
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            pids = _session_pids(self.session, self.root)
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
            deadline = time.monotonic() + wait
            while _session_pids(self.session, self.root) and time.monotonic() < deadline:
                time.sleep(0.1)
        left = _session_pids(self.session, self.root)
        shutil.rmtree(self.root, ignore_errors=True)
        if left:
            print(f"warning: Ray processes left: {left}", file=sys.stderr)


# --- a job -----------------------------------------------------------------------------

def run_job(head: Head, args, out: str, remote: bool, core: int) -> Dict[str, float]:
    """One job; its figures from the worker's records."""
    command = [sys.executable, os.path.join(ROOT, "src", "esync", "launch", "run.py"), "--ray", head.address,
               "-m", "local", "-e", "4", "--num-threads", "1", "--time-limit",
               str(args.seconds), "--no-progress", "--no-evaluator", "--out", out,
               *(["--remote-prep", str(args.remote_prep)] if remote else []),
               os.path.abspath(__file__), SCRIPT_FLAG, args.shards, str(args.aug_ms),
               str(args.batch), str(core)]
    done = subprocess.run(command, cwd=ROOT, env=head.env, capture_output=True, text=True,
                          timeout=args.seconds + 300)
    if done.returncode != 0:
        raise SystemExit(f"bench/remote_prep.py: the job failed ({done.returncode}):\n"
                         f"{(done.stdout + done.stderr)[-3000:]}")
    (folder,) = glob.glob(os.path.join(out, "remote_prep", "local", "*", "*", ""))
    records = [json.load(open(p)) for p in glob.glob(os.path.join(folder, "iter-*.json"))]
    records.sort(key=lambda r: r["num_iters"])
    walls = [sum(r["breakdown"].values()) for r in records]
    start, elapsed = len(records), 0.0
    for k, wall in enumerate(walls):  # the rounds of the second half of the time
        elapsed += wall
        if elapsed >= sum(walls) / 2:
            start = k + 1
            break
    kept = records[start:]
    seconds = sum(walls[start:])
    return {"samples_per_s": sum(r["num_samples"] for r in kept) / seconds,
            "prep_share": sum(r["breakdown"]["prep"] for r in kept) / seconds,
            "remote_share": sum(r.get("remote_batches", 0) for r in kept)
            / max(1, sum(r["num_samples"] for r in kept) / args.batch),
            "rounds": len(kept)}


def _spread(values: List[float], digits: int = 1) -> str:
    return (f"{statistics.median(values):.{digits}f} "
            f"[{min(values):.{digits}f}-{max(values):.{digits}f}]")


def main(argv: Sequence[str] = ()) -> int:
    if argv and argv[0] == SCRIPT_FLAG:
        shards, aug_ms, batch, core = argv[1:5]
        _script(shards, float(aug_ms), int(batch), int(core))
        return 0
    parser = argparse.ArgumentParser(prog="bench/remote_prep.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=30.0, help="each job's --time-limit")
    parser.add_argument("--aug-ms", type=float, default=2.0,
                        help="CPU ms of augmentation per sample")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--remote-prep", type=float, default=0.1)
    parser.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "esync-bench-rp"))
    parser.add_argument("--out", default=None, help="the jobs' logs (default: removed)")
    args = parser.parse_args(argv)
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("bench/remote_prep.py: needs 2 cores or more (one for the worker)")
    core, others = cores[0], cores[1:]
    args.shards = write_shards(args.dir, args.samples)
    out = args.out or tempfile.mkdtemp(prefix="esync-rp-out-")
    print(f"cores: the worker on {core}, a Ray head of {len(others) + 1} CPUs on "
          f"{','.join(map(str, others))} (the job's bundle takes 1: {len(others)} free for "
          f"tasks); augmentation {args.aug_ms:g} ms CPU per sample, batches of {args.batch}, "
          f"{args.samples} samples; {args.seconds:g} s per job, measured over its second "
          f"half", flush=True)
    head = Head(others, len(others) + 1)
    results: Dict[str, List[Dict[str, float]]] = {"baseline": [], "remote": []}
    try:
        for run in range(args.runs):
            order = ["baseline", "remote"] if run % 2 == 0 else ["remote", "baseline"]
            for kind in order:
                figures = run_job(head, args, os.path.join(out, f"run{run}-{kind}"),
                                  kind == "remote", core)
                results[kind].append(figures)
                print(f"run {run} {kind:8s}: {figures['samples_per_s']:7.1f} samples/s, "
                      f"prep stall {100 * figures['prep_share']:4.1f}% of the time, "
                      f"{100 * figures['remote_share']:5.1f}% of batches by Ray tasks "
                      f"({figures['rounds']} rounds)", flush=True)
    finally:
        head.stop()
        if args.out is None:
            shutil.rmtree(out, ignore_errors=True)
    rates = {k: [f["samples_per_s"] for f in v] for k, v in results.items()}
    ratios = [r / b for r, b in zip(rates["remote"], rates["baseline"])]
    print(f"samples/s, median [min-max] of {args.runs} runs: without --remote-prep "
          f"{_spread(rates['baseline'])}, with --remote-prep {args.remote_prep:g} "
          f"{_spread(rates['remote'])}; ratio {_spread(ratios, 2)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
