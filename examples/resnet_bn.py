"""A small ResNet with BatchNorm on a synthetic 32x32 image folder.

A workload with BatchNorm (running statistics are buffers, not parameters,
which a distributed framework must treat on purpose) that trains in well under
a minute on one CPU core.  The data is generated, not downloaded:
``write_image_folder`` draws one shape per class at a random position, size and
colour on a random background with noise, so a classifier must learn shapes,
not colours.  The builders are meant to be imported as plug-ins
(``examples.resnet_bn:build_model``); ``examples/resnet_plain.py`` trains them.
"""

from __future__ import annotations

import os
import random

import torch
from PIL import Image, ImageDraw
from torch import nn
from torch.utils.data import Dataset

#: Image side in pixels.
SIZE = 32
#: Shapes drawn for classes 0, 1, ... (so at most this many classes).  The
#: localised shapes come first: with the default 4 classes the model must tell
#: circle, square, triangle and ring apart; the stripes (5+) are easy.
SHAPES = ("circle", "square", "triangle", "ring", "cross", "hstripes", "vstripes", "dstripes")
#: Weight of uniform noise blended into every image (0: none, 1: only noise).
NOISE = 0.3
#: Range of the shapes' half-size in pixels (randrange bounds).
RADIUS = (7, 12)
#: Padding of ``build_data(augment=True)``'s random crops, in pixels.
PAD = 3


class BasicBlock(nn.Module):
    """Two 3x3 conv + BatchNorm layers with an identity (or 1x1 conv) shortcut."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def build_model(num_classes: int = 10, width: int = 16) -> nn.Module:
    """Stem conv, three stages of one BasicBlock (width, 2 width and 4 width channels at
    32/16/8 pixels), global average pooling and a linear head: about 78 k parameters at
    width 16, 309 k at 32."""
    w = width
    return nn.Sequential(
        nn.Conv2d(3, w, 3, 1, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU(),
        BasicBlock(w, w, 1), BasicBlock(w, 2 * w, 2), BasicBlock(2 * w, 4 * w, 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * w, num_classes),
    )


def build_wide_model(num_classes: int = 10) -> nn.Module:
    """``build_model`` at width 32 (about 309 k parameters, four times the computing a
    step): the evidence benchmark's vision workload (bench/evidence.py)."""
    return build_model(num_classes, width=32)


def _draw(shape: str, rng: random.Random) -> Image.Image:
    """One SIZE x SIZE RGB image of ``shape``, random colour, place and size."""
    bg = tuple(rng.randrange(0, 110) for _ in range(3))
    fg = tuple(rng.randrange(140, 256) for _ in range(3))
    img = Image.new("RGB", (SIZE, SIZE), bg)
    d = ImageDraw.Draw(img)
    r = rng.randrange(*RADIUS)                                 # half-size of the shape
    cx, cy = rng.randrange(r, SIZE - r), rng.randrange(r, SIZE - r)
    box = (cx - r, cy - r, cx + r, cy + r)
    w = rng.randrange(2, 4)                                    # stroke / stripe width
    if shape == "circle":
        d.ellipse(box, fill=fg)
    elif shape == "square":
        d.rectangle(box, fill=fg)
    elif shape == "triangle":
        d.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=fg)
    elif shape == "ring":
        d.ellipse(box, outline=fg, width=w)
    elif shape == "cross":
        d.rectangle((cx - w, cy - r, cx + w, cy + r), fill=fg)
        d.rectangle((cx - r, cy - w, cx + r, cy + w), fill=fg)
    else:  # stripes over the whole image, random phase
        period, phase = 2 * w + 2, rng.randrange(0, 2 * w + 2)
        for k in range(-SIZE, 2 * SIZE, period):
            o = k + phase
            if shape == "hstripes":
                d.rectangle((0, o, SIZE, o + w - 1), fill=fg)
            elif shape == "vstripes":
                d.rectangle((o, 0, o + w - 1, SIZE), fill=fg)
            else:
                d.line([(o, 0), (o + SIZE, SIZE)], fill=fg, width=w)
    noise = Image.frombytes("RGB", (SIZE, SIZE), rng.randbytes(SIZE * SIZE * 3))
    return Image.blend(img, noise, NOISE)


