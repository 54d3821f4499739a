"""Per-device iteration logs: LOG_DIR/<host>/<device>/iter-<n>.json, one file per round.

The format (documented in README.md, read by logs_tools/summary.py) extends the
original ESync's `iter-<n>.txt`:

    {"num_iters": n,                          # the round (global iteration), from 1
     "time": {"0": {"get_batch": s, "forward and backward": s, "local update": s, ...},
              "1": {...}, ...},               # local iteration -> phase -> seconds
     "num_samples": k,                        # samples trained on in this round
     "total_time": s,                         # seconds since training started
     "loss": x,                               # mean training loss of the round (null: NaN/inf)
     "bytes_sent": b, "bytes_received": b,    # real network bytes of the round
     "accuracy": a}                           # only in rounds that evaluated

One process owns a folder at a time: it holds an exclusive lock on `.lock` in it for
its lifetime, and a second process given the same host and device label stops with a
clear error instead of overwriting the first one's files. A new run in a folder that
no running process holds replaces the `iter-*.json` files left there, as the original
emptied its log folder, unless it continues a job (`keep`: a worker rejoining, or a job
resumed from a checkpoint), whose logs go on from where they were.

With `tensorboard` (--tensorboard DIR) each round also goes to TensorBoard
(esync.scalars), into DIR/<host>/<device>/; with `live` (ESYNC_LIVE_URL), to the live
job page (esync.live).

A file that cannot be written or removed (a full disk, a read-only folder) is a
UserError naming -ld/--log-dir and the file: the process ends with that one line (a
worker of a job tells the scheduler, which ends the job), not a traceback.

Beside the records, a worker over shards keeps data-<n>.json: where its loader was when
round n's synchronisation began (write_data), which a worker continuing the job from
round n+1 goes on from.
"""
from __future__ import annotations

import fcntl
import glob
import json
import math
import os
import time
from typing import Mapping, Optional

from esync.errors import UserError
from esync.live import LiveReporter
from esync.scalars import Scalars

Phases = Mapping[str, float]
#: data-<n>.json files kept (the loader's state before each round's push; see write_data)
KEEP_DATA = 64


def _log_dir_error(doing: str, path: str, error: OSError) -> UserError:
    """The one line for a log file this process cannot create, write or remove."""
    return UserError(f"-ld/--log-dir: cannot {doing} {path}: {error.strerror or error}")


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:  # gone already: what was wanted
        pass
    except OSError as e:
        raise _log_dir_error("remove", path, e) from None


