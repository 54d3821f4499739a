"""esync.comm.compress: `--compress none|fp16|topk:R` on the pushed weight chunks.

1. `Compression.parse` takes the documented spellings and refuses the others with a
   ValueError naming the text; `kept(length)` is ceil(R * length), at least 1.
2. fp16: encode, the real wire format (esync.transport.message encode/decode), then
   `decode_chunk` gives back every normal-range value within fp16's unit roundoff
   (relative error <= 2**-11), and the data frame holds half the bytes of float32.
3. topk with error feedback: vectors pushed again and again, chunk by chunk, through a
   `Compressor` and the wire, decoded by `decode_chunk`: after every push what arrived
   plus the residual is exactly what was pushed (to float tolerance); the residual stays
   bounded (||e|| <= sqrt(1-d)/(1-sqrt(1-d)) * max ||g||, d = k/n, top-k's contraction);
   and vectors of one magnitude have every coordinate sent within ceil(1/R) pushes.
4. threshold with error feedback: what is sent is exactly what owes more than T, so
   after every push the residual is at most T everywhere, and what arrived plus the
   residual is what was pushed; a chunk with nothing over T travels empty.
5. partial: the K windows of rounds r..r+K-1 are disjoint, cover the vector and differ
   in size by at most one; a chunk carries its part of the round's window as a `slice`
   (4 bytes a value, an empty section where the chunk is outside it).
6. `decode_chunk` refuses hostile input (indices out of range, negative, too many,
   wrong dtypes, unknown codecs, mismatched lengths, slices that do not fit) with a
   CompressionError.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Tuple

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from esync.comm.compress import Compression, CompressionError, Compressor, decode_chunk
from esync.transport.message import CHUNK_VALUES, chunk_spans, decode, encode, frame_bytes

SETTINGS = settings(max_examples=60, deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def through_wire(fields: Dict[str, Any], sections: List[np.ndarray]
                 ) -> Tuple[Dict[str, Any], List[np.ndarray], list]:
    """A push of `sections` with header `fields`, encoded and decoded as the server
    would receive it: (header, one array per section, the encoded frames)."""
    frames = encode({"type": "push", "sender": 0, "shard": 0, "round": 1, "section": 0,
                     "offset": 0, **fields}, sections)
    msg = decode([bytes(f) for f in frames], ("push",))
    return msg.header, msg.arrays(), frames


# --- 1. the spellings -----------------------------------------------------------------
@pytest.mark.parametrize("text, kind, ratio", [
    ("none", "none", 1.0), ("fp16", "fp16", 1.0), (" FP16 ", "fp16", 1.0),
    ("topk:0.01", "topk", 0.01), ("topk:1", "topk", 1.0), ("TopK:0.5", "topk", 0.5),
    ("topk:1e-3", "topk", 1e-3), ("threshold:0.05", "threshold", 0.05),
    ("threshold:0", "threshold", 0.0), ("Threshold:1e3", "threshold", 1e3),
    ("partial:2", "partial", 2), ("partial:16", "partial", 16), ("partial:4.0", "partial", 4),
    ("threshold:auto:0.01", "threshold", 0.01), ("threshold:AUTO:1", "threshold", 1.0),
])
def test_parse_accepts(text, kind, ratio):
    c = Compression.parse(text)
    parameter = {"topk": c.ratio, "threshold": c.fraction or c.threshold,
                 "partial": c.slices}
    assert (c.kind, parameter.get(c.kind, 1.0)) == (kind, ratio)
    assert Compression.parse(str(c)) == c  # str() is a spelling parse takes back


@pytest.mark.parametrize("text", [
    "topk:0", "topk:1.5", "topk:x", "fp32", "topk", "topk:", "topk:-0.1", "topk:nan",
    "topk:inf", "fp16:0.5", "none:1", "", "float16", "top-k:0.1", "threshold",
    "threshold:", "threshold:-0.1", "threshold:inf", "threshold:nan", "partial",
    "partial:1", "partial:0", "partial:-2", "partial:2.5", "partial:x", "partial:inf",
    "threshold:auto", "threshold:auto:", "threshold:auto:0", "threshold:auto:1.5",
    "threshold:auto:nan", "threshold:0.1:0.1", "threshold:automatic:0.1",
])
def test_parse_refuses_naming_the_text(text):
    with pytest.raises(ValueError) as info:
        Compression.parse(text)
    assert repr(text) in str(info.value)


def test_kept():
    c = Compression.parse("topk:0.01")
    assert [c.kept(n) for n in (1, 2, 99, 100, 101, 1000, 12345)] == \
        [1, 1, 1, 1, 2, 10, 124]
    assert Compression.parse("topk:1").kept(7) == 7
    assert Compression.parse("topk:0.5").kept(3) == 2
    assert Compression.parse("topk:1e-9").kept(CHUNK_VALUES) == 1


@SETTINGS
@given(ratio=st.floats(1e-6, 1.0, exclude_min=True), length=st.integers(1, 10**7))
def test_kept_is_ceil_of_ratio_and_at_least_one(ratio, length):
    k = Compression("topk", ratio).kept(length)
    assert 1 <= k <= length
    assert k >= ratio * length * (1 - 1e-12)
    assert k == 1 or k - 1 < ratio * length * (1 + 1e-12)


# --- 2. fp16 --------------------------------------------------------------------------
NORMAL_FP16 = st.floats(2.0 ** -14, 65504.0, width=32)  # fp16's normal range
FP16_UNIT_ROUNDOFF = 2.0 ** -11


@SETTINGS
@given(magnitudes=st.lists(NORMAL_FP16, min_size=1, max_size=300),
       signs=st.lists(st.booleans(), min_size=300, max_size=300))
@example(magnitudes=[2.0 ** -14, 65504.0, 1.0, 1 + 2.0 ** -11, 1 + 3 * 2.0 ** -12],
         signs=[True] * 300)
def test_fp16_round_trip_within_precision(magnitudes, signs):
    values = np.array(magnitudes, np.float32) * np.where(signs[:len(magnitudes)], 1, -1)
    values = values.astype(np.float32)
    fields, sections = Compressor(Compression.parse("fp16"), len(values)).encode(0, values)
    assert fields == {"codec": "fp16"} and sections[0].dtype == np.float16
    header, arrays, _ = through_wire(fields, sections)
    assert header["dtype"] == "float16"
    got = decode_chunk(header, arrays, len(values))
    assert got.dtype == np.float32 and got.shape == values.shape
    relative = np.abs(got.astype(np.float64) - values) / np.abs(values.astype(np.float64))
    assert relative.max() <= FP16_UNIT_ROUNDOFF, values[np.argmax(relative)]


@pytest.mark.parametrize("length", [1, 1000, CHUNK_VALUES])
def test_fp16_frame_is_half_the_bytes(length):
    values = np.linspace(-3, 3, length, dtype=np.float32)
    plain_fields, plain = Compressor(Compression(), length).encode(0, values)
    half_fields, half = Compressor(Compression.parse("fp16"), length).encode(0, values)
    assert plain_fields == {} and plain[0] is values
    _, _, plain_frames = through_wire(plain_fields, plain)
    _, _, half_frames = through_wire(half_fields, half)
    assert len(plain_frames) == len(half_frames) == 2  # header and one data frame
    assert frame_bytes(plain_frames[1]) == 4 * length
    assert frame_bytes(half_frames[1]) == 2 * length == frame_bytes(plain_frames[1]) // 2


def test_uncompressed_chunk_decodes_as_it_is():
    values = np.arange(10, dtype=np.float32)
    header, arrays, _ = through_wire(*Compressor(Compression(), 10).encode(0, values))
    np.testing.assert_array_equal(decode_chunk(header, arrays, 10), values)


# --- 3. top-k with error feedback -------------------------------------------------------
def push_through_topk(compressor: Compressor, vector: np.ndarray, chunk: int
                      ) -> Tuple[np.ndarray, int]:
    """One push of `vector` in chunks of `chunk` values: the dense vector the server
    decodes, and the bytes of the data frames."""
    out, nbytes = np.empty_like(vector), 0
    for offset in range(0, len(vector), chunk):
        values = vector[offset:offset + chunk]
        fields, sections = compressor.encode(offset, values)
        assert fields == {"codec": "topk"}
        index, sent = sections
        assert index.dtype == np.int32 and sent.dtype == np.float32
        assert len(index) == len(sent) == compressor.compression.kept(len(values))
        assert np.all(np.diff(index) > 0)  # sorted, no index twice
        header, arrays, frames = through_wire(fields, sections)
        assert header["dtype"] == ["int32", "float32"]
        nbytes += sum(frame_bytes(f) for f in frames[1:])
        out[offset:offset + len(values)] = decode_chunk(header, arrays, len(values))
    return out, nbytes


def residual_bound(ratio: float, chunk: int, n: int, largest_push: float) -> float:
    """Top-k keeps at least k/L of each chunk's squared norm, so
    ||e_t|| <= sqrt(1-d) (||e_{t-1}|| + ||g_t||), d = min over chunks of k/L."""
    c = Compression("topk", ratio)
    d = min(c.kept(length) / length
            for length in {min(chunk, n - o) for o in range(0, n, chunk)})
    q = math.sqrt(1 - d)
    return (q / (1 - q) if q < 1 else 0.0) * largest_push


@SETTINGS
@given(n=st.integers(1, 400), ratio=st.floats(0.01, 1.0), chunk=st.integers(1, 400),
       pushes=st.integers(1, 40), seed=st.integers(0, 2**32 - 1),
       same=st.booleans())
@example(n=1, ratio=0.01, chunk=1, pushes=3, seed=0, same=True)
@example(n=400, ratio=0.01, chunk=400, pushes=40, seed=1, same=False)
def test_topk_error_feedback_delivers_everything(n, ratio, chunk, pushes, seed, same):
    """Random vectors (or one vector again and again): nothing is lost, the residual
    stays bounded."""
    rng = np.random.default_rng(seed)
    compressor = Compressor(Compression("topk", ratio), n)
    fixed = rng.standard_normal(n).astype(np.float32)
    pushed = np.zeros(n, np.float64)
    decoded = np.zeros(n, np.float64)
    largest = 0.0
    for t in range(pushes):
        vector = fixed if same else (rng.standard_normal(n) * rng.uniform(0.1, 10)
                                     ).astype(np.float32)
        got, _ = push_through_topk(compressor, vector, chunk)
        pushed += vector
        decoded += got
        largest = max(largest, float(np.linalg.norm(vector)))
        scale = np.abs(pushed).max() + largest * (t + 1)
        np.testing.assert_allclose(decoded + compressor.residual, pushed, rtol=0,
                                   atol=1e-5 * scale, err_msg=f"after push {t + 1}")
        bound = residual_bound(ratio, chunk, n, largest)
        assert np.linalg.norm(compressor.residual) <= bound * (1 + 1e-4) + 1e-5 * scale, \
            (t, np.linalg.norm(compressor.residual), bound)


@SETTINGS
@given(n=st.integers(1, 300), ratio=st.floats(0.02, 1.0), chunk=st.integers(1, 300),
       magnitude=st.floats(1e-3, 1e3), seed=st.integers(0, 2**32 - 1))
@example(n=300, ratio=0.02, chunk=300, magnitude=1.0, seed=0)
def test_topk_sends_every_coordinate_within_ceil_one_over_r_pushes(n, ratio, chunk,
                                                                   magnitude, seed):
    """One vector of one magnitude (random signs) pushed again and again: a coordinate
    never sent owes more than any sent one, so each chunk of L values sends all of them
    within ceil(L / k) <= ceil(1/R) pushes; after that the residual of each coordinate
    is below ceil(1/R) pushes' worth."""
    rng = np.random.default_rng(seed)
    vector = (magnitude * rng.choice([-1.0, 1.0], n)).astype(np.float32)
    compressor = Compressor(Compression("topk", ratio), n)
    rounds = math.ceil(1 / ratio)
    sent_once = np.zeros(n, bool)
    decoded = np.zeros(n, np.float64)
    for t in range(1, rounds + 3):
        got, _ = push_through_topk(compressor, vector, chunk)
        sent_once |= got != 0
        decoded += got
        np.testing.assert_allclose(decoded + compressor.residual, t * vector.astype(np.float64),
                                   rtol=1e-5)
        if t >= rounds:
            assert sent_once.all(), (t, np.flatnonzero(~sent_once)[:10])
            assert np.abs(compressor.residual).max() <= rounds * magnitude * (1 + 1e-5)


