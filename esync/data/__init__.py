"""Data sets (datasets.py, idx.py), per-worker partitions (partition.py), per-epoch sample
orders (shuffle.py, CorgiPile) and batches (batches.py).

Importing this package is cheap (no torch): the command-line parser reads the names
below. Import the classes and functions from their modules.
"""

#: `--dataset` values: digits is embedded (scikit-learn), the others are IDX files
DATASETS = ("digits", "fashion-mnist", "mnist")
#: `--shuffle` values: CorgiPile's two-level shuffle, one shuffle, the stored order
SHUFFLES = ("corgipile", "once", "none")
