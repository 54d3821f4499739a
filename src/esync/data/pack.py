"""`esync-pack SRC OUT`: a data set as shards and their index (esync.data.shards), and
`esync-pack --index DIR`: an index for WebDataset shards written by other tools.

Sources (`--format auto` tells them apart, in this order): the words `digits`, `mnist`,
`fashion-mnist` (the built-in data sets, mnist and fashion-mnist from --data-dir); a text
file (`text`); a folder holding MNIST-style IDX files (`idx`); CIFAR-10's binary batches
(`cifar10`); class folders of `.npy` arrays (`npy`) or of images (`folder`), in the
layouts and with the test split of esync.data.formats.image_folder. A folder of text
files is `--format text`.

What a sample holds: an image file's bytes unchanged, as the part named by its
lower-cased extension (`.jpeg` is `jpg`; one folder holds one type of image, since the
index names one input part); a `.npy` file's bytes unchanged (`npy`); IDX, CIFAR-10 and
built-in images PNG-encoded (`png`, grayscale or RGB); with the class index as its
`.cls` part and label. A text corpus (a file, or a folder's regular files in sorted
order, hidden ones skipped, concatenated) becomes windows of `--window`+1 consecutive
bytes with stride `--window`, each a uint8 `.npy` array without label (target None);
the last tenth of the windows (at least one) is the test split.

`--order` is the samples' order in the shards, in both splits: `shuffle` (the default:
a permutation seeded by --seed), `stored` (the source's: class by class for a folder)
or `interleave` (round-robin over the classes: each class's first sample, then each
one's second, ...).

The functions below do the same from Python: `pack`, `pack_folder`, `pack_arrays`,
`pack_text`, `pack_samples` (any samples), `index_shards`; esync.data.sources reads the
sources. Every problem with the input is a one-line UserError naming the file; the
command prints it as `esync-pack: error: ...`, exit 2.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from esync.data.shards import IMAGE_PARTS, INDEX, ShardWriter, write_index
from esync.data.sources import (BUILTINS, class_files, detect_format, image_part,
                                input_parts_left, read_corpus, read_file, walk_tar)
from esync.errors import OneLineParser, UserError, command_main

PROG = "esync-pack"
FORMATS = ("auto", "folder", "idx", "cifar10", "npy", "text") + BUILTINS
ORDERS = ("stored", "interleave", "shuffle")
#: the command's order: shuffled when packed, as WebDataset advises, since CorgiPile's
#: blocks mix little on shards written class by class (the manual: docs/how-to/data-and-networks.md)
DEFAULT_ORDER = "shuffle"
DEFAULT_SHARD_BYTES = 64 << 20
DEFAULT_WINDOW = 256
#: text: the last 1/TEXT_TEST_EVERY of the windows (at least one) is the test split
TEXT_TEST_EVERY = 10
#: --shard-size units (powers of 1024, as the default 64MB is 64 << 20)
UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
#: the shards this module writes (removed from OUT before packing into it again)
SHARD_NAME = re.compile(r"(train|test)-\d{6}\.tar")
#: the parts --index takes for a sample's input, besides images
ARRAY_PARTS = ("npy",)
#: a split for pack_samples: (number of samples, their labels or None, sample i's parts)
Split = Tuple[int, Optional[np.ndarray], Callable[[int], Dict[str, bytes]]]


@dataclass
class Packed:
    """What was written: samples per split, shard files, their bytes, the index."""
    index: str
    samples: Dict[str, int]
    shards: int
    bytes: int

    def line(self, verb: str = "packed") -> str:
        counts = " and ".join(f"{n} {split}" for split, n in self.samples.items())
        return (f"{verb} {counts} samples in {self.shards} shard{'s' * (self.shards != 1)} "
                f"({self.bytes} bytes): {os.path.dirname(self.index) or '.'}")


def parse_size(text: str) -> int:
    """`--shard-size`: bytes, or a number with a unit: 500KB, 64MB, 1.5GB (K, KiB alike)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*(?:([kmgt])(?:i?b)?|b)?\s*", str(text), re.I)
    value = float(match.group(1)) * UNITS[(match.group(2) or "").lower()] if match else 0
    if value < 1:
        raise UserError(f"--shard-size {text}: expected a positive number of bytes or a "
                        f"size such as 500KB, 64MB, 1GB")
    return int(value)


