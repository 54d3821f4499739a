"""esync-stalls' predictions against real runs of the configurations it predicts.

    python bench/stalls.py [--runs 3] [--images 4400] [--size 256] [--disk-bandwidth 50]
                           [--seconds 3] [--real-seconds 20] [--epochs 2] [--dir DIR]

Data: --images grayscale PNGs of --size x --size pixels of noise in 10 class folders
(PNG decoding is then a real share of a batch: about 0.3 ms an image here, against
LeNet's 10 ms for a batch of 64), packed by `esync-pack` into shards in --dir (kept
and reused while their description matches).

(a) DataLoader workers. `esync-stalls -m local -n lenet --dataset shards:DIR -b 64
--loader-workers 1 --seconds S --json F` predicts samples/s for --loader-workers 0, 1
and 2 (its what-ifs); each is then run for real: `main.py -m local` with the same flags,
in a process of its own, for one epoch (at most --real-seconds).
(b) A memory cache. The same with --loader-workers 2 --disk-bandwidth B (emulated slow
storage, so that fetching matters): esync-stalls predicts --cache-fraction 0, 0.5 and
0.9; each runs for real for --epochs epochs, measured from its second epoch (the
cache's steady state, MinIO's policy: the cached samples are never read again).

Every run, esync-stalls' own too, reads its shards from storage: they are evicted from
the page cache before each real run (esync.stalls.stallprobe.evict, as esync-stalls does
before its cold run), and (a)'s runs last one epoch, so that nothing they read comes
back from the page cache; (b)'s later epochs may find their shards there, but their
emulated storage takes at least the bytes over B either way. A real run's samples/s is
taken from its round records as esync-stalls takes its own (esync.stalls.stallprobe.steady:
the first quarter of its time left out, then whole periods of its block reads); for
(b), from all its rounds of the second epoch on.

Printed: per configuration the predicted and measured samples/s, median [min-max] over
--runs, the error of each run's prediction against its measurement, in %, and for (b)
the share of the samples the cache served (its blocks are drawn by a seeded coin of
probability F: about F of them, not exactly). Timings, not test material: on a shared
machine they move with its load (printed at the start and the end).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from esync.stalls.stallprobe import evict, read_records, shard_paths, steady  # noqa: E402
from esync.options import parse_options  # noqa: E402

PROG = "stalls.py"
DEFAULT_DIR = os.path.join(tempfile.gettempdir(), "esync-bench-stalls")
DESCRIPTION = "bench-stalls.json"
WORKERS = (0, 1, 2)
FRACTIONS = (0.0, 0.5, 0.9)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # bad input: one line, exit status 2
        self.exit(2, f"{PROG}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, allow_abbrev=False, description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3, help="runs (default %(default)s)")
    p.add_argument("--images", type=int, default=4400, help="images (default %(default)s)")
    p.add_argument("--size", type=int, default=256, help="pixels a side (default %(default)s)")
    p.add_argument("--disk-bandwidth", type=float, default=50.0,
                   help="(b): MB/s of the emulated storage (default %(default)s)")
    p.add_argument("--seconds", type=float, default=3.0,
                   help="esync-stalls --seconds (default %(default)s)")
    p.add_argument("--real-seconds", type=float, default=20.0,
                   help="(a): the most seconds of each real run (default %(default)s)")
    p.add_argument("--epochs", type=int, default=2,
                   help="(b): epochs of each real run, at least 2 (default %(default)s)")
    p.add_argument("--dir", default=DEFAULT_DIR, help="the data (default %(default)s)")
    return p


def prepare(folder: str, images: int, size: int) -> str:
    """Shards of noise PNGs in folder/shards (written unless those there are these)."""
    wanted = {"images": images, "size": size}
    shards = os.path.join(folder, "shards")
    try:
        with open(os.path.join(folder, DESCRIPTION)) as f:
            if json.load(f) == wanted:
                return shards
    except (OSError, ValueError):
        pass
    from PIL import Image

    shutil.rmtree(folder, ignore_errors=True)
    rng = np.random.default_rng(0)
    print(f"data: {images} PNGs of {size}x{size} into {folder}", flush=True)
    for i in range(images):
        label = i % 10
        os.makedirs(os.path.join(folder, "images", str(label)), exist_ok=True)
        pixels = (rng.random((size, size)) * 200 + label * 5).astype(np.uint8)
        Image.fromarray(pixels).save(os.path.join(folder, "images", str(label), f"{i:05d}.png"))
    subprocess.run([sys.executable, "-m", "esync.data.pack", os.path.join(folder, "images"),
                    shards], check=True, cwd=ROOT)
    shutil.rmtree(os.path.join(folder, "images"))
    with open(os.path.join(folder, DESCRIPTION), "w") as f:
        json.dump(wanted, f)
    return shards


def predict(flags: List[str], seconds: float, work: str) -> dict:
    """esync-stalls' report (its JSON) for a job alone with `flags`."""
    out = os.path.join(work, "stalls.json")
    done = subprocess.run([sys.executable, "-c", "import sys; from esync.launch.stalls import main; "
                           "sys.exit(main())", "-m", "local", *flags, "--seconds", str(seconds),
                           "--json", out], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"esync-stalls failed: {(done.stderr or done.stdout)[-800:]}")
    with open(out) as f:
        return json.load(f)["devices"][0]


