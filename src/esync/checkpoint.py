"""Checkpoints of a server's shard: CHECKPOINT_DIR/shard<k>/round-<n>/ (and a worker's
own state at the same rounds: `WorkerCheckpoints`).

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


class WorkerState:
    """A worker's own state at the job's checkpoints: its optimizers' and prepared
    learning-rate schedulers' `state_dict()`s (in the order the script made them), its
    counts of local iterations and samples, and the model's integer buffers (BatchNorm's
    num_batches_tracked, each worker's own), as of the end of round n, kept in
    CHECKPOINT_DIR/worker<rank>/round-<n>.{json,safetensors} (esync.statefile: no pickle)
    when the servers checkpoint the model at round n, so that a resumed job goes on with
    Adam's moments and the schedule where they were. The newest `keep` are kept. Without
    a folder it keeps nothing (and a resumed job finds nothing)."""

    def __init__(self, folder: Optional[str] = None, rank: int = 0, keep: int = 3):
        self.path = os.path.join(folder, f"worker{rank}") if folder else None
        self.rank, self.keep = rank, keep
        self.stateful: List[Tuple[str, Any]] = []  # ("optimizer" or "scheduler", it)
        self.pending: List[int] = []  # checkpoint rounds whose state is not kept yet
        self.resumed: Optional[Dict[str, Any]] = None  # the state the job goes on with

    def add(self, kind: str, thing: Any) -> None:
        """Keep `thing`'s state (an optimizer or a prepared scheduler: `kind`); resuming,
        give it back the state it had at the checkpoint the job goes on from (and the
        optimizers theirs again after a scheduler's: a scheduler made sets the learning
        rate it starts at)."""
        self.stateful.append((kind, thing))
        if self.resumed is None:
            return
        index = sum(1 for k, _ in self.stateful if k == kind) - 1
        saved = self.resumed.get(f"{kind}s", [])
        if index >= len(saved):
            log.warning("resuming: no %s state was kept for this worker's %s number %d; it "
                        "starts afresh", kind, kind, index + 1)
            return
        thing.load_state_dict(saved[index])
        if kind == "scheduler":
            optimizers = [o for k, o in self.stateful if k == "optimizer"]
            for optimizer, state in zip(optimizers, self.resumed.get("optimizers", [])):
                optimizer.load_state_dict(state)

    def keep_pending(self, counts: Dict[str, Any], integers: Dict[str, Any]) -> None:
        """The state of each checkpoint round pending, as the script's loop leaves it now
        (`counts`: the session's iterations and samples; `integers`: the model's integer
        buffers)."""
        rounds, self.pending = self.pending, []
        if self.path is None:
            return
        from esync import statefile

        for round_ in rounds:
            state = {"round": round_, **counts, "counts": dict(integers),
                     "optimizers": [t.state_dict() for k, t in self.stateful if k == "optimizer"],
                     "schedulers": [t.state_dict() for k, t in self.stateful if k == "scheduler"]}
            try:
                os.makedirs(self.path, exist_ok=True)
                statefile.save_state(os.path.join(self.path, f"round-{round_}"), state)
            except OSError as e:
                raise UserError(f"--checkpoint-dir: cannot write worker {self.rank}'s state "
                                f"in {self.path}: {e.strerror}") from None
            for old in self.rounds()[:-self.keep]:
                for suffix in (".json", ".safetensors"):
                    try:
                        os.remove(os.path.join(self.path, f"round-{old}{suffix}"))
                    except OSError:
                        pass

    def rounds(self) -> List[int]:
        try:
            names = os.listdir(self.path) if self.path else []
        except OSError:
            return []
        found = (re.fullmatch(r"round-(\d{1,12})\.json", name) for name in names)
        return sorted(int(m.group(1)) for m in found if m)

    def take_back(self, round_: int, integers: Dict[str, Any]) -> Dict[str, Any]:
        """Resuming from round `round_`: the newest state kept at or before it (a damaged
        one is skipped with a warning), given back as the optimizers and schedulers are
        made; the model's integer buffers now; returns the counts it had ({} if none)."""
        from esync import statefile

        for kept in sorted((r for r in self.rounds() if r <= round_), reverse=True):
            try:
                self.resumed = statefile.load_state(os.path.join(self.path, f"round-{kept}"))
            except UserError as e:
                log.warning("[worker %d] skipping a damaged state: %s", self.rank, e)
                continue
            if kept != round_:
                log.warning("resuming from round %d: worker %d's optimizer and scheduler "
                            "state is of round %d, the newest kept", round_, self.rank, kept)
            for name, value in (self.resumed.get("counts") or {}).items():
                mine = integers.get(name)
                if mine is not None and getattr(value, "shape", None) == mine.shape:
                    mine.copy_(value)
            return {k: self.resumed[k] for k in ("iterations", "samples")
                    if isinstance(self.resumed.get(k), int)}
        log.warning("resuming from round %d: no optimizer or scheduler state was kept for "
                    "worker %d (in %s); they start afresh", round_, self.rank, self.path)
        return {}
