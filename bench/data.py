"""Samples per second read from shards on local disk: CorgiPile's blocks against a full
random-access shuffle of the same data.

    python bench/data.py [--size-gb 2.2] [--sample-kb 110] [--dir DIR] [--runs 3]
                         [--samples N|P%] [--block-size N] [--buffer-ratio 0.1]
                         [--drop-caches auto|always|never] [--seed 0] [--no-keep]

Data: --size-gb GB (10^9 bytes) of samples of --sample-kb KB (10^3 bytes; 110 KB is
about ImageNet's mean JPEG), each a valid `.npy` of incompressible random bytes (uint8,
never decoded: this measures I/O, not decoding) with a `.cls` label, written by
esync.data.shards' ShardWriter into shards of 64 MiB, `train-000000.tar`, ..., with
their `index.json` (write_index), in --dir. The data is written once and reused by the
next run when its index matches the requested size (sample count and bytes per sample),
which the script says; it stays after the run (--no-keep removes it) and the last line
says how to delete it.

Two methods, each reading the same number of samples (--samples, default 20% of the
data: a fixed share, so that both read the same bytes) through `ShardSet`. Not the whole
set: where the shards fit in RAM, as 2.2 GB do, later reads would land more often on
pages an earlier read brought in by read-ahead (the kernel reads up to the disk's
read_ahead_kb past a read), which a data set larger than RAM would not keep; for longer
measurements raise --runs. The methods:
  - random: a full random-access shuffle, what a map-style Dataset with a RandomSampler
    does: the first --samples of a seeded random permutation of all samples, each read
    by itself, `ShardSet.read(i, 1)` (one `os.pread` of that sample's bytes).
  - corgipile: CorgiPile's (Xu et al., SIGMOD 2022) two-level shuffle over storage:
    `ShardSet.blocks(--block-size)` (runs of consecutive samples that never cross a
    shard; default 10 MB of samples, 90 of 110 KB, the block of CorgiPile's PyTorch
    version) visited in a seeded random order, each read with one `ShardSet.read(first,
    count)` (one `os.pread` of the block's byte range), into a buffer of whole blocks
    holding --buffer-ratio of the data (as esync.data.shuffle.EpochOrder sizes it: at
    least one block), whose samples are emitted in a seeded random order once it is full;
    the last block is cut short at --samples.
Both parse what they read (tarfile, as ShardSet.read does) and touch every sample's
parts; the emitting costs nothing beside the reads.

Page cache: before each timed run the shards are evicted from the page cache: fsync and
`posix_fadvise(POSIX_FADV_DONTNEED)` on every shard file (drops its clean cached pages,
no root needed), then, with --drop-caches always (or auto, when fadvise left more than
1% of the shards' pages cached), `sync` and `1` written to /proc/sys/vm/drop_caches
(the whole machine's clean page cache; needs root and a writable /proc/sys). The share of
the shards' pages still cached is measured with mincore(2) (libc, through ctypes) before
and after each step; the run's line says which step took effect and the residue. Where
neither evicts (no fadvise, no mincore, drop_caches refused) the figures are warm-cache
and the summary says so. A virtual disk's host may cache it where no guest can evict it:
the machine facts at the top say whether --dir is on a virtio disk.

Runs: --runs repetitions; run k reads with seed [--seed, k] and alternates the order of
the two methods (corgipile first in odd runs, random first in even ones), so that neither
always goes first. Printed: the machine facts (the device, file system, rotational flag
and read-ahead of --dir, RAM, CPUs and load, the shards' total size); one line per
method and run: samples, preads, seconds, samples/s, MB/s of the byte ranges asked for,
disk MB (what the process had read from storage, /proc/self/io's read_bytes: read-ahead
included, page-cache hits not) and the page cache's eviction (the shards' cached share
before, after each step); then per method the median [min-max] over runs of samples/s
and MB/s, corgipile / random samples/s taken within each run (median [min-max]), and
disk MB over MB asked for (read-ahead's extra; under 0.9x some reads came from the page
cache, which the line says). Timings, not test material: they vary with the machine's
load and the disk's other users.
"""
from __future__ import annotations

