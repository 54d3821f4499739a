"""Data sets (datasets.py, idx.py), per-worker partitions (partition.py), per-epoch sample
orders (shuffle.py, CorgiPile) and batches (batches.py).

Importing this package is cheap (no torch): the command-line parser reads the names
below. Import the classes and functions from their modules.
"""

#: `--dataset` values: digits is embedded (scikit-learn), fashion-mnist and mnist are
#: IDX files, folder an image folder (formats.image_folder) and cifar10 CIFAR-10's
#: binary batches (formats.cifar10_binary), all in --data-dir; or a plug-in's
#: module:function
IN_MEMORY = ("digits", "fashion-mnist", "mnist")  # arrays (datasets.py)
ON_DISK = ("folder", "cifar10")                   # torch Datasets (formats.py)
DATASETS = IN_MEMORY + ON_DISK
#: `--metric` values: what an evaluation measures on the test set
METRICS = ("accuracy", "loss")
#: per --metric: the name of its value in the records (iter-<n>.json), and in log lines
#: (the launchers' progress line reads `test accuracy`)
METRIC_RECORD = {"accuracy": "accuracy", "loss": "val_loss"}
METRIC_LINE = {"accuracy": "test accuracy", "loss": "val_loss"}
#: `--dataset shards:DIR`: shards in the WebDataset layout with their index (shards.py)
SHARDS_PREFIX = "shards:"
#: `--data-split` values: each device its own equal share of the data (the original's),
#: blocks leased by the scheduler to whichever device asks (leases.py; shards only), or
#: the whole data set for every device, each in its own order (map-style data)
DATA_SPLITS = ("static", "leased", "whole")
#: the one line for `whole` over shards (refused at start-up and by a script's loader)
WHOLE_NOT_FOR_SHARDS = ("--data-split whole is for map-style data sets; shards are static "
                        "or leased (leased: to whichever worker asks)")
#: `--shuffle` values: a new permutation each epoch (a DataLoader's shuffle=True; shards,
#: read block by block, take CorgiPile's), CorgiPile's two-level shuffle, one shuffle,
#: the stored order
SHUFFLES = ("random", "corgipile", "once", "none")
