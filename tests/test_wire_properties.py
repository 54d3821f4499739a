"""Property-based tests (hypothesis) of the wire format and of a server's checks.

1. `decode` / `decode_header` / `check_payload` on anything a peer could send (any bytes,
   any msgpack value as the header, any frames): a `Message` or a `MessageError`, never
   another exception; `encode` then `decode` gives back headers and float32 sections
   exactly (bit for bit, NaN payloads included).
2. A `ShardServer` in this process, on a real ROUTER socket bound to a free loopback
   port, with DEALER peers (two workers, the evaluator, strangers), initialised by a
   valid `init` (SSGD and ASGD), is handed generated push/pull/init messages through
   `ShardServer.handle(frames)`: it never raises, answers every rejected request with
   `error` (strangers: `error` or nothing, never weights), leaves the shard's weights and
   buffers as they were, and a valid round still gives exactly the expected weights
   afterwards.

The in-process harness (how a server is built and who its peers are) is `Harness`,
built by the `harness` fixture only: adapt it there if ShardServer's constructor or its
way of learning who a peer is changes.
"""
from __future__ import annotations

import math
import struct
from typing import Dict, List, Optional, Tuple

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from esync.registry import EVALUATOR
from esync.comm.server import ShardServer
from esync.transport.message import (CHUNK_VALUES, MAX_HEADER_BYTES, Message, MessageError,
                                     check_payload, decode, decode_header, encode)

pytestmark = pytest.mark.filterwarnings(  # rules.py's own filter, reset by pytest
    "ignore:The given NumPy array is not writable")

SERVER_REQUESTS = ("init", "pull", "push", "join", "leave")
ANSWERS = ("weights", "ack", "error")
SETTINGS = settings(max_examples=150, deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])
SERVER_SETTINGS = settings(SETTINGS, max_examples=60)

# --- strategies ----------------------------------------------------------------------------
INTS = st.integers(min_value=-2**63, max_value=2**64 - 1)  # all msgpack can carry
SCALARS = st.one_of(st.none(), st.booleans(), INTS, st.floats(), st.text(max_size=20))
MSGPACK_VALUES = st.recursive(
    st.one_of(SCALARS, st.binary(max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.one_of(st.text(max_size=8), INTS), inner,
                                            max_size=4)),
    max_leaves=12)
#: values that fit no integer field (a float like 1.0 included: the measured crash)
NOT_INTEGERS = st.one_of(st.none(), st.booleans(), st.floats(), st.text(max_size=8),
                         st.lists(st.integers(0, 2), max_size=2),
                         st.dictionaries(st.text(max_size=3), INTS, max_size=2),
                         st.sampled_from([0.0, 1.0, -0.0, float("nan"), float("inf"), "0",
                                          "1", True, False, [0], {"0": 0}]))
HUGE = st.integers(min_value=2**62, max_value=2**64 - 1)
NEGATIVE = st.integers(min_value=-2**63, max_value=-1)


def packed(header) -> bytes:
    return msgpack.packb(header, use_bin_type=True)


def as_frames(frames: List[bytes], kind: str) -> list:
    if kind == "frame":
        return [zmq.Frame(f) for f in frames]
    if kind == "memoryview":
        return [memoryview(f) for f in frames]
    return list(frames)


# --- 1. the wire format ------------------------------------------------------------------
@SETTINGS
@given(raw=st.binary(max_size=200), types=st.lists(st.text(max_size=6), max_size=3))
def test_decode_header_of_any_bytes(raw, types):
    for frame in (raw, zmq.Frame(raw), memoryview(raw), bytearray(raw)):
        try:
            header = decode_header(frame, types or SERVER_REQUESTS)
        except MessageError:
            continue
        assert isinstance(header, dict) and header["type"] in (types or SERVER_REQUESTS)
        assert isinstance(header["sender"], (str, int))
        assert not isinstance(header["sender"], bool)


@SETTINGS
@given(value=MSGPACK_VALUES)
def test_decode_header_of_any_msgpack_value(value):
    raw = packed(value)
    try:
        header = decode_header(raw, SERVER_REQUESTS)
    except MessageError:
        return
    assert packed(header) == raw  # what was sent, nothing lost or added


