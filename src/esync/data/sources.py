"""What `esync-pack` reads (esync.data.pack): class folders of images or .npy files (in
formats.image_folder's layouts, with its test split), text corpora, what a source is
(`--format auto`), and tar shards written by other tools (for `--index`). Every problem
is a one-line UserError naming the file.
"""
from __future__ import annotations

import os
import re
import tarfile
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from esync.data.shards import IMAGE_PARTS
from esync.errors import UserError

BUILTINS = ("digits", "mnist", "fashion-mnist")


def read_corpus(src: str) -> bytes:
    """A text file's bytes, or a folder's regular files' (recursively, sorted, hidden files
    and folders skipped), concatenated."""
    if os.path.isfile(src):
        paths = [src]
    else:
        paths = []
        for top, dirs, names in os.walk(src, followlinks=True):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            paths += [os.path.join(top, n) for n in sorted(names) if not n.startswith(".")
                      and os.path.isfile(os.path.join(top, n))]
    chunks = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                chunks.append(f.read())
        except OSError as e:
            raise UserError(f"cannot read {path}: {e.strerror or e}") from None
    return b"".join(chunks)


def image_part(path: str) -> str:
    """The part an image file is stored as: its lower-cased extension, `.jpeg` as jpg."""
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    ext = {"jpeg": "jpg"}.get(ext, ext)
    if ext not in IMAGE_PARTS:
        raise UserError(f"{path}: .{ext} images cannot be read from shards (these can: "
                        f"{', '.join(IMAGE_PARTS)}): convert them first")
    return ext


def _npy_files(folder: str) -> List[str]:
    return [os.path.join(top, name) for top, _, names in sorted(os.walk(folder, followlinks=True))
            for name in sorted(names) if name.lower().endswith(".npy")]


def _class_npy(folder: str) -> Dict[str, List[str]]:
    """formats._class_images for .npy files: {class: its files}."""
    from esync.data.formats import _subfolders

    classes = _subfolders(folder)
    if not classes:
        raise UserError(f"{folder} has no class folders: put the .npy files of each class "
                        f"in {os.path.join(folder, '<class name>')}/")
    found = {name: _npy_files(os.path.join(folder, name)) for name in classes}
    for name, files in found.items():
        if not files:
            raise UserError(f"{os.path.join(folder, name)} holds no .npy files")
    return found


def class_files(root: str, kind: str = "images"
                ) -> Tuple[List[str], List[Tuple[str, int]], List[Tuple[str, int]]]:
    """(classes, train [(file, class)], test [(file, class)]) of class folders of `kind`
    ("images" or "npy"), by formats.image_folder's rules: root/train/ and root/test/ (or
    val/), or root/<class>/ whose every SPLIT_EVERY-th file per class is the test set."""
    from esync.data.formats import class_split

    if not os.path.isdir(root):
        raise UserError(f"no folder {root}")
    if kind == "images":
        return class_split(root)
    return class_split(root, _class_npy, "files")


def read_file(path: str) -> bytes:
    """A sample's file, unchanged."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror or e}") from None


def _has_idx(folder: str) -> bool:
    from esync.data.datasets import IDX_FILES

    return any(os.path.isfile(os.path.join(folder, name + gz))
               for name in IDX_FILES.values() for gz in ("", ".gz"))


def _has_cifar(folder: str) -> bool:
    from esync.data.formats import CIFAR_FOLDER

    inner = os.path.join(folder, CIFAR_FOLDER)
    return any(re.fullmatch(r"data_batch_\d+\.bin", n)
               for n in os.listdir(inner if os.path.isdir(inner) else folder))


def _first_sample_file(folder: str) -> Optional[str]:
    """The format of the first .npy ("npy") or image file ("folder") under `folder`."""
    from esync.data.formats import IMG_EXTENSIONS

    for top, dirs, names in os.walk(folder, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            if name.lower().endswith(".npy"):
                return "npy"
            if name.lower().endswith(IMG_EXTENSIONS):
                return "folder"
    return None


def detect_format(src: str) -> str:
    """`--format auto`: what `src` holds (see the module)."""
    if src in BUILTINS and not os.path.exists(src):
        return src
    if os.path.isfile(src):
        return "text"
    if not os.path.isdir(src):
        raise UserError(f"{src}: no such file or folder (or built-in data set: "
                        f"{', '.join(BUILTINS)})")
    found = "idx" if _has_idx(src) else "cifar10" if _has_cifar(src) else \
        _first_sample_file(src)
    if found is None:
        raise UserError(f"{src}: cannot tell what it holds: expected a text file, IDX files, "
                        f"CIFAR-10's binary batches, or class folders of images or .npy "
                        f"files (give --format text for a folder of text files)")
    return found


@dataclass
class TarSample:
    """A sample of a tar shard: its key, its parts' extensions, its .cls part."""
    key: str
    parts: List[str]
    cls: Optional[bytes]


def walk_tar(path: str) -> Tuple[List[int], List[TarSample], int]:
    """(each sample's first byte and the last one's end, the samples, the file's size) of
    tar file `path`: members grouped by key as WebDataset (and shards.parse_members) do."""
    offsets: List[int] = []
    samples: List[TarSample] = []
    end = 0
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f, tarfile.open(fileobj=f, mode="r:") as tar:
            for member in tar:
                base = member.name.rsplit("/", 1)[-1]
                key, dot, ext = base.partition(".")
                if not member.isfile() or not dot:
                    continue  # not a part of a sample
                key = member.name[:len(member.name) - len(base)] + key
                end = member.offset_data + -(-member.size // tarfile.BLOCKSIZE) * \
                    tarfile.BLOCKSIZE
                if member.offset_data + member.size > size:
                    raise tarfile.ReadError(f"member {member.name} is cut short: the file "
                                            f"ends at byte {size}")
                if not samples or samples[-1].key != key:
                    offsets.append(member.offset)
                    samples.append(TarSample(key, [], None))
                samples[-1].parts.append(ext)
                if ext == "cls":
                    samples[-1].cls = tar.extractfile(member).read()
            # tarfile stops quietly at a damaged header: what follows must be the zeros
            # that end an archive
            f.seek(tar.offset)
            while True:
                block = f.read(1 << 20)
                if not block:
                    break
                if block.count(0) != len(block):
                    raise tarfile.ReadError(f"no tar header at byte {tar.offset}")
    except OSError as e:
        raise UserError(f"cannot read shard {path}: {e.strerror or e}") from None
    except (tarfile.TarError, EOFError) as e:
        raise UserError(f"shard {path} is not a readable tar file: {e}") from None
    return offsets + [end] * bool(samples), samples, size


def input_parts_left(candidates: List[str], sample: TarSample, path: str) -> List[str]:
    """The input parts still possible after `sample` (those every sample so far has)."""
    left = [p for p in candidates if p in sample.parts]
    if not left:
        raise UserError(f"shard {path}: sample {sample.key} has no "
                        f"{' or '.join('.' + p for p in candidates)} part, which the samples "
                        f"before it have (it has {', '.join('.' + p for p in sample.parts)})")
    return left