def test_topk_sends_the_largest_and_keeps_the_rest():
    compressor = Compressor(Compression.parse("topk:0.25"), 8)
    values = np.array([0.1, -5, 0.2, 3, -0.3, 0.4, 0.5, -0.6], np.float32)
    fields, (index, sent) = compressor.encode(0, values)
    assert fields == {"codec": "topk"}
    assert index.tolist() == [1, 3] and sent.tolist() == [-5.0, 3.0]
    expected = values.copy()
    expected[[1, 3]] = 0
    np.testing.assert_array_equal(compressor.residual, expected)
    # the next push adds to what is owed: 0.5 + 0.5 and -0.6 + -0.6 now lead
    again = np.array([0, 0, 0, 0, 0, 0, 0.5, -0.6], np.float32)
    fields, (index, sent) = compressor.encode(0, again)
    assert index.tolist() == [6, 7]
    np.testing.assert_allclose(sent, [1.0, -1.2])
    np.testing.assert_allclose(compressor.residual, [0.1, 0, 0.2, 0, -0.3, 0.4, 0, 0])


def test_topk_chunks_have_their_own_residual():
    """The residual is per value of the pushed vector: a chunk's offset picks its part."""
    compressor = Compressor(Compression.parse("topk:0.5"), 6)
    compressor.encode(0, np.array([1, 2, 3], np.float32))
    compressor.encode(3, np.array([30, 20, 10], np.float32))
    np.testing.assert_array_equal(compressor.residual, [1, 0, 0, 0, 0, 10])


