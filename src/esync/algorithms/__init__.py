"""The training algorithms, each a set of hooks for the one training loop.

Which class runs which `-m` is said in esync/registry.py; each class builds itself from
the parsed options with `from_options`.
"""
from esync.algorithms.base import Algorithm, Job

__all__ = ["Algorithm", "Job"]
