"""Training on shards with the sample cache (--cache-fraction: MinIO's policy, as CoorDL
uses it) against none, on a data set the page cache is not allowed to hold.

    python bench/cache.py [--fractions 0,0.5,0.9] [--runs 3] [--size-gb 0.5] [--sample-kb 110]
                          [--epochs 3] [--disk-bandwidth 100] [--evict-every 0.1]
                          [--dir DIR] [--out DIR] [--seed 0] [main.py flags ...]

Data: --size-gb GB (10^9 bytes) of samples of --sample-kb KB in shards of 64 MiB written
by esync.data.shards' ShardWriter (`train-*.tar` and `index.json`, in --dir; reused by
the next run while their description matches). A sample is a LeNet-sized input, a
float32 `.npy` of 1x28x28 (a fixed pattern of its class plus noise), its `.cls` and a
`.pad` part of random bytes that no one decodes, up to --sample-kb on disk (110 KB is
about ImageNet's mean JPEG): the bytes a real data set reads, the compute of a small
network, so that the jobs are bound by their reads, as a cache is meant for.

Jobs: one worker alone, for real: `main.py -m local -n lenet --dataset shards:DIR
--epochs E -e 0 --num-threads 1 --seed K --cache-fraction F [--disk-bandwidth B]` (the
flags after the benchmark's own are added), run k of --runs with seed k, the fractions
in a rotated order per run so that none always goes first; fraction 0 (no cache) is
the baseline, measured in the same run. From the job's round records (iter-<n>.json):
samples/s over the whole job (samples over the last record's total_time), samples/s
from the second epoch on (the cache filled: the rounds from the first of epoch >= 1),
bytes read from the shards per sample (read_bytes), the share of the samples the cache
served (cache_hits) and read_seconds. Printed: one line per job, then per fraction the
median [min-max] over the runs, and the ratios against no cache taken within each run.

Larger than the page cache allows: while a job runs, a side thread of this process
drops the shards' pages from the page cache every --evict-every s with
posix_fadvise(POSIX_FADV_DONTNEED) (esync.data.pagecache; no root needed), after
measuring with mincore(2) the share of them that was cached (printed: the most seen), so
that no epoch finds the previous one's reads in memory, whatever the machine's RAM. A
memory cgroup's limit (memory.max, or v1's memory.limit_in_bytes) would bound the page
cache too, but it means moving the job's processes out of the cgroup of whatever runs
the benchmark (on a development machine, its session's own): not done. Storage: the
disk's own speed (its cold sequential read is measured and printed) or, with
--disk-bandwidth B (MB/s; default 100, a network file system's or a hard disk's; 0: the
disk's own), the jobs' emulated storage: a lease's reads take at least their bytes
over B (esync.data.blocks). The output's first lines say which took effect. Timings, not
test material: they vary with the machine's load.
"""
from __future__ import annotations

import argparse
import glob
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional, Sequence

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from esync.data.pagecache import Residency, fadvise_dontneed  # noqa: E402
from esync.data.shards import ShardSet, ShardWriter, write_index  # noqa: E402
from esync.errors import UserError  # noqa: E402

PROG = "cache.py"
DEFAULT_DIR = os.path.join(tempfile.gettempdir(), "esync-bench-cache")
DEFAULT_OUT = os.path.join(tempfile.gettempdir(), "esync-bench-cache-logs")
DESCRIPTION = "bench-cache.json"  # what the data in --dir is (this script wrote it)
CLASSES, SHARD_BYTES, MB = 10, 64 << 20, 1e6
_ITER = re.compile(r"iter-([0-9]+)\.json")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # bad input: one line, exit status 2
        self.exit(2, f"{PROG}: error: {message}\n")


def _number(kind, low: float, strict: bool = True):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {low}: {text!r}")
        return value
    return parse


