"""Per-device iteration logs: LOG_DIR/<host>/<device>/iter-<n>.json, one file per round,
extending the original ESync's `iter-<n>.txt` (read by esync/logs_tools/summary.py). This
docstring is the manual's log format reference.

Every training process writes one JSON file per round (communication round; in `local`
mode, per evaluation interval of `-e` iterations) to
`LOG_DIR/<host>/<device>/iter-<n>.json`, `n` counting from 1. `<host>` is the machine's
host name, `<device>` is `--device-name` or else `cpu` / `gpu<N>`.

```json
{"num_iters": 3,
 "time": {"0": {"get_batch": 0.0002, "forward and backward": 0.0055, "local update": 0.0004}},
 "num_samples": 64,
 "total_time": 0.1105,
 "loss": 2.2958,
 "bytes_sent": 0,
 "bytes_received": 0,
 "epoch": 0.1335,
 "accuracy": 0.1142}
```

| field | meaning |
|---|---|
| `num_iters` | the round (global iteration) this file describes |
| `time` | local iteration index (from `"0"`) -> phase -> seconds. Phases: `get_batch`, `forward and backward`, `local update`, `slowdown` (only with `--slowdown`); phases of a whole round are recorded in the round's first local iteration (before the local iterations: `state server`, ESync's wait for its budget) or its last (after them: `global aggregate` in SSGD/ASGD/DC-ASGD, `global update` in ESync: push, wait for the others, pull; both include the wait for an emulated link, `--bandwidth`/`--latency`). In DDP, `global aggregate` is the broadcast of the buffers at the start of forward and the all-reduce inside backward, both taken out of `forward and backward`; balanced DDP adds `balance batches`, the all-gather of the workers' speeds every 10 steps |
| `num_samples` | samples trained on in this round |
| `total_time` | seconds since training started, when the round's file was written |
| `loss` | mean training loss over the round's local iterations; `null` if it was not finite |
| `bytes_sent`, `bytes_received` | network bytes of this round (0 in `local` mode; DDP: estimated, 2(W-1)/W of the gradient's bytes each way per step, as a ring all-reduce moves) |
| `epoch` | epochs trained so far (fractional): of the job's data where the job counts the samples every worker trained (the parameter-server and all-reduce modes' prepared loaders: the samples all workers together trained, over the samples of one pass over every partition), else passes over this worker's partition |
| `accuracy` | test accuracy, present only in rounds that evaluated (in process, or a script's `esync.report(metric=...)`) |
| `val_loss` | with `--metric loss`, in place of `accuracy`: the loss on the test set (lower is better), present only in rounds that evaluated; a record has `accuracy` or `val_loss`, never both |
| `scalars` | what a training script reported by name in the round (`esync.report(name=value)`: the latest value of each) |
| `budget` | ESync only: the local iterations the state server gave this round (= the number of entries in `time`; 1 where its answer was refused) |
| `state_server_request` | ESync only: seconds the budget request of this round took over HTTP (it runs during the previous round's aggregation; `state server` is what the round waited for it) |
| `synced` | with `--compress partial:K`: the `[start, stop)` of the weights vector this round synchronised (the others stayed local) |
| `pushed_values` | with `--compress topk:R` or `threshold:T`: how many of the weights' values this worker's push sent (through the servers, as index and value; the all-reduce pads every worker's to the most any sent) |
| `batch_sizes` | balanced DDP only: every worker's batch in this round, by rank (their sum is the ranks' loaders' batches together; `-b` times the workers in main.py's loop) |
| `data` | shards only: the prepared loader's state as of the round's last batch (torchdata's `StatefulDataLoader` state: the lease in progress, its position, the epoch), `split` (`static` or `leased`) and the worker's `rank`; a worker continuing the job goes on from it (from `data-<n>.json`, the same state written before the round's push, where it exists). With `--remote-prep`, `sampler` (the block sampler's state as of that batch) in place of `loader` |
| `remote_batches` | with `--remote-prep`: batches of the round made by Ray tasks |
| `breakdown` | where the round's time went, in seconds, from the end of the previous round: `fetch` (blocked on block reads of shards), `prep` (blocked on decoding, the transform and collation, wherever they ran), `compute` (forward, backward, local update, and a `--slowdown`'s wait), `communication` (push and pull, or the all-reduce), `wait` (waiting for the other workers: a push's wait at the servers, as they measured it, or the all-reduce's first, small vector; DDP waits inside its all-reduce, so its `wait` is 0 and communication holds it), `state_server` (ESync: waiting for the budget), `other` (the rest: the user's code between steps, hooks, an evaluation in the process). They add up to the round's wall time (`esync/logs/breakdown.py`) |
| `compute_cpu` | with `--slowdown` on a CPU computing with one torch thread: each local iteration's CPU seconds of computing (forward, backward, local update: its thread's time), which the slowdown's wait is based on (`esync.infra.clock.Slowdown`) |
| `slowdown_ahead` | with `--slowdown`: the part of each local iteration's wait (`slowdown`, which includes it) waited before its computing, so that the computing falls anywhere in the iteration as on a slower device of its own (`esync.infra.clock.Slowdown`) |
| `prep_seconds` | the decoding work of the round's batches, timed where it ran (DataLoader workers, Ray tasks or the training process) and carried back with each batch: work, not stall |
| `read_bytes`, `read_seconds` | shards only: bytes of the blocks read from disk in this round and the seconds the reads took (an emulated `--disk-bandwidth` included) |
| `cache_hits`, `cache_bytes` | with `--cache-fraction`: samples the cache served in this round, and their bytes in the shards (not read) |
| `skipped_samples` | shards only, where it happened: samples of blocks that could not be read (a corrupt shard, named in a warning) |
| `sample_ids` | with `--log-samples 1` (shards): `{"<epoch>": [sample id, ...]}`, the samples of the round's batches by the epoch of their lease |

**The evaluator's log** is the device folder `evaluator`, one file per evaluation (`n`
counts evaluations): `time` has the phases `pull` and `evaluate`, `num_samples` is 0,
`loss` null, `total_time` is the training time the evaluated model had behind it (on the
servers' clock when its round was done, or DDP rank 0's when it took the snapshot),
`pulled` the clock when the evaluator pulled it (a parameter server's model is its last
round's: up to a round older), `round` the model's round (updates of the servers'
first chunk: rounds in SSGD and ESync, pushes in ASGD; DDP: steps), and `accuracy` (with
`--metric loss`, `val_loss`) is always present.

Files are written atomically (a reader never sees half a file). One process owns a log
folder at a time: a second process started with the same host and device label stops
with `log folder ... is in use by another running process (pid N); give each process on
a host its own --device-name`, and the first one's files stay intact. A new run in a
folder that no running process holds replaces the `iter-*.json` (and `data-*.json`) files there, as the
original emptied its log folder. A log file that cannot be written or removed (a full
disk, a read-only folder) stops the process with one line,
`-ld/--log-dir: cannot write LOG_DIR/.../iter-3.json: No space left on device` (exit
status 2; a worker of a job tells the scheduler, which ends the job).

With `tensorboard` (--tensorboard DIR) each round also goes to TensorBoard
(esync.logs.scalars), into DIR/<host>/<device>/; with `live` (ESYNC_LIVE_URL), to the live
job page (esync.logs.live). A continuing job (`keep`: a worker rejoining, or a job resumed
from a checkpoint) keeps its logs and goes on from where they were.

Beside the records, a worker keeps data-<n>.json: where its prepared loader was when
round n's synchronisation began (write_data; shards: the loader's state, as `data`
above; a map-style data set: `{"drawn": samples drawn from its order}`), which a worker
continuing the job from round n+1 goes on from. When the job stops, rank 0 writes the
job's final model into its folder, `model.safetensors` (MODEL_FILE): the model's
`state_dict()` in safetensors, loaded with
`model.load_state_dict(safetensors.torch.load_file(path))`.
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
from esync.logs.live import LiveReporter
from esync.logs.scalars import Scalars

Phases = Mapping[str, float]
#: data-<n>.json files kept (the loader's state before each round's push; see write_data)
KEEP_DATA = 64
#: the job's final model, in rank 0's log folder (esync.runtime.session writes it)
MODEL_FILE = "model.safetensors"


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
    (esync.logs.scalars), into <tensorboard>/<host>/<device>/; `live`: where each round's
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
