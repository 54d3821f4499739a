"""Sharded data sets on disk in the WebDataset layout, with an index of byte offsets.

A shard is a POSIX tar file; a sample is the run of members that share a key
(`000123.png` + `000123.cls`), the layout WebDataset, Megatron-Energon and Ray Data read.
`index.json` beside the shards says, per split (`train`, `test`), each shard's file,
size and the byte offset of each sample's first member (plus where the last one ends),
and the samples' labels where they have one. A run of consecutive samples of one shard
(a CorgiPile block) is then one byte range, read with one sequential read and parsed
with `tarfile`. Nothing is unpickled: parts are images (Pillow), `.npy` arrays
(`allow_pickle=False`), text, JSON or integers.

`esync-pack` (esync.data.pack) writes shards and their index, or indexes shards written
by other tools. Every problem with the files is a one-line UserError naming the file.
"""
from __future__ import annotations

import io
import json
import os
import tarfile
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from esync.errors import UserError

INDEX = "index.json"
FORMAT, VERSION = "esync-shards", 1
SPLITS = ("train", "test")
IMAGE_PARTS = ("png", "jpg", "jpeg", "ppm", "pgm", "bmp", "webp", "tif", "tiff")
#: a sample read from a shard: its key and {extension: bytes}
Raw = Tuple[str, Dict[str, bytes]]


def tar_member(name: str, data: bytes) -> Tuple[tarfile.TarInfo, io.BytesIO]:
    """A tar member of `data` with fixed metadata (so that packing is reproducible)."""
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o444, 0
    return info, io.BytesIO(data)


class ShardWriter:
    """Writes samples into shards `<split>-000000.tar`, ... of about `shard_bytes` each,
    keeping each sample's byte offset; `close()` returns the split's index entries."""

    def __init__(self, folder: str, split: str, shard_bytes: int = 64 << 20):
        self.folder, self.split, self.shard_bytes = folder, split, shard_bytes
        self.shards: List[dict] = []
        self._tar: Optional[tarfile.TarFile] = None
        self.count = 0

    def write(self, parts: Dict[str, bytes], label: Optional[int] = None) -> None:
        """One sample: {extension: bytes}; `label` goes into the index (and is the
        sample's `.cls` part, as text, unless `parts` has one)."""
        if self._tar is None or self._tar.offset >= self.shard_bytes:
            self._next_shard()
        key = f"{self.count:09d}"
        if label is not None and "cls" not in parts:
            parts = {**parts, "cls": str(int(label)).encode()}
        entry = self.shards[-1]
        entry["offsets"].append(self._tar.offset)
        for ext, data in parts.items():
            self._tar.addfile(*tar_member(f"{key}.{ext}", data))
        if label is not None:
            entry.setdefault("labels", []).append(int(label))
        self.count += 1

    def _next_shard(self) -> None:
        self._close_shard()
        name = f"{self.split}-{len(self.shards):06d}.tar"
        self._tar = tarfile.open(os.path.join(self.folder, name), "w", format=tarfile.USTAR_FORMAT)
        self.shards.append({"file": name, "offsets": []})

    def _close_shard(self) -> None:
        if self._tar is not None:
            self.shards[-1]["offsets"].append(self._tar.offset)  # where the last sample ends
            self._tar.close()
            path = os.path.join(self.folder, self.shards[-1]["file"])
            self.shards[-1]["bytes"] = os.path.getsize(path)
            self._tar = None

    def close(self) -> List[dict]:
        self._close_shard()
        return self.shards


def write_index(folder: str, splits: Dict[str, List[dict]], input_part: str,
                target_part: Optional[str], classes: Optional[Sequence[str]]) -> str:
    """Write `folder/index.json` (atomically); its path."""
    index = {"format": FORMAT, "version": VERSION, "input": input_part,
             "target": target_part, "classes": list(classes) if classes else None,
             "splits": splits}
    path = os.path.join(folder, INDEX)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(index, f, separators=(",", ":"))
    os.replace(path + ".tmp", path)
    return path


@dataclass
class ShardFile:
    path: str
    offsets: np.ndarray           # int64 [samples + 1]
    labels: Optional[np.ndarray]  # int64 [samples], or None