def _fractions(text: str) -> List[float]:
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of numbers: {text!r}") from None
    if any(not 0 <= v <= 1 for v in values) or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"fractions must be distinct, in [0, 1]: {text!r}")
    return sorted(set(values) | {0.0})  # no cache: the baseline, always


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, allow_abbrev=False, description=__doc__.split("\n\n")[0],
                epilog="See the module docstring for what is measured and how; flags "
                       "after these go to every job's main.py.")
    p.add_argument("--fractions", type=_fractions, default=[0.0, 0.5, 0.9],
                   help="--cache-fraction of the jobs, 0 (the baseline) added (default 0,0.5,0.9)")
    p.add_argument("--runs", type=_number(int, 0), default=3, help="runs (default %(default)s)")
    p.add_argument("--size-gb", type=_number(float, 0), default=0.5,
                   help="data, GB of samples (default %(default)s)")
    p.add_argument("--sample-kb", type=_number(float, 4), default=110.0,
                   help="bytes per sample on disk, KB (default %(default)s)")
    p.add_argument("--epochs", type=_number(int, 1), default=3,
                   help="epochs per job, at least 2 (default %(default)s)")
    p.add_argument("--disk-bandwidth", type=_number(float, 0, strict=False), default=100.0,
                   help="MB/s of the jobs' emulated storage; 0: the disk's own (default "
                        "%(default)s)")
    p.add_argument("--evict-every", type=_number(float, 0, strict=False), default=0.1,
                   help="seconds between evictions of the shards from the page cache; 0: "
                        "none (default %(default)s)")
    p.add_argument("--dir", default=DEFAULT_DIR, help="the shards (default %(default)s)")
    p.add_argument("--out", default=DEFAULT_OUT,
                   help="the jobs' logs, replaced each time (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="run k's jobs: seed SEED+k; the data's")
    return p


# --- the data ---------------------------------------------------------------------------
def npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=False)
    return out.getvalue()


def write_data(folder: str, samples: int, sample_bytes: int, seed: int) -> None:
    rng = np.random.default_rng([seed, 7])
    patterns = rng.normal(0, 1, (CLASSES, 1, 28, 28)).astype(np.float32)
    splits = {}
    for split, count, pad in (("train", samples, True), ("test", 200, False)):
        writer = ShardWriter(folder, split, SHARD_BYTES)
        for i in range(count):
            label = int(rng.integers(CLASSES))
            image = npy(patterns[label] + rng.normal(0, 0.5, (1, 28, 28)).astype(np.float32))
            parts = {"npy": image}
            if pad:
                parts["pad"] = rng.bytes(max(1, sample_bytes - len(image) - 2048))
            writer.write(parts, label)
        splits[split] = writer.close()
    write_index(folder, splits, "npy", "cls", [str(c) for c in range(CLASSES)])


def prepare_data(folder: str, samples: int, sample_bytes: int, seed: int) -> ShardSet:
    """The shards in `folder`, written unless the ones there are these."""
    wanted = {"samples": samples, "sample_bytes": sample_bytes, "seed": seed}
    path = os.path.join(folder, DESCRIPTION)
    try:
        with open(path) as f:
            if json.load(f) == wanted:
                print(f"data: reusing {folder} ({samples:,} samples of ~{sample_bytes:,} bytes)")
                return ShardSet(folder)
    except (OSError, ValueError, UserError):
        pass
    if os.path.isdir(folder) and os.listdir(folder) and not os.path.exists(path):
        raise UserError(f"--dir {folder} holds files this benchmark did not write: give "
                        f"an empty or new folder")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    print(f"data: writing {samples:,} samples of ~{sample_bytes:,} bytes into {folder}",
          flush=True)
    write_data(folder, samples, sample_bytes, seed)
    with open(path, "w") as f:
        json.dump(wanted, f)
    return ShardSet(folder)


def cold_read_mbps(paths: Sequence[str], limit: int = 256 << 20) -> Optional[float]:
    """The disk's own sequential read, MB/s, of up to `limit` bytes just evicted."""
    if fadvise_dontneed(paths):
        return None
    done, started = 0, time.perf_counter()
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while done < limit:
                chunk = f.read(4 << 20)
                if not chunk:
                    break
                done += len(chunk)
    return done / MB / (time.perf_counter() - started)


# --- the page cache, kept from holding the shards ----------------------------------------
class Evictor(threading.Thread):
    """Every `every` s: the shards' cached share (mincore), then drop them (fadvise)."""

    def __init__(self, paths: Sequence[str], every: float, residency: Residency):
        super().__init__(daemon=True)
        self.paths, self.every, self.residency = paths, every, residency
        self.halt = threading.Event()
        self.most: Optional[float] = 0.0
        self.error = ""

    def run(self) -> None:
        while not self.halt.wait(self.every):
            share = self.residency.share(self.paths)
            self.most = None if share is None or self.most is None else max(self.most, share)
            self.error = fadvise_dontneed(self.paths) or self.error

    def stop(self) -> None:
        self.halt.set()
        self.join()