class Recorder:
    """`tensorboard`: a folder where each round also goes as TensorBoard scalars
    (esync.scalars), into <tensorboard>/<host>/<device>/; `live`: where each round's
    figures also go to the live job page (closed with the recorder)."""

    def __init__(self, log_dir: str, host: str, device: str, keep: bool = False,
                 tensorboard: Optional[str] = None, live: Optional[LiveReporter] = None):
        self.path = os.path.join(log_dir, host, device)
        self.scalars: Optional[Scalars] = None
        self.live = live
        try:
            os.makedirs(self.path, exist_ok=True)
            self._lock = open(os.path.join(self.path, ".lock"), "a+")
        except OSError as e:
            raise _log_dir_error("create", self.path, e) from None
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.seek(0)
            owner = self._lock.read().strip() or "unknown"
            self._lock.close()
            raise UserError(f"log folder {self.path} is in use by another running process "
                            f"(pid {owner}); give each process on a host its own "
                            f"--device-name") from None
        try:
            self._lock.truncate(0)
            self._lock.write(str(os.getpid()))
            self._lock.flush()
        except OSError as e:
            self.close()
            raise _log_dir_error("write", self._lock.name, e) from None
        try:
            if not keep:
                for old in glob.glob(os.path.join(self.path, "iter-*.json")) + \
                        glob.glob(os.path.join(self.path, "data-*.json")):
                    _remove(old)
            if tensorboard is not None:
                self.scalars = Scalars(os.path.join(tensorboard, host, device), fresh=not keep)
        except UserError:
            self.close()
            raise
        self.start = time.time()

    def rounds(self) -> list:
        """The rounds logged in this folder, in order."""
        found = []
        for path in glob.glob(os.path.join(self.path, "iter-*.json")):
            number = os.path.basename(path)[5:-5]
            if number.isdigit():
                found.append(int(number))
        return sorted(found)

    def last_record(self, before: Optional[int] = None) -> Optional[dict]:
        """The latest readable round record (before round `before`, if given)."""
        for round_ in reversed(self.rounds()):
            if before is not None and round_ >= before:
                continue
            try:
                with open(os.path.join(self.path, f"iter-{round_}.json")) as f:
                    record = json.load(f)
            except (OSError, ValueError):
                continue
            if isinstance(record, dict):
                return record
        return None

    def drop_from(self, round_: int) -> None:
        """Remove the records of rounds >= `round_` (a resumed job trains them again)."""
        for n in self.rounds():
            if n >= round_:
                _remove(os.path.join(self.path, f"iter-{n}.json"))
        for n in self._data_rounds():
            if n >= round_:
                _remove(os.path.join(self.path, f"data-{n}.json"))

    # --- where the data loader was when a round's synchronisation began --------------
    def _data_rounds(self) -> list:
        names = (os.path.basename(p)[5:-5] for p in glob.glob(os.path.join(self.path, "data-*.json")))
        return sorted(int(n) for n in names if n.isdigit())

    def write_data(self, round_: int, state: dict) -> None:
        """Keep `state` (the prepared loader's, as of round `round_`'s last batch) in
        data-<round>.json, atomically, before the round is pushed: a checkpoint of the
        round then always has it, even if this worker dies before its record. The
        newest KEEP_DATA are kept."""
        final = os.path.join(self.path, f"data-{round_}.json")
        try:
            with open(final + ".partial", "w") as f:
                json.dump(state, f)
            os.replace(final + ".partial", final)
        except OSError as e:
            _remove(final + ".partial")
            raise _log_dir_error("write", final, e) from None
        for n in self._data_rounds():
            if n <= round_ - KEEP_DATA:
                _remove(os.path.join(self.path, f"data-{n}.json"))

    def read_data(self, round_: int) -> Optional[dict]:
        """The state write_data kept for round `round_` (None if none, or unreadable)."""
        try:
            with open(os.path.join(self.path, f"data-{round_}.json")) as f:
                state = json.load(f)
        except (OSError, ValueError):
            return None
        return state if isinstance(state, dict) else None

    def restart_clock(self, elapsed: float = 0.0) -> None:
        """Count `total_time` from now (the start of training, after set-up), or from
        `elapsed` seconds ago."""
        self.start = time.time() - elapsed

    def pause(self, seconds: float) -> None:
        """Leave out the last `seconds` from `total_time` (a pause of training)."""
        self.start += seconds

    def write_round(self, round_: int, times: Mapping[int, Phases], num_samples: int,
                    loss: float, bytes_sent: int = 0, bytes_received: int = 0,
                    accuracy: Optional[float] = None, at: Optional[float] = None,
                    **extra) -> str:
        """Write iter-<round>.json atomically (readers never see half a file).
        `total_time` is now, or `at` (seconds on this recorder's clock) if given.
        UserError naming the file if it cannot be written (e.g. the disk is full)."""
        record = {
            "num_iters": round_,
            "time": {str(i): {k: round(v, 6) for k, v in phases.items()}
                     for i, phases in times.items()},
            "num_samples": num_samples,
            "total_time": round(time.time() - self.start if at is None else at, 6),
            "loss": loss if math.isfinite(loss) else None,  # JSON has no NaN
            "bytes_sent": bytes_sent,
            "bytes_received": bytes_received,
            **extra,
        }
        if accuracy is not None:
            record["accuracy"] = accuracy
        final = os.path.join(self.path, f"iter-{round_}.json")
        partial = final + ".partial"
        try:
            with open(partial, "w") as f:
                json.dump(record, f)
            os.replace(partial, final)
        except OSError as e:
            try:  # no half-written file left behind (a full disk keeps its space)
                os.remove(partial)
            except OSError:
                pass
            raise _log_dir_error("write", final, e) from None
        if self.scalars is not None:
            self.scalars.add(record)
        if self.live is not None:
            self.live.add(record)
        return final

    def close(self) -> None:
        if self.scalars is not None:
            self.scalars.close()
            self.scalars = None
        if self.live is not None:
            self.live.close()
            self.live = None
        if not self._lock.closed:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()

    def __enter__(self) -> "Recorder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
