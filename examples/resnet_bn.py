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


def build_model(num_classes: int = 10) -> nn.Module:
    """Stem conv, three stages of one BasicBlock (16/32/64 channels at 32/16/8
    pixels), global average pooling and a linear head: about 78 k parameters."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        BasicBlock(16, 16, 1), BasicBlock(16, 32, 2), BasicBlock(32, 64, 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, num_classes),
    )


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


class _PILImageFolder(Dataset):
    """What ``torchvision.datasets.ImageFolder`` with ToTensor + Normalize(0.5, 0.5)
    gives for a folder of PNGs, for when torchvision cannot be imported."""

    def __init__(self, root: str) -> None:
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
        return (x.permute(2, 0, 1).float() / 255 - 0.5) / 0.5, label


def build_data(root: str) -> tuple[Dataset, Dataset]:
    """(train, test) datasets of (3x32x32 float tensor in [-1, 1], class index)
    read from a folder written by ``write_image_folder``, with
    ``torchvision.datasets.ImageFolder`` when torchvision imports, else with an
    equivalent PIL-only reader (same tensors, same class indices)."""
    try:
        from torchvision import transforms
        from torchvision.datasets import ImageFolder
    except (ImportError, OSError, RuntimeError):  # absent, or a build not matching this torch
        return _PILImageFolder(os.path.join(root, "train")), _PILImageFolder(os.path.join(root, "test"))
    tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.5,) * 3, (0.5,) * 3)])
    return ImageFolder(os.path.join(root, "train"), tf), ImageFolder(os.path.join(root, "test"), tf)