# --- the jobs ----------------------------------------------------------------------------
def run_job(args, extra: List[str], fraction: float, seed: int, logs: str) -> dict:
    """One training job; its figures from its round records (RuntimeError if it failed)."""
    argv = [sys.executable, os.path.join(ROOT, "main.py"), "-m", "local", "-n", "lenet",
            "--dataset", f"shards:{os.path.abspath(args.dir)}", "--epochs", str(args.epochs),
            "-e", "0", "--num-threads", "1", "--seed", str(seed),
            "--cache-fraction", f"{fraction:g}", "-ld", logs]
    if args.disk_bandwidth:
        argv += ["--disk-bandwidth", f"{args.disk_bandwidth:g}"]
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    started = time.perf_counter()
    done = subprocess.run(argv + extra, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        raise RuntimeError(f"fraction {fraction:g}: exit status {done.returncode}: "
                           f"{lines[-1] if lines else ''}")
    records = []
    for path in glob.glob(os.path.join(logs, "*", "*", "iter-*.json")):
        match = _ITER.fullmatch(os.path.basename(path))
        if match:
            with open(path) as f:
                records.append((int(match.group(1)), json.load(f)))
    records = [r for _, r in sorted(records, key=lambda nr: nr[0])]
    if not records:
        raise RuntimeError(f"fraction {fraction:g}: no round records in {logs}")
    if fraction and not any("cache_hits" in r for r in records):
        raise RuntimeError("the round records have no cache_hits: this esync builds no cache "
                           "from --cache-fraction (esync/runtime/shardloader.py)")
    total = lambda key, rs: sum(r.get(key) or 0 for r in rs)  # noqa: E731
    warm_at = next((i for i, r in enumerate(records) if r["epoch"] >= 1.0), None)
    if warm_at is None:
        raise RuntimeError(f"fraction {fraction:g}: the job never reached its second epoch")
    warm = records[warm_at:]
    warm_seconds = records[-1]["total_time"] - (records[warm_at - 1]["total_time"]
                                                if warm_at else 0.0)
    samples = total("num_samples", records)
    out = {"fraction": fraction, "wall": wall, "samples": samples,
           "seconds": records[-1]["total_time"], "read_bytes": total("read_bytes", records),
           "read_seconds": total("read_seconds", records), "hits": total("cache_hits", records),
           "warm_samples": total("num_samples", warm), "warm_seconds": warm_seconds,
           "warm_bytes": total("read_bytes", warm), "warm_hits": total("cache_hits", warm)}
    out["sps"] = samples / out["seconds"]
    out["warm_sps"] = out["warm_samples"] / warm_seconds
    out["per_sample"] = out["read_bytes"] / samples
    out["warm_per_sample"] = out["warm_bytes"] / out["warm_samples"]
    out["emulated"] = bool(args.disk_bandwidth) and \
        out["read_seconds"] >= 0.99 * out["read_bytes"] / (args.disk_bandwidth * MB)
    return out


def spread(values: Sequence[float], fmt: str = "{:.1f}", unit: str = "") -> str:
    return (f"{fmt.format(statistics.median(values))}{unit} "
            f"[{fmt.format(min(values))}-{fmt.format(max(values))}]")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args, extra = build_parser().parse_known_args(argv)
    sample_bytes = int(round(args.sample_kb * 1e3))
    samples = -(-int(args.size_gb * 1e9) // sample_bytes)
    try:
        shards = prepare_data(os.path.abspath(args.dir), samples, sample_bytes, args.seed)
    except (UserError, OSError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    paths = [f.path for f in shards.files]
    size = sum(os.path.getsize(p) for p in paths)
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    residency = Residency()
    print(f"shards: {len(paths)} files, {size / 1e9:.2f} GB, {len(shards):,} samples "
          f"({size / len(shards) / 1e3:.0f} KB each); RAM {mem / 1e9:.1f} GB; CPUs "
          f"{os.cpu_count()}, load {os.getloadavg()[0]:.2f}")
    cold = cold_read_mbps(paths)
    print(f"storage: the disk's own cold sequential read "
          f"{'?' if cold is None else f'{cold:.0f} MB/s'}; " +
          (f"the jobs' reads emulated at --disk-bandwidth {args.disk_bandwidth:g} MB/s"
           if args.disk_bandwidth else "no emulation (--disk-bandwidth 0)"))
    if args.evict_every and residency.libc is None:
        print(f"page cache: eviction unchecked ({residency.error})")
    print(f"jobs: main.py -m local -n lenet --epochs {args.epochs} -e 0 --num-threads 1 "
          f"{' '.join(extra)}; fractions {', '.join(f'{f:g}' for f in args.fractions)}; "
          f"{args.runs} run(s)\n", flush=True)
    out_dir = os.path.abspath(args.out)
    shutil.rmtree(out_dir, ignore_errors=True)
    results: Dict[float, List[dict]] = {f: [] for f in args.fractions}
    most: List[Optional[float]] = []
    errors: List[str] = []
    header = (f"{'run':>3}  {'fraction':>8}  {'samples':>7}  {'seconds':>7}  {'samples/s':>9}  "
              f"{'warm s/s':>8}  {'read MB':>8}  {'KB/sample':>9}  {'hits':>7}  "
              f"{'read s':>6}  {'cached':>6}")
    print(header + "\n" + "-" * len(header))
    try:
        for run in range(args.runs):
            shift = run % len(args.fractions)
            for fraction in args.fractions[shift:] + args.fractions[:shift]:
                evictor = None
                if args.evict_every:
                    fadvise_dontneed(paths)
                    evictor = Evictor(paths, args.evict_every, residency)
                    evictor.start()
                try:
                    r = run_job(args, extra, fraction, args.seed + run,
                                os.path.join(out_dir, f"run{run + 1}", f"f{fraction:g}"))
                finally:
                    if evictor is not None:
                        evictor.stop()
                        most.append(evictor.most)
                        if evictor.error:
                            errors.append(evictor.error)
                results[fraction].append(r)
                cached = "-" if evictor is None or evictor.most is None else \
                    f"{100 * evictor.most:.0f}%"
                print(f"{run + 1:>3}  {fraction:>8g}  {r['samples']:>7,}  {r['seconds']:>7.1f}  "
                      f"{r['sps']:>9.0f}  {r['warm_sps']:>8.0f}  {r['read_bytes'] / MB:>8.0f}  "
                      f"{r['per_sample'] / 1e3:>9.1f}  {r['hits']:>7,}  "
                      f"{r['read_seconds']:>6.1f}  {cached:>6}", flush=True)
    except RuntimeError as e:
        print(f"{PROG}: a job failed: {e}", file=sys.stderr)
        return 1

    base = results[0.0]
    print(f"\nover {args.runs} run(s), median [min-max]; ratios against no cache within "
          f"each run; warm: from the second epoch on")
    rows = [("fraction", "samples/s", "x no cache", "warm samples/s", "warm x no cache",
             "KB read/sample", "warm KB read/sample", "warm x no cache", "warm hits")]
    for f in args.fractions:
        rs = results[f]
        ratio = lambda key: spread([r[key] / b[key] for r, b in zip(rs, base)],  # noqa: E731
                                   "{:.2f}", "x")
        rows.append((f"{f:g}", spread([r["sps"] for r in rs], "{:.0f}"), ratio("sps"),
                     spread([r["warm_sps"] for r in rs], "{:.0f}"), ratio("warm_sps"),
                     spread([r["per_sample"] / 1e3 for r in rs]),
                     spread([r["warm_per_sample"] / 1e3 for r in rs]),
                     ratio("warm_per_sample") if f else "1.00x",
                     spread([100 * r["warm_hits"] / r["warm_samples"] for r in rs], "{:.0f}",
                            "%")))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.rjust(w) for cell, w in zip(row, widths)))
    emulated = [r["emulated"] for rs in results.values() for r in rs]
    if args.disk_bandwidth:
        print(f"storage: --disk-bandwidth {args.disk_bandwidth:g} MB/s took effect in "
              f"{sum(emulated)} of {len(emulated)} jobs (read_seconds >= read bytes / "
              f"bandwidth)")
    if not args.evict_every:
        print("page cache: not evicted (--evict-every 0): later epochs may read from memory")
    elif errors:
        print(f"page cache: eviction FAILED ({errors[0]}): figures may be warm-cache")
    elif any(m is None for m in most):
        print(f"page cache: evicted every {args.evict_every:g} s by posix_fadvise(DONTNEED), "
              f"unchecked ({residency.error})")
    else:
        print(f"page cache: the shards evicted every {args.evict_every:g} s by "
              f"posix_fadvise(DONTNEED) from a side thread; at most {100 * max(most):.1f}% of "
              f"their pages were cached at a check (mincore)")
    print(f"data kept for the next run; delete it with: rm -r {os.path.abspath(args.dir)} "
          f"{out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
