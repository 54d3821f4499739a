"""One device training alone (`-m local`), one unit: its policy here (torch-free), its
hooks in `worker`."""
from __future__ import annotations

from dataclasses import dataclass

from esync.algorithms.policy import Policy


@dataclass(frozen=True)
class Standalone(Policy):
    """One process trains alone: no servers, no other workers."""

    key = "local"
