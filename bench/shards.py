"""Training on shards: how well CorgiPile mixes class-sorted shards, what that costs in
accuracy, and what block leases gain over static shares on heterogeneous devices.

    python bench/shards.py [--only mixing,accuracy,leases] [--seeds 3] [--quick]
                           [--out DIR] [--mix-epochs 3] [--epochs 8] [--time-limit 10]
                           [--mitigation auto|NAME] [--target 0.9] [main.py flags ...]

Data: the embedded digits (1438 training, 359 test images), packed into shards (PNG
images, the class as `.cls`) with esync.data.pack's `pack_arrays` (its own ShardWriter
and write_index where esync.data.pack cannot be imported), one train shard at the
packer's default --shard-size. Three packings: `class-sorted` (the training images
sorted by class, packed in that order: what `esync-pack --order stored` makes of an
image folder, class by class; the built-in digits are stored mixed, so they are sorted
here first), `interleave` (round-robin over the classes) and `shuffle` (a permutation;
seed k for seed k). They go to OUT/shards/.

Every number comes from seeds 0..N-1 (--seeds) and is printed as `median [min-max]`
over them; a ratio or difference against a baseline is taken within each seed, against
the baseline of the same run, and then summarised.

1. mixing (in-process, no job): the labels of the batches (32 samples, --mix-batch) the
   devices of a 4-worker job at --slowdown 1,1,4,4 train on, for each setting of the
   table, read through the real esync.data.blocks.BlockSampler (the batch sampler of
   the prepared loader over shards: blocks of --block-size consecutive samples, a
   lease of whole blocks read into the buffer and emitted in its seeded order), its
   leases from the real esync.data.leases sources as the prepared loader builds them:
   `static`, each device's own share (ShardLoader._own_blocks) through StaticLeases;
   `leased`, one LeaseBook for the job, its leases granted to whichever device asks
   next, the devices asking in turn by their slowdown (a device 4x slower asks 4x less
   often). Blocks per lease as esync.runtime.shardloader computes it (blocks_per_lease of
   --buffer-ratio of a device's share). Until --mix-epochs epochs of samples are
   drawn (default 3). A batch's label entropy: -sum p log2 p over its classes' shares (bits;
   log2(10) = 3.32 is the most, about 3.30 for 32 samples); the mean over every batch
   of every device is one seed's figure. Baseline: a full shuffle, a random
   permutation of all training samples per epoch cut into batches of 32. Rows: the
   full shuffle, class-sorted shards at the defaults (--block-size 32, --buffer-ratio
   0.1), and the mitigations: --block-size 8, --buffer-ratio 0.5, interleaved
   packing, shuffled packing. Columns: blocks per lease x block size (the buffer),
   entropy static, entropy leased, leased / full shuffle (per seed), distinct
   classes per batch (leased).

2. accuracy: ESync jobs (`-m esync --workers 4 --servers 1 --slowdown 1,1,4,4 -n lenet
   -b 32 --data-split leased --epochs E`, E = --epochs, default 8: a fixed amount of
   training, so that final accuracies compare), on shuffle-packed shards (the full-shuffle
   baseline), on class-sorted shards at the defaults, and with the best mitigation of
   item 1 (the highest leased entropy among --block-size 8, --buffer-ratio 0.5 and
   interleaved packing; --mitigation names one instead). Final test accuracy: the
   evaluator's last evaluation (compare.final_accuracy; it evaluates every
   --eval-interval s, so the last one may be of a model up to that much older than the
   job's last); the difference from the baseline in points, seed by seed; the best
   evaluation (drawer.best_accuracy) and the training seconds (drawer.duration).

3. leases: ESync jobs as in 2 on the shuffle-packed shards for --time-limit s (10),
   `--data-split leased` against `--data-split static`, with --log-samples 1. Time to
   the target accuracy (--target, default 0.9; where some job did not reach it, the
   highest of --targets that every job reached, which the output says) and final
   accuracy; static / leased time to target, seed by seed (compare.speedup); the
   job's samples/s (drawer.throughput) and the median `get_batch` phase of its local
   iterations (ms; under leased it includes asking the scheduler for the next lease,
   one block at the defaults on digits, i.e. one batch). From the
   round records' `sample_ids` ({epoch: [ids]}): per device, its speed share (its
   samples per computing second, summary.py's compute_time_list, over the sum of the
   devices'); under leased its share of the samples trained (the blocks are of one
   size, 32 but the last, so this is its share of the blocks it took, up to the leases
   in progress at the end); under static its own share of the data (its blocks,
   ShardLoader._own_blocks of the rank whose blocks hold every sample it trained), and
   how many times each of its own samples was visited per epoch of the
   job (its samples trained / its share's samples / (all samples trained / training
   samples)); the fast devices' visits over the slow ones'. Under leased: the visits
   per sample per epoch of the job over all samples, and in the epochs the job went
   two past, how many samples were trained exactly once.

Jobs run through esync/launch/local.py (`--no-auth --no-progress --num-threads 1`) into
OUT/<part>/<row>/seed<k>/, seed by seed, row by row, so that a slow spell of the machine
falls on every row alike; each job's iteration logs are summarised by
esync/logs_tools/summary.py (its JSON beside them) and measured with logs_tools' functions
(compare.final_accuracy, time_to_target, speedup, spread; drawer.training_records). A
job that fails is reported (its launcher's last line) and left out; the exit status is
then 1. Flags not listed here are passed to every job's main.py; --quick is --seeds 1
--mix-epochs 1 --epochs 2 --time-limit 4 (unless those are given), a check that it runs.
"""
from __future__ import annotations