import argparse
import glob
import io
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from esync.data.pagecache import Residency, drop_caches, fadvise_dontneed
from esync.data.shards import INDEX, ShardSet, ShardWriter, write_index
from esync.errors import UserError

PROG = "data.py"
DEFAULT_DIR = os.path.join(tempfile.gettempdir(), "esync-bench-data")
MARKER = ".esync-bench-data"   # a folder this script wrote (and may rewrite)
SHARD_BYTES = 64 << 20         # ShardWriter's default, 64 MiB
BLOCK_BYTES = 10_000_000       # CorgiPile's PyTorch version reads blocks of ~10 MB
CLASSES = 1000
METHODS = ("corgipile", "random")
WARM = 0.01                    # a share of shard pages still cached that counts as warm
MB = 1e6


class _Parser(argparse.ArgumentParser):
    """Bad input: one line, exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{PROG}: error: {message}\n")


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
        return value
    return parse


def _samples(text: str) -> Tuple[str, float]:
    """N samples, or P% of the data."""
    pct = text.endswith("%")
    value = _positive(float if pct else int)(text[:-1] if pct else text)
    if pct and value > 100:
        raise argparse.ArgumentTypeError(f"more than 100%: {text!r}")
    return ("%" if pct else "n", value)


def _ratio(text: str) -> float:
    value = _positive(float)(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"more than 1: {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, allow_abbrev=False,
                     description=__doc__.split("\n\n")[0],
                     epilog="See the module docstring for what is measured and how.")
    parser.add_argument("--size-gb", type=_positive(float), default=2.2,
                        help="data written, GB of samples (default %(default)s)")
    parser.add_argument("--sample-kb", type=_positive(float), default=110.0,
                        help="bytes per sample, KB: ImageNet's mean JPEG is ~110 "
                             "(default %(default)s)")
    parser.add_argument("--dir", default=DEFAULT_DIR,
                        help="folder of the shards, written once and reused while its index "
                             "matches (default %(default)s)")
    parser.add_argument("--runs", type=_positive(int), default=3,
                        help="repetitions, each method once per run (default %(default)s)")
    parser.add_argument("--samples", type=_samples, default=("%", 20.0),
                        help="samples each method reads per run: N, or P%% of the data "
                             "(default 20%%)")
    parser.add_argument("--block-size", type=_positive(int), default=None,
                        help="CorgiPile: samples per block (default: 10 MB of samples, "
                             "90 at 110 KB)")
    parser.add_argument("--buffer-ratio", type=_ratio, default=0.1,
                        help="CorgiPile: share of the data its buffer holds, in whole "
                             "blocks (default %(default)s)")
    parser.add_argument("--drop-caches", choices=("auto", "always", "never"), default="auto",
                        help="also write 1 to /proc/sys/vm/drop_caches (the whole machine's "
                             "page cache): auto: when fadvise left the shards cached "
                             "(default %(default)s)")
    parser.add_argument("--seed", type=int, default=0,
                        help="run k reads with seed [SEED, k]; the data's bytes too "
                             "(default %(default)s)")
    parser.add_argument("--keep", action=argparse.BooleanOptionalAction, default=True,
                        help="keep the data for the next run (default; --no-keep removes "
                             "it at the end)")
    return parser


# --- the data -------------------------------------------------------------------------
def npy_header(values: int) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        out, {"descr": "|u1", "fortran_order": False, "shape": (values,)})
    return out.getvalue()


def payload_layout(sample_bytes: int) -> Tuple[bytes, int]:
    """The `.npy` header and the count of random bytes after it, `sample_bytes` in all."""
    header = npy_header(max(1, sample_bytes - 128))
    values = sample_bytes - len(header)
    if values < 1:
        raise UserError(f"--sample-kb {sample_bytes / 1e3:g} is smaller than a .npy header")
    return npy_header(values), values


def record_bytes(sample_bytes: int) -> int:
    """A sample's bytes in a shard: the `.npy` member and the `.cls` member (a label of
    at most 511 characters), each a 512-byte header and its data padded to 512."""
    return 512 + -(-sample_bytes // 512) * 512 + 512 + 512


def shard_paths(folder: str) -> List[str]:
    return sorted(glob.glob(os.path.join(folder, "train-[0-9][0-9][0-9][0-9][0-9][0-9].tar")))


def existing_data(folder: str, samples: int,
                  sample_bytes: int) -> Tuple[Optional[ShardSet], str]:
    """The shards in `folder` if its index matches the request, else (None, why not)."""
    if not os.path.isfile(os.path.join(folder, INDEX)):
        return None, "no index"
    try:
        shards = ShardSet(folder, "train")
    except UserError as e:
        return None, str(e)
    record = record_bytes(sample_bytes)
    sizes = np.concatenate([np.diff(f.offsets) for f in shards.files])
    if len(shards) != samples or shards.input != "npy" or np.any(sizes != record):
        return None, (f"its index holds {len(shards)} samples of {int(sizes[0])} bytes, "
                      f"{samples} of {record} requested")
    return shards, ""


def prepare_folder(folder: str) -> None:
    """Make `folder`, or clear what this script wrote there; refuse a folder it did not
    write (its shards may be someone's data)."""
    os.makedirs(folder, exist_ok=True)
    marker = os.path.join(folder, MARKER)
    if not os.path.exists(marker):
        if os.listdir(folder):
            raise UserError(f"--dir {folder} holds files this benchmark did not write: "
                            f"give an empty or new folder")
    else:
        for path in shard_paths(folder) + [os.path.join(folder, INDEX)]:
            if os.path.exists(path):
                os.remove(path)
    with open(marker, "w") as f:
        f.write("written by bench/data.py; the whole folder may be deleted\n")


def write_data(folder: str, samples: int, sample_bytes: int, seed: int) -> float:
    """Write the shards and their index; the seconds it took (fsync included)."""
    header, values = payload_layout(sample_bytes)
    rng = np.random.default_rng([seed, 1 << 20])
    started = time.perf_counter()
    writer = ShardWriter(folder, "train", SHARD_BYTES)
    for i in range(samples):
        writer.write({"npy": header + rng.bytes(values)}, label=i % CLASSES)
        if (i + 1) % 2000 == 0:
            print(f"  written {i + 1:,} of {samples:,} samples", file=sys.stderr, flush=True)
    entries = writer.close()
    for entry in entries:
        fd = os.open(os.path.join(folder, entry["file"]), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    write_index(folder, {"train": entries}, "npy", "cls",
                [f"class{k:03d}" for k in range(CLASSES)])
    return time.perf_counter() - started


# --- the page cache (Residency, fadvise_dontneed, drop_caches: esync.data.pagecache) --
def _pct(share: Optional[float]) -> str:
    return "?" if share is None else f"{100 * share:.1f}%"


def evict(paths: Sequence[str], mode: str, residency: Residency) -> dict:
    """Evict the shards; what each step did and the cached share before and after."""
    before = residency.share(paths)
    out = {"before": before, "steps": []}
    error = fadvise_dontneed(paths)
    after = residency.share(paths)
    out["steps"].append(("fadvise", error, after))
    warm = after is None or after > WARM
    if mode == "always" or (mode == "auto" and warm):
        error = drop_caches()
        after = residency.share(paths)
        out["steps"].append(("drop_caches", error, after))
    out["after"] = after
    return out


def describe_eviction(ev: dict) -> Tuple[str, str]:
    """(the step that took effect, or 'none'; a line saying what each step did)."""
    parts, took = [], "none"
    for name, error, after in ev["steps"]:
        if error:
            parts.append(f"{name} failed ({error})")
            continue
        parts.append(f"{name} -> {_pct(after)}")
        if took == "none" and after is None:
            took = f"{name} (unchecked)"
        elif took == "none" and after <= WARM:
            took = name
    return took, f"cached {_pct(ev['before'])}: " + ", ".join(parts)


# --- the two methods ------------------------------------------------------------------
def read_random(shards: ShardSet, count: int, rng: np.random.Generator) -> Tuple[int, List]:
    """The first `count` samples of a random permutation, each read by itself: (preads,
    the (first, count) ranges read)."""
    order = rng.permutation(len(shards))[:count]
    touched = 0
    for i in order:
        for _, parts in shards.read(int(i), 1):
            touched += len(parts["npy"])
    return len(order), [(int(i), 1) for i in order]


def read_corgipile(shards: ShardSet, count: int, rng: np.random.Generator, block_size: int,
                   buffer_ratio: float) -> Tuple[int, List]:
    """Blocks in random order into a buffer of whole blocks, emitted shuffled once full,
    until `count` samples: (preads, the (first, count) ranges read)."""
    blocks = shards.blocks(block_size)
    # as esync.data.shuffle.EpochOrder: as many whole blocks as fit in ratio x samples
    per_buffer = max(1, int(buffer_ratio * len(shards)) // block_size)
    ranges: List[Tuple[int, int]] = []
    buffer: List = []
    in_buffer, remaining, touched = 0, count, 0
    for b in rng.permutation(len(blocks)):
        first, size = (int(v) for v in blocks[b])
        size = min(size, remaining)
        buffer += shards.read(first, size)
        ranges.append((first, size))
        in_buffer += 1
        remaining -= size
        if in_buffer == per_buffer or remaining == 0:
            for j in rng.permutation(len(buffer)):  # the emitting: costs nothing
                touched += len(buffer[j][1]["npy"])
            buffer, in_buffer = [], 0
        if remaining == 0:
            break
    return len(ranges), ranges


def storage_read_bytes() -> Optional[int]:
    """Bytes this process has had read from storage (/proc/self/io: read-ahead included,
    page-cache hits not), or None where the kernel does not say."""
    for line in (_read("/proc/self/io") or "").splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    return None


def timed_run(method: str, shards: ShardSet, count: int, seed: Sequence[int],
              block_size: int, buffer_ratio: float) -> dict:
    rng = np.random.default_rng(list(seed))
    disk0 = storage_read_bytes()
    started = time.perf_counter()
    if method == "random":
        preads, ranges = read_random(shards, count, rng)
    else:
        preads, ranges = read_corgipile(shards, count, rng, block_size, buffer_ratio)
    seconds = time.perf_counter() - started
    disk1 = storage_read_bytes()
    nbytes = sum(shards.read_bytes(first, n) for first, n in ranges)
    samples = sum(n for _, n in ranges)
    return {"samples": samples, "preads": preads, "seconds": seconds, "bytes": nbytes,
            "disk": None if disk0 is None or disk1 is None else disk1 - disk0,
            "sps": samples / seconds, "mbps": nbytes / MB / seconds}


# --- the machine ----------------------------------------------------------------------
def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def mount_of(path: str) -> Tuple[str, str, str]:
    """(device, mount point, file system) of the mount holding `path`."""
    path = os.path.realpath(path)
    best = ("?", "/", "?")
    for line in (_read("/proc/mounts") or "").splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        device, point, fstype = fields[0], fields[1].replace("\\040", " "), fields[2]
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[1]):
            best = (device, point, fstype)
    return best


def disk_facts(device: str) -> str:
    """The block device's rotational flag, read-ahead and kind, from /sys."""
    if not device.startswith("/dev/"):
        return ""
    name = os.path.basename(os.path.realpath(device))
    sysdir = os.path.realpath(os.path.join("/sys/class/block", name))
    if not os.path.isdir(os.path.join(sysdir, "queue")):   # a partition: its disk's queue
        sysdir = os.path.dirname(sysdir)
    facts = []
    rotational = _read(os.path.join(sysdir, "queue", "rotational"))
    if rotational is not None:
        facts.append("rotational" if rotational == "1" else "non-rotational")
        facts[-1] += " (as the kernel says; virtual disks often say rotational)"
    ahead = _read(os.path.join(sysdir, "queue", "read_ahead_kb"))
    if ahead is not None:
        facts.append(f"read-ahead {ahead} KB")
    model = _read(os.path.join(sysdir, "device", "model"))
    if model:
        facts.append(f"model {model}")
    if "virtio" in os.path.realpath(os.path.join(sysdir, "device")):
        facts.append("a virtio disk: its host may cache it beyond this machine's eviction")
    return ", ".join(facts)


def meminfo() -> Dict[str, int]:
    out = {}
    for line in (_read("/proc/meminfo") or "").splitlines():
        key, _, rest = line.partition(":")
        if rest.strip().endswith("kB"):
            out[key] = int(rest.split()[0]) * 1024
    return out


def print_machine(folder: str, paths: Sequence[str]) -> None:
    device, point, fstype = mount_of(folder)
    total = sum(os.path.getsize(p) for p in paths)
    usage = shutil.disk_usage(folder)
    print(f"--dir {folder}: on {device} ({fstype}, mounted at {point}; "
          f"{usage.free / 1e9:.1f} of {usage.total / 1e9:.1f} GB free)")
    facts = disk_facts(device)
    if facts:
        print(f"  disk: {facts}")
    if fstype in ("tmpfs", "ramfs"):
        print("  WARNING: --dir is in memory: nothing to evict, no disk is read")
    mem = meminfo()
    if mem:
        print(f"RAM: {mem.get('MemTotal', 0) / 1e9:.1f} GB, "
              f"{mem.get('MemAvailable', 0) / 1e9:.1f} GB available; the shards are "
              f"{100 * total / max(1, mem.get('MemTotal', 1)):.0f}% of it")
    print(f"CPUs: {os.cpu_count()}, load average "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    print(f"shards: {len(paths)} files, {total / 1e9:.3f} GB in all")


# --- the report -----------------------------------------------------------------------
def spread(values: Sequence[float], fmt: str = "{:.1f}", unit: str = "") -> str:
    return (f"{fmt.format(statistics.median(values))}{unit} "
            f"[{fmt.format(min(values))}-{fmt.format(max(values))}]")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    sample_bytes = int(round(args.sample_kb * 1e3))
    samples = -(-int(args.size_gb * 1e9) // sample_bytes)   # at least --size-gb of payload
    folder = os.path.abspath(args.dir)
    try:
        payload_layout(sample_bytes)
        shards, why = existing_data(folder, samples, sample_bytes)
        if shards is not None:
            print(f"data: reusing {folder} ({samples:,} samples of {sample_bytes:,} bytes; "
                  f"its index matches)")
        else:
            need = samples * record_bytes(sample_bytes) * 1.02
            os.makedirs(folder, exist_ok=True)
            if shutil.disk_usage(folder).free < need:
                raise UserError(f"--dir {folder}: {need / 1e9:.2f} GB needed, "
                                f"{shutil.disk_usage(folder).free / 1e9:.2f} GB free")
            prepare_folder(folder)
            print(f"data: writing {samples:,} samples of {sample_bytes:,} bytes into {folder} "
                  f"({why})", flush=True)
            seconds = write_data(folder, samples, sample_bytes, args.seed)
            shards = ShardSet(folder, "train")
            written = sum(os.path.getsize(f.path) for f in shards.files)
            print(f"  written in {seconds:.1f} s ({written / MB / seconds:.0f} MB/s, "
                  f"fsync included)")
    except UserError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    paths = [f.path for f in shards.files]
    n = len(shards)
    count = min(n, int(args.samples[1]) if args.samples[0] == "n"
                else max(1, int(round(n * args.samples[1] / 100))))
    block_size = args.block_size or max(1, BLOCK_BYTES // sample_bytes)
    per_buffer = max(1, int(args.buffer_ratio * n) // block_size)
    print_machine(folder, paths)
    print(f"each method reads {count:,} of {n:,} samples per run "
          f"({100 * count / n:.1f}%, {count * record_bytes(sample_bytes) / 1e9:.3f} GB); "
          f"corgipile: blocks of {block_size} samples "
          f"({block_size * record_bytes(sample_bytes) / MB:.1f} MB), a buffer of "
          f"{per_buffer} blocks ({per_buffer * block_size:,} samples, "
          f"--buffer-ratio {args.buffer_ratio:g}); random: one pread per sample")
    residency = Residency()
    if residency.libc is None:
        print(f"page cache: cannot check eviction ({residency.error})")
    print()

    results: Dict[str, List[dict]] = {m: [] for m in METHODS}
    took_effect: List[str] = []
    warm_runs: List[str] = []
    residues: List[Optional[float]] = []
    header = (f"{'run':>3}  {'method':<9}  {'samples':>8}  {'preads':>7}  {'seconds':>8}  "
              f"{'samples/s':>10}  {'MB/s':>8}  {'disk MB':>8}  page cache before the run")
    print(header)
    print("-" * len(header))
    for run in range(args.runs):
        order = METHODS if run % 2 == 0 else METHODS[::-1]
        for method in order:
            ev = evict(paths, args.drop_caches, residency)
            took, line = describe_eviction(ev)
            took_effect.append(took)
            residues.append(ev["after"])
            if ev["after"] is None or ev["after"] > WARM:
                warm_runs.append(f"run {run + 1} {method}: {_pct(ev['after'])} still cached")
            r = timed_run(method, shards, count, [args.seed, run], block_size,
                          args.buffer_ratio)
            results[method].append(r)
            disk = "?" if r["disk"] is None else f"{r['disk'] / MB:.1f}"
            print(f"{run + 1:>3}  {method:<9}  {r['samples']:>8,}  {r['preads']:>7,}  "
                  f"{r['seconds']:>8.3f}  {r['sps']:>10.1f}  {r['mbps']:>8.1f}  {disk:>8}  "
                  f"{line}", flush=True)

    print()
    print(f"over {args.runs} run(s), median [min-max]:")
    print(f"{'method':<9}  {'samples/s':>26}  {'MB/s':>26}")
    for method in METHODS:
        rs = results[method]
        print(f"{method:<9}  {spread([r['sps'] for r in rs]):>26}  "
              f"{spread([r['mbps'] for r in rs]):>26}")
    ratios = [c["sps"] / r["sps"] for c, r in zip(results["corgipile"], results["random"])]
    print(f"corgipile / random, samples/s within each run: {spread(ratios, '{:.2f}', 'x')}")
    if all(r["disk"] is not None for m in METHODS for r in results[m]):
        low = min(r["disk"] / r["bytes"] for m in METHODS for r in results[m])
        print("disk MB / MB requested: " + ", ".join(
            f"{m} {spread([r['disk'] / r['bytes'] for r in results[m]], '{:.2f}', 'x')}"
            for m in METHODS) + (f"; WARNING: {low:.2f}x: part of the reads came from "
                                 f"the page cache" if low < 0.9 else ""))
    methods = sorted(set(took_effect))
    if any(r is None for r in residues):
        print(f"page cache: eviction unchecked ({residency.error}): "
              f"{', '.join(methods)} ran without an error; the figures may be warm-cache")
    elif warm_runs:
        print(f"page cache: WARM-CACHE figures, eviction did not take effect in "
              f"{len(warm_runs)} of {len(took_effect)} timed runs ({'; '.join(warm_runs)}); "
              f"{residency.error or 'see the page-cache column for why'}")
    else:
        print(f"page cache: evicted before every timed run by {', '.join(methods)} "
              f"(at most {_pct(max(residues))} of the shards' pages left cached, by "
              f"mincore)")
    if args.keep:
        print(f"data kept for the next run; delete it with: rm -r {folder}")
    elif os.path.exists(os.path.join(folder, MARKER)):
        shutil.rmtree(folder)
        print(f"data removed: {folder}")
    else:
        print(f"data kept: {folder} was not written by this benchmark")
    return 0


if __name__ == "__main__":
    sys.exit(main())