@SETTINGS
@given(kind=st.sampled_from(SERVER_REQUESTS + ("heartbeat", "", "pushh")),
       sender=st.one_of(INTS, st.text(max_size=8), NOT_INTEGERS),
       extra=st.dictionaries(st.sampled_from(["frames", "lengths", "dtype", "section",
                                              "offset", "round", "shard", "rule"]),
                             MSGPACK_VALUES, max_size=4),
       payload=st.lists(st.binary(max_size=24), max_size=4),
       kind_of_frames=st.sampled_from(["bytes", "frame", "memoryview"]))
@example(kind="init", sender=0, extra={"frames": None}, payload=[], kind_of_frames="bytes")
@example(kind="init", sender=0, extra={"frames": [], "lengths": [], "dtype": "float32"},
         payload=[], kind_of_frames="bytes")
def test_decode_of_any_header_and_frames(kind, sender, extra, payload, kind_of_frames):
    header = {"type": kind, "sender": sender, **extra}
    frames = as_frames([packed(header), *payload], kind_of_frames)
    try:
        msg = decode(frames, SERVER_REQUESTS)
    except MessageError:
        return
    assert isinstance(msg, Message) and msg.type in SERVER_REQUESTS
    # what decode accepted is consistent: the announced sections are the frames held
    sections = msg.sections()
    assert sum(len(s) for s in sections) == len(payload)
    for length, chunks in zip(msg.header.get("lengths", []), sections):
        assert sum(len(view) for _, view in chunks) == length


@SETTINGS
@given(frames=st.lists(st.binary(max_size=64), max_size=5))
def test_decode_of_any_frames(frames):
    try:
        msg = decode(frames, SERVER_REQUESTS)
    except MessageError:
        return
    assert isinstance(msg, Message)


@SETTINGS
@given(header=st.dictionaries(st.sampled_from(["frames", "lengths", "dtype", "type"]),
                              MSGPACK_VALUES, max_size=4),
       sizes=st.lists(st.integers(0, 2**40), max_size=5))
def test_check_payload_of_any_header(header, sizes):
    try:
        check_payload(header, sizes)
    except MessageError:
        return
    if sizes:  # accepted: the sizes are exactly what the header announces
        assert sum(header["frames"]) == len(sizes)
        assert sum(sizes) == 4 * sum(header["lengths"])


def test_oversized_header_is_a_message_error():
    raw = packed({"type": "push", "sender": 0, "pad": "x" * MAX_HEADER_BYTES})
    with pytest.raises(MessageError, match="header of"):
        decode([raw], SERVER_REQUESTS)


