"""Readers for two on-disk formats users keep their own data in, as plain torch Datasets.

`image_folder` reads torchvision's `ImageFolder` layout (one sub-folder of images per
class), `cifar10_binary` the binary version of CIFAR-10 (read with numpy, never
unpickled). Both return a (train, test) pair whose items are (float32 image [3, H, W]
scaled to [0, 1] and then normalised per channel with mean 0.5 and std 0.5, so in
[-1, 1]; label), and which carry `classes` (names) and `targets` (ints) like
torchvision's data sets. Every problem in the files is a one-line `UserError`.

The image folder reader follows `torchvision.datasets.ImageFolder` (class order, image
extensions, recursive walk, RGB conversion) with Pillow alone: the torchvision wheel
PyPI serves is built against CUDA torch and does not import beside the CPU build.
"""
from __future__ import annotations

import logging
import os
import re

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from esync.errors import UserError

log = logging.getLogger(__name__)

#: the extensions `torchvision.datasets.ImageFolder` accepts (any case)
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
#: single-folder layout: every SPLIT_EVERY-th image of a class (sorted) goes to the test set
SPLIT_EVERY = 10
CIFAR_FOLDER = "cifar-10-batches-bin"
CIFAR_RECORD = 1 + 3 * 32 * 32
CIFAR_CLASSES = ["airplane", "automobile", "bird", "cat", "deer",
                 "dog", "frog", "horse", "ship", "truck"]


def _normalize(pixels: torch.Tensor) -> torch.Tensor:
    """uint8 [..., 3, H, W] -> float32 in [-1, 1]: [0, 1], then (x - 0.5) / 0.5 per channel."""
    return (pixels.float() / 255.0 - 0.5) / 0.5


class ImageFiles(Dataset):
    """Images read from their files when drawn; `samples` is [(path, class index)]."""

    def __init__(self, samples: list[tuple[str, int]], classes: list[str],
                 size: int | None, shape: tuple[int, int] | None = None):
        self.samples, self.classes, self.size = samples, classes, size
        self.class_to_idx = {name: i for i, name in enumerate(classes)}
        self.targets = [target for _, target in samples]
        # without `size` every image must have the first one's (width, height) to batch
        self.shape = shape if size or shape else _open(samples[0][0]).size

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path, target = self.samples[i]
        image = _open(path)
        if self.size:
            image = image.resize((self.size, self.size), Image.BILINEAR)
        elif image.size != self.shape:
            raise UserError(f"{path} is {image.size[0]}x{image.size[1]} pixels, other images "
                            f"{self.shape[0]}x{self.shape[1]}: give a size to resize them all")
        pixels = torch.from_numpy(np.array(image, dtype=np.uint8)).permute(2, 0, 1)
        return _normalize(pixels), target


def _open(path: str) -> Image.Image:
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except OSError as e:  # includes PIL.UnidentifiedImageError
        raise UserError(f"cannot read image {path}: {e}") from None


def _subfolders(folder: str) -> list[str]:
    return sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))


def _images(folder: str) -> list[str]:
    """The image files under `folder`, recursively, in ImageFolder's (sorted) order."""
    return [os.path.join(top, name) for top, _, names in sorted(os.walk(folder, followlinks=True))
            for name in sorted(names) if name.lower().endswith(IMG_EXTENSIONS)]


def _class_images(folder: str) -> dict[str, list[str]]:
    """{class name: its image files} of an ImageFolder-layout `folder`."""
    classes = _subfolders(folder)
    if not classes:
        raise UserError(f"{folder} has no class folders: put the images of each class "
                        f"in {os.path.join(folder, '<class name>')}/")
    found = {name: _images(os.path.join(folder, name)) for name in classes}
    for name, files in found.items():
        if not files:
            raise UserError(f"{os.path.join(folder, name)} holds no images "
                            f"({', '.join(IMG_EXTENSIONS)})")
    return found


def class_split(root: str, list_classes=_class_images, what: str = "images"
                ) -> tuple[list[str], list[tuple[str, int]], list[tuple[str, int]]]:
    """(class names, training [(file, class)], test [(file, class)]) of a class-folder
    layout: `root/train/<class>/*` and `root/test/<class>/*` (or `val/`), or one
    `root/<class>/*` whose every SPLIT_EVERY-th file per class (sorted) is the test set.
    `list_classes(folder)` gives {class: its files} (images; esync-pack's .npy too)."""
    parts = {p: os.path.join(root, p) for p in ("train", "test", "val")
             if os.path.isdir(os.path.join(root, p))}
    if "train" in parts:
        if "test" not in parts and "val" not in parts:
            raise UserError(f"{root} has train/ but no test split: add test/ (or val/) "
                            f"with the same class folders")
        train = list_classes(parts["train"])
        test_dir = parts.get("test", parts.get("val"))
        test = list_classes(test_dir)
        unknown = sorted(set(test) - set(train))
        if unknown:
            raise UserError(f"{test_dir} has class folders {', '.join(unknown)} that "
                            f"{parts['train']} lacks")
    elif parts:
        raise UserError(f"{root} has {'/, '.join(sorted(parts))}/ but no train/ split")
    else:
        found = list_classes(root)
        train = {c: [f for i, f in enumerate(fs) if i % SPLIT_EVERY != SPLIT_EVERY - 1]
                 for c, fs in found.items()}
        test = {c: fs[SPLIT_EVERY - 1::SPLIT_EVERY] for c, fs in found.items()}
        if not any(test.values()):
            raise UserError(f"{root} has no test split: no train/ and test/ folders, and no "
                            f"class has the {SPLIT_EVERY} {what} to split every "
                            f"{SPLIT_EVERY}th off")
    classes = sorted(train)
    number = {name: i for i, name in enumerate(classes)}
    listed = lambda d: [(f, number[c]) for c in sorted(d) for f in d[c]]
    return classes, listed(train), listed(test)


