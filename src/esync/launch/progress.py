"""A live status line for the launchers: a tqdm bar on a terminal, plain lines every
`every` seconds elsewhere (a log file, a pipe), nothing when switched off."""
from __future__ import annotations

import time
from typing import IO, Optional

from tqdm import tqdm

#: seconds between plain status lines when the output is not a terminal
PLAIN_EVERY_S = 10.0
#: the bar's resolution: a fraction of the job is shown as per-mille steps
_STEPS = 1000


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
