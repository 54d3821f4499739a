"""The data sets: `digits` (embedded in scikit-learn), `fashion-mnist` and `mnist` (IDX files).

Every data set is held in memory as 1x28x28 uint8 images and int64 labels 0..9; a
batch is turned into normalised float32 only when it is drawn (`Dataset.normalize`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from esync.data.idx import find_idx_file, read_idx
from esync.errors import UserError

NUM_CLASSES = 10
IDX_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
DIGITS_TEST_SHARE = 0.2
DIGITS_SPLIT_SEED = 0


@dataclass
class Dataset:
    name: str
    train_images: torch.Tensor  # uint8 [N, 1, 28, 28]
    train_labels: torch.Tensor  # int64 [N]
    test_images: torch.Tensor
    test_labels: torch.Tensor
    mean: float                 # of the training pixels, scaled to [0, 1]
    std: float

    @property
    def num_classes(self) -> int:
        return int(max(self.train_labels.max(), self.test_labels.max())) + 1

    def sample(self, n: int = 2) -> torch.Tensor:
        """The first `n` test images, normalised: inputs to check a network on."""
        return self.normalize(self.test_images[:n])

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 images -> float32, scaled to [0, 1] and standardised."""
        return (images.float() / 255.0 - self.mean) / self.std


def _make(name: str, train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray,
          test_y: np.ndarray) -> Dataset:
    as_images = lambda a: torch.from_numpy(np.array(a, np.uint8)).unsqueeze(1)
    as_labels = lambda a: torch.from_numpy(np.asarray(a, np.int64))
    pixels = train_x.astype(np.float64) / 255.0
    return Dataset(name, as_images(train_x), as_labels(train_y), as_images(test_x),
                   as_labels(test_y), float(pixels.mean()), float(pixels.std()) or 1.0)


def _digits_file():
    """(pixels as float32 [n, 64], labels as int64) from scikit-learn's digits.csv.gz,
    read directly: importing sklearn.datasets costs most of a second per process (scipy),
    as much as importing torch, and every worker and the evaluator load the digits."""
    import gzip
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    path = os.path.join(os.path.dirname(spec.origin), "datasets", "data", "digits.csv.gz") \
        if spec and spec.origin else None
    if path is None or not os.path.isfile(path):
        from sklearn.datasets import load_digits as sklearn_digits

        bunch = sklearn_digits()
        return bunch.data.astype(np.float32), bunch.target.astype(np.int64)
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    return table[:, :-1], table[:, -1].astype(np.int64)


def load_digits() -> Dataset:
    """scikit-learn's 1797 8x8 digits, upsampled to 28x28, split 80/20 by a fixed seed."""
    pixels, labels = _digits_file()
    small = torch.from_numpy(pixels.reshape(-1, 8, 8) / 16.0).unsqueeze(1)
    big = F.interpolate(small, size=(28, 28), mode="bilinear", align_corners=False)
    images = (big.clamp(0, 1) * 255).round().to(torch.uint8).squeeze(1).numpy()
    order = np.random.RandomState(DIGITS_SPLIT_SEED).permutation(len(labels))
    n_test = int(round(len(labels) * DIGITS_TEST_SHARE))
    test, train = order[:n_test], order[n_test:]
    return _make("digits", images[train], labels[train], images[test], labels[test])


def load_idx_dataset(name: str, data_dir: str) -> Dataset:
    """MNIST-style IDX files from DATA_DIR/<name>/, checked for shape and consistency."""
    folder = os.path.join(data_dir, name)
    if not os.path.isdir(folder):
        raise UserError(f"-dd/--data-dir: no folder {folder}; the {name} IDX files "
                        f"({', '.join(v + '.gz' for v in IDX_FILES.values())}) go there")
    paths = {key: find_idx_file(folder, base) for key, base in IDX_FILES.items()}
    arrays = {key: read_idx(path, 3 if key.endswith("images") else 1)
              for key, path in paths.items()}
    for part in ("train", "test"):
        images, labels = arrays[f"{part}_images"], arrays[f"{part}_labels"]
        if len(images) != len(labels):
            raise UserError(f"{paths[part + '_images']} holds {len(images)} images but "
                            f"{paths[part + '_labels']} holds {len(labels)} labels")
        if len(labels) == 0:
            raise UserError(f"{paths[part + '_labels']} holds no samples")
        if labels.max() >= NUM_CLASSES:
            raise UserError(f"{paths[part + '_labels']} has label {labels.max()}, "
                            f"expected labels 0..{NUM_CLASSES - 1}")
    train_shape, test_shape = arrays["train_images"].shape[1:], arrays["test_images"].shape[1:]
    if train_shape != test_shape:
        raise UserError(f"{paths['train_images']} has {train_shape[0]}x{train_shape[1]} "
                        f"images but {paths['test_images']} has {test_shape[0]}x{test_shape[1]}")
    return _make(name, arrays["train_images"], arrays["train_labels"],
                 arrays["test_images"], arrays["test_labels"])


def load_dataset(name: str, data_dir: str) -> Dataset:
    if name == "digits":
        return load_digits()
    if name in ("fashion-mnist", "mnist"):
        return load_idx_dataset(name, data_dir)
    raise UserError(f"--dataset: unknown data set {name!r}")
