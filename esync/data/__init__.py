"""Data sets, per-worker partitions and per-epoch sample orders (CorgiPile)."""
from esync.data.batches import BatchStream
from esync.data.datasets import Dataset, load_dataset
from esync.data.partition import partition
from esync.data.shuffle import EpochOrder

__all__ = ["BatchStream", "Dataset", "EpochOrder", "load_dataset", "partition"]
