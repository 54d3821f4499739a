"""Compression of pushed traffic (`--compress none|fp16|topk:R`).

- `fp16`: the pushed weight chunks (gradients in SSGD, deltas in ESync) travel as
  float16, half the bytes; the server (or the all-reduce) adds them up in float32.
- `topk:R` (parameter servers only): of each pushed weight chunk only the fraction R of
  its values largest in magnitude travel, as int32 indices and float32 values, with
  *error feedback*: what was not sent is kept and added to the next push, so every
  coordinate's sum arrives eventually (Stich et al. 2018; Lin et al.'s deep gradient
  compression).

Only the weights section is compressed: the buffers (BatchNorm statistics) are
averaged, not summed over rounds, and are small; they travel as float32. Answers
(pulls) are not compressed.

A push chunk carries `codec` ("fp16" or "topk") in its header; `decode_chunk` turns
what arrived back into the dense float32 chunk, checking every index a peer sent (an
index sent twice keeps its last value: the honest encoder never repeats one).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Tuple

if TYPE_CHECKING:  # numpy is imported where it is used: parsing the flag (esync.options,
    import numpy as np  # the launchers) stays free of it

#: the spellings `--compress` takes (topk with its kept fraction: topk:0.01)
KINDS = ("none", "fp16", "topk")


class CompressionError(ValueError):
    """A pushed chunk that cannot be decoded; the text says why."""


@dataclass(frozen=True)
class Compression:
    kind: str = "none"
    ratio: float = 1.0  # topk: the kept fraction of each chunk

    @classmethod
    def parse(cls, text: str) -> "Compression":
        """`none`, `fp16` or `topk:R` with R in (0, 1]; ValueError says what is wrong."""
        kind, _, rest = text.strip().lower().partition(":")
        if kind in ("none", "fp16") and not rest:
            return cls(kind)
        if kind == "topk":
            try:
                ratio = float(rest)
            except ValueError:
                ratio = math.nan
            if math.isfinite(ratio) and 0 < ratio <= 1:
                return cls(kind, ratio)
        raise ValueError(f"expected none, fp16 or topk:R with R in (0, 1], got {text!r}")

    def __str__(self) -> str:
        return f"topk:{self.ratio:g}" if self.kind == "topk" else self.kind

    def kept(self, length: int) -> int:
        """Values a top-k chunk of `length` values sends."""
        return max(1, min(length, math.ceil(self.ratio * length)))


class Compressor:
    """A worker's encoder of its pushed weight chunks (holding top-k's error feedback:
    the residual of what was not yet sent, per value of the weights vector)."""

    def __init__(self, compression: Compression, length: int):
        import numpy as np

        self.compression = compression
        self.residual = np.zeros(length, np.float32) if compression.kind == "topk" else None

    def encode(self, offset: int, values: "np.ndarray") -> Tuple[Dict[str, Any], List["np.ndarray"]]:
        """The header fields and sections of the weight chunk `values`, which starts at
        `offset` of the pushed vector."""
        import numpy as np

        kind = self.compression.kind
        if kind == "none":
            return {}, [values]
        if kind == "fp16":
            return {"codec": "fp16"}, [values.astype(np.float16)]
        error = self.residual[offset:offset + len(values)]
        error += values  # what this push adds to what is owed
        k = self.compression.kept(len(error))
        if k == len(error):
            index = np.arange(len(error), dtype=np.int32)
        else:
            index = np.argpartition(np.abs(error), len(error) - k)[len(error) - k:]
            index = np.sort(index).astype(np.int32)
        sent = error[index]  # a copy
        error[index] = 0.0
        return {"codec": "topk"}, [index, sent]


def decode_chunk(header: Dict[str, Any], sections: List["np.ndarray"],
                 length: int) -> "np.ndarray":
    """The dense float32 chunk of `length` values that a push carried (`sections`: its
    arrays, as the wire format typed them)."""
    import numpy as np

    codec = header.get("codec")
    if codec is None:
        values = _one(sections, np.float32, "an uncompressed chunk")
    elif codec == "fp16":
        values = _one(sections, np.float16, "an fp16 chunk").astype(np.float32)
    elif codec == "topk":
        if len(sections) != 2 or sections[0].dtype != np.int32 \
                or sections[1].dtype != np.float32 or len(sections[0]) != len(sections[1]):
            raise CompressionError("a topk chunk carries int32 indices and as many "
                                   "float32 values")
        index = sections[0]
        if len(index) > length or (len(index) and (index.min() < 0 or index.max() >= length)):
            raise CompressionError(f"topk indices must be in 0..{length - 1}, at most "
                                   f"{length} of them")
        values = np.zeros(length, np.float32)
        values[index] = sections[1]
        return values
    else:
        raise CompressionError(f"unknown codec {str(codec)[:40]!r} (expected fp16 or topk)")
    if len(values) != length:
        raise CompressionError(f"chunk of {len(values)} values, expected {length}")
    return values


def _one(sections: List["np.ndarray"], dtype, what: str) -> "np.ndarray":
    import numpy as np

    if len(sections) != 1 or sections[0].dtype != dtype:
        raise CompressionError(f"{what} carries one section of {np.dtype(dtype).name}")
    return sections[0]