import argparse
import collections
import glob
import io
import json
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from esync import config
from esync.data.blocks import BlockSampler
from esync.data.leases import LeaseBook, StaticLeases, blocks_per_lease
from esync.data.order import DataSettings
from esync.data.shards import ShardSet
from esync.launch import local  # the jobs run through the launcher
from esync.logs_tools import compare, drawer, summary  # and are read by the log tools

PROG = "shards.py"
PARTS = ("mixing", "accuracy", "leases")
NETWORK, WORKERS, SLOWDOWN, BATCH = "lenet", 4, "1,1,4,4", 32
CLASSES = 10
DEFAULT_SEEDS, MIX_EPOCHS, EPOCHS, TIME_LIMIT = 3, 3, 8, 10.0
QUICK_SEEDS, QUICK_MIX_EPOCHS, QUICK_EPOCHS, QUICK_TIME_LIMIT = 1, 1, 2, 4.0
SPLITS = ("static", "leased")
_ITER = re.compile(r"iter-([0-9]+)\.json")


# --- the settings of item 1 (and the rows of item 2) ------------------------------------
@dataclass(frozen=True)
class Setting:
    """A way to read the digits: its packing (None: the full shuffle, no shards),
    --block-size and --buffer-ratio."""

    name: str
    slug: str
    packing: Optional[str]
    block_size: int = config.BLOCK_SIZE
    buffer_ratio: float = config.BUFFER_RATIO

    def flags(self) -> List[str]:
        return ["--block-size", str(self.block_size), "--buffer-ratio", f"{self.buffer_ratio:g}"]


FULL = Setting("full shuffle (a permutation of all samples)", "full-shuffle", None)
SORTED = Setting(f"class-sorted, defaults (--block-size {config.BLOCK_SIZE}, "
                 f"--buffer-ratio {config.BUFFER_RATIO:g})", "sorted", "sorted")
MITIGATIONS = (
    Setting("class-sorted, --block-size 8", "sorted-block8", "sorted", block_size=8),
    Setting("class-sorted, --buffer-ratio 0.5", "sorted-buffer0.5", "sorted", buffer_ratio=0.5),
    Setting("interleaved packing", "interleave", "interleave"),
)
SHUFFLED = Setting("shuffled packing", "shuffle", "shuffle")
SETTINGS = (FULL, SORTED, *MITIGATIONS, SHUFFLED)


# --- the data ---------------------------------------------------------------------------
def _png(image: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image.reshape(image.shape[-2:]))).save(buffer, "PNG")
    return buffer.getvalue()


def _write_shards(folder: str, arrays, order: str, seed: int, shard_bytes: int) -> None:
    """Without esync.data.pack: the same samples through ShardWriter and write_index."""
    from esync.data.shards import ShardWriter, write_index

    os.makedirs(folder, exist_ok=True)
    splits = {}
    for number, (split, (images, labels)) in enumerate(arrays.items()):
        if order == "shuffle":
            sequence = np.random.default_rng([seed, number]).permutation(len(labels))
        elif order == "interleave":  # each class's first sample, then each one's second...
            rank = np.zeros(len(labels), np.int64)
            for c in np.unique(labels):
                rank[labels == c] = np.arange(int((labels == c).sum()))
            sequence = np.lexsort((labels, rank))
        else:
            sequence = np.arange(len(labels))
        writer = ShardWriter(folder, split, shard_bytes)
        for i in sequence:
            writer.write({"png": _png(images[i])}, int(labels[i]))
        splits[split] = writer.close()
    write_index(folder, splits, "png", "cls", [str(c) for c in range(CLASSES)])


def pack_digits(folder: str, packing: str, seed: int, shard_bytes: int) -> str:
    """The digits in shards in `folder` (made once): `sorted` (class by class),
    `interleave` or `shuffle` (seeded by `seed`); the folder."""
    if os.path.isfile(os.path.join(folder, "index.json")):
        return folder
    from esync.data.datasets import load_digits

    digits = load_digits()
    arrays = {}
    for split, images, labels in (("train", digits.train_images, digits.train_labels),
                                  ("test", digits.test_images, digits.test_labels)):
        labels = labels.numpy()
        by_class = np.argsort(labels, kind="stable")
        arrays[split] = (images.numpy()[by_class], labels[by_class])
    order = "stored" if packing == "sorted" else packing
    try:
        from esync.data.pack import pack_arrays
    except ImportError:
        _write_shards(folder, arrays, order, seed, shard_bytes)
    else:
        pack_arrays(folder, *arrays["train"], *arrays["test"], shard_bytes=shard_bytes,
                    order=order, seed=seed, classes=[str(c) for c in range(CLASSES)])
    return folder


