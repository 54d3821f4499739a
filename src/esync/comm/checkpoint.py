"""Checkpoints of a server's shard: CHECKPOINT_DIR/shard<k>/round-<n>/ (a worker's own
state at the same rounds is esync.comm.statefile's `WorkerState`).

Each checkpoint is a folder with two files:
- `tensors.safetensors`: the shard's weights, buffers and the rule's tensors (SGD
  velocity, DC-ASGD backups), in safetensors, which loads without unpickling;
- `meta.json`: the rule's settings, the round, the training clock, the tensors'
  lengths and the SHA-256 of `tensors.safetensors`.

A checkpoint is written into a hidden `.partial-*` folder, flushed to disk, then renamed
into place: a reader sees a whole checkpoint or none. Loading checks the digest, so a
file damaged afterwards is detected; the loader then falls back to the previous
checkpoint, and stops with a one-line error naming the file if none is whole. The
newest `keep` checkpoints of a shard are kept.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import shutil
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from esync.errors import UserError

FORMAT = 1
TENSORS, META = "tensors.safetensors", "meta.json"
_NAME = re.compile(r"round-(\d{1,12})")

log = logging.getLogger(__name__)

Tensors = Dict[str, np.ndarray]


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the text names the file."""


def fsync(path: str) -> None:
    """Flush a file (or a folder: the renames in it) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _digest(path: str) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def shard_folder(folder: str, shard: int) -> str:
    return os.path.join(folder, f"shard{shard}")


def rounds_in(path: str) -> List[int]:
    """Rounds of the complete (renamed into place) checkpoints in a shard's folder."""
    try:
        names = os.listdir(path)
    except OSError:
        return []
    return sorted(int(m.group(1)) for m in map(_NAME.fullmatch, names) if m)


def survey(folder: str) -> Dict[str, List[int]]:
    """{"<shard>": [rounds]} of every shard folder under `folder` (what a server
    reports to the scheduler when the job resumes)."""
    out = {}
    try:
        names = os.listdir(folder)
    except OSError:
        return out
    for name in names:
        m = re.fullmatch(r"shard(\d{1,6})", name)
        if m:
            rounds = rounds_in(os.path.join(folder, name))
            if rounds:
                out[m.group(1)] = rounds[-4096:]
    return out


class Checkpoints:
    """The checkpoints of shard `shard` under `folder`."""

    def __init__(self, folder: str, shard: int, keep: int = 3):
        self.path = shard_folder(folder, shard)
        self.shard, self.keep = shard, keep
        try:
            os.makedirs(self.path, exist_ok=True)
        except OSError as e:
            raise UserError(f"--checkpoint-dir: cannot create {self.path}: {e.strerror}") \
                from None

    def rounds(self) -> List[int]:
        return rounds_in(self.path)

    def save(self, round_: int, tensors: Tensors, meta: Dict[str, Any]) -> str:
        final = os.path.join(self.path, f"round-{round_}")
        partial = os.path.join(self.path, f".partial-{round_}-{secrets.token_hex(4)}")
        os.makedirs(partial)
        try:
            tensors_path = os.path.join(partial, TENSORS)
            save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, tensors_path)
            fsync(tensors_path)
            meta = dict(meta, format=FORMAT, round=round_, sha256=_digest(tensors_path),
                        lengths={k: int(v.size) for k, v in tensors.items()})
            with open(os.path.join(partial, META), "w") as f:
                json.dump(meta, f)
                f.flush()
                os.fsync(f.fileno())
            if os.path.exists(final):  # the same round again (after a restore): replace
                shutil.rmtree(final)
            os.rename(partial, final)
            fsync(self.path)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        for old in self.rounds()[:-self.keep]:
            shutil.rmtree(os.path.join(self.path, f"round-{old}"), ignore_errors=True)
        return final

    def load(self, round_: int) -> Tuple[Tensors, Dict[str, Any]]:
        folder = os.path.join(self.path, f"round-{round_}")
        meta_path, tensors_path = os.path.join(folder, META), os.path.join(folder, TENSORS)
        try:
            with open(meta_path) as f:
                meta = json.load(f)
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{meta_path}: unreadable ({getattr(e, 'strerror', None) or e})") \
                from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT \
                or not isinstance(meta.get("sha256"), str) or meta.get("round") != round_:
            raise CheckpointError(f"{meta_path}: not an esync checkpoint of round {round_}")
        try:
            if _digest(tensors_path) != meta["sha256"]:
                raise CheckpointError(f"{tensors_path}: damaged (its SHA-256 differs from "
                                      f"the one in {META})")
            tensors = load_file(tensors_path)
        except OSError as e:
            raise CheckpointError(f"{tensors_path}: unreadable ({e.strerror})") from None
        except SafetensorError as e:
            raise CheckpointError(f"{tensors_path}: not valid safetensors ({e})") from None
        lengths = meta.get("lengths")
        if not isinstance(lengths, dict) or set(lengths) != set(tensors) or any(
                tensors[k].dtype != np.float32 or tensors[k].size != lengths[k] for k in tensors):
            raise CheckpointError(f"{tensors_path}: its tensors do not match {META}")
        return tensors, meta

    def load_newest(self, rounds: Optional[Sequence[int]] = None
                    ) -> Tuple[Tensors, Dict[str, Any]]:
        """The newest whole checkpoint among `rounds` (default: all of this shard's);
        a damaged one is skipped with a warning. UserError if none can be loaded."""
        candidates = sorted(self.rounds() if rounds is None else rounds, reverse=True)
        if not candidates:
            raise UserError(f"--checkpoint-dir: no checkpoint of shard {self.shard} in "
                            f"{self.path}")
        problem = None
        for round_ in candidates:
            try:
                return self.load(round_)
            except CheckpointError as e:
                problem = str(e)
                log.warning("[server %d] skipping a damaged checkpoint: %s", self.shard, e)
        raise UserError(f"--checkpoint-dir: no whole checkpoint of shard {self.shard}: "
                        f"{problem}")
