"""A live status line for the launchers: what a job's logs say so far (`JobLogs`: its
latest round and accuracy), shown as a tqdm bar on a terminal, plain lines every
`every` seconds elsewhere (a log file, a pipe), nothing when switched off."""
from __future__ import annotations

import glob
import os
import re
import time
from typing import IO, Dict, Optional, Sequence

from tqdm import tqdm

from esync import registry
from esync.data import METRIC_LINE

#: seconds between plain status lines when the output is not a terminal
PLAIN_EVERY_S = 10.0
#: the bar's resolution: a fraction of the job is shown as per-mille steps
_STEPS = 1000
#: an evaluation in a worker's or the evaluator's output (esync.data.METRIC_LINE's names)
ACCURACY = re.compile(r"round (\d+) .*(?:test accuracy|val_loss) ([0-9.]+)")
_ITER = re.compile(r"iter-(\d+)\.json$")


class JobLogs:
    """What a running job's logs say so far: the latest round any device logged (its
    iteration files under `folder`, OUT/<network>/<log folder>/<host>/<device>/), the
    latest accuracy its processes printed, and the model rank 0 wrote."""

    def __init__(self, folder: str, stop_rounds: Optional[int],
                 stop_seconds: Optional[float], metric: str):
        self.folder = folder
        self.stop_rounds = stop_rounds
        self.stop_seconds = stop_seconds
        self.metric = metric
        self._read_up_to: Dict[str, int] = {}  # bytes of each process's log read
        self._accuracy: Optional[str] = None
        self._start = 0.0
        self._started_at = 0.0  # wall clock (file times), a little before the first child

    def begin(self) -> None:
        """The job starts now: files older than this are an earlier run's."""
        self._start = time.monotonic()
        self._started_at = time.time() - 1.0  # file systems with coarse times

    def _read_accuracy(self, child) -> None:
        """The latest test accuracy in what `child` logged since the last look."""
        offset = self._read_up_to.get(child.name, 0)
        try:
            with open(child.log, "rb") as f:
                f.seek(offset)
                new = f.read()
        except OSError:
            return
        whole = new[:new.rfind(b"\n") + 1]  # a line still being written: next time
        self._read_up_to[child.name] = offset + len(whole)
        found = ACCURACY.findall(whole.decode(errors="replace"))
        if found:
            self._accuracy = found[-1][1]

    def rounds(self) -> int:
        """The latest round any device of this run logged (files left by an earlier run
        in the same folder, until the new run replaces them, do not count)."""
        rounds = 0
        try:  # every host's (on Ray, the job's nodes')
            devices = [d.path for h in os.scandir(self.folder) if h.is_dir()
                       for d in os.scandir(h.path)
                       if d.is_dir() and d.name != registry.EVALUATOR]
        except OSError:
            return 0
        for folder in devices:
            try:
                latest = max((int(m.group(1)) for m in map(_ITER.search, os.listdir(folder))
                              if m), default=0)
                if latest > rounds and os.stat(os.path.join(
                        folder, f"iter-{latest}.json")).st_mtime >= self._started_at:
                    rounds = latest
            except OSError:
                continue
        return rounds

    def status(self, evaluating: Sequence) -> tuple:
        """(fraction done or None, `round R, E s, test accuracy A`), the accuracy read
        from the logs of the processes `evaluating` (each with a name and a log)."""
        rounds = self.rounds()
        for child in evaluating:
            self._read_accuracy(child)
        elapsed = time.monotonic() - self._start
        fraction = None
        if self.stop_rounds:
            fraction = rounds / self.stop_rounds
        if self.stop_seconds:
            fraction = max(fraction or 0.0, elapsed / self.stop_seconds)
        return fraction, (f"round {rounds}, {elapsed:.0f} s, "
                          f"{METRIC_LINE[self.metric]} {self._accuracy or 'n/a'}")

    def line(self, status: tuple) -> str:
        """The plain form of a `status`: `[####....] esync: round 12, 31 s, test
        accuracy 0.91`."""
        fraction, text = status
        bar = ""
        if fraction is not None:
            filled = int(20 * min(1.0, fraction))
            bar = f"[{'#' * filled}{'.' * (20 - filled)}] "
        return f"{bar}{os.path.basename(self.folder)}: {text}"

    def model_note(self) -> str:
        """`; the job's model: PATH` where rank 0 wrote it in this run (esync.runtime.join's
        MODEL_FILE, in its log folder)."""
        from esync.logs.recorder import MODEL_FILE  # (only at the end: the recorder's imports)

        for path in glob.glob(os.path.join(self.folder, "*", "*", MODEL_FILE)):
            try:
                if os.stat(path).st_mtime >= self._started_at:
                    return f"; the job's model: {path}"
            except OSError:
                continue
        return ""


class Progress:
    """Shows `status` (and, given a fraction done, a bar) while a job runs.

    On a terminal: one tqdm bar, ` 42%|########            | DESC: STATUS`, or
    `DESC: STATUS` without a fraction. Elsewhere: the plain `line` every `every` seconds. `live=False`:
    nothing at all."""

    def __init__(self, out: IO[str], desc: str, *, live: bool = True,
                 bounded: bool = False, position: int = 0, leave: bool = True,
                 every: float = PLAIN_EVERY_S):
        self.out = out
        self.every = every
        self.desc = desc
        self.bar: Optional[tqdm] = None
        self.plain = live and not _isatty(out)
        self._shown = float("-inf")  # the first plain line at once
        if live and not self.plain:
            fmt = "{percentage:3.0f}%|{bar:20}| {desc}" if bounded else "{desc}"
            self.bar = tqdm(total=_STEPS if bounded else None, desc=desc, file=out,
                            position=position, leave=leave, bar_format=fmt,
                            dynamic_ncols=True, mininterval=0)

    @property
    def terminal(self) -> bool:
        """Whether a live bar is shown (else callers print their own final line)."""
        return self.bar is not None

    @property
    def refresh_s(self) -> Optional[float]:
        """How long a caller may wait before the next `show` (None: never needed)."""
        if self.bar is not None:
            return 0.5
        return max(0.0, self._shown + self.every - time.monotonic()) if self.plain else None

    def show(self, fraction: Optional[float], status: str, line: str) -> None:
        if self.bar is not None:
            if fraction is not None:
                self.bar.n = int(_STEPS * min(1.0, max(0.0, fraction)))
            self.bar.set_description_str(f"{self.desc}: {status}", refresh=False)
            self.bar.refresh()
        elif self.plain and time.monotonic() - self._shown >= self.every:
            self.out.write(line + "\n")
            self.out.flush()
            self._shown = time.monotonic()

    def write(self, line: str) -> None:
        """A line of its own, above the bar."""
        if self.bar is not None:
            self.bar.write(line, file=self.out)
        else:
            self.out.write(line + "\n")
            self.out.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _isatty(out: IO[str]) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False
