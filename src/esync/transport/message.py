"""The wire format: one msgpack header frame, then raw tensor frames.

    [header, frame, frame, ...]        header = msgpack map, e.g.
    {"type": "push", "sender": 1, "shard": 0, "round": 7, "section": 0,
     "offset": 2097152, "dtype": "float32", "lengths": [1048576], "frames": [1]}

A payload is a list of *sections* (for example a shard of the parameter vector and a
shard of the buffer vector); `lengths` gives each section's number of elements and
`frames` how many frames carry it; `dtype` is each section's element type (one name for
all sections, or a list of one per section): float32, or float16 and int32 for the
compressed pushes of esync.comm.compress. Sections are cut into frames of at most CHUNK_BYTES,
because ZeroMQ moves frames of a few MiB faster per byte than one huge frame (the
runtime's pushes go further and send one message per chunk, see esync.comm.server). Tensor
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
#: the element types a frame may hold, with their sizes in bytes
DTYPES = {"float32": 4, "float16": 2, "int32": 4}


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
        """Per section, its frames as (element offset, view of its dtype) pairs."""
        out, i = [], 0
        counts = self.header.get("frames") or []
        for count, dtype in zip(counts, section_dtypes(self.header, len(counts))):
            chunks, offset = [], 0
            for frame in self.frames[i:i + count]:
                view = np.frombuffer(_buffer(frame), dtype=dtype)
                chunks.append((offset, view))
                offset += len(view)
            out.append(chunks)
            i += count
        return out

    def arrays(self) -> List[np.ndarray]:
        """Per section, its values as one array of its dtype: a view of its one frame, a
        copy joining several, and an empty array for a section with no values (which
        travels as no frame)."""
        dtypes = section_dtypes(self.header, len(self.header.get("frames") or []))
        return [chunks[0][1] if len(chunks) == 1 else
                np.concatenate([v for _, v in chunks]) if chunks else np.empty(0, dtype)
                for chunks, dtype in zip(self.sections(), dtypes)]

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


def _wire_dtype(array) -> str:
    """The dtype a section travels as: its own if the wire format has it, else float32."""
    name = getattr(getattr(array, "dtype", None), "name", None)
    return name if name in DTYPES else DTYPE


def section_dtypes(header: Dict[str, Any], count: int) -> List[str]:
    """The dtype of each of `count` sections, from a checked header."""
    dtype = header.get("dtype", DTYPE)
    return list(dtype) if isinstance(dtype, list) else [dtype] * count


def _chunks(array: np.ndarray, dtype: str) -> Iterator[memoryview]:
    flat = np.ascontiguousarray(array, dtype=dtype).reshape(-1)
    for offset, length in chunk_spans(len(flat)):
        yield memoryview(flat[offset:offset + length])


def encode(header: Dict[str, Any], sections: Sequence[np.ndarray] = ()) -> List[Any]:
    """The frames of a message: header (with lengths and frame counts filled in), chunks."""
    header = dict(header)
    frames: List[Any] = []
    if sections:
        counts, dtypes = [], [_wire_dtype(s) for s in sections]
        for section, dtype in zip(sections, dtypes):
            chunks = list(_chunks(section, dtype))
            counts.append(len(chunks))
            frames.extend(chunks)
        header.update(dtype=dtypes[0] if len(set(dtypes)) == 1 else dtypes,
                      lengths=[int(np.size(s)) for s in sections], frames=counts)
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
    dtype = field(header, "dtype", (str, list))
    names = dtype if isinstance(dtype, list) else [dtype] * len(counts)
    for name in names:
        if not isinstance(name, str) or name not in DTYPES:
            raise MessageError(f"dtype {str(name)[:40]!r}, only {', '.join(DTYPES)} are "
                               f"accepted")
    if len(names) != len(counts):
        raise MessageError("header field 'dtype' must name one dtype, or one per section")
    if len(lengths) != len(counts) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in lengths + counts):
        raise MessageError("header fields 'lengths' and 'frames' must be lists of "
                           "non-negative integers of equal size")
    if sum(counts) != len(sizes):
        raise MessageError(f"header announces {sum(counts)} data frames, "
                           f"message has {len(sizes)}")
    i = 0
    for n, (length, count, name) in enumerate(zip(lengths, counts, names)):
        part, item = sizes[i:i + count], DTYPES[name]
        if any(size % item for size in part):
            raise MessageError(f"section {n} has a frame whose size is not a multiple of "
                               f"{item} bytes")
        if sum(part) != length * item:
            raise MessageError(f"section {n} announces {length} {name} values "
                               f"({length * item} bytes), its frames hold {sum(part)} bytes")
        i += count


def decode(frames: Sequence[Any], types: Sequence[str]) -> Message:
    """Parse and check a received message (identity frames already removed)."""
    if not frames:
        raise MessageError("empty message")
    header = decode_header(frames[0], types)
    payload = list(frames[1:])
    check_payload(header, [frame_bytes(f) for f in payload])
    return Message(header, payload, frame_bytes(frames[0]))
