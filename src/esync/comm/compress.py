"""Compression of pushed traffic (`--compress none|fp16|topk:R|threshold:T|partial:K`).

The four ways Apache SINGA's DistOpt synchronises, on both backends:
- `fp16`: the pushed weight chunks (gradients in SSGD, deltas in ESync) travel as
  float16, half the bytes; the server (or the all-reduce) adds them up in float32.
- `topk:R`: of the pushed weights only the fraction R of values largest in magnitude
  travel (per chunk to the servers, of the whole vector in the all-reduce), as int32
  indices and float32 values, with *error feedback*: what was not sent is kept and added
  to the next push, so every coordinate's sum arrives eventually (Stich et al. 2018;
  Lin et al.'s deep gradient compression).
- `threshold:T`: the same, sending the values whose magnitude (with the error fed back)
  exceeds T, as SINGA's `backward_and_sparse_update(topK=False)`: how many travel
  varies from round to round and from worker to worker. `threshold:auto:F` chooses T at
  each push to keep about the fraction F: the (1-F) quantile of the magnitudes of an
  evenly spaced sample of the values (at most SAMPLE of them), as deep gradient
  compression estimates its threshold; cheaper than an exact top-k on a large vector.
- `partial:K` (synchronous modes): each round synchronises one of K slices of the
  weights vector in round-robin (`window`), the others staying local, as SINGA's
  `backward_and_partial_update`; what a worker pushes for a slice is its change since
  the slice was last synchronised (esync.algorithms.partial), so every slice is averaged
  once every K rounds and a round sends about 1/K of the bytes.

Only the weights section is compressed: the buffers (BatchNorm statistics) are
averaged, not summed over rounds, and are small; they travel as float32. Answers
(pulls) are not compressed.

A push chunk carries `codec` ("fp16", "topk", "threshold" or "slice") in its header;
`decode_chunk` turns what arrived back into the dense float32 chunk, checking every
index a peer sent (an index sent twice keeps its last value: the honest encoder never
repeats one). A slice chunk carries `start`, the chunk's first value it holds; values
it does not hold are zero (no change).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Tuple

if TYPE_CHECKING:  # numpy and torch are imported where they are used: parsing the flag
    import numpy as np  # (esync.options, the launchers) stays free of them
    import torch

#: the spellings `--compress` takes (with their parameter: topk:0.01, threshold:0.05,
#: partial:4)
KINDS = ("none", "fp16", "topk", "threshold", "partial")
#: the codecs that send indices and values, with error feedback
SPARSE = ("topk", "threshold")
SPELLING = ("none, fp16, topk:R (0 < R <= 1), threshold:T (T >= 0), threshold:auto:F "
            "(0 < F <= 1) or partial:K (K >= 2)")
#: threshold:auto:F estimates T from at most this many values, evenly spaced
SAMPLE = 4096


class CompressionError(ValueError):
    """A pushed chunk that cannot be decoded; the text says why."""


@dataclass(frozen=True)
class Compression:
    kind: str = "none"
    ratio: float = 1.0  # topk: the kept fraction of each chunk
    threshold: float = 0.0  # threshold: the magnitude a value must exceed to be sent
    fraction: float = 0.0  # threshold:auto:F: the fraction T is chosen to keep (0: fixed T)
    slices: int = 1  # partial: the slices synchronised in turn

    @classmethod
    def parse(cls, text: str) -> "Compression":
        """One of SPELLING; ValueError says what is wrong."""
        kind, _, rest = text.strip().lower().partition(":")
        if kind in ("none", "fp16") and not rest:
            return cls(kind)
        number = _number(rest)
        if kind == "topk" and 0 < number <= 1:
            return cls(kind, ratio=number)
        if kind == "threshold" and 0 <= number < math.inf:
            return cls(kind, threshold=number)
        auto, _, fraction = rest.partition(":")
        if kind == "threshold" and auto == "auto" and 0 < _number(fraction) <= 1:
            return cls(kind, fraction=_number(fraction))
        if kind == "partial" and number.is_integer() and 2 <= number <= 1 << 20:
            return cls(kind, slices=int(number))
        raise ValueError(f"expected {SPELLING}, got {text!r}")

    def __str__(self) -> str:
        threshold = f"auto:{self.fraction:g}" if self.fraction else f"{self.threshold:g}"
        return {"topk": f"topk:{self.ratio:g}", "threshold": f"threshold:{threshold}",
                "partial": f"partial:{self.slices}"}.get(self.kind, self.kind)

    @property
    def sparse(self) -> bool:
        return self.kind in SPARSE

    def kept(self, length: int) -> int:
        """Values a top-k chunk of `length` values sends."""
        return max(1, min(length, math.ceil(self.ratio * length)))

    def window(self, round_: int, length: int) -> Tuple[int, int]:
        """partial: the [start, stop) of a vector of `length` values that round `round_`
        (from 1) synchronises: slice (round - 1) mod K of K nearly equal ones (the whole
        vector for the other kinds)."""
        if self.kind != "partial":
            return 0, length
        k = self.slice_of(round_)
        return length * k // self.slices, length * (k + 1) // self.slices

    def slice_of(self, round_: int) -> int:
        """partial: which of the K slices round `round_` (from 1) synchronises."""
        return (round_ - 1) % self.slices

    def select(self, error: "torch.Tensor") -> "torch.Tensor":
        """The indices (sorted, int64) of the values of `error` a sparse codec sends."""
        import torch

        if self.kind == "threshold":
            threshold = self.auto_threshold(error) if self.fraction else self.threshold
            return torch.nonzero(error.abs() > threshold).flatten()
        k = self.kept(len(error))
        if k == len(error):
            return torch.arange(len(error), device=error.device)
        return torch.topk(error.abs(), k, sorted=False).indices.sort().values

    def take(self, error: "torch.Tensor") -> Tuple["torch.Tensor", "torch.Tensor"]:
        """A sparse codec's push from `error` (the residual with this push's values added,
        changed in place): the indices and values it sends, which leave the residual."""
        index = self.select(error)
        sent = error[index]  # a copy
        error[index] = 0.0
        return index, sent

    def auto_threshold(self, error: "torch.Tensor") -> float:
        """threshold:auto:F: the T that about the fraction F of `error` exceeds, from an
        evenly spaced sample of it."""
        import torch

        sample = error[::max(1, len(error) // SAMPLE)].abs()
        keep = math.ceil(self.fraction * len(sample))
        if keep >= len(sample):
            return -1.0  # everything
        return float(torch.topk(sample, keep + 1).values[-1])  # the largest left out


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        return math.nan
    return value if math.isfinite(value) else math.nan


class Compressor:
    """A worker's encoder of its pushed weight chunks to the servers (holding a sparse
    codec's error feedback: the residual of what was not yet sent, per value of the
    weights vector). `begin(round_)` before a round's chunks: partial's slice."""

    def __init__(self, compression: Compression, length: int):
        import numpy as np

        self.compression = compression
        self.length = length
        self.residual = np.zeros(length, np.float32) if compression.sparse else None
        self.window = (0, length)
        self.sent_values = 0  # the weights' values the round's chunks carried

    def begin(self, round_: int) -> None:
        self.window = self.compression.window(round_, self.length)
        self.sent_values = 0

    def encode(self, offset: int, values: "np.ndarray") -> Tuple[Dict[str, Any], List["np.ndarray"]]:
        """The header fields and sections of the weight chunk `values`, which starts at
        `offset` of the pushed vector."""
        import numpy as np
        import torch

        kind = self.compression.kind
        if kind in ("none", "fp16"):
            self.sent_values += len(values)
            return ({}, [values]) if kind == "none" else \
                ({"codec": "fp16"}, [values.astype(np.float16)])
        if kind == "partial":
            lo, hi = self.window
            start, stop = max(lo - offset, 0), max(min(hi - offset, len(values)), 0)
            start = min(start, stop)
            self.sent_values += stop - start
            return {"codec": "slice", "start": start}, [values[start:stop]]
        error = self.residual[offset:offset + len(values)]
        error += values  # what this push adds to what is owed
        index, sent = self.compression.take(torch.from_numpy(error))
        self.sent_values += len(index)
        return {"codec": kind}, [index.numpy().astype(np.int32), sent.numpy()]


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
    elif codec in SPARSE:
        if len(sections) != 2 or sections[0].dtype != np.int32 \
                or sections[1].dtype != np.float32 or len(sections[0]) != len(sections[1]):
            raise CompressionError(f"a {codec} chunk carries int32 indices and as many "
                                   f"float32 values")
        index = sections[0]
        if len(index) > length or (len(index) and (index.min() < 0 or index.max() >= length)):
            raise CompressionError(f"{codec} indices must be in 0..{length - 1}, at most "
                                   f"{length} of them")
        values = np.zeros(length, np.float32)
        values[index] = sections[1]
        return values
    elif codec == "slice":
        part, start = _one(sections, np.float32, "a slice chunk"), header.get("start")
        if type(start) is not int or not 0 <= start <= length - len(part):
            raise CompressionError(f"a slice chunk's 'start' must be an integer in "
                                   f"0..{length - len(part)}")
        values = np.zeros(length, np.float32)
        values[start:start + len(part)] = part
        return values
    else:
        raise CompressionError(f"unknown codec {str(codec)[:40]!r} (expected fp16, topk, "
                               f"threshold or slice)")
    if len(values) != length:
        raise CompressionError(f"chunk of {len(values)} values, expected {length}")
    return values


def _one(sections: List["np.ndarray"], dtype, what: str) -> "np.ndarray":
    import numpy as np

    if len(sections) != 1 or sections[0].dtype != dtype:
        raise CompressionError(f"{what} carries one section of {np.dtype(dtype).name}")
    return sections[0]


def compression(opts: Any) -> Compression:
    """The codec of parsed flags (esync.options.Options: --compress)."""
    return Compression.parse(opts.compress)