def write_image_folder(root: str, classes: int = 4, per_class: int = 60, seed: int = 0) -> None:
    """Write ``root/{train,test}/<k>_<shape>/<n>.png``: ``per_class`` training
    and ``per_class // 2`` test images for each of ``classes`` shapes.  The same
    arguments always write the same files (class folders sort in class order)."""
    if not 1 <= classes <= len(SHAPES):
        raise ValueError(f"classes must be in 1..{len(SHAPES)}, got {classes}")
    rng = random.Random(seed)
    for split, count in (("train", per_class), ("test", max(1, per_class // 2))):
        for k, shape in enumerate(SHAPES[:classes]):
            folder = os.path.join(root, split, f"{k}_{shape}")
            os.makedirs(folder, exist_ok=True)
            for n in range(count):
                _draw(shape, rng).save(os.path.join(folder, f"{n:05d}.png"))


def write_digits_folder(root: str, size: int = SIZE) -> None:
    """Write scikit-learn's embedded 1,797 handwritten digits (8x8, 16 grey levels) as
    ``root/{train,test}/<digit>/<n>.png`` of ``size`` x ``size`` pixels (bilinear; RGB,
    three equal channels, the input ``build_model`` takes), the
    80/20 split of esync's built-in ``digits`` data set (same seed): a real image data
    set on disk, decoded by an ImageFolder reader like any other, without a download."""
    from esync.data.datasets import load_digits

    digits = load_digits()  # 28x28 uint8, esync's split
    for split, images, labels in (("train", digits.train_images, digits.train_labels),
                                  ("test", digits.test_images, digits.test_labels)):
        big = torch.nn.functional.interpolate(images.float(), size=(size, size), mode="bilinear",
                                              align_corners=False).round().clamp(0, 255).to(torch.uint8)
        for n, (image, label) in enumerate(zip(big, labels.tolist())):
            folder = os.path.join(root, split, str(label))
            os.makedirs(folder, exist_ok=True)
            Image.fromarray(image[0].numpy()).convert("RGB").save(os.path.join(folder, f"{n:05d}.png"))


class _PILImageFolder(Dataset):
    """What ``torchvision.datasets.ImageFolder`` with ToTensor + Normalize(0.5, 0.5)
    gives for a folder of PNGs, for when torchvision cannot be imported."""

    def __init__(self, root: str, augment: bool = False) -> None:
        self.augment = augment
        self.classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.samples = [(os.path.join(root, c, f), i) for c, i in self.class_to_idx.items()
                        for f in sorted(os.listdir(os.path.join(root, c))) if f.lower().endswith(".png")]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[i]
        with Image.open(path) as img:
            img = img.convert("RGB")
            x = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8).view(img.height, img.width, 3)
        x = (x.permute(2, 0, 1).float() / 255 - 0.5) / 0.5
        return (random_crop(x) if self.augment else x), label


def random_crop(x: torch.Tensor, pad: int = PAD) -> torch.Tensor:
    """A random ``SIZE`` x ``SIZE`` crop of ``x`` padded by ``pad`` pixels of black (-1),
    torchvision's ``RandomCrop(SIZE, padding=pad)`` on the normalised image."""
    h, w = x.shape[-2:]
    padded = torch.nn.functional.pad(x, (pad, pad, pad, pad), value=-1.0)
    top, left = (int(torch.randint(0, n - SIZE + 2 * pad + 1, ())) for n in (h, w))  # torch's seed
    return padded[..., top:top + SIZE, left:left + SIZE]


def build_data(root: str, augment: bool = False) -> tuple[Dataset, Dataset]:
    """(train, test) datasets of (3x32x32 float tensor in [-1, 1], class index)
    read from a folder written by ``write_image_folder`` or ``write_digits_folder``,
    with ``torchvision.datasets.ImageFolder`` when torchvision imports, else with an
    equivalent PIL-only reader (same tensors, same class indices).  ``augment``: the
    training images are randomly cropped after padding by ``PAD`` pixels (the usual
    CIFAR augmentation), a new crop each time an image is read."""
    try:
        from torchvision import transforms
        from torchvision.datasets import ImageFolder
    except (ImportError, OSError, RuntimeError):  # absent, or a build not matching this torch
        return (_PILImageFolder(os.path.join(root, "train"), augment),
                _PILImageFolder(os.path.join(root, "test")))
    tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.5,) * 3, (0.5,) * 3)])
    train_tf = transforms.Compose([transforms.RandomCrop(SIZE, padding=PAD), tf]) if augment else tf
    return ImageFolder(os.path.join(root, "train"), train_tf), ImageFolder(os.path.join(root, "test"), tf)