def test_topk_across_wire_chunks():
    """A vector longer than one wire chunk, cut as the kvstore cuts it (chunk_spans)."""
    n = CHUNK_VALUES + 1000
    rng = np.random.default_rng(0)
    vector = rng.standard_normal(n).astype(np.float32)
    compressor = Compressor(Compression.parse("topk:0.01"), n)
    decoded, nbytes = np.zeros(n, np.float32), 0
    for offset, length in chunk_spans(n):
        fields, sections = compressor.encode(offset, vector[offset:offset + length])
        header, arrays, frames = through_wire(fields, sections)
        nbytes += sum(frame_bytes(f) for f in frames[1:])
        decoded[offset:offset + length] = decode_chunk(header, arrays, length)
    kept = [Compression.parse("topk:0.01").kept(length) for _, length in chunk_spans(n)]
    assert nbytes == 8 * sum(kept)  # int32 index and float32 value each
    assert np.count_nonzero(decoded) == sum(kept)
    np.testing.assert_array_equal(decoded + compressor.residual, vector)
    # what was sent is each chunk's largest in magnitude
    for (offset, length), k in zip(chunk_spans(n), kept):
        part = np.abs(vector[offset:offset + length])
        sent = np.abs(decoded[offset:offset + length])
        assert sent[sent > 0].min() >= np.sort(part)[-k]


