"""SSGD: every worker takes one step of its optimizer a round, the servers (or the
all-reduce) average the steps as gradients and take one SGD step of -l.

Its worker is the shared push/pull (esync.algorithms.pushpull), its server rule the
synchronous round itself (esync.algorithms.rules.SyncRule). No settings of its own.
"""
from __future__ import annotations

from dataclasses import dataclass

from esync.algorithms.policy import Policy


@dataclass(frozen=True)
class SSGD(Policy):
    """Synchronous SGD: a round is one local iteration on every worker."""

    key = "sync"