HEADER_VALUES = st.recursive(  # what round-trips exactly (msgpack refuses bin in headers)
    st.one_of(st.none(), st.booleans(), INTS, st.floats(allow_nan=False), st.text(max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=10)
FLOAT32_BITS = st.integers(0, 2**32 - 1)  # any bit pattern: NaNs, infinities, denormals


@st.composite
def float32_sections(draw) -> List[np.ndarray]:
    out = []
    for _ in range(draw(st.integers(0, 3))):
        length = draw(st.sampled_from([0, 1, 2, 7, CHUNK_VALUES - 1, CHUNK_VALUES,
                                       CHUNK_VALUES + 3]))
        bits = draw(st.lists(FLOAT32_BITS, min_size=1, max_size=8))
        pattern = np.array(bits, dtype=np.uint32)
        out.append(np.resize(pattern, length).view(np.float32))
    return out


@settings(SETTINGS, max_examples=50)
@given(kind=st.sampled_from(SERVER_REQUESTS), sender=st.one_of(INTS, st.text(max_size=10)),
       fields=st.dictionaries(st.text(max_size=8).filter(
           lambda k: k not in ("type", "sender", "dtype", "lengths", "frames")),
           HEADER_VALUES, max_size=5),
       sections=float32_sections(), kind_of_frames=st.sampled_from(["bytes", "frame"]))
def test_encode_decode_round_trip(kind, sender, fields, sections, kind_of_frames):
    assume(not isinstance(sender, bool))
    header = {"type": kind, "sender": sender, **fields}
    frames = encode(header, sections)
    if kind_of_frames == "frame":
        frames = [zmq.Frame(bytes(f)) for f in frames]
    msg = decode(frames, SERVER_REQUESTS)
    expected = dict(header)
    if sections:
        expected.update(dtype="float32", lengths=[len(s) for s in sections],
                        frames=[len(range(0, len(s), CHUNK_VALUES)) for s in sections])
    assert msg.header == expected
    got = msg.sections()
    assert len(got) == len(sections)
    for section, chunks in zip(sections, got):
        joined = np.concatenate([v for _, v in chunks]) if chunks else np.empty(0, np.float32)
        assert [o for o, _ in chunks] == list(range(0, len(section), CHUNK_VALUES))
        np.testing.assert_array_equal(joined.view(np.uint32), section.view(np.uint32))


# --- 2. a server's checks ----------------------------------------------------------------
LR = 0.5
WEIGHT_CHUNKS = ((0, CHUNK_VALUES), (CHUNK_VALUES, 1000))  # (offset, length) of section 0
NUM_BUFFERS = 10
NUM_WEIGHTS = sum(n for _, n in WEIGHT_CHUNKS)
VALID_KEYS = [(0, o, n) for o, n in WEIGHT_CHUNKS] + [(1, 0, NUM_BUFFERS)]
PEERS = {  # ZeroMQ identity -> who the scheduler says it is (None: not a member)
    b"worker-a/kv": ("worker", 0),
    b"worker-b/kv": ("worker", 1),
    b"evaluator-c/kv": (EVALUATOR, 0),
    b"stranger/kv": None,
    b"no-slash-at-all": None,
    b"": None,  # never used as a ROUTER identity, only handed to handle() directly
}


class Harness:
    """One ShardServer (rule `rule`, two workers) in this process on a ROUTER bound to a
    free loopback port, with one DEALER per peer of PEERS."""

    def __init__(self, rule: str, init: bool = True):
        self.rule_name = rule
        self.context = zmq.Context()
        self.router = self.context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.router.setsockopt(zmq.LINGER, 0)
        port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.dealers: Dict[bytes, zmq.Socket] = {}
        for identity in PEERS:
            if not identity:
                continue
            sock = self.context.socket(zmq.DEALER)
            sock.setsockopt(zmq.IDENTITY, identity)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(f"tcp://127.0.0.1:{port}")
            sock.send(b"hello")  # so that the ROUTER knows the peer (ROUTER_MANDATORY)
            self.dealers[identity] = sock
        for _ in self.dealers:
            assert self.router.poll(5000), "a peer did not connect"
            self.router.recv_multipart()
        self.asked: List[bytes] = []
        self.server = self._build()
        self.weights0 = (np.arange(NUM_WEIGHTS) % 13).astype(np.float32) - 6
        self.buffers0 = np.arange(NUM_BUFFERS, dtype=np.float32)
        if init:
            self.init()

    def _who(self, identity: bytes) -> Optional[Tuple[str, int]]:
        self.asked.append(identity)
        return PEERS.get(identity)

    def _build(self) -> ShardServer:
        """The one place that knows ShardServer's constructor."""
        return ShardServer(0, 2, self.router, self._who)

    def config(self, **change) -> Dict:
        return {"name": self.rule_name, "num_workers": 2, "lr": LR, **change}

    def init(self) -> None:
        frames = encode({"type": "init", "sender": 0, "shard": 0, "rule": self.config()},
                        [self.weights0, self.buffers0])
        answers = self.send(b"worker-a/kv", frames)
        assert [a.type for a in answers] == ["ack"], [a.header for a in answers]
        self.snapshot()

    def snapshot(self) -> None:
        self.saved = tuple(s.copy() for s in self.server.sections)
        self.saved_state = self.state()

    def state(self) -> Tuple:
        s = self.server
        return (s.rule is None, s.stop_reason, s.started_at, s.updates,
                {k: list(v) for k, v in s.waiting.items()}, list(s.early_pulls),
                list(s.round_pulls), sorted(getattr(s.rule, "members", ())))

    def unchanged(self) -> bool:
        return len(self.saved) == len(self.server.sections) and all(
            a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
            for a, b in zip(self.saved, self.server.sections))

    def send(self, identity: bytes, frames: list, as_frame: bool = False) -> List[Message]:
        """handle() one request from `identity`; every answer the server sent back."""
        first = zmq.Frame(identity) if as_frame else identity
        body = [zmq.Frame(bytes(f)) for f in frames] if as_frame else list(frames)
        self.server.handle([first, *body])  # must never raise
        if identity not in self.dealers:
            return []
        # a marker behind the server's answers on the same ROUTER->DEALER pipe (ordered)
        self.router.send_multipart([identity, b"--marker--"])
        sock, answers = self.dealers[identity], []
        while True:
            assert sock.poll(10000), "the marker did not come back"
            frames = sock.recv_multipart(copy=False)
            if frames[0].bytes == b"--marker--":
                return answers
            answers.append(decode(frames, ANSWERS))

    def close(self) -> None:
        for sock in self.dealers.values():
            sock.close(linger=0)
        self.router.close(linger=0)
        self.context.term()


@pytest.fixture(params=["sync", "async"])
def harness(request):
    h = Harness(request.param)
    yield h
    h.close()


@pytest.fixture
def fresh_harness():
    """A server not yet initialised (SSGD)."""
    h = Harness("sync", init=False)
    yield h
    h.close()


def good_push(rank: int, section: int, offset: int, length: int, round_: int = 1,
              value: float = 1.0) -> list:
    return encode({"type": "push", "sender": rank, "shard": 0, "round": round_,
                   "section": section, "offset": offset},
                  [np.full(length, value, np.float32)])


def assert_valid_round_works(h: Harness) -> None:
    """After whatever came before, one valid round gives exactly the expected values."""
    w0, b0 = h.saved
    if h.rule_name == "sync":  # w -= lr * (g0 + g1) / 2;  buffers: the workers' mean
        grads, pushed_buffers = (1.0, 3.0), (b0 + 1, b0 + 3)
        expected_w, expected_b = w0 - LR * 2.0, b0 + 2
        pushers = (0, 1)
    else:  # one worker: w -= lr * g;  buffers move half-way (1/N) to the pushed ones
        grads, pushed_buffers = (2.0,), (b0 + 2,)
        expected_w, expected_b = w0 - LR * 2.0, b0 + 1
        pushers = (0,)
    replies: Dict[int, List[Message]] = {r: [] for r in pushers}
    for rank in pushers:
        identity = b"worker-a/kv" if rank == 0 else b"worker-b/kv"
        for offset, length in WEIGHT_CHUNKS:
            replies[rank] += h.send(identity, good_push(rank, 0, offset, length,
                                                        value=grads[rank]))
        frames = encode({"type": "push", "sender": rank, "shard": 0, "round": 1,
                         "section": 1, "offset": 0}, [pushed_buffers[rank]])
        replies[rank] += h.send(identity, frames)
    np.testing.assert_array_equal(h.server.sections[0], expected_w)
    np.testing.assert_array_equal(h.server.sections[1], expected_b)
    if h.rule_name == "sync":  # the answers come once the second worker pushed
        replies[0] += h.send(b"worker-a/kv", encode({"type": "pull", "sender": 0,
                                                     "shard": 0}))
    for rank, answers in replies.items():
        assert answers and all(a.type == "weights" for a in answers), \
            [a.header for a in answers]
        got_w = np.empty(NUM_WEIGHTS, np.float32)
        got_b = np.empty(NUM_BUFFERS, np.float32)
        for a in answers:  # the latest answer of each chunk holds the new values
            target = got_w if a.header["section"] == 0 else got_b
            values = a.sections()[0][0][1]
            target[a.header["offset"]:a.header["offset"] + len(values)] = values
        np.testing.assert_array_equal(got_w, expected_w)
        np.testing.assert_array_equal(got_b, expected_b)


# how to break each field of a push so that it is wrong whatever the others are
PUSH_BREAKERS = {
    "type": st.one_of(st.sampled_from(["", "Push", "push ", "delete", "weights", "ack"]),
                      NOT_INTEGERS.filter(lambda v: not isinstance(v, str)), st.just(None)),
    "sender": st.one_of(st.just(None), NOT_INTEGERS.filter(lambda v: v is not None),
                        st.sampled_from([1, 2, 7, -1, 2**40, 2**64 - 1, "worker-a", ""])),
    "shard": st.one_of(st.just(None), NOT_INTEGERS, st.integers(1, 2**64 - 1), NEGATIVE),
    "round": st.one_of(st.just(None), NOT_INTEGERS, NEGATIVE, HUGE),
    "section": st.one_of(st.just(None), NOT_INTEGERS, st.integers(2, 2**64 - 1), NEGATIVE),
    "offset": st.one_of(st.just(None), NOT_INTEGERS, NEGATIVE, HUGE,
                        st.integers(NUM_WEIGHTS, 2**62),
                        st.integers(1, NUM_WEIGHTS - 1).filter(lambda o: o % CHUNK_VALUES)),
    "dtype": st.one_of(st.just(None), st.sampled_from(["float64", "float16", "int32",
                                                       "FLOAT32", "float32 ", "f4", "<f4"]),
                       NOT_INTEGERS.filter(lambda v: v is not None and v != "float32")),
    "lengths": st.one_of(st.just(None), NOT_INTEGERS, st.lists(INTS, min_size=2, max_size=3),
                         st.lists(NOT_INTEGERS, min_size=1, max_size=2),
                         st.builds(lambda n: [n], NEGATIVE)),
    "frames": st.one_of(st.just(None), NOT_INTEGERS.filter(lambda v: v != [1]), st.sampled_from([[0], [2], [1, 1], [],
                                                                      [1, 0], [-1]])),
}
#: the fields to break, the chunk's own first (hypothesis tries the first ones most)
PUSH_FIELDS = ["section", "offset", "lengths", "payload", "round", "frames", "dtype", "shard",
               "sender", "type"]
PAYLOAD_BREAKERS = ("drop", "short", "long", "odd", "split", "extra")
#: other rounds that are wrong in SSGD only (ASGD takes any round number)
SYNC_ROUNDS = st.integers(2, 2**40)


@st.composite
def broken_pushes(draw, rule: str):
    """A push from worker 0 with at least one field (or its payload) wrong."""
    section, offset, length = draw(st.sampled_from(VALID_KEYS))
    header = {"type": "push", "sender": 0, "shard": 0, "round": 1, "section": section,
              "offset": offset, "dtype": "float32", "lengths": [length], "frames": [1]}
    value = draw(st.sampled_from([float("nan"), float("inf"), -1e30, 0.0, 1.0]))
    payload = [np.full(length, value, np.float32).tobytes()]
    fields = PUSH_FIELDS + (["sync-round"] if rule == "sync" else [])
    for name in draw(st.lists(st.sampled_from(fields), min_size=1, max_size=2, unique=True)):
        if name == "payload":
            how = draw(st.sampled_from(PAYLOAD_BREAKERS))
            raw = payload[0]
            payload = {"drop": [], "short": [raw[:-4]], "long": [raw + raw[:8]],
                       "odd": [raw[:-draw(st.integers(1, 3))]],
                       "split": [raw[:4], raw[4:]], "extra": [raw, b"\0" * 4]}[how]
        elif name == "sync-round":
            header["round"] = draw(SYNC_ROUNDS)
        elif draw(st.integers(0, 3)) == 0 and name != "round":  # a missing field
            header.pop(name)  # (a missing round means round 0: valid in ASGD)
        else:
            header[name] = draw(PUSH_BREAKERS[name])
            if name == "lengths" and header[name] == [length]:
                header[name] = [length + 1]
    extra = draw(st.dictionaries(st.sampled_from(["stop", "start", "at_round", "junk", "pad"]),
                                 HEADER_VALUES, max_size=2))
    header.update({k: v for k, v in extra.items() if k not in header})
    return header, payload


def check_refused(h: Harness, strategy, identity: bytes) -> None:
    """Each generated request from `identity` is answered with one `error` and changes
    nothing; handle() never raises."""
    @SERVER_SETTINGS
    @given(data=st.data())
    def run(data):
        header, payload = data.draw(strategy)
        answers = h.send(identity, [packed(header), *payload], as_frame=data.draw(st.booleans()))
        assert [a.type for a in answers] == ["error"], (header, [a.header for a in answers])
        assert h.unchanged(), header
    run()


def test_broken_pushes_are_refused_and_change_nothing(harness):
    check_refused(harness, strategy=broken_pushes(harness.rule_name),
                             identity=b"worker-a/kv")
    assert_valid_round_works(harness)


def expected_length(section, offset) -> Optional[int]:
    """The length of the chunk at (section, offset) of the test shard; None: no chunk."""
    size = {0: NUM_WEIGHTS, 1: NUM_BUFFERS}.get(section) if type(section) is int else None
    if size is None or type(offset) is not int or offset < 0 or offset >= size \
            or offset % CHUNK_VALUES:
        return None
    return min(CHUNK_VALUES, size - offset)


@st.composite
def misplaced_chunks(draw, rule: str):
    """Pushes that follow the wire format (lengths, frames and dtype match the payload)
    but whose chunk is not one of the shard's: the server's own layout checks."""
    odd = draw(st.integers(0, 9))  # mostly an integer section and offset
    section = draw(st.sampled_from([0, 1]) if odd > 1 else
                   st.one_of(st.integers(-2, 3), NOT_INTEGERS))
    offset = draw(st.sampled_from([0, CHUNK_VALUES, 2 * CHUNK_VALUES, NUM_WEIGHTS,
                                   NUM_BUFFERS, NUM_WEIGHTS - 1, 1, -1, 2**63, 2**64 - 1])
                  if odd > 4 else st.integers(-2**63, 2**64 - 1) if odd > 0 else NOT_INTEGERS)
    length = draw(st.one_of(st.sampled_from([0, 1, NUM_BUFFERS, NUM_BUFFERS - 1, 1000, 999,
                                             1001, CHUNK_VALUES, CHUNK_VALUES - 1]),
                            st.integers(0, CHUNK_VALUES + 8)))
    if expected_length(section, offset) == length:  # a valid chunk after all: shift it
        length += 1
    header = {"type": "push", "sender": 0, "shard": 0, "round": 1, "section": section,
              "offset": offset, "dtype": "float32", "lengths": [length], "frames": [1]}
    return header, [np.full(length, np.nan, np.float32).tobytes()]


def test_misplaced_chunks_are_refused_and_change_nothing(harness):
    check_refused(harness, strategy=misplaced_chunks(harness.rule_name),
                  identity=b"worker-a/kv")
    assert_valid_round_works(harness)


def test_the_measured_crash_section_one_point_zero(harness):
    """The issue's failure: `section: 1.0` raised TypeError in the server."""
    for section in (1.0, 0.0, True, False, "1", None, [1], {"1": 1}):
        frames = good_push(0, 1, 0, NUM_BUFFERS)
        header = msgpack.unpackb(frames[0])
        header["section"] = section
        answers = harness.send(b"worker-a/kv", [packed(header), bytes(frames[1])])
        assert [a.type for a in answers] == ["error"], section
        assert "section" in answers[0].header["error"]
    assert harness.unchanged()
    assert_valid_round_works(harness)


PULL_BREAKERS = {
    "type": PUSH_BREAKERS["type"],
    "sender": PUSH_BREAKERS["sender"],
    "shard": PUSH_BREAKERS["shard"],
    "round": PUSH_BREAKERS["round"],
    "at_round": st.one_of(NOT_INTEGERS.filter(lambda v: v is not None), NEGATIVE, HUGE),
    "frames": st.sampled_from([[1], [2], [0, 1]]),  # announced, but no payload follows
}


@st.composite
def broken_pulls(draw):
    header = {"type": "pull", "sender": 0, "shard": 0, "round": draw(st.integers(0, 5))}
    for name in draw(st.lists(st.sampled_from(list(PULL_BREAKERS)), min_size=1, max_size=3,
                              unique=True)):
        header[name] = draw(PULL_BREAKERS[name])
    if "frames" in header:
        header.update(dtype="float32", lengths=[1] * len(header["frames"]))
    header.update(draw(st.dictionaries(st.sampled_from(["junk", "start"]),
                                       st.sampled_from([False, 0, "x"]), max_size=1)))
    return header, []


def test_broken_pulls_are_refused(harness):
    check_refused(harness, strategy=broken_pulls(), identity=b"worker-a/kv")
    assert_valid_round_works(harness)


@st.composite
def inits(draw, rule: str):
    """An `init` after the shard was initialised, right or wrong: it may be answered
    `ack` (the same rule: a restored shard keeps its values) or `error`, never applied."""
    rule_header = {"name": rule, "num_workers": 2, "lr": LR}
    for name in draw(st.lists(st.sampled_from(["name", "num_workers", "lr", "momentum",
                                               "weight_decay", "lamda", "whole"]),
                              max_size=2, unique=True)):
        bad = st.one_of(NOT_INTEGERS, NEGATIVE, st.sampled_from(["sync", "async", "esync",
                                                                 "dcasgd", "ddp", "local"]))
        if name == "whole":
            rule_header = draw(MSGPACK_VALUES)
        elif isinstance(rule_header, dict):
            rule_header[name] = draw(bad)
    sizes = draw(st.sampled_from([(NUM_WEIGHTS, NUM_BUFFERS), (5, 0), (0, 0), (3,),
                                  (1, 2, 3), (NUM_WEIGHTS + 1, NUM_BUFFERS)]))
    value = draw(st.sampled_from([float("nan"), 1e30, -7.0]))
    frames = encode({"type": "init", "sender": draw(st.sampled_from([0, 0, 1])), "shard": 0,
                     "rule": rule_header}, [np.full(n, value, np.float32) for n in sizes])
    if draw(st.booleans()):  # and lengths that do not match the frames
        header = msgpack.unpackb(frames[0], strict_map_key=False)
        header["lengths"] = draw(st.one_of(NOT_INTEGERS, st.lists(INTS, max_size=3)))
        frames[0] = packed(header)
    return msgpack.unpackb(frames[0], strict_map_key=False), [bytes(f) for f in frames[1:]]


def test_inits_after_the_first_change_nothing(harness):
    @SERVER_SETTINGS
    @given(data=st.data())
    def run(data):
        header, payload = data.draw(inits(harness.rule_name))
        answers = harness.send(data.draw(st.sampled_from([b"worker-a/kv", b"worker-b/kv"])),
                               [packed(header), *payload])
        assert len(answers) == 1 and answers[0].type in ("ack", "error"), header
        assert harness.unchanged(), header
    run()
    assert_valid_round_works(harness)


def test_broken_inits_leave_a_fresh_server_uninitialised(fresh_harness):
    h = fresh_harness
    h.saved = ()

    @SERVER_SETTINGS
    @given(data=st.data())
    def run(data):
        header, payload = data.draw(inits("sync"))
        answers = h.send(b"worker-a/kv", [packed(header), *payload])
        assert len(answers) == 1, header
        if answers[0].type == "error":
            assert h.server.rule is None and h.server.sections == (), header
        else:  # an init that is right after all (another valid rule or shape): start over
            assert answers[0].type == "ack", answers[0].header
            h.server = h._build()
    run()
    h.init()
    assert_valid_round_works(h)


# --- strangers and the evaluator ----------------------------------------------------------
@st.composite
def any_request(draw, rule: str):
    """Any request at all: valid pushes of NaN and pulls included."""
    choice = draw(st.sampled_from(["good-push", "broken-push", "pull", "broken-pull",
                                   "init", "join", "leave", "random"]))
    if choice == "good-push":
        section, offset, length = draw(st.sampled_from(VALID_KEYS))
        frames = good_push(draw(st.sampled_from([0, 1])), section, offset, length,
                           round_=draw(st.integers(0, 3)), value=float("nan"))
        return msgpack.unpackb(frames[0]), [bytes(frames[1])]
    if choice == "broken-push":
        return draw(broken_pushes(rule))
    if choice == "pull":
        return {"type": "pull", "sender": draw(st.sampled_from([0, 1, EVALUATOR])),
                "shard": 0, "round": draw(st.integers(0, 3)),
                **draw(st.sampled_from([{}, {"start": True}, {"at_round": 2}]))}, []
    if choice == "broken-pull":
        return draw(broken_pulls())
    if choice == "init":
        return draw(inits(rule))
    if choice in ("join", "leave"):
        return {"type": choice, "sender": draw(st.sampled_from([0, 1])), "shard": 0,
                "round": draw(st.integers(0, 3))}, []
    return draw(st.dictionaries(st.text(max_size=6), MSGPACK_VALUES, max_size=5)), \
        draw(st.lists(st.binary(max_size=16), max_size=2))


def test_strangers_get_nothing_and_change_nothing(harness):
    """Requests from sockets the scheduler did not register: never weights, never an
    `ack`, nothing changed (the measured attack: NaN pushes and pulls from outside)."""
    @SERVER_SETTINGS
    @given(data=st.data())
    def run(data):
        header, payload = data.draw(any_request(harness.rule_name))
        identity = data.draw(st.sampled_from([b"stranger/kv", b"no-slash-at-all", b""]))
        answers = harness.send(identity, [packed(header), *payload],
                               as_frame=data.draw(st.booleans()))
        assert all(a.type == "error" for a in answers), (header, [a.header for a in answers])
        assert len(answers) <= 1
        assert harness.unchanged(), header
        assert harness.state() == harness.saved_state, header
    run()
    assert_valid_round_works(harness)


def test_the_evaluator_may_only_pull(harness):
    @SERVER_SETTINGS
    @given(data=st.data())
    def run(data):
        header, payload = data.draw(any_request(harness.rule_name))
        assume(header.get("type") != "pull")
        answers = harness.send(b"evaluator-c/kv", [packed(header), *payload])
        assert [a.type for a in answers] == ["error"], (header, [a.header for a in answers])
        assert harness.unchanged(), header
    run()
    answers = harness.send(b"evaluator-c/kv", encode({"type": "pull", "sender": EVALUATOR,
                                                      "shard": 0}))
    assert answers and all(a.type == "weights" for a in answers)
    assert_valid_round_works(harness)


def test_the_evaluator_is_told_when_the_model_s_round_was_done(harness):
    """Answers carry the training clock (`age`) and the clock when the shard's model was
    last updated (`round_age`): a pull that comes after a round's end reads that round's
    model, whose training time is the round's end, not the pull's (the evaluator logs
    it as the model's time)."""
    start = encode({"type": "pull", "sender": 0, "shard": 0, "start": True})
    harness.send(b"worker-a/kv", start)
    assert_valid_round_works(harness)
    done = harness.server.round_age
    assert done > 0.0
    harness.server.started_at -= 10.0  # ten seconds of training pass, no round ends
    answers = harness.send(b"evaluator-c/kv", encode({"type": "pull", "sender": EVALUATOR,
                                                      "shard": 0}))
    assert answers and all(a.type == "weights" for a in answers)
    for a in answers:
        assert a.header["round_age"] == round(done, 6) and a.header["age"] >= done + 10.0


def test_a_refused_pull_does_not_end_the_job(harness):
    """A pull that is refused (a bad round) must not take its `stop` either: a rejected
    message changes nothing."""
    answers = harness.send(b"worker-a/kv", [packed({"type": "pull", "sender": 0, "shard": 0,
                                                    "round": 1.0, "stop": "attacker"})])
    assert [a.type for a in answers] == ["error"]
    assert harness.server.stop_reason is None
    assert_valid_round_works(harness)
    assert harness.server.stop_reason is None


def test_a_stranger_is_asked_about_once(harness):
    """A stranger's requests do not each cost a question to the scheduler."""
    before = len(harness.asked)
    for _ in range(5):
        harness.send(b"stranger/kv", encode({"type": "pull", "sender": 0, "shard": 0}))
    assert harness.asked[before:].count(b"stranger/kv") <= 1


def test_odd_numbers_in_every_push_field_are_refused(harness):
    """Values msgpack can carry that Python compares oddly (NaN != NaN, -0.0 == 0,
    True == 1, 1.0 == 1, big unsigned ints) in every field a push has."""
    odd = [float("nan"), -0.0, 0.0, 1.0, True, False, 2**64 - 1, -2**63,
           struct.unpack("<d", struct.pack("<Q", 0x7ff8000000000001))[0], math.inf]
    for name in ("sender", "shard", "round", "section", "offset", "lengths", "frames"):
        for value in odd:
            frames = good_push(0, 1, 0, NUM_BUFFERS)
            header = msgpack.unpackb(frames[0])
            header[name] = [value] if name in ("lengths", "frames") else value
            if name in ("lengths", "frames") and value in (1, NUM_BUFFERS) \
                    and type(value) is int:
                continue
            answers = harness.send(b"worker-a/kv", [packed(header), bytes(frames[1])])
            assert [a.type for a in answers] == ["error"], (name, value)
    assert harness.unchanged()
    assert_valid_round_works(harness)