def test_topk_ratio_one_sends_everything():
    compressor = Compressor(Compression.parse("topk:1"), 5)
    values = np.array([0, -1, 2, 0, 3], np.float32)
    header, arrays, _ = through_wire(*compressor.encode(0, values))
    assert arrays[0].tolist() == [0, 1, 2, 3, 4]
    np.testing.assert_array_equal(decode_chunk(header, arrays, 5), values)
    assert not compressor.residual.any()


def test_none_and_fp16_keep_no_residual():
    assert Compressor(Compression(), 10).residual is None
    assert Compressor(Compression.parse("fp16"), 10).residual is None


# --- 4. threshold with error feedback ---------------------------------------------------
@SETTINGS
@given(n=st.integers(1, 300), threshold=st.floats(0.0, 3.0), chunk=st.integers(1, 300),
       pushes=st.integers(1, 20), seed=st.integers(0, 2**32 - 1))
@example(n=300, threshold=0.0, chunk=300, pushes=2, seed=0)
def test_threshold_sends_what_owes_more_than_t(n, threshold, chunk, pushes, seed):
    rng = np.random.default_rng(seed)
    compression = Compression("threshold", threshold=threshold)
    compressor = Compressor(compression, n)
    pushed, decoded = np.zeros(n, np.float64), np.zeros(n, np.float64)
    for t in range(pushes):
        vector = (rng.standard_normal(n) * rng.uniform(0.1, 2)).astype(np.float32)
        owed = compressor.residual + vector
        compressor.begin(t + 1)
        for offset in range(0, n, chunk):
            values = vector[offset:offset + chunk]
            fields, (index, sent) = compressor.encode(offset, values)
            assert fields == {"codec": "threshold"} and index.dtype == np.int32
            part = owed[offset:offset + len(values)]
            assert index.tolist() == np.flatnonzero(np.abs(part) > threshold).tolist()
            header, arrays, frames = through_wire(fields, [index, sent])
            assert sum(frame_bytes(f) for f in frames[1:]) == 8 * len(index)
            decoded[offset:offset + len(values)] += decode_chunk(header, arrays, len(values))
        assert compressor.sent_values == np.count_nonzero(np.abs(owed) > threshold)
        pushed += vector
        assert np.abs(compressor.residual).max() <= threshold
        np.testing.assert_allclose(decoded + compressor.residual, pushed, rtol=0,
                                   atol=1e-5 * (np.abs(pushed).max() + t + 1))


