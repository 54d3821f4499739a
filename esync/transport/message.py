"""The wire format: one msgpack header frame, then raw float32 tensor frames.

    [header, frame, frame, ...]        header = msgpack map, e.g.
    {"type": "push", "sender": 1, "shard": 0, "round": 7, "section": 0,
     "offset": 2097152, "dtype": "float32", "lengths": [1048576], "frames": [1]}

A payload is a list of *sections* (for example a shard of the parameter vector and a
shard of the buffer vector); `lengths` gives each section's number of elements and
`frames` how many frames carry it. Sections are cut into frames of at most CHUNK_BYTES,
because ZeroMQ moves frames of a few MiB faster per byte than one huge frame (the
runtime's pushes go further and send one message per chunk, see esync.server). Tensor
bytes never pass through msgpack and are sent and received without copies: a frame is
sent from a memoryview of the array and read back as a numpy view of the frame.

Nothing here is pickled, and `decode` checks everything a peer could get wrong; a bad
message raises `MessageError`, which servers answer or log, never die of.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import msgpack
import numpy as np

CHUNK_BYTES = 4 << 20
CHUNK_VALUES = CHUNK_BYTES // 4
MAX_HEADER_BYTES = 64 << 10
#: what a frame may exceed those sizes by on the wire (ZMQ_MAXMSGSIZE counts the frame
#: as it arrives: with CurveZMQ, the box's MAC, nonce and command name come on top)
FRAME_SLACK = 1024
DTYPE = "float32"
_ITEM = 4


class MessageError(ValueError):
    """A message that does not follow the wire format; the text says what is wrong."""


@dataclass
class Message:
    header: Dict[str, Any]
    frames: List[Any] = field(default_factory=list)  # zmq.Frame, bytes or memoryview
    header_bytes: int = 0

    @property
    def type(self) -> str:
        return self.header["type"]

    def sections(self) -> List[List[Tuple[int, np.ndarray]]]:
        """Per section, its frames as (element offset, float32 view) pairs."""
        out, i = [], 0
        for count in self.header.get("frames") or []:
            chunks, offset = [], 0
            for frame in self.frames[i:i + count]:
                view = np.frombuffer(_buffer(frame), dtype=np.float32)
                chunks.append((offset, view))
                offset += len(view)
            out.append(chunks)
            i += count
        return out

    def nbytes(self) -> int:
        """Bytes of the whole message as it crossed the network (header and frames)."""
        return self.header_bytes + sum(frame_bytes(f) for f in self.frames)


def _buffer(frame) -> memoryview:
    buf = getattr(frame, "buffer", frame)  # zmq.Frame -> memoryview, else bytes-like
    return buf if isinstance(buf, memoryview) else memoryview(buf)


def frame_bytes(frame) -> int:
    """Size in bytes of a frame (a typed memoryview's len() counts items, not bytes)."""
    return _buffer(frame).nbytes


def chunk_spans(length: int) -> Iterator[Tuple[int, int]]:
    """(offset, length) of each chunk of a section of `length` values: the one layout that
    workers and servers cut sections into."""
    for offset in range(0, length, CHUNK_VALUES):
        yield offset, min(CHUNK_VALUES, length - offset)


def _chunks(array: np.ndarray) -> Iterator[memoryview]:
    flat = np.ascontiguousarray(array, dtype=np.float32).reshape(-1)
    for offset, length in chunk_spans(len(flat)):
        yield memoryview(flat[offset:offset + length])


def encode(header: Dict[str, Any], sections: Sequence[np.ndarray] = ()) -> List[Any]:
    """The frames of a message: header (with lengths and frame counts filled in), chunks."""
    header = dict(header)
    frames: List[Any] = []
    if sections:
        counts = []
        for section in sections:
            chunks = list(_chunks(section))
            counts.append(len(chunks))
            frames.extend(chunks)
        header.update(dtype=DTYPE, lengths=[int(np.size(s)) for s in sections], frames=counts)
    return [msgpack.packb(header, use_bin_type=True), *frames]


def field(header: Dict[str, Any], name: str, kind, required: bool = True):
    """Header field `name` of type `kind` (None if absent and not `required`)."""
    value = header.get(name)
    if value is None:
        if required:
            raise MessageError(f"header lacks field {name!r}")
        return None
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise MessageError(f"header field {name!r} has type {type(value).__name__}")
    return value


def integer_field(header: Dict[str, Any], name: str, low: int, high: int,
                  required: bool = True) -> Optional[int]:
    """Header field `name`, an integer in low..high (None if absent and not `required`)."""
    value = header.get(name)
    if value is None and not required:
        return None
    if type(value) is not int or not low <= value <= high:
        raise MessageError(f"field {name!r} must be an integer in {low}..{high}")
    return value


def text_field(header: Dict[str, Any], name: str, limit: int = 256,
               required: bool = True) -> Optional[str]:
    """Header field `name`, a string of at most `limit` characters (None if absent and
    not `required`)."""
    value = header.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise MessageError(f"field {name!r} must be a string of at most {limit} characters")
    return value


def decode_header(raw, types: Sequence[str]) -> Dict[str, Any]:
    """Parse and check a header frame: a msgpack map with a known `type` and a `sender`."""
    raw = _buffer(raw).cast("B")
    if len(raw) > MAX_HEADER_BYTES:
        raise MessageError(f"header of {len(raw)} bytes (at most {MAX_HEADER_BYTES})")
    try:
        header = msgpack.unpackb(raw, raw=False, max_bin_len=0, max_ext_len=0)
    except Exception as e:  # msgpack raises several unrelated types on garbage
        raise MessageError(f"header is not valid msgpack ({type(e).__name__})") from None
    if not isinstance(header, dict):
        raise MessageError(f"header is a {type(header).__name__}, expected a map")
    kind = field(header, "type", str)
    if kind not in types:
        raise MessageError(f"unknown message type {kind[:40]!r}")
    field(header, "sender", (str, int))
    return header


def check_payload(header: Dict[str, Any], sizes: Sequence[int]) -> None:
    """Check that data frames of `sizes` bytes match what the header announces."""
    if not sizes and not any(name in header for name in ("frames", "lengths", "dtype")):
        return  # a header-only message
    counts = field(header, "frames", list)
    lengths = field(header, "lengths", list)
    if field(header, "dtype", str) != DTYPE:
        raise MessageError(f"dtype {header['dtype'][:40]!r}, only {DTYPE!r} is accepted")
    if len(lengths) != len(counts) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in lengths + counts):
        raise MessageError("header fields 'lengths' and 'frames' must be lists of "
                           "non-negative integers of equal size")
    if sum(counts) != len(sizes):
        raise MessageError(f"header announces {sum(counts)} data frames, "
                           f"message has {len(sizes)}")
    i = 0
    for n, (length, count) in enumerate(zip(lengths, counts)):
        part = sizes[i:i + count]
        if any(size % _ITEM for size in part):
            raise MessageError(f"section {n} has a frame whose size is not a multiple of "
                               f"{_ITEM} bytes")
        if sum(part) != length * _ITEM:
            raise MessageError(f"section {n} announces {length} float32 values "
                               f"({length * _ITEM} bytes), its frames hold {sum(part)} bytes")
        i += count


def decode(frames: Sequence[Any], types: Sequence[str]) -> Message:
    """Parse and check a received message (identity frames already removed)."""
    if not frames:
        raise MessageError("empty message")
    header = decode_header(frames[0], types)
    payload = list(frames[1:])
    check_payload(header, [frame_bytes(f) for f in payload])
    return Message(header, payload, frame_bytes(frames[0]))