def shard_folder(base: str, packing: str, seed: int) -> str:
    return os.path.join(base, "shards", f"digits-{packing}"
                        + (f"-seed{seed}" if packing == "shuffle" else ""))


def default_shard_bytes() -> int:
    try:
        from esync.data.pack import DEFAULT_SHARD_BYTES
    except ImportError:
        return 64 << 20
    return DEFAULT_SHARD_BYTES


def parse_size(text: str) -> int:
    try:
        from esync.data.pack import parse_size as packer_size
    except ImportError:
        value = int(text)
        if value < 1:
            raise ValueError(f"--shard-size {text}: expected a positive number of bytes")
        return value
    from esync.errors import UserError

    try:
        return packer_size(text)
    except UserError as e:
        raise ValueError(str(e)) from None


# --- item 1: mixing ---------------------------------------------------------------------
def per_lease(shards: ShardSet, blocks: np.ndarray, workers: int, setting: Setting) -> int:
    """Blocks per lease, as esync.runtime.shardloader.ShardLoader computes it."""
    share = len(shards) // workers
    mean_block = shards.read_bytes_total / len(blocks)
    return blocks_per_lease(share, len(blocks) // workers, setting.buffer_ratio,
                            setting.block_size,
                            int(config.BUFFER_MAX_MB * 2**20 // max(1, mean_block)))


def own_blocks(shards: ShardSet, blocks: np.ndarray, workers: int, rank: int,
               seed: int) -> np.ndarray:
    """Device `rank`'s own blocks under --data-split static: the prepared loader's own
    choice (ShardLoader._own_blocks, on the settings it reads)."""
    from esync.runtime.shardloader import ShardLoader

    me = SimpleNamespace(session=SimpleNamespace(num_workers=workers, rank=rank),
                         settings=DataSettings(seed=seed))
    return ShardLoader._own_blocks(me, shards, blocks)


class BookLeases:
    """The job's LeaseBook (the scheduler's) as one device's lease source."""

    def __init__(self, book: LeaseBook, rank: int):
        self.book, self.rank = book, rank

    def next(self):
        return self.book.grant(self.rank)

    def resume(self, lease):
        return None

    def report(self, done, at) -> None:
        self.book.report(self.rank, done, at)


def device_batches(shards: ShardSet, setting: Setting, split: str, seed: int,
                   slowdowns: Sequence[float], epochs: int, batch: int) -> List[np.ndarray]:
    """The labels of every batch the devices train on until `epochs` epochs of samples
    are drawn, the devices taking batches in turn by their slowdowns."""
    workers = len(slowdowns)
    labels = shards.labels
    blocks = shards.blocks(setting.block_size)
    lease_blocks = per_lease(shards, blocks, workers, setting)
    if split == "static":
        sources = [StaticLeases(own_blocks(shards, blocks, workers, rank, seed), lease_blocks,
                                [seed, rank]) for rank in range(workers)]
    else:
        book = LeaseBook(blocks, lease_blocks, [seed], workers)
        sources = [BookLeases(book, rank) for rank in range(workers)]
    share = len(shards) // workers
    samplers = [BlockSampler(shards, source, lambda: batch, False, share) for source in sources]
    passes = [iter(s) for s in samplers]
    clock = [0.0] * workers
    out: List[np.ndarray] = []
    drawn, goal = 0, epochs * len(shards)
    while drawn < goal:
        k = min(range(workers), key=lambda i: (clock[i], i))
        try:
            items = next(passes[k])
        except StopIteration:  # the device's pass is over: it starts the next one
            passes[k] = iter(samplers[k])
            items = next(passes[k], None)
            if items is None:
                raise RuntimeError(f"{setting.name}, {split}: device {k} has no samples")
        emitted = samplers[k].emitted.popleft()
        sources[k].report(emitted.done, emitted.at)
        ids = [i for i, _ in items]
        out.append(labels[ids])
        drawn += len(ids)
        clock[k] += slowdowns[k]
    return out


def full_shuffle_batches(labels: np.ndarray, seed: int, epochs: int,
                         batch: int) -> List[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(epochs):
        order = labels[rng.permutation(len(labels))]
        out += [order[i:i + batch] for i in range(0, len(order) - batch + 1, batch)]
    return out


def entropy_bits(batch_labels: np.ndarray) -> float:
    p = np.bincount(batch_labels, minlength=CLASSES) / len(batch_labels)
    p = p[p > 0]
    return float(-(p * np.log2(p)).sum()) + 0.0


def batch_stats(batches: List[np.ndarray]) -> Tuple[float, float]:
    """(mean label entropy in bits, mean distinct classes) per batch."""
    return (statistics.fmean(entropy_bits(b) for b in batches),
            statistics.fmean(len(np.unique(b)) for b in batches))


def measure_mixing(args, base: str, settings: Sequence[Setting], say=print) -> dict:
    """{setting slug: {"static", "leased": [entropy per seed], "classes": [per seed],
    "buffer": "k x b"}}."""
    slowdowns = [float(f) for f in SLOWDOWN.split(",")]
    results: Dict[str, dict] = {s.slug: {"static": [], "leased": [], "classes": [],
                                         "buffer": ""} for s in settings}
    for seed in range(args.seeds):
        for setting in settings:
            row = results[setting.slug]
            if setting.packing is None:
                labels = ShardSet(shard_folder(base, "sorted", seed)).labels
                batches = full_shuffle_batches(labels, seed, args.mix_epochs, args.mix_batch)
                bits, classes = batch_stats(batches)
                row["static"].append(bits)
                row["leased"].append(bits)
                row["classes"].append(classes)
                row["buffer"] = f"all {len(labels)}"
                continue
            shards = ShardSet(shard_folder(base, setting.packing, seed))
            blocks = shards.blocks(setting.block_size)
            row["buffer"] = f"{per_lease(shards, blocks, WORKERS, setting)} x " \
                            f"{setting.block_size}"
            for split in SPLITS:
                batches = device_batches(shards, setting, split, seed, slowdowns,
                                         args.mix_epochs, args.mix_batch)
                bits, classes = batch_stats(batches)
                row[split].append(bits)
                if split == "leased":
                    row["classes"].append(classes)
        say(f"mixing: seed {seed} done", file=sys.stderr, flush=True)
    return results


def best_mitigation(mixing: dict) -> Setting:
    return max(MITIGATIONS, key=lambda s: statistics.median(mixing[s.slug]["leased"]))


def ratios(values: Sequence[Optional[float]], bases: Sequence[Optional[float]]):
    return [v / b if v is not None and b else None for v, b in zip(values, bases)]


def print_table(title: str, head: Sequence[str], rows: List[Sequence[str]]) -> None:
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    print(f"\n{title}")
    for r in [head, *rows]:
        print("  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                        for i, (c, w) in enumerate(zip(r, widths))).rstrip())


def report_mixing(args, mixing: dict) -> None:
    full = mixing[FULL.slug]["leased"]
    rows = []
    for s in SETTINGS:
        m = mixing[s.slug]
        vs = "(baseline)" if s is FULL else compare.spread_cell(
            compare.spread(ratios(m["leased"], full)), ".2f", "x")
        rows.append([s.name, m["buffer"],
                     compare.spread_cell(compare.spread(m["static"]), ".3f"),
                     compare.spread_cell(compare.spread(m["leased"]), ".3f"), vs,
                     compare.spread_cell(compare.spread(m["classes"]), ".2f")])
    print_table(f"1. mixing: label entropy of a batch of {args.mix_batch} (bits; at most "
                f"log2({CLASSES}) = {math.log2(CLASSES):.2f}), the mean over every batch of "
                f"{WORKERS} devices at --slowdown {SLOWDOWN}, {args.mix_epochs} epoch(s); "
                f"median [min-max] over {args.seeds} seed(s)",
                ["setting", "buffer (blocks x size)", "entropy static", "entropy leased",
                 "leased / full shuffle", "classes per batch (leased)"], rows)


# --- jobs ---------------------------------------------------------------------------------
@dataclass
class Job:
    part: str
    row: str     # the row's name in its table
    slug: str    # and its folder
    seed: int
    argv: List[str]


def job_argv(args, data: str, out: str, seed: int, flags: Sequence[str],
             extra: Sequence[str]) -> List[str]:
    return ["-m", "esync", "--workers", str(WORKERS), "--servers", "1", "--slowdown", SLOWDOWN,
            "-n", NETWORK, "--dataset", f"shards:{data}", "-b", str(BATCH), "--seed", str(seed),
            "--eval-interval", f"{args.eval_interval:g}", "--num-threads", "1", "--out", out,
            "--no-auth", "--no-progress", *flags, *extra]


def accuracy_rows(mitigation: Setting) -> List[Tuple[str, Setting]]:
    return [(f"{SHUFFLED.name} (full-shuffle baseline)", SHUFFLED),
            (SORTED.name, SORTED), (f"best mitigation: {mitigation.name}", mitigation)]


def plan(args, extra: Sequence[str], base: str, parts: Sequence[str],
         mitigation: Optional[Setting]) -> List[Job]:
    """Every job in the order they run; ValueError (one line) on bad input."""
    jobs = []
    for seed in range(args.seeds):
        if "accuracy" in parts:
            for row, setting in accuracy_rows(mitigation):
                out = os.path.join(base, "accuracy", setting.slug, f"seed{seed}")
                data = shard_folder(base, setting.packing, seed)
                flags = [*setting.flags(), "--data-split", "leased", "--epochs", str(args.epochs)]
                jobs.append(Job("accuracy", row, setting.slug, seed,
                                job_argv(args, data, out, seed, flags, extra)))
        if "leases" in parts:
            for split in ("leased", "static"):
                out = os.path.join(base, "leases", split, f"seed{seed}")
                data = shard_folder(base, SHUFFLED.packing, seed)
                flags = [*SHUFFLED.flags(), "--data-split", split, "--log-samples", "1",
                         "--time-limit", f"{args.time_limit:g}"]
                jobs.append(Job("leases", split, split, seed,
                                job_argv(args, data, out, seed, flags, extra)))
    for job in jobs:  # every job's flags, checked by the launcher and main.py
        try:
            folder = local.plan(job.argv).folder
        except local.LaunchError as e:
            raise ValueError(f"{job.part} {job.row}: {e}") from None
        if os.path.exists(folder):
            raise ValueError(f"{folder} exists (an earlier run's logs): choose another --out")
    return jobs


def run_job(job: Job) -> dict:
    """Run one job through esync/launch/local.py: {"summary", "folder", "plan"}; RuntimeError
    (the launcher's last line) if it failed."""
    said = io.StringIO()
    code = local.run(job.argv, progress=False, out=said)
    if code == 130:
        raise KeyboardInterrupt
    if code != 0:
        lines = [line for line in said.getvalue().splitlines() if line.strip()]
        raise RuntimeError(lines[-1] if lines else f"exit status {code}")
    planned = local.plan(job.argv)
    folder = planned.folder
    network = os.path.basename(os.path.dirname(folder))
    logs = os.path.dirname(os.path.dirname(folder))
    notes: List[str] = []
    try:
        _, result = summary.write_summary(logs, network, os.path.basename(folder),
                                          warn=notes.append)
    except OSError:
        result = summary.summarize(logs, network, os.path.basename(folder), warn=notes.append)
    for line in notes:
        print(line, file=sys.stderr)
    return {"summary": result, "folder": folder, "plan": planned}


# --- item 2: accuracy ---------------------------------------------------------------------
def report_accuracy(args, runs: Dict[str, Dict[int, dict]], mitigation: Setting) -> None:
    baseline = runs.get(SHUFFLED.slug, {})
    rows = []
    for name, setting in accuracy_rows(mitigation):
        got = runs.get(setting.slug, {})
        if not got:
            rows.append([name, "(no job finished)", "", "", "", ""])
            continue
        finals = {seed: compare.final_accuracy(r["summary"]) for seed, r in got.items()}
        if setting is SHUFFLED:
            diff = "(baseline)"
        else:
            base = {seed: compare.final_accuracy(r["summary"]) for seed, r in baseline.items()}
            diff = compare.spread_cell(compare.spread(
                [100 * (a - base[s]) if a is not None and base.get(s) is not None else None
                 for s, a in finals.items()]), "+.1f")
        rows.append([name, compare.spread_cell(compare.spread(list(finals.values())), ".4f"),
                     diff,
                     compare.spread_cell(compare.spread(
                         [drawer.best_accuracy(r["summary"]) for r in got.values()]), ".4f"),
                     compare.spread_cell(compare.spread(
                         [drawer.duration(r["summary"]) for r in got.values()]), ".1f"),
                     f"{len(got)}/{args.seeds}"])
    print_table(f"2. accuracy after --epochs {args.epochs} (--data-split leased), ESync, "
                f"{WORKERS} workers, --slowdown {SLOWDOWN}, {NETWORK}, -b {BATCH}; median "
                f"[min-max] over the seeds",
                ["shards", "final accuracy", "vs baseline (points)", "best accuracy",
                 "training s", "seeds"],
                rows)


# --- item 3: leases -------------------------------------------------------------------------
def round_records(folder: str) -> Dict[str, dict]:
    """{device: {"ids": {epoch: [sample ids]}, "get_batch": [s per local iteration]}}
    of the round records under folder (the evaluator left out)."""
    out: Dict[str, dict] = {}
    for device in sorted(glob.glob(os.path.join(folder, "*", "*"))):
        name = os.path.basename(device)
        if not os.path.isdir(device) or drawer.is_evaluator(name):
            continue
        ids: Dict[int, List[int]] = collections.defaultdict(list)
        fetch: List[float] = []
        for path in glob.glob(os.path.join(device, "iter-*.json")):
            if not _ITER.fullmatch(os.path.basename(path)):
                continue
            try:
                with open(path) as f:
                    record = json.load(f)
                for epoch, samples in record.get("sample_ids", {}).items():
                    ids[int(epoch)] += [int(i) for i in samples]
                fetch += [float(phases["get_batch"]) for phases in record["time"].values()
                          if "get_batch" in phases]
            except (OSError, ValueError, TypeError, AttributeError, KeyError):
                continue  # summary.py reports broken files
        out[name] = {"ids": dict(ids), "get_batch": fetch}
    return out


def get_batch_ms(result: dict) -> Optional[float]:
    """The median get_batch phase of every local iteration of the job's devices, ms."""
    fetch = [t for r in round_records(result["folder"]).values() for t in r["get_batch"]]
    return 1000 * statistics.median(fetch) if fetch else None


def speeds(result: dict) -> Dict[str, float]:
    """{device: samples per computing second} of a job's summary."""
    out = {}
    for _, device, rec in drawer.training_records(result):
        busy = sum(v for v in rec["compute_time_list"] if v is not None)
        if busy > 0:
            out[device] = sum(rec["num_samples_list"]) / busy
    return out


def data_use(result: dict, args, base: str, seed: int, split: str) -> dict:
    """One leases job's per-device figures: {"devices": {device: {"slowdown", "speed",
    "data", "visits"}}, "per_sample": spread of visits per epoch (leased), "once":
    (samples trained exactly once in each complete epoch, samples, complete epochs),
    "notes": [...]}."""
    shards = ShardSet(shard_folder(base, SHUFFLED.packing, seed))
    n = len(shards)
    ids = {d: r["ids"] for d, r in round_records(result["folder"]).items()}
    planned = result["plan"]
    slowdown = {planned.label(k): planned.slowdowns[k] for k in range(planned.workers)}
    trained = {d: sum(len(v) for v in per.values()) for d, per in ids.items()}
    total = sum(trained.values())
    notes: List[str] = []
    out = {"devices": {}, "per_sample": None, "once": None, "notes": notes}
    if not total:
        notes.append(f"{split} seed {seed}: no sample_ids in the round records")
        return out
    epochs = total / n  # epochs of the job's data trained
    speed = speeds(result["summary"])
    speed_sum = sum(speed.get(d, 0.0) for d in ids)
    owned: Dict[str, int] = {}
    if split == "static":
        blocks = shards.blocks(SHUFFLED.block_size)
        sets = [set(int(i) for first, count in own_blocks(shards, blocks, WORKERS, r, seed)
                    for i in range(first, first + count)) for r in range(WORKERS)]
        for device, per in ids.items():
            seen = {i for v in per.values() for i in v}
            mine = [s for s in sets if seen <= s]
            if len(mine) == 1:
                owned[device] = len(mine[0])
            else:  # not within one share: the distinct samples it trained
                owned[device] = len(seen)
                notes.append(f"static seed {seed}: {device}'s samples are not one device's "
                             f"share; its visits count over the {len(seen)} it trained")
    for device in ids:
        out["devices"][device] = {
            "slowdown": slowdown.get(device),
            "speed": speed.get(device, 0.0) / speed_sum if speed_sum else None,
            "data": trained[device] / total,
            "owned": owned[device] / n if owned.get(device) else None,
            "visits": (trained[device] / owned[device] / epochs
                       if split == "static" and owned.get(device) else None)}
    if split == "leased":
        visits = np.zeros(n, np.int64)
        per_epoch: Dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
        for per in ids.values():
            for epoch, samples in per.items():
                np.add.at(visits, samples, 1)
                per_epoch[epoch].update(samples)
        out["per_sample"] = compare.spread((visits / epochs).tolist())
        complete = [e for e in sorted(per_epoch) if e + 2 in per_epoch]
        once = sum(all(per_epoch[e].get(i, 0) == 1 for e in complete) for i in range(n)) \
            if complete else None
        out["once"] = (once, n, complete)
    return out


def choose_target(args, runs: Dict[str, Dict[int, dict]]) -> Tuple[float, str]:
    summaries = [r["summary"] for per in runs.values() for r in per.values()]
    if all(drawer.time_to_target(s, args.target) is not None for s in summaries):
        return args.target, f"{compare.target_label(args.target)} (--target; every job " \
                            f"reached it)"
    reached = [t for t in args.targets
               if all(drawer.time_to_target(s, t) is not None for s in summaries)]
    if reached:
        return max(reached), (f"{compare.target_label(max(reached))}: some job did not "
                              f"reach --target {args.target:g}; the highest of --targets "
                              f"every job reached")
    return args.target, f"{compare.target_label(args.target)} (--target; NOT every job " \
                        f"reached it, nor any of --targets)"


def report_leases(args, runs: Dict[str, Dict[int, dict]], base: str) -> None:
    target, why = choose_target(args, runs)
    summaries = {split: {seed: r["summary"] for seed, r in runs.get(split, {}).items()}
                 for split in ("leased", "static")}
    rows = []
    for split in ("leased", "static"):
        got = summaries[split]
        if not got:
            rows.append([split, "(no job finished)", "", "", "", "", ""])
            continue
        vs = "(baseline)" if split == "leased" else compare.spread_cell(
            compare.speedup(got, summaries["leased"], target), ".2f", "x")
        rows.append([split, compare.time_cell(compare.time_to_target(got, target)), vs,
                     compare.spread_cell(compare.spread(
                         [compare.final_accuracy(s) for s in got.values()]), ".4f"),
                     compare.spread_cell(compare.spread(
                         [drawer.throughput(s) for s in got.values()]), ".0f"),
                     compare.spread_cell(compare.spread(
                         [get_batch_ms(r) for r in runs[split].values()]), ".1f"),
                     f"{len(got)}/{args.seeds}"])
    print_table(f"3. leases vs static: ESync, {WORKERS} workers, --slowdown {SLOWDOWN}, "
                f"{NETWORK}, -b {BATCH}, shuffle-packed shards, --time-limit "
                f"{args.time_limit:g}; target accuracy {why}; median [min-max] over the seeds",
                ["--data-split", f"time to {compare.target_label(target)} s",
                 "static / leased", "final accuracy", "samples/s", "get_batch ms",
                 "seeds"], rows)

    use = {split: {seed: data_use(r, args, base, seed, split) for seed, r in
                   runs.get(split, {}).items()} for split in ("leased", "static")}
    devices = sorted({d for per in use.values() for u in per.values() for d in u["devices"]})

    def cell(split, device, key, spec):
        return compare.spread_cell(compare.spread(
            [u["devices"].get(device, {}).get(key) for u in use[split].values()]), spec)

    rows = []
    for device in devices:
        factor = next((u["devices"][device]["slowdown"] for per in use.values()
                       for u in per.values() if device in u["devices"]), None)
        rows.append([device, "" if factor is None else f"{factor:g}",
                     cell("leased", device, "speed", ".3f"), cell("leased", device, "data", ".3f"),
                     cell("static", device, "speed", ".3f"), cell("static", device, "owned", ".3f"),
                     cell("static", device, "visits", ".2f")])
    print_table("3. per device: speed share = its samples per computing second over the "
                "devices' sum; blocks taken = its share of the samples trained (blocks of "
                "equal size); own data = its static share of the training samples; visits = "
                "times each of its own samples was trained per epoch of the job",
                ["device", "slowdown", "leased: speed share", "leased: blocks taken",
                 "static: speed share", "static: own data", "static: visits/epoch"], rows)
    lines = []
    if use["static"]:
        factors = {d: f for d, f in ((d, next((u["devices"][d]["slowdown"]
                                               for u in use["static"].values()
                                               if d in u["devices"]), None)) for d in devices)}
        fast = [d for d, f in factors.items() if f is not None and f == min(
            v for v in factors.values() if v is not None)]
        slow = [d for d in devices if d not in fast]
        ratio = []
        for u in use["static"].values():
            f = [u["devices"][d]["visits"] for d in fast if d in u["devices"]]
            s = [u["devices"][d]["visits"] for d in slow if d in u["devices"]]
            f, s = [v for v in f if v is not None], [v for v in s if v is not None]
            ratio.append(statistics.fmean(f) / statistics.fmean(s) if f and s else None)
        lines.append(f"static: the fast devices' ({', '.join(fast)}) samples are visited "
                     f"{compare.spread_cell(compare.spread(ratio), '.2f', 'x')} as often "
                     f"as the slow devices' ({', '.join(slow)})")
    if use["leased"]:
        for seed, u in use["leased"].items():
            if u["per_sample"] is None:
                continue
            p = u["per_sample"]
            text = (f"leased seed {seed}: visits per sample per epoch of the job, over all "
                    f"{len(p['per_seed'])} samples: median {p['median']:.2f} "
                    f"[{p['min']:.2f}-{p['max']:.2f}]")
            once, n, complete = u["once"]
            text += (f"; trained exactly once in each of epochs "
                     f"{complete[0]}..{complete[-1]}: {once} of {n} samples" if complete else
                     "; no epoch complete (the job did not go two epochs past one)")
            lines.append(text)
    for per in use.values():
        for u in per.values():
            lines += u["notes"]
    if lines:
        print()
        print("\n".join(lines))


# --- the command line -------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """Bad input: one line, exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{PROG}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, allow_abbrev=False, description=__doc__.split("\n\n")[0],
                     epilog="Flags not listed here are passed to every job's main.py. See "
                            "the module docstring for what is measured and how.")
    parser.add_argument("--only", default=",".join(PARTS),
                        help=f"which measurements, comma-separated: {', '.join(PARTS)} "
                             f"(default all)")
    parser.add_argument("--seeds", type=int, default=None,
                        help=f"repetitions with seeds 0..N-1 (default {DEFAULT_SEEDS})")
    parser.add_argument("--quick", action="store_true",
                        help=f"a check that it runs: --seeds {QUICK_SEEDS} --mix-epochs "
                             f"{QUICK_MIX_EPOCHS} --epochs {QUICK_EPOCHS} --time-limit "
                             f"{QUICK_TIME_LIMIT:g} unless given")
    parser.add_argument("--out", help="folder for the shards and the jobs' logs, kept "
                                      "(default: a temp folder, removed at the end)")
    parser.add_argument("--mix-epochs", type=int, default=None,
                        help=f"mixing: epochs of samples drawn per seed and setting "
                             f"(default {MIX_EPOCHS})")
    parser.add_argument("--mix-batch", type=int, default=BATCH,
                        help="mixing: samples per batch (default %(default)s)")
    parser.add_argument("--epochs", type=int, default=None,
                        help=f"accuracy: --epochs of each job (default {EPOCHS})")
    parser.add_argument("--mitigation", default="auto",
                        help="accuracy: the mitigation row, auto (the highest leased "
                             "entropy of the mixing) or one of "
                             + ", ".join(s.slug for s in MITIGATIONS))
    parser.add_argument("--time-limit", type=float, default=None,
                        help=f"leases: seconds of training per job (default {TIME_LIMIT:g})")
    parser.add_argument("--target", type=float, default=0.9,
                        help="leases: the target accuracy (default %(default)s; where some "
                             "job did not reach it, the highest of --targets every job did)")
    parser.add_argument("--targets", default="0.8,0.85,0.9,0.95,0.97",
                        help="leases: the fallback targets (default %(default)s)")
    parser.add_argument("--eval-interval", type=float, default=config.EVAL_INTERVAL,
                        help="seconds between the evaluator's evaluations (default "
                             "%(default)s)")
    parser.add_argument("--shard-size", default=None,
                        help="bytes per shard, e.g. 200KB (default: esync-pack's, 64MB: "
                             "one training shard)")
    return parser


def settle(args) -> List[str]:
    """Fill in the defaults (--quick's where it is given); the parts; ValueError."""
    parts = list(dict.fromkeys(p.strip() for p in args.only.split(",") if p.strip()))
    if not parts or any(p not in PARTS for p in parts):
        raise ValueError(f"--only {args.only!r}: choose from {', '.join(PARTS)}")
    quick = args.quick
    for dest, full, short in (("seeds", DEFAULT_SEEDS, QUICK_SEEDS),
                              ("mix_epochs", MIX_EPOCHS, QUICK_MIX_EPOCHS),
                              ("epochs", EPOCHS, QUICK_EPOCHS),
                              ("time_limit", TIME_LIMIT, QUICK_TIME_LIMIT)):
        if getattr(args, dest) is None:
            setattr(args, dest, short if quick else full)
    if args.seeds < 1 or args.mix_epochs < 1 or args.epochs < 1 or args.mix_batch < 1:
        raise ValueError("--seeds, --mix-epochs, --epochs and --mix-batch must be at least 1")
    if not 0 < args.time_limit < float("inf") or not 0 < args.eval_interval < float("inf"):
        raise ValueError("--time-limit and --eval-interval must be > 0")
    if args.mitigation != "auto" and args.mitigation not in [s.slug for s in MITIGATIONS]:
        raise ValueError(f"--mitigation {args.mitigation}: auto or one of "
                         f"{', '.join(s.slug for s in MITIGATIONS)}")
    args.target = compare.parse_targets(str(args.target))[0]
    args.targets = compare.parse_targets(args.targets)
    args.shard_bytes = default_shard_bytes() if args.shard_size is None \
        else parse_size(args.shard_size)
    return parts


def main(argv: Optional[Sequence[str]] = None) -> int:
    args, extra = build_parser().parse_known_args(argv)
    made_base = args.out is None
    base = tempfile.mkdtemp(prefix="esync-shards-") if made_base else args.out
    try:
        return _run(args, extra, base)
    finally:
        if made_base:
            shutil.rmtree(base, ignore_errors=True)


def _run(args, extra: Sequence[str], base: str) -> int:
    started = time.monotonic()
    try:
        parts = settle(args)
    except ValueError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    for seed in range(args.seeds):  # the data (made once per --out)
        for packing in ("sorted", "interleave", "shuffle"):
            pack_digits(shard_folder(base, packing, seed), packing, seed, args.shard_bytes)
    print(f"digits in shards ({shard_folder(base, 'sorted', 0)}: "
          f"{len(ShardSet(shard_folder(base, 'sorted', 0)))} training samples, "
          f"{len(ShardSet(shard_folder(base, 'sorted', 0)).files)} training shard(s)); "
          f"{args.seeds} seed(s)" + (f"; main.py flags {' '.join(extra)}" if extra else ""),
          flush=True)

    try:  # the jobs' flags and folders, checked before anything runs
        plan(args, extra, base, parts, MITIGATIONS[0] if args.mitigation == "auto" else
             next(s for s in MITIGATIONS if s.slug == args.mitigation))
    except ValueError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    mixing = None
    if "mixing" in parts or ("accuracy" in parts and args.mitigation == "auto"):
        try:
            mixing = measure_mixing(args, base, SETTINGS)
        except KeyboardInterrupt:
            print(f"{PROG}: interrupted", file=sys.stderr)
            return 130
        if "mixing" in parts:
            report_mixing(args, mixing)
            sys.stdout.flush()
    mitigation = None
    if "accuracy" in parts:
        mitigation = best_mitigation(mixing) if args.mitigation == "auto" else \
            next(s for s in MITIGATIONS if s.slug == args.mitigation)
        how = "--mitigation" if args.mitigation != "auto" else \
            f"the highest leased entropy of the mixing, " \
            f"{statistics.median(mixing[mitigation.slug]['leased']):.3f} bits"
        print(f"\nbest mitigation: {mitigation.name} ({how})", flush=True)

    try:
        jobs = plan(args, extra, base, parts, mitigation)
    except ValueError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    results: Dict[str, Dict[str, Dict[int, dict]]] = {"accuracy": {}, "leases": {}}
    failed = []
    try:
        for i, job in enumerate(jobs, 1):
            name = f"{job.part}/{job.slug}/seed{job.seed}"
            t0 = time.monotonic()
            try:
                measured = run_job(job)
            except (RuntimeError, summary.SummaryError) as e:
                failed.append(name)
                print(f"[{i}/{len(jobs)}] {name}: failed: {e}", file=sys.stderr, flush=True)
                continue
            results[job.part].setdefault(job.slug, {})[job.seed] = measured
            final = compare.final_accuracy(measured["summary"])
            print(f"[{i}/{len(jobs)}] {name}: {time.monotonic() - t0:.0f} s; final accuracy "
                  f"{'n/a' if final is None else f'{final:.4f}'}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    if "accuracy" in parts:
        report_accuracy(args, results["accuracy"], mitigation)
    if "leases" in parts:
        report_leases(args, results["leases"], base)
    print(f"\n{len(jobs) - len(failed)} of {len(jobs)} jobs done; " * bool(jobs)
          + f"{(time.monotonic() - started) / 60:.1f} min in all"
          + (f"; shards and logs in {base}" if args.out else "")
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
