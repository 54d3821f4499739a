"""The wire format: header + raw float32 frames, and what decode refuses."""
import msgpack
import numpy as np
import pytest

from esync.transport import message
from esync.transport.message import MessageError, decode, encode

TYPES = ("push", "pull")


def _header(**kw):
    return msgpack.packb({"type": "push", "sender": 1, **kw})


def test_round_trip_cuts_sections_into_chunks(monkeypatch):
    monkeypatch.setattr(message, "CHUNK_VALUES", 10)  # 10 floats per frame
    a, b = np.arange(25, dtype=np.float32), np.arange(3, dtype=np.float32) + 100
    frames = encode({"type": "push", "sender": 3, "shard": 0, "round": 9}, [a, b])
    assert len(frames) == 1 + 3 + 1
    msg = decode([bytes(f) for f in frames], TYPES)
    assert msg.header["lengths"] == [25, 3] and msg.header["frames"] == [3, 1]
    assert msg.header["round"] == 9 and msg.header["dtype"] == "float32"
    first, second = msg.sections()
    assert [off for off, _ in first] == [0, 10, 20]
    np.testing.assert_array_equal(np.concatenate([c for _, c in first]), a)
    np.testing.assert_array_equal(second[0][1], b)
    assert msg.nbytes() == sum(len(bytes(f)) for f in frames)


def test_arrays_give_each_section_whole_an_empty_one_included(monkeypatch):
    """One array per section, of its dtype: several frames joined, one frame as it came,
    and a section with no values (no frame on the wire) as an empty array."""
    monkeypatch.setattr(message, "CHUNK_VALUES", 10)
    a, b = np.arange(25, dtype=np.float32), np.arange(3, dtype=np.int32)
    frames = encode({"type": "push", "sender": 3}, [a, np.zeros(0, np.float32), b])
    msg = decode([bytes(f) for f in frames], TYPES)
    assert msg.header["frames"] == [3, 0, 1]
    whole, empty, small = msg.arrays()
    np.testing.assert_array_equal(whole, a)
    assert empty.dtype == np.float32 and len(empty) == 0
    assert small.dtype == np.int32 and small.tolist() == [0, 1, 2]


def test_sending_is_zero_copy():
    a = np.arange(8, dtype=np.float32)
    frames = encode({"type": "push", "sender": 0}, [a])
    a[0] = 42  # the frame is a view of the array, not a copy
    assert np.frombuffer(frames[1], np.float32)[0] == 42


def test_header_only_message():
    msg = decode([_header(round=1)], TYPES)
    assert msg.type == "push" and msg.sections() == []


BAD = [
    ([], "empty message"),
    ([b"\xc1\xff garbage"], "not valid msgpack"),
    ([msgpack.packb([1, 2])], "header is a list, expected a map"),
    ([msgpack.packb({"sender": 1})], "lacks field 'type'"),
    ([_header(type="explode")], "unknown message type 'explode'"),
    ([msgpack.packb({"type": "push"})], "lacks field 'sender'"),
    ([_header(type=7)], "field 'type' has type int"),
    ([_header(), b"1234"], "lacks field 'frames'"),
    ([_header(frames=[1], lengths=[1], dtype="float64"), b"12345678"], "dtype 'float64'"),
    ([_header(frames=[2], lengths=[2], dtype="float32"), b"12345678"],
     "announces 2 data frames, message has 1"),
    ([_header(frames=[1], lengths=[3], dtype="float32"), b"12345678"],
     "announces 3 float32 values (12 bytes), its frames hold 8"),
    ([_header(frames=[1], lengths=[-1], dtype="float32"), b"1234"], "non-negative integers"),
    ([_header(frames=[1, 1], lengths=[1], dtype="float32"), b"1234"], "of equal size"),
    ([_header(frames=[2], lengths=[2], dtype="float32"), b"123", b"45678"],
     "not a multiple of 4"),
    ([b"\x00" * (70 << 10)], "header of 71680 bytes"),
]


@pytest.mark.parametrize("frames,problem", BAD, ids=[p for _, p in BAD])
def test_decode_refuses(frames, problem):
    with pytest.raises(MessageError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        decode(frames, TYPES)
