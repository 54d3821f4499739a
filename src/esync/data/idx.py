"""Reading the IDX files of MNIST and Fashion-MNIST, gzipped or not, with clear errors.

An IDX file is a 4-byte magic number (two zero bytes, a type code, the number of
dimensions), one big-endian uint32 per dimension, then the data. Images are type
0x08 (unsigned byte) with 3 dimensions, labels the same type with 1 dimension.
"""
from __future__ import annotations

import gzip
import os
import struct
import zlib

import numpy as np

from esync.errors import UserError

UBYTE = 0x08
GZIP_MAGIC = b"\x1f\x8b"


def _read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}") from None
    if raw[:2] != GZIP_MAGIC:
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:
        raise UserError(f"{path} is not a valid gzip file ({e})") from None


def read_idx(path: str, ndim: int) -> np.ndarray:
    """The array stored in IDX file `path`, which must hold unsigned bytes in `ndim` dims."""
    raw = _read_bytes(path)
    if len(raw) < 4:
        raise UserError(f"{path} is truncated: {len(raw)} bytes, expected an IDX header")
    zero, dtype, dims = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype != UBYTE or dims != ndim:
        raise UserError(
            f"{path} has magic number 0x{raw[:4].hex()}, expected 0x000008{ndim:02x} "
            f"(unsigned bytes in {ndim} dimension{'s' if ndim > 1 else ''})")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise UserError(f"{path} is truncated inside its header ({len(raw)} bytes)")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    expected = int(np.prod(shape, dtype=np.int64))
    found = len(raw) - header
    if found != expected:
        what = "truncated" if found < expected else "longer than its header says"
        raise UserError(f"{path} is {what}: header says shape {'x'.join(map(str, shape))} "
                        f"({expected} data bytes), found {found}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def find_idx_file(folder: str, name: str) -> str:
    """`folder/name.gz` or `folder/name`, whichever exists (the gzipped one first)."""
    for candidate in (os.path.join(folder, name + ".gz"), os.path.join(folder, name)):
        if os.path.isfile(candidate):
            return candidate
    raise UserError(f"missing {os.path.join(folder, name)}.gz (or unzipped "
                    f"{name}): put the IDX files of the data set there, see -dd/--data-dir")