def test_a_threshold_chunk_with_nothing_over_t_travels_empty():
    compressor = Compressor(Compression.parse("threshold:1"), 4)
    fields, sections = compressor.encode(0, np.array([0.5, -0.5, 1, 0], np.float32))
    header, arrays, frames = through_wire(fields, sections)
    assert len(frames) == 1 and header["lengths"] == [0, 0] and header["frames"] == [0, 0]
    np.testing.assert_array_equal(decode_chunk(header, arrays, 4), np.zeros(4))
    np.testing.assert_array_equal(compressor.residual, [0.5, -0.5, 1, 0])
    fields, (index, sent) = compressor.encode(0, np.array([0.6, 0, 0, 0], np.float32))
    assert index.tolist() == [0] and sent.tolist() == [pytest.approx(1.1)]


@pytest.mark.parametrize("n, fraction", [(10**4, 0.01), (62158, 0.01), (10**6, 0.001),
                                         (CHUNK_VALUES, 0.05), (1000, 0.2)])
def test_an_automatic_threshold_keeps_about_its_fraction(n, fraction):
    """threshold:auto:F on vectors of very different scales (a vector's magnitudes do
    not matter, only their spread) sends about F of them: within 2x, the sample being at
    most SAMPLE values."""
    import torch

    rng = np.random.default_rng(n)
    compression = Compression.parse(f"threshold:auto:{fraction:g}")
    for scale in (1e-4, 1.0, 1e3):
        vector = torch.from_numpy((scale * rng.standard_t(3, n)).astype(np.float32))
        sent = len(compression.select(vector)) / n
        assert fraction / 2 <= sent <= fraction * 2, (scale, sent)


