"""A live server and scheduler answer or drop malformed messages and keep serving."""
import msgpack
import numpy as np
import pytest
import zmq

from esync.comm.kvstore import KVStore
from esync.transport.cluster import ClusterEnv
from esync.transport.message import decode
from esync.transport.node import Node
from tests.cluster import Cluster

pytestmark = pytest.mark.slow  # whole clusters of real processes

WEIGHTS = np.linspace(-1, 1, 1000).astype(np.float32)
BUFFERS = np.arange(6, dtype=np.float32)


def _push(round_=1, section=0, offset=0, length=1000, dtype="float32", shard=0, sender=0,
          payload=None, **extra):
    header = {"type": "push", "sender": sender, "shard": shard, "round": round_,
              "section": section, "offset": offset, "dtype": dtype, "lengths": [length],
              "frames": [1], **extra}
    return [msgpack.packb(header), payload if payload is not None else b"\1\0\0\0" * length]


BEFORE_INIT = [
    ([b"\x92\xc1"], "not valid msgpack"),
    ([msgpack.packb({"type": "delete", "sender": 0})], "unknown message type 'delete'"),
    ([msgpack.packb({"type": "pull", "sender": 0, "shard": 5})], "shard 5 does not exist"),
    ([msgpack.packb({"type": "pull", "sender": 7, "shard": 0})], "sender 7 is worker 0"),
    (_push(), "push before init"),
]
AFTER_INIT = [
    (_push(length=999), "chunk of 999 values at offset 0 of section 0 does not fit"),
    (_push(section=1, offset=4, length=2), "does not fit the shard's 6 values"),
    (_push(section=2, length=6), "with 'section' 0 or 1"),
    (_push(dtype="float64"), "dtype 'float64', only float32"),
    (_push(round_=5), "push for round 5, but the current round is 1"),
    (_push(payload=b"\0" * 3996), "its frames hold 3996 bytes"),
    ([msgpack.packb({"type": "init", "sender": 0, "shard": 0})], "already initialised"),
    (_push(round_=None), "field 'round' must be an integer"),
    (_push(section=1.0, length=6), "with 'section' 0 or 1"),
    ([msgpack.packb({"type": "push", "sender": 0, "shard": 0, "round": 1})], "one chunk"),
]


def _ask(sock, frames):
    sock.send_multipart(frames)
    assert sock.poll(5000), "the server did not answer"
    return decode(sock.recv_multipart(), ("error", "weights", "ack"))


def test_server_and_scheduler_survive_malformed_messages(tmp_path):
    with Cluster(tmp_path, num_servers=1, num_workers=1) as job:
        job.start("scheduler", "scheduler")
        job.start("server0", "server")
        env = {k: v for k, v in job.env.items() if k.startswith(("DMLC_", "PS_"))}
        node = Node(ClusterEnv.from_environ({**env, "DMLC_ROLE": "worker"}), "worker")
        try:
            assignment = node.register()
            # garbage to the scheduler: it must drop it and go on (node.finish below)
            junk = node.context.socket(zmq.DEALER)
            junk.setsockopt(zmq.LINGER, 1000)
            junk.connect(node.env.scheduler_address)
            junk.send_multipart([b"\xff\xfe not msgpack"])
            assert junk.poll(5000), "the scheduler did not answer the garbage"
            assert "not valid msgpack" in decode(junk.recv_multipart(), ("error",)).header["error"]
            junk.send_multipart([msgpack.packb({"type": "register", "sender": "x", "role": "king"})])
            assert junk.poll(5000), "the scheduler did not answer the bad registration"
            assert "unknown role 'king'" in decode(junk.recv_multipart(), ("error",)).header["error"]
            # a socket of this registered worker's node ("<node id>/<socket name>")
            raw = node.context.socket(zmq.DEALER)
            raw.setsockopt(zmq.IDENTITY, f"{node.uid}/raw".encode())
            raw.connect(assignment["servers"][0])
            stranger = node.context.socket(zmq.DEALER)
            stranger.connect(assignment["servers"][0])
            for frames in ([msgpack.packb({"type": "pull", "sender": 0, "shard": 0})],
                           _push()):
                answer = _ask(stranger, frames)
                assert answer.type == "error" and "not a member" in answer.header["error"]
            for frames, problem in BEFORE_INIT:
                answer = _ask(raw, frames)
                assert answer.type == "error" and problem in answer.header["error"]

            kv = KVStore(node, assignment["servers"], 0, len(WEIGHTS), len(BUFFERS))
            kv.init({"name": "sync", "num_workers": 1, "lr": 0.5}, WEIGHTS, BUFFERS)
            for frames, problem in AFTER_INIT:
                answer = _ask(raw, frames)
                assert answer.type == "error" and problem in answer.header["error"], answer.header
            params, buffers = np.zeros_like(WEIGHTS), np.zeros_like(BUFFERS)
            kv.pull(params, buffers)
            np.testing.assert_array_equal(params, WEIGHTS)  # nothing bad was applied
            np.testing.assert_array_equal(buffers, BUFFERS)
            kv.push_pull(1, np.ones_like(WEIGHTS), BUFFERS * 2, params, buffers)
            np.testing.assert_allclose(params, WEIGHTS - 0.5)  # and good pushes still work
            np.testing.assert_array_equal(buffers, BUFFERS * 2)
            kv.close()
            junk.close()
            raw.close()
            stranger.close()
            node.finish()
        finally:
            node.close()
        codes = job.wait(30)
        assert codes == {"scheduler": 0, "server0": 0}, job.output("server0")
        assert "rejected a message" in job.output("server0")
        assert "dropped a malformed message" in job.output("scheduler")
