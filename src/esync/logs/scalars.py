"""TensorBoard scalars beside the iteration logs (`--tensorboard DIR`), the viewer
researchers already use: each process writes its rounds into DIR/<host>/<device>/,
the same folders as LOG_DIR's, so that `tensorboard --logdir DIR` shows every device
of a job side by side (and the evaluator's accuracy) while the job runs.

Each round record (esync.logs.recorder) becomes these scalars at step = its round:

    train/loss, train/samples, train/seconds (total_time), esync/budget (ESync only),
    traffic/bytes_sent, traffic/bytes_received, eval/accuracy or eval/val_loss (where
    evaluated, per --metric), script/<name> (what the script reported by name)

Written with torch.utils.tensorboard's SummaryWriter (the `tensorboard` package:
`pip install -e '.[tensorboard]'`), flushed every few seconds so that a live viewer
follows the job.
"""
from __future__ import annotations

import glob
import importlib.util
import math
import os
from typing import Mapping

from esync.errors import UserError

FLAG = "--tensorboard"
MISSING = f"{FLAG}: needs the tensorboard package (pip install -e '.[tensorboard]')"
#: seconds between flushes to disk (SummaryWriter's default is 120: too late to watch)
FLUSH_S = 5
#: TensorBoard tag -> the round record's field
TAGS = {"train/loss": "loss", "train/samples": "num_samples", "train/seconds": "total_time",
        "esync/budget": "budget", "traffic/bytes_sent": "bytes_sent",
        "traffic/bytes_received": "bytes_received", "eval/accuracy": "accuracy",
        "eval/val_loss": "val_loss"}


def check_installed() -> None:
    """UserError (one line naming --tensorboard) unless the tensorboard package is
    installed: asked before anything starts, without importing it."""
    if importlib.util.find_spec("tensorboard") is None:
        raise UserError(MISSING)


class Scalars:
    """One device's TensorBoard scalars in `folder`; `fresh`: remove the event files a
    previous run left there first (as the recorder does with its iter-*.json files)."""

    def __init__(self, folder: str, fresh: bool = True):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise UserError(MISSING) from None
        try:
            os.makedirs(folder, exist_ok=True)
            if fresh:
                for old in glob.glob(os.path.join(folder, "events.out.tfevents.*")):
                    os.remove(old)
            self.writer = SummaryWriter(folder, flush_secs=FLUSH_S)
        except OSError as e:
            raise UserError(f"{FLAG}: cannot write {folder}: {e.strerror or e}") from None

    def add(self, record: Mapping) -> None:
        """The record's numeric fields, at step = its round (and what the script
        reported by name, esync.report(name=value), as script/<name>)."""
        step = record["num_iters"]
        named = record.get("scalars") or {}
        tags = [*((tag, record.get(field)) for tag, field in TAGS.items()),
                *((f"script/{name}", value) for name, value in named.items())]
        for tag, value in tags:
            if isinstance(value, (int, float)) and not isinstance(value, bool) \
                    and math.isfinite(value):
                self.writer.add_scalar(tag, value, step)

    def close(self) -> None:
        self.writer.close()