class ShardSet:
    """One split of a sharded data set: its samples in shard order (sample i is the
    i-th of the split), read by byte ranges."""

    def __init__(self, folder: str, split: str = "train"):
        self.folder = folder
        index_path = os.path.join(folder, INDEX)
        index = _read_index(index_path)
        self.input, self.target = index["input"], index["target"]
        self.classes = index["classes"]
        entries = index["splits"].get(split)
        if entries is None:
            raise UserError(f"{index_path}: no {split!r} split (it has "
                            f"{', '.join(index['splits']) or 'none'})")
        if not isinstance(entries, list) or not entries:
            raise UserError(f"{index_path}: the {split!r} split lists no shards")
        self.files = [_shard_file(folder, e, index_path, self.classes) for e in entries]
        counts = [len(f.offsets) - 1 for f in self.files]
        #: first sample of each shard, and the number of samples after the last
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        if self.starts[-1] == 0:
            raise UserError(f"{index_path}: the {split!r} split has no samples")

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def labels(self) -> Optional[np.ndarray]:
        if any(f.labels is None for f in self.files):
            return None
        return np.concatenate([f.labels for f in self.files])

    @property
    def read_bytes_total(self) -> int:
        """Bytes of all the split's samples (what an epoch reads)."""
        return int(sum(f.offsets[-1] - f.offsets[0] for f in self.files))

    def shard_of(self, sample: int) -> int:
        return int(np.searchsorted(self.starts, sample, side="right") - 1)

    def blocks(self, block_size: int) -> np.ndarray:
        """[first sample, samples] of each block: runs of `block_size` consecutive samples
        (fewer at a shard's end) that never cross a shard."""
        from esync.data.leases import blocks_of

        return blocks_of(self.starts.tolist(), block_size)

    def byte_range(self, first: int, count: int) -> Tuple[int, int, int]:
        """(shard, start byte, end byte) of samples first .. first+count-1 (one shard)."""
        shard = self.shard_of(first)
        local = first - int(self.starts[shard])
        offsets = self.files[shard].offsets
        if local + count > len(offsets) - 1:
            raise ValueError(f"samples {first}..{first + count - 1} cross shard {shard}'s end")
        return shard, int(offsets[local]), int(offsets[local + count])

    def read(self, first: int, count: int) -> List[Raw]:
        """Samples first .. first+count-1 of one shard, with one read of their byte range;
        UserError naming the shard if the bytes are not those samples."""
        shard, start, end = self.byte_range(first, count)
        path = self.files[shard].path
        try:
            with open(path, "rb") as f:
                data = os.pread(f.fileno(), end - start, start)
        except OSError as e:
            raise UserError(f"cannot read shard {path}: {e.strerror or e}") from None
        if len(data) != end - start:
            raise UserError(f"shard {path} is truncated: bytes {start}..{end} expected, "
                            f"the file ends at {start + len(data)}")
        samples = parse_members(data, path, start)
        if len(samples) != count:
            raise UserError(f"shard {path}: bytes {start}..{end} hold {len(samples)} samples, "
                            f"the index says {count} (re-index with esync-pack --index)")
        return samples

    def read_bytes(self, first: int, count: int) -> int:
        _, start, end = self.byte_range(first, count)
        return end - start


def parse_members(data: bytes, path: str, at: int = 0) -> List[Raw]:
    """The samples of a byte range of a tar file: members grouped by key (the name up to
    its first dot after the last slash), in order."""
    samples: List[Raw] = []
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                base = member.name.rsplit("/", 1)[-1]
                key, dot, ext = base.partition(".")
                ext = ext.lower()  # as WebDataset reads parts
                key = member.name[:len(member.name) - len(base)] + key
                if not dot:
                    continue  # no extension: no part of a sample (WebDataset skips it too)
                content = tar.extractfile(member).read()
                if len(content) != member.size:
                    raise tarfile.ReadError(f"member {member.name} is cut short")
                if samples and samples[-1][0] == key:
                    samples[-1][1][ext] = content
                else:
                    samples.append((key, {ext: content}))
    except (tarfile.TarError, EOFError) as e:
        raise UserError(f"shard {path} is corrupt at bytes {at}..{at + len(data)}: {e}") from None
    return samples


def _read_index(path: str) -> dict:
    if not os.path.isfile(path):
        raise UserError(f"{path}: no index of the shards in {os.path.dirname(path) or '.'} "
                        f"(write one with: esync-pack --index {os.path.dirname(path) or '.'})")
    try:
        with open(path, encoding="utf-8") as f:
            index = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: not a readable JSON index: {e}") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise UserError(f"{path}: not an esync shard index (format {FORMAT!r} expected)")
    if index.get("version") != VERSION:
        raise UserError(f"{path}: index version {index.get('version')!r}, this esync reads "
                        f"version {VERSION}")
    for field, kind in (("input", str), ("splits", dict)):
        if not isinstance(index.get(field), kind):
            raise UserError(f"{path}: field {field!r} is missing or not a {kind.__name__}")
    if index.get("target") is not None and not isinstance(index["target"], str):
        raise UserError(f"{path}: field 'target' is not a part's extension")
    classes = index.get("classes")
    if classes is not None and not (isinstance(classes, list) and classes):
        raise UserError(f"{path}: field 'classes' is not a list of class names")
    index.setdefault("classes", None)
    return index


def _shard_file(folder: str, entry, index_path: str, classes) -> ShardFile:
    if not isinstance(entry, dict) or not isinstance(entry.get("file"), str):
        raise UserError(f"{index_path}: a shard entry has no 'file'")
    name = entry["file"]
    path = os.path.join(folder, name)
    if os.path.isabs(name) or ".." in name.replace("\\", "/").split("/"):
        raise UserError(f"{index_path}: shard {name!r} lies outside {folder}")
    try:
        offsets = np.asarray(entry.get("offsets"), dtype=np.int64)
        labels = None if entry.get("labels") is None else \
            np.asarray(entry["labels"], dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        raise UserError(f"{index_path}: shard {name}'s offsets or labels are not "
                        f"integers") from None
    if offsets.ndim != 1 or len(offsets) < 2 or np.any(np.diff(offsets) <= 0) or offsets[0] < 0:
        raise UserError(f"{index_path}: shard {name}'s offsets are not increasing byte "
                        f"offsets of at least one sample")
    if labels is not None and (labels.ndim != 1 or len(labels) != len(offsets) - 1):
        raise UserError(f"{index_path}: shard {name} has {len(offsets) - 1} samples but "
                        f"{labels.size} labels")
    if labels is not None and classes is not None and len(labels) and \
            (labels.min() < 0 or labels.max() >= len(classes)):
        bad = int(np.flatnonzero((labels < 0) | (labels >= len(classes)))[0])
        raise UserError(f"{index_path}: shard {name}'s sample {bad} has label {labels[bad]}, "
                        f"outside the {len(classes)} classes (0..{len(classes) - 1})")
    try:
        size = os.path.getsize(path)
    except OSError:
        raise UserError(f"{index_path}: shard {path} is missing") from None
    if size < offsets[-1] or size != entry.get("bytes", size):
        raise UserError(f"shard {path} is {size} bytes, the index says "
                        f"{entry.get('bytes', offsets[-1])}: truncated or changed since "
                        f"it was indexed")
    return ShardFile(path, offsets, labels)
