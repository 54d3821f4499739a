"""A learning-rate scheduler that follows the job rather than this device's own steps
(esync.prepare_scheduler): the same schedule on a fast and a slow device, kept with the
job's checkpoints."""
from __future__ import annotations

from typing import Any, Dict, Optional

from esync.runtime.session import Session


class JobScheduler:
    """A learning-rate scheduler that follows the job, not this device's own steps
    (prepare_scheduler): under ESync a device doing 8 local steps a round would
    otherwise decay 8 times faster than one doing 1, and ahead of the job's data."""

    def __init__(self, scheduler: Any, session: Session):
        self.scheduler, self.session = scheduler, session
        self.steps = 0  # the wrapped scheduler's steps so far
        #: stepped once an epoch (its first step came between two passes of the
        #: prepared loader), else once a step; None until its first step
        self.per_epoch: Optional[bool] = None

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Call it where the plain loop would. Stepped after each optimizer step, it
        moves the wrapped scheduler to the job's step (Session.global_steps: the same
        on every device; one step a round in SSGD, DDP and alone, the mean of ESync's
        budgets a round); stepped once an epoch, to the epochs the job has trained (the
        prepared loader's passes). Never past a OneCycleLR's `total_steps`. With
        arguments (ReduceLROnPlateau's metric) it steps the wrapped scheduler once."""
        if args or kwargs:
            self.steps += 1
            self.scheduler.step(*args, **kwargs)
            return
        session = self.session
        if self.per_epoch is None:
            self.per_epoch = session.passes_done > 0 and not session.in_pass
        target = session.passes_done if self.per_epoch else session.global_steps()
        total = getattr(self.scheduler, "total_steps", None)
        if isinstance(total, int):  # OneCycleLR raises once stepped past its end
            target = min(target, total)
        while self.steps < target:
            self.steps += 1
            self.scheduler.step()

    def get_last_lr(self):
        return self.scheduler.get_last_lr()

    def state_dict(self) -> Dict[str, Any]:
        return {"scheduler": self.scheduler.state_dict(), "steps": self.steps,
                "per_epoch": self.per_epoch}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
        self.steps, self.per_epoch = state["steps"], state.get("per_epoch")

    def __getattr__(self, name: str) -> Any:  # last_epoch, optimizer, base_lrs...
        if name == "scheduler":
            raise AttributeError(name)
        return getattr(self.scheduler, name)
