"""The training algorithms, each a set of hooks for the one training loop."""
from esync.algorithms.base import Algorithm
from esync.algorithms.local import LocalSGD

__all__ = ["Algorithm", "LocalSGD"]