def image_folder(root: str, size: int | None = None) -> tuple[Dataset, Dataset]:
    """(train, test) from `root/train/<class>/*` and `root/test/<class>/*` (or `val/`), or
    from one `root/<class>/*` whose every 10th image per class (sorted) is the test set.

    Images become RGB, are resized to `size` x `size` when given, then scaled to [0, 1]
    and normalised per channel with mean 0.5 and std 0.5 (torchvision's Resize((size, size)),
    ToTensor(), Normalize((0.5,) * 3, (0.5,) * 3)).
    """
    if not os.path.isdir(root):
        raise UserError(f"no image folder {root}")
    if size is not None and size < 1:
        raise UserError(f"image size {size} for {root}: expected a positive number of pixels")
    classes, train, test = class_split(root)
    train_set = ImageFiles(train, classes, size)
    test_set = ImageFiles(test, classes, size, train_set.shape)
    log.info("%s: %d train and %d test images of %d classes", root, len(train_set),
             len(test_set), len(classes))
    return train_set, test_set


class LabelledImages(Dataset):
    """uint8 images [N, 3, H, W] held in memory, normalised to float32 when drawn."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, classes: list[str]):
        self.images, self.labels, self.classes = images, labels, classes
        self.targets = labels.tolist()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return _normalize(self.images[i]), self.labels[i]


def _cifar_batch(path: str, classes: list[str]) -> tuple[np.ndarray, np.ndarray]:
    try:
        raw = np.fromfile(path, dtype=np.uint8)
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror or e}") from None
    if raw.size == 0 or raw.size % CIFAR_RECORD:
        raise UserError(f"{path} is {raw.size} bytes, not a whole number of {CIFAR_RECORD}-byte "
                        f"records (1 label byte and a 3x32x32 image)")
    records = raw.reshape(-1, CIFAR_RECORD)
    labels = records[:, 0].astype(np.int64)
    bad = np.flatnonzero(labels >= len(classes))
    if bad.size:
        raise UserError(f"{path}: record {bad[0]} has label {labels[bad[0]]}, but there are "
                        f"only {len(classes)} class names (0..{len(classes) - 1})")
    return records[:, 1:].reshape(-1, 3, 32, 32), labels


def cifar10_binary(root: str) -> tuple[Dataset, Dataset]:
    """(train, test) from CIFAR-10's binary version: `root` is `cifar-10-batches-bin/` or its
    parent, with data_batch_*.bin (one or more), test_batch.bin and, optionally,
    batches.meta.txt (class names, one a line; CIFAR-10's ten otherwise).

    Images are scaled to [0, 1], then normalised per channel with mean 0.5 and std 0.5.
    """
    if not os.path.isdir(root):
        raise UserError(f"no CIFAR-10 folder {root}")
    folder = os.path.join(root, CIFAR_FOLDER)
    folder = folder if os.path.isdir(folder) else root
    names = os.listdir(folder)
    number = lambda n: int(re.sub(r"\D", "", n) or 0)
    batches = sorted((n for n in names if re.fullmatch(r"data_batch_\d+\.bin", n)), key=number)
    if not batches:
        raise UserError(f"{folder} has no data_batch_*.bin files: expected CIFAR-10's binary "
                        f"version ({CIFAR_FOLDER}/), not the python one")
    if "test_batch.bin" not in names:
        raise UserError(f"{folder} has no test_batch.bin: no test split")
    meta = os.path.join(folder, "batches.meta.txt")
    classes = CIFAR_CLASSES
    if os.path.isfile(meta):
        with open(meta, encoding="utf-8", errors="replace") as f:
            classes = [line.strip() for line in f if line.strip()]
        if not classes:
            raise UserError(f"{meta} names no classes")
    parts = [_cifar_batch(os.path.join(folder, n), classes) for n in batches]
    test_images, test_labels = _cifar_batch(os.path.join(folder, "test_batch.bin"), classes)
    as_set = lambda x, y: LabelledImages(torch.from_numpy(np.ascontiguousarray(x)),
                                         torch.from_numpy(y), list(classes))
    train = as_set(np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts]))
    test = as_set(test_images, test_labels)
    log.info("%s: %d train and %d test images from %d batch files", folder, len(train),
             len(test), len(batches))
    return train, test