def test_an_automatic_threshold_with_feedback_loses_nothing():
    """Vectors pushed again and again: each push sends what owes more than that push's
    T and about the fraction F, and what arrived plus the residual is what was pushed."""
    import torch

    n, pushes = 2000, 100
    rng = np.random.default_rng(1)
    compression = Compression.parse("threshold:auto:0.05")
    compressor = Compressor(compression, n)
    pushed, decoded = np.zeros(n, np.float64), np.zeros(n, np.float64)
    for t in range(pushes):
        vector = rng.standard_normal(n).astype(np.float32)
        threshold = compression.auto_threshold(torch.from_numpy(compressor.residual + vector))
        compressor.begin(t + 1)
        fields, sections = compressor.encode(0, vector)
        assert 0.025 * n <= compressor.sent_values <= 0.1 * n
        assert np.abs(compressor.residual).max() <= threshold
        decoded += decode_chunk(*through_wire(fields, sections)[:2], n)
        pushed += vector
    np.testing.assert_allclose(decoded + compressor.residual, pushed, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("kind", ["topk:0.1", "threshold:1.0"])
def test_select_on_torch_is_the_codecs_choice(kind):
    """The all-reduce picks on torch tensors with the same `select` the chunks use."""
    import torch

    rng = np.random.default_rng(3)
    vector = rng.standard_normal(1000).astype(np.float32)
    compression = Compression.parse(kind)
    index = compression.select(torch.from_numpy(vector)).numpy()
    if compression.kind == "topk":
        assert len(index) == 100
        assert np.abs(vector[index]).min() >= np.sort(np.abs(vector))[-100]
    else:
        assert index.tolist() == np.flatnonzero(np.abs(vector) > 1.0).tolist()
    assert np.all(np.diff(index) > 0)


# --- 5. partial ------------------------------------------------------------------------------
@SETTINGS
@given(n=st.integers(0, 10**6), k=st.integers(2, 64), first=st.integers(1, 10**6))
def test_partial_windows_cover_the_vector_once_in_k_rounds(n, k, first):
    compression = Compression("partial", slices=k)
    windows = sorted(compression.window(r, n) for r in range(first, first + k))
    assert windows[0][0] == 0 and windows[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(windows, windows[1:]))  # disjoint, no gap
    sizes = [hi - lo for lo, hi in windows]
    assert max(sizes) - min(sizes) <= 1
    assert compression.window(first, n) == compression.window(first + k, n)


def test_partial_chunks_carry_the_round_window_as_slices():
    """A vector of 3 wire-sized chunks of 10 values, partial:3: round 2's window is
    [10, 20) of 31 values... cut as the kvstore cuts it."""
    n, chunk = 31, 10
    compressor = Compressor(Compression.parse("partial:3"), n)
    vector = np.arange(1, n + 1, dtype=np.float32)
    for round_ in (1, 2, 3):
        compressor.begin(round_)
        lo, hi = compressor.window
        decoded, nbytes = np.zeros(n, np.float32), 0
        for offset in range(0, n, chunk):
            values = vector[offset:offset + chunk]
            fields, sections = compressor.encode(offset, values)
            assert fields["codec"] == "slice"
            header, arrays, frames = through_wire(fields, sections)
            nbytes += sum(frame_bytes(f) for f in frames[1:])
            decoded[offset:offset + len(values)] = decode_chunk(header, arrays, len(values))
        expected = np.where((np.arange(n) >= lo) & (np.arange(n) < hi), vector, 0)
        np.testing.assert_array_equal(decoded, expected)
        assert nbytes == 4 * (hi - lo) and compressor.sent_values == hi - lo
    assert [Compression.parse("partial:3").window(r, n) for r in (1, 2, 3)] == \
        [(0, 10), (10, 20), (20, 31)]


# --- 6. hostile input --------------------------------------------------------------------
I32, F32, F16 = np.int32, np.float32, np.float16
TOPK = {"codec": "topk"}
HOSTILE = [
    # (header, sections, length, what the error says)
    (TOPK, [np.array([0, 10], I32), np.ones(2, F32)], 10, "indices must be in 0..9"),
    (TOPK, [np.array([2**31 - 1], I32), np.ones(1, F32)], 10, "indices must be in"),
    (TOPK, [np.array([-1, 3], I32), np.ones(2, F32)], 10, "indices must be in"),
    (TOPK, [np.array([-2**31], I32), np.ones(1, F32)], 10, "indices must be in"),
    (TOPK, [np.arange(11, dtype=I32) % 10, np.ones(11, F32)], 10, f"at most {10}"),
    (TOPK, [np.array([0, 1], F32), np.ones(2, F32)], 10, "int32 indices"),
    (TOPK, [np.array([0, 1], I32), np.ones(2, F16)], 10, "float32 values"),
    (TOPK, [np.array([0, 1], I32), np.array([1, 2], I32)], 10, "float32 values"),
    (TOPK, [np.array([0, 1], I32), np.ones(3, F32)], 10, "as many"),
    (TOPK, [np.array([0, 1, 2], I32), np.ones(2, F32)], 10, "as many"),
    (TOPK, [np.array([0, 1], I32)], 10, "int32 indices"),
    (TOPK, [np.ones(2, F32)], 10, "int32 indices"),
    (TOPK, [], 10, "int32 indices"),
    (TOPK, [np.array([0], I32), np.ones(1, F32), np.ones(1, F32)], 10, "int32 indices"),
    (TOPK, [np.array([0], I32), np.ones(1, F32)], 0, "at most 0"),
    ({"codec": "fp16"}, [np.ones(10, F32)], 10, "one section of float16"),
    ({"codec": "fp16"}, [np.ones(9, F16)], 10, "chunk of 9 values, expected 10"),
    ({"codec": "fp16"}, [np.ones(11, F16)], 10, "chunk of 11 values, expected 10"),
    ({"codec": "fp16"}, [np.ones(5, F16), np.ones(5, F16)], 10, "one section"),
    ({"codec": "fp16"}, [], 10, "one section"),
    ({}, [np.ones(10, F16)], 10, "one section of float32"),
    ({}, [np.ones(10, I32)], 10, "one section of float32"),
    ({}, [np.ones(9, F32)], 10, "chunk of 9 values, expected 10"),
    ({}, [np.ones(5, F32), np.ones(5, F32)], 10, "one section"),
    ({"codec": "fp32"}, [np.ones(10, F32)], 10, "unknown codec 'fp32'"),
    ({"codec": "TOPK"}, [np.array([0], I32), np.ones(1, F32)], 10, "unknown codec"),
    ({"codec": ""}, [np.ones(10, F32)], 10, "unknown codec"),
    ({"codec": 1}, [np.ones(10, F32)], 10, "unknown codec"),
    ({"codec": ["topk"]}, [np.array([0], I32), np.ones(1, F32)], 10, "unknown codec"),
    ({"codec": "x" * 1000}, [np.ones(10, F32)], 10, "unknown codec"),
    ({"codec": "threshold"}, [np.array([10], I32), np.ones(1, F32)], 10,
     "threshold indices must be in 0..9"),
    ({"codec": "threshold"}, [np.array([0], I32)], 10, "int32 indices"),
    ({"codec": "slice", "start": 9}, [np.ones(2, F32)], 10, "integer in 0..8"),
    ({"codec": "slice", "start": -1}, [np.ones(2, F32)], 10, "'start'"),
    ({"codec": "slice", "start": 0}, [np.ones(11, F32)], 10, "'start'"),
    ({"codec": "slice", "start": "0"}, [np.ones(2, F32)], 10, "'start'"),
    ({"codec": "slice", "start": True}, [np.ones(2, F32)], 10, "'start'"),
    ({"codec": "slice", "start": 0.0}, [np.ones(2, F32)], 10, "'start'"),
    ({"codec": "slice"}, [np.ones(2, F32)], 10, "'start'"),
    ({"codec": "slice", "start": 0}, [np.ones(2, F16)], 10, "one section of float32"),
    ({"codec": "slice", "start": 0}, [np.ones(2, F32)] * 2, 10, "one section"),
]


@pytest.mark.parametrize("header, sections, length, problem", HOSTILE,
                         ids=[f"{i}-{p[:20]}" for i, (_, _, _, p) in enumerate(HOSTILE)])
def test_decode_chunk_refuses(header, sections, length, problem):
    with pytest.raises(CompressionError) as info:
        decode_chunk(header, sections, length)
    assert problem in str(info.value)
    assert len(str(info.value)) < 200  # a peer's text is cut, not echoed whole
    assert isinstance(info.value, ValueError)


@SETTINGS
@given(length=st.integers(0, 50),
       index=st.lists(st.integers(-2**31, 2**31 - 1), max_size=60),
       extra_values=st.integers(-2, 2))
def test_decode_chunk_of_any_topk_indices(length, index, extra_values):
    """Any int32 indices: a dense chunk with the values where they say, or a
    CompressionError; never another exception."""
    idx = np.array(index, I32)
    values = np.arange(1, len(index) + 1 + max(0, extra_values), dtype=F32)
    values = values[:max(0, len(index) + extra_values)]
    valid = len(values) == len(idx) and len(index) <= length and \
        all(0 <= i < length for i in index)
    try:
        got = decode_chunk(TOPK, [idx, values], length)
    except CompressionError:
        assert not valid
        return
    assert valid
    assert got.dtype == np.float32 and len(got) == length
    if len(set(index)) != len(index):
        return  # an index twice: which of its values is kept is not specified
    expected = np.zeros(length, F32)
    expected[idx] = values
    np.testing.assert_array_equal(got, expected)