def measure(flags: List[str], logs: str, paths: Sequence[str],
            from_epoch: float = 0.0) -> Tuple[float, float]:
    """A real run of main.py with `flags`, its shards evicted from the page cache first;
    its steady samples/s (from `from_epoch` on) and the share of those samples its
    cache served."""
    shutil.rmtree(logs, ignore_errors=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    evict(paths)
    done = subprocess.run([sys.executable, os.path.join(ROOT, "main.py"), "-m", "local",
                           "-e", "0", "--eval-interval", "1000000", "--num-threads", "1",
                           "-ld", logs, *flags], cwd=ROOT, env=env, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise RuntimeError(f"main.py {' '.join(flags)} failed: {done.stderr[-800:]}")
    records = read_records(logs)
    if not from_epoch:
        return steady(records).rate, 0.0
    later = [r for r in records if r.get("epoch", 0.0) >= from_epoch]  # all of them
    if not later:
        raise RuntimeError(f"main.py {' '.join(flags)} never reached epoch {from_epoch:g}")
    samples = sum(r["num_samples"] for r in later)
    return (samples / sum(sum(r["breakdown"].values()) for r in later),
            sum(r.get("cache_hits", 0) for r in later) / samples)


def spread(values: Sequence[float], fmt: str = "{:.0f}", unit: str = "") -> str:
    return (f"{fmt.format(statistics.median(values))}{unit} "
            f"[{fmt.format(min(values))}-{fmt.format(max(values))}]")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.epochs < 2 or args.runs < 1:
        print(f"{PROG}: error: --epochs must be at least 2 and --runs at least 1",
              file=sys.stderr)
        return 2
    shards = prepare(os.path.abspath(args.dir), args.images, args.size)
    base = ["-n", "lenet", "--dataset", f"shards:{shards}", "-b", "64"]
    paths = shard_paths(parse_options(base))
    size = sum(os.path.getsize(p) for p in paths)
    print(f"shards: {size / 1e6:.0f} MB; {os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.2f}; {args.runs} run(s)", flush=True)
    started = time.perf_counter()
    cache = ["--loader-workers", "2", "--disk-bandwidth", f"{args.disk_bandwidth:g}"]
    rows: Dict[str, Dict[str, List[float]]] = {}

    def note(name: str, predicted: float, measured: float, hits: float = 0.0) -> None:
        row = rows.setdefault(name, {"predicted": [], "measured": [], "error": [],
                                     "hits": []})
        row["predicted"].append(predicted)
        row["measured"].append(measured)
        row["error"].append(100 * (predicted - measured) / measured)
        row["hits"].append(100 * hits)
        print(f"  {name:<48} predicted {predicted:7.0f}  measured {measured:7.0f}  "
              f"({row['error'][-1]:+.0f}%)" + (f"; the cache served {100 * hits:.0f}%"
                                               if hits else ""), flush=True)

    with tempfile.TemporaryDirectory(prefix="esync-bench-stalls-") as work:
        try:
            for run in range(args.runs):
                print(f"run {run + 1}: (a) esync-stalls --loader-workers 1 ...", flush=True)
                device = predict([*base, "--loader-workers", "1"], args.seconds, work)
                print(f"  cold: {device['eviction']}")
                shift = run % len(WORKERS)
                for k in WORKERS[shift:] + WORKERS[:shift]:
                    got, _ = measure([*base, "--loader-workers", str(k), "--seed", str(run),
                                      "--epochs", "1", "--time-limit",
                                      f"{args.real_seconds:g}"],
                                     os.path.join(work, "logs"), paths)
                    want = next(w["rate"] for w in device["predicted"]["loader_workers"]
                                if w["workers"] == k)
                    note(f"(a) --loader-workers {k}", want, got)
                print(f"run {run + 1}: (b) esync-stalls {' '.join(cache)} ...", flush=True)
                device = predict([*base, *cache], args.seconds, work)
                shift = run % len(FRACTIONS)
                for x in FRACTIONS[shift:] + FRACTIONS[:shift]:
                    got, hits = measure([*base, *cache, "--cache-fraction", f"{x:g}",
                                         "--seed", str(run), "--epochs", str(args.epochs)],
                                        os.path.join(work, "logs"), paths, from_epoch=1.0)
                    want = next(w["rate"] for w in device["predicted"]["cache_fraction"]
                                if w["fraction"] == x)
                    note(f"(b) {' '.join(cache)} --cache-fraction {x:g}", want, got, hits)
        except RuntimeError as e:
            print(f"{PROG}: {e}", file=sys.stderr)
            return 1
    print(f"\n{args.runs} run(s), median [min-max]; error: each run's prediction against "
          f"its measurement; {(time.perf_counter() - started) / 60:.1f} min, load at the "
          f"end {os.getloadavg()[0]:.2f}\n")
    print(f"| configuration (lenet, -b 64, PNG {args.size}x{args.size}) | predicted "
          f"samples/s | measured samples/s | error | samples the cache served |")
    print("|---|---:|---:|---:|---:|")
    for name, row in rows.items():
        served = spread(row["hits"], unit="%") if any(row["hits"]) else "-"
        print(f"| {name} | {spread(row['predicted'])} | {spread(row['measured'])} | "
              f"{spread(row['error'], '{:+.0f}', '%')} | {served} |")
    print(f"\ndata kept for the next run; delete it with: rm -r {os.path.abspath(args.dir)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