def sample_order(count: int, labels: Optional[np.ndarray], order: str,
                 rng: np.random.Generator) -> np.ndarray:
    """The source indices of the samples in their order in the shards (see the module)."""
    if order == "stored":
        return np.arange(count)
    if order == "shuffle":
        return rng.permutation(count)
    if order != "interleave":
        raise UserError(f"--order {order}: expected one of {', '.join(ORDERS)}")
    if labels is None:
        raise UserError("--order interleave: these samples have no classes to deal "
                        "round-robin (use stored or shuffle)")
    labels = np.asarray(labels, dtype=np.int64)
    by_class = np.argsort(labels, kind="stable")
    first = np.searchsorted(labels[by_class], labels[by_class], side="left")
    rank = np.empty(count, dtype=np.int64)
    rank[by_class] = np.arange(count) - first  # each sample's place within its class
    return np.lexsort((labels, rank))


# --- writing ----------------------------------------------------------------------------

def packed_files(out: str) -> List[str]:
    """The index and the shards (`train-NNNNNN.tar`, `test-NNNNNN.tar`) of a data set
    packed in `out`, index first; UserError if `out` is a file."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise UserError(f"{out} is a file: expected a folder for the shards")
    names = os.listdir(out) if os.path.isdir(out) else []
    return [INDEX] * (INDEX in names) + sorted(n for n in names if SHARD_NAME.fullmatch(n))


def check_out(out: str, force: bool) -> None:
    """Refuse an `out` that holds a packed data set already, unless `force`."""
    old = packed_files(out)
    if old and not force:
        raise UserError(f"{out} already holds {old[0]}{' and more' if len(old) > 1 else ''}: "
                        f"give --force to replace that data set, or another OUT")


def pack_samples(out: str, splits: Dict[str, Split], input_part: str,
                 target_part: Optional[str], classes: Optional[Sequence[str]],
                 shard_bytes: int = DEFAULT_SHARD_BYTES, order: str = "stored",
                 seed: int = 0) -> Packed:
    """Write each split's samples, in `order`, into shards of about `shard_bytes` in `out`
    (replacing a data set packed there before), then the index. Sample i of a split is
    `parts(i)`, with label `labels[i]` (labels None: no label). If writing fails, the
    shards written so far are removed."""
    orders = {}
    for number, (split, (count, labels, _)) in enumerate(splits.items()):
        if count < 1:
            raise UserError(f"{out}: no samples for the {split} split")
        orders[split] = sample_order(count, labels, order, np.random.default_rng([seed, number]))
    for name in packed_files(out):  # the index first: never one naming missing shards
        os.remove(os.path.join(out, name))
    os.makedirs(out, exist_ok=True)
    entries: Dict[str, List[dict]] = {}
    writers: List[ShardWriter] = []
    try:
        for split, (_, labels, parts) in splits.items():
            writers.append(ShardWriter(out, split, shard_bytes))
            for i in orders[split]:
                writers[-1].write(parts(int(i)), None if labels is None else int(labels[i]))
            entries[split] = writers[-1].close()
    except BaseException:
        for writer in writers:
            try:
                writer.close()
            except Exception:
                pass  # its shards go all the same
            for shard in writer.shards:
                path = os.path.join(out, shard["file"])
                if os.path.exists(path):
                    os.remove(path)
        raise
    index = write_index(out, entries, input_part, target_part, classes)
    files = [e for es in entries.values() for e in es]
    return Packed(index, {split: splits[split][0] for split in entries}, len(files),
                  sum(e["bytes"] for e in files))


def png_bytes(image: np.ndarray) -> bytes:
    """A uint8 image [H, W] or [1, H, W] (grayscale) or [3, H, W] (RGB) as PNG bytes."""
    import io

    from PIL import Image

    image = np.asarray(image, dtype=np.uint8)
    image = image[0] if image.ndim == 3 and image.shape[0] == 1 else image
    image = image.transpose(1, 2, 0) if image.ndim == 3 else image
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image)).save(buffer, format="PNG")
    return buffer.getvalue()


def pack_arrays(out: str, train_images, train_labels, test_images, test_labels,
                shard_bytes: int = DEFAULT_SHARD_BYTES, order: str = "stored",
                seed: int = 0, classes: Optional[Sequence[str]] = None) -> Packed:
    """uint8 images ([N, H, W], [N, 1, H, W] or [N, 3, H, W], numpy or torch) and integer
    labels as PNG samples; classes default to "0".."<largest label>"."""
    arrays = {"train": (np.asarray(train_images), np.asarray(train_labels, dtype=np.int64)),
              "test": (np.asarray(test_images), np.asarray(test_labels, dtype=np.int64))}
    for split, (images, labels) in arrays.items():
        if len(images) != len(labels) or not len(labels) or images.ndim not in (3, 4) \
                or (images.ndim == 4 and images.shape[1] not in (1, 3)) or labels.min() < 0:
            raise UserError(f"{split}: {len(images)} images of shape {images.shape[1:]} and "
                            f"{len(labels)} labels: expected as many non-negative labels "
                            f"as images [N, H, W], [N, 1, H, W] or [N, 3, H, W], at least one")
    if classes is None:
        classes = [str(k) for k in range(max(int(y.max()) for _, y in arrays.values()) + 1)]
    splits = {split: (len(y), y, lambda i, x=x: {"png": png_bytes(x[i])})
              for split, (x, y) in arrays.items()}
    return pack_samples(out, splits, "png", "cls", classes, shard_bytes, order, seed)


def npy_bytes(array: np.ndarray) -> bytes:
    import io

    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def pack_text(out: str, corpus: bytes, window: int = DEFAULT_WINDOW,
              shard_bytes: int = DEFAULT_SHARD_BYTES, order: str = "stored", seed: int = 0,
              source: str = "the corpus") -> Packed:
    """Windows of `window`+1 bytes of `corpus` with stride `window` as uint8 .npy samples
    without labels; the last tenth of them (at least one) is the test split."""
    if window < 1:
        raise UserError(f"--window {window}: expected a positive number of bytes")
    data = np.frombuffer(corpus, dtype=np.uint8)
    count = (len(data) - 1) // window if len(data) > window else 0
    if count < 2:
        raise UserError(f"{source} is {len(data)} bytes: too short for two windows of "
                        f"--window {window} + 1 bytes (one to train on, one to test)")
    n_test = max(1, count // TEXT_TEST_EVERY)
    first = {"train": 0, "test": count - n_test}
    window_at = lambda start: lambda i: {
        "npy": npy_bytes(data[(start + i) * window:(start + i) * window + window + 1])}
    splits = {split: (n, None, window_at(first[split]))
              for split, n in (("train", count - n_test), ("test", n_test))}
    return pack_samples(out, splits, "npy", None, None, shard_bytes, order, seed)


def pack_folder(src: str, out: str, kind: str = "images",
                shard_bytes: int = DEFAULT_SHARD_BYTES, order: str = "stored",
                seed: int = 0) -> Packed:
    """Class folders of images (kind "images") or .npy files ("npy"): each file's bytes
    unchanged as one sample, labelled with its class."""
    classes, train, test = class_files(src, kind)
    if kind == "images":
        seen = {}
        for path, _ in train + test:
            seen.setdefault(image_part(path), path)
        if len(seen) > 1:
            (a, path_a), (b, path_b) = list(seen.items())[:2]
            raise UserError(f"{src} mixes .{a} and .{b} images ({path_a}, {path_b}): "
                            f"convert them to one type (the index names one input part)")
        part = next(iter(seen))
    else:
        part = "npy"
    splits = {split: (len(files), np.array([c for _, c in files], dtype=np.int64),
                      lambda i, files=files: {part: read_file(files[i][0])})
              for split, files in (("train", train), ("test", test))}
    return pack_samples(out, splits, part, "cls", classes, shard_bytes, order, seed)


def pack(src: str, out: str, fmt: str = "auto", shard_bytes: int = DEFAULT_SHARD_BYTES,
         order: str = DEFAULT_ORDER, seed: int = 0, window: int = DEFAULT_WINDOW,
         data_dir: str = "data", force: bool = False) -> Packed:
    """What `esync-pack SRC OUT` does: pack `src` (of format `fmt`, or detected) into `out`,
    which must not hold a data set already unless `force`."""
    fmt = detect_format(src) if fmt == "auto" else fmt
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt}: expected one of {', '.join(FORMATS)}")
    if order not in ORDERS:
        raise UserError(f"--order {order}: expected one of {', '.join(ORDERS)}")
    if fmt not in BUILTINS and fmt != "text" and not os.path.isdir(src):
        raise UserError(f"{src}: no such folder (--format {fmt})")
    check_out(out, force)
    options = dict(shard_bytes=shard_bytes, order=order, seed=seed)
    if fmt in ("folder", "npy"):
        return pack_folder(src, out, "images" if fmt == "folder" else "npy", **options)
    if fmt == "text":
        if not os.path.exists(src):
            raise UserError(f"{src}: no such text file or folder")
        return pack_text(out, read_corpus(src), window, source=src, **options)
    if fmt == "cifar10":
        from esync.data.formats import cifar10_binary

        train, test = cifar10_binary(src)
        return pack_arrays(out, train.images.numpy(), train.labels.numpy(),
                           test.images.numpy(), test.labels.numpy(), classes=train.classes,
                           **options)
    from esync.data.datasets import NUM_CLASSES, load_dataset, load_idx_dataset

    if fmt == "idx":
        folder = os.path.abspath(src)
        data = load_idx_dataset(os.path.basename(folder), os.path.dirname(folder))
    else:
        data = load_dataset(fmt, data_dir)
    return pack_arrays(out, data.train_images.numpy(), data.train_labels.numpy(),
                       data.test_images.numpy(), data.test_labels.numpy(),
                       classes=[str(k) for k in range(NUM_CLASSES)], **options)


def index_shards(folder: str) -> Packed:
    """Write `folder/index.json` for the WebDataset shards `*.tar` in `folder`: those named
    train* are the train split, test* or val* the test split (by name). The input part
    is the first image or .npy part that every sample has; the target `cls` if every
    sample has one (an integer: its label; classes "0".."<largest>", or the names in an
    index.json already there if it names enough of them)."""
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".tar")
                       and os.path.isfile(os.path.join(folder, n)))
    except OSError as e:
        raise UserError(f"--index {folder}: {e.strerror or e}") from None
    files = {"train": [n for n in names if n.startswith("train")],
             "test": [n for n in names if n.startswith(("test", "val"))]}
    if not files["train"]:
        raise UserError(f"--index {folder}: no train*.tar shards there"
                        f"{' (it has ' + ', '.join(names[:3]) + ')' if names else ''}")
    entries: Dict[str, List[dict]] = {}
    candidates: Optional[List[str]] = None
    every_cls = True
    for split, shard_names in files.items():
        for name in shard_names:
            path = os.path.join(folder, name)
            offsets, samples, size = walk_tar(path)
            if not samples:
                continue  # no samples: nothing to index (WebDataset yields none either)
            if candidates is None:
                candidates = [p for p in samples[0].parts if p in IMAGE_PARTS + ARRAY_PARTS]
                if not candidates:
                    raise UserError(f"shard {path}: sample {samples[0].key} has no image or "
                                    f".npy part (it has "
                                    f"{', '.join('.' + p for p in samples[0].parts)})")
            labels = []
            for sample in samples:
                candidates = input_parts_left(candidates, sample, path)
                every_cls = every_cls and sample.cls is not None
                if every_cls:
                    text = sample.cls.decode("ascii", "replace").strip()
                    if not text.isdigit():
                        raise UserError(f"shard {path}: sample {sample.key}'s .cls part is "
                                        f"{text[:20]!r}, not a class number (0, 1, ...)")
                    labels.append(int(text))
            entries.setdefault(split, []).append(
                {"file": name, "bytes": size, "offsets": offsets, "labels": labels})
    if "train" not in entries:
        raise UserError(f"--index {folder}: the train shards ({', '.join(files['train'])}) "
                        f"hold no samples")
    classes = None
    for entry in (e for es in entries.values() for e in es):
        if not every_cls:
            del entry["labels"]
        else:
            classes = max(classes or 0, max(entry["labels"]) + 1)
    names = [str(k) for k in range(classes)] if classes else None
    if names:  # re-indexing: the class names of the index there, if they fit
        try:
            with open(os.path.join(folder, INDEX), encoding="utf-8") as f:
                old = json.load(f).get("classes")
            if isinstance(old, list) and len(old) >= classes:
                names = [str(name) for name in old]
        except (OSError, ValueError, AttributeError):
            pass
    index = write_index(folder, entries, candidates[0], "cls" if every_cls else None, names)
    shards = [e for es in entries.values() for e in es]
    return Packed(index, {s: sum(len(e["offsets"]) - 1 for e in es) for s, es in
                          entries.items()}, len(shards), sum(e["bytes"] for e in shards))


# --- the command ------------------------------------------------------------------------

def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    p = OneLineParser(prog=prog, description=__doc__.split("\n\nThe functions below")[0],
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        usage="%(prog)s SRC OUT [options]\n       %(prog)s --index DIR")
    p.add_argument("src", metavar="SRC", nargs="?",
                   help="the data set: a folder, a text file, or digits/mnist/fashion-mnist")
    p.add_argument("out", metavar="OUT", nargs="?", help="the folder for shards and index")
    p.add_argument("--format", default="auto", choices=FORMATS,
                   help="what SRC holds (default: auto, told from SRC)")
    p.add_argument("--shard-size", default="64MB",
                   help="bytes a shard holds about, e.g. 500KB, 64MB, 1GB (default: 64MB)")
    p.add_argument("--order", default=DEFAULT_ORDER, choices=ORDERS,
                   help=f"the samples' order in the shards (default: {DEFAULT_ORDER})")
    p.add_argument("--seed", type=int, default=0, help="--order shuffle's seed (default: 0)")
    p.add_argument("--window", type=int, default=DEFAULT_WINDOW,
                   help=f"text: tokens (bytes) a sample predicts (default: {DEFAULT_WINDOW})")
    p.add_argument("--data-dir", default="data",
                   help="mnist, fashion-mnist: the folder holding mnist/, fashion-mnist/ "
                        "(default: data)")
    p.add_argument("--force", action="store_true",
                   help="replace the data set OUT holds (its index and shards)")
    p.add_argument("--index", metavar="DIR",
                   help="write DIR/index.json (replacing one there) for the WebDataset "
                        "shards in DIR instead")
    return p


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    """The `esync-pack` command (see the module's docstring)."""
    return command_main(_main, argv, prog, PROG)


def _main(argv: List[str], prog: str) -> int:
    args = build_parser(prog).parse_args(argv)
    if args.index is not None:
        if args.src is not None:
            raise UserError(f"--index {args.index} indexes shards in place: no SRC or OUT")
        print(index_shards(args.index).line("indexed"), flush=True)
        return 0
    if args.out is None:
        raise UserError("expected SRC and OUT (or --index DIR)")
    packed = pack(args.src, args.out, args.format, parse_size(args.shard_size),
                  args.order, args.seed, args.window, args.data_dir, args.force)
    print(packed.line(), flush=True)
    return 0


def console_main() -> int:
    """The `esync-pack` command."""
    return main()


if __name__ == "__main__":
    sys.exit(main())
