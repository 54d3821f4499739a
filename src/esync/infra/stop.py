"""When a training process stops: the limits of the job's flags (--epochs,
--max-rounds, --time-limit) and its targets (--target-accuracy, --target-loss), the
first reached ending the run. Used by a worker's session and by the evaluator."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class StopCriteria:
    """Whichever limit is reached first ends the run; None means no such limit. A target
    counts once it has held `target_hold` seconds (every evaluation in between reaching
    it): `target_accuracy` is reached at or above it, `target_loss` at or below it."""

    epochs: Optional[float] = None
    max_rounds: Optional[int] = None
    time_limit: Optional[float] = None
    target_accuracy: Optional[float] = None
    target_hold: float = 0.0
    target_loss: Optional[float] = None
    _held_since: Optional[float] = field(default=None, repr=False)

    def epochs_reached(self, epochs_done: float) -> bool:
        return self.epochs is not None and epochs_done >= self.epochs - 1e-9

    def _reached(self, metric: float) -> Optional[str]:
        if self.target_accuracy is not None and metric >= self.target_accuracy:
            return f"reached target accuracy {self.target_accuracy}"
        if self.target_loss is not None and metric <= self.target_loss:
            return f"reached target loss {self.target_loss}"
        return None

    def target_held(self, metric: Optional[float], elapsed: float) -> Optional[str]:
        """After an evaluation (metric None: none this time): the reason to stop, if the
        target has now held long enough."""
        if metric is None or (self.target_accuracy is None and self.target_loss is None):
            return None
        reached = self._reached(metric)
        if reached is None:
            self._held_since = None
            return None
        if self._held_since is None:
            self._held_since = elapsed
        if elapsed - self._held_since < self.target_hold:
            return None
        return reached + (f" (held {self.target_hold:g} s)" if self.target_hold else "")

    def rounds_reached(self, rounds: int) -> bool:
        """Whether --max-rounds is reached: a limit every worker of a job reaches after
        a round of the same number."""
        return self.max_rounds is not None and rounds >= self.max_rounds

    def reason(self, rounds: int, epochs_done: float, elapsed: float,
               metric: Optional[float]) -> Optional[str]:
        reached = self.target_held(metric, elapsed)
        if reached:
            return reached
        if self.epochs_reached(epochs_done):
            return f"finished {self.epochs:g} epoch{'' if self.epochs == 1 else 's'}"
        if self.rounds_reached(rounds):
            return f"finished {self.max_rounds} rounds"
        if self.time_limit is not None and elapsed >= self.time_limit:
            return f"reached the time limit of {self.time_limit:g} s"
        return None
