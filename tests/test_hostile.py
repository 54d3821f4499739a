"""Replays, against real live jobs, of the failures an attacker on the job's network
caused (the issue's measurements): each must now leave the job running to a normal end.

(a) `register` with a map or a list as `role`: the scheduler died of `TypeError`.
(b) `push` with `section: 1.0`: the server raised `TypeError` and the job was aborted.
(c) well-formed NaN pushes from a socket that never registered: ASGD's accuracy fell
    from 0.98 to 0.08, SSGD's rounds were corrupted and the job aborted; and a `pull`
    from such a socket returned the full weights.
(d) 2,000 heartbeats with unique 60 KB sender names: the scheduler grew by 118 MB.
(e) with a job key (ESYNC_JOB_KEY), a socket without it cannot connect at all: it gets
    no answer and changes nothing.

Each job is small (lenet on digits, two workers, one server, one thread each) and the
attacker is this test process.
"""
from __future__ import annotations

import os
import re
import secrets
import socket
import time
from typing import List, Optional

import msgpack
import numpy as np
import pytest
import zmq

from esync.comm.flat import floating_buffers, trainable
from esync.comm.kvstore import shard_bounds
from esync.models import build_network
from esync.transport.auth import Guard, JobKey, new_key
from esync.transport.cluster import ClusterEnv
from esync.transport.message import Message, MessageError, chunk_spans, decode, encode
from esync.transport.node import Node
from tests.cluster import Cluster

pytestmark = pytest.mark.slow  # whole clusters of real processes

HEARTBEAT_TIMEOUT = 3.0
ANSWERS = ("error", "weights", "ack", "assign", "barrier_done", "member", "abort",
           "shutdown", "left", "servers")


def job_args(mode: str, *more: str) -> List[str]:
    return ["-m", mode, "-n", "lenet", "--num-threads", "1", "--epochs", "5", "-e", "5",
            *more]


def packed(header) -> bytes:
    return msgpack.packb(header, use_bin_type=True)


def scheduler_address(job: Cluster) -> str:
    return f"tcp://127.0.0.1:{job.env['DMLC_PS_ROOT_PORT']}"


def server_address(job: Cluster) -> str:
    """Where server 0 serves, as the scheduler logs it when the server registers."""
    job.wait_for_output("scheduler", "serving at tcp://")
    return re.search(r"server registered: .*serving at (tcp://\S+)",
                     job.output("scheduler")).group(1)


def lenet_sizes() -> tuple:
    """What a worker pushes: lenet's trainable values and floating buffer values."""
    model = build_network("lenet")
    return (sum(p.numel() for p in trainable(model)),
            sum(b.numel() for _, _, b in floating_buffers(model)))


def shard_sizes(job: Cluster) -> tuple:
    """(weights, buffers) of server 0's shard, once worker 0 initialised it; checked
    against what a worker of a one-server job pushes."""
    job.wait_for_output("server0", "shard of ")
    found = tuple(map(int, re.search(r"shard of (\d+) weights and (\d+) buffer values",
                                     job.output("server0")).groups()))
    params, buffers = lenet_sizes()
    (p0, p1), = shard_bounds(params, 1)
    (b0, b1), = shard_bounds(buffers, 1)
    assert found == (p1 - p0, b1 - b0)
    return found


def final_accuracy(job: Cluster) -> float:
    """The last test accuracy worker 0 (the one that evaluates) logged."""
    for w in range(job.num_workers):
        if "test accuracy 0" in job.output(f"worker{w}"):
            accuracy = [r["accuracy"] for r in job.rounds(w) if "accuracy" in r]
            assert accuracy, job.output(f"worker{w}")[-2000:]
            return accuracy[-1]
    raise AssertionError("no worker evaluated")


def assert_clean_end(job: Cluster, timeout: float = 60) -> None:
    codes = job.wait(timeout)
    assert codes == {name: 0 for name in job.procs}, \
        {n: job.output(n)[-1500:] for n, c in codes.items() if c != 0}


def workers_running(job: Cluster) -> bool:
    return any(p.poll() is None for n, p in job.procs.items() if n.startswith("worker"))


class Attacker:
    """Sockets of an outsider in this process; `key` makes them CurveZMQ clients with
    the job key (an insider that holds the key but never registered)."""

    def __init__(self, key: Optional[str] = None):
        self.context = zmq.Context()
        self.guard = Guard(self.context, JobKey.parse(key, "test") if key else None)
        self.sockets: List[zmq.Socket] = []

    def dealer(self, address: str, identity: Optional[bytes] = None) -> zmq.Socket:
        sock = self.guard.connect(self.context.socket(zmq.DEALER))
        if identity is not None:
            sock.setsockopt(zmq.IDENTITY, identity)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 100)
        sock.connect(address)
        self.sockets.append(sock)
        return sock

    def close(self) -> None:
        for sock in self.sockets:
            sock.close(linger=0)
        self.context.term()

    def __enter__(self) -> "Attacker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def answer(sock: zmq.Socket, timeout_ms: int, node: Optional[Node] = None) \
        -> Optional[Message]:
    """The next answer on `sock` within `timeout_ms`, decoded; None if none came. With
    `node` (a node of the job in this process), JobAborted as soon as the job is aborted
    (before the node's watchdog would end this process)."""
    deadline = time.monotonic() + timeout_ms / 1000
    while not sock.poll(min(100, timeout_ms)):
        if node is not None:
            node.check()
        if time.monotonic() >= deadline:
            return None
    frames = sock.recv_multipart()
    try:
        return decode(frames, ANSWERS)
    except MessageError as e:
        raise AssertionError(f"a malformed answer: {e}: {frames[:1]}") from None


def ask(sock: zmq.Socket, frames: list, timeout_ms: int = 10000,
        node: Optional[Node] = None) -> Message:
    sock.send_multipart(frames)
    got = answer(sock, timeout_ms, node)
    assert got is not None, f"no answer to {frames[:1]}"
    return got


def nan_push(sender, round_: int, section: int, offset: int, length: int) -> list:
    return encode({"type": "push", "sender": sender, "shard": 0, "round": round_,
                   "section": section, "offset": offset},
                  [np.full(length, np.nan, np.float32)])


# --- (a) --------------------------------------------------------------------------------
BAD_REGISTRATIONS = [
    {"role": {"worker": 1}}, {"role": ["worker"]}, {"role": {}}, {"role": []},
    {"role": [["server"]]}, {"role": {"role": "server"}},
    {"role": "worker", "settings": {"-m": 1}}, {"role": "worker", "settings": ["-m"]},
    {"role": "worker", "settings": {"-m": "x" * 300}},
    {"role": "worker", "settings": {f"k{i}": "v" for i in range(40)}},
    {"role": "server", "host": {"h": 1}, "port": [1]},
    {"role": "server", "host": "127.0.0.1", "port": 1.5},
    {"role": "worker", "pid": {"p": 1}, "hostname": ["h"], "device": {"d": 1}},
    {"role": "server", "host": "127.0.0.1", "port": 1, "checkpoints": {"0": {"a": 1}}},
    {"role": "server", "host": "127.0.0.1", "port": 1, "checkpoints": [[0]]},
]


def test_register_with_a_map_or_list_role_leaves_the_scheduler_running(tmp_path):
    with Cluster(tmp_path, 1, 2, heartbeat_timeout=HEARTBEAT_TIMEOUT) as job, \
            Attacker() as attacker:
        job.start_all(job_args("sync"))
        sock = attacker.dealer(scheduler_address(job))
        server_address(job)  # before the job is complete: while it gathers its nodes
        for n, fields in enumerate(BAD_REGISTRATIONS):
            reply = ask(sock, [packed({"type": "register", "sender": f"evil-{n}",
                                       "pid": 1, **fields})])
            assert reply.type == "error", (fields, reply.header)
        job.wait_for_output("scheduler", "ranks assigned")  # and while it trains
        for n, fields in enumerate(BAD_REGISTRATIONS):
            reply = ask(sock, [packed({"type": "register", "sender": f"evil-late-{n}",
                                       "pid": 1, **fields})])
            assert reply.type == "error", (fields, reply.header)
        for header in ({"type": "barrier", "sender": "x", "group": {"g": 1}},
                       {"type": "who", "sender": "x", "uid": ["u"]},
                       {"type": "finished", "sender": {"s": 1}},
                       {"type": {"t": 1}, "sender": "x"}):
            assert ask(sock, [packed(header)]).type == "error", header
        assert_clean_end(job)
        assert final_accuracy(job) >= 0.9


# --- (b) --------------------------------------------------------------------------------
def test_push_with_section_one_point_zero_leaves_the_job_running(tmp_path):
    """From a stranger (refused as one) and from a registered worker's own socket (the
    issue's case: refused for its section), the job goes on and ends normally."""
    with Cluster(tmp_path, 1, 2, heartbeat_timeout=HEARTBEAT_TIMEOUT) as job, \
            Attacker() as attacker:
        job.start("scheduler", "scheduler")
        job.start("server0", "server")
        job.start("worker0", "worker", [*job_args("async"), "--device-name", "w0",
                                        "-ld", job.log_dir])
        address = server_address(job)
        job.wait_for_output("scheduler", "worker registered")  # the real one is worker 0
        env = {k: v for k, v in job.env.items() if k.startswith(("DMLC_", "PS_"))}
        node = Node(ClusterEnv.from_environ({**env, "DMLC_ROLE": "worker"}), "worker")
        try:  # worker 1 is this process: it registers, then pushes nonsense
            assignment = node.register(device="w1")
            assert assignment["rank"] == 1
            node.barrier("workers")  # worker 0 initialised the shard: training starts
            weights, buffers = shard_sizes(job)
            insider = node.context.socket(zmq.DEALER)
            insider.setsockopt(zmq.IDENTITY, f"{node.uid}/raw".encode())
            insider.setsockopt(zmq.LINGER, 0)
            insider.connect(address)
            stranger = attacker.dealer(address)
            for section in (1.0, 0.0, True, "1", None, [1], {"1": 1}, -0.0, float("nan")):
                for sock, sender in ((insider, 1), (stranger, 0)):
                    frames = nan_push(sender, 1, 1, 0, buffers)
                    header = msgpack.unpackb(frames[0])
                    header["section"] = section
                    reply = ask(sock, [packed(header), bytes(frames[1])], node=node)
                    assert reply.type == "error", (section, reply.header)
            # the shard still serves this (registered) worker, with finite weights
            reply = ask(insider, [packed({"type": "pull", "sender": 1, "shard": 0})],
                        node=node)
            assert reply.type == "weights"
            assert np.isfinite(reply.sections()[0][0][1]).all()
            insider.close(linger=0)
            node.finish()
        finally:
            node.close()
        assert_clean_end(job)
        assert "section" in job.output("server0")  # the refusals were logged


# --- (c) --------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_nan_pushes_from_an_unregistered_socket_change_nothing(tmp_path, mode):
    with Cluster(tmp_path, 1, 2, heartbeat_timeout=HEARTBEAT_TIMEOUT) as job, \
            Attacker() as attacker:
        job.start_all(job_args(mode))
        address = server_address(job)
        weights, buffers = shard_sizes(job)  # training starts
        chunks = [(0, o, n) for o, n in chunk_spans(weights)] + \
                 [(1, o, n) for o, n in chunk_spans(buffers)]
        host = socket.gethostname()
        pids = [job.procs[f"worker{w}"].pid for w in range(2)]
        sockets = [attacker.dealer(address),  # ZeroMQ's own random identity
                   attacker.dealer(address, b"stranger/kv"),
                   # what a worker's identity looks like, but for its random part
                   *(attacker.dealer(address, f"worker-{host}-{pid}-"
                                              f"{secrets.token_hex(3)}/kv".encode())
                     for pid in pids)]
        pushes = pulls = answered = 0
        round_ = 0
        while workers_running(job) or pushes < 20:
            round_ += 1
            sock = sockets[round_ % len(sockets)]
            if round_ % 7 == 0:
                sock.send_multipart([packed({"type": "pull", "sender": round_ % 2,
                                             "shard": 0, "round": round_ % 50})])
                pulls += 1
            else:
                section, offset, length = chunks[round_ % len(chunks)]
                sock.send_multipart(nan_push(round_ % 2, round_ % 50, section, offset,
                                             length))
                pushes += 1
            got = answer(sock, 200)
            if got is not None:
                answered += 1
                assert got.type == "error", got.header  # never weights, never ack
            if not workers_running(job) and pushes >= 20:
                break
            assert round_ < 100000
        for sock in sockets:  # whatever came later: still never weights
            while (got := answer(sock, 0)) is not None:
                assert got.type == "error", got.header
        assert_clean_end(job)
        accuracy = final_accuracy(job)
        assert accuracy >= 0.9, (accuracy, pushes, pulls, answered)
        assert "aborting" not in job.output("scheduler")


# --- (d) --------------------------------------------------------------------------------
def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_heartbeats_with_huge_unique_senders_keep_the_scheduler_small(tmp_path):
    with Cluster(tmp_path, 1, 2, heartbeat_timeout=HEARTBEAT_TIMEOUT) as job, \
            Attacker() as attacker:
        job.start("scheduler", "scheduler")
        job.start("server0", "server")
        server_address(job)  # the scheduler listens and waits for the workers
        pid = job.procs["scheduler"].pid
        sockets = [attacker.dealer(scheduler_address(job)) for _ in range(4)]

        def handled() -> None:
            """Until the scheduler has handled everything sent: an answer behind all of
            them on each socket (a heartbeat's is an ack, this one an error)."""
            for sock in sockets:
                reply = ask(sock, [b"\xc1 not msgpack"], timeout_ms=30000)
                while reply.type != "error":
                    reply = answer(sock, 30000)
                    assert reply is not None, "the scheduler stopped answering"

        def flood(count: int, tag: str) -> None:
            # 100 at a time, each lot handled before the next: what the scheduler keeps,
            # not how many messages its queue holds while it falls behind (on a loaded
            # machine, unpaced, up to 2000 of 60 KB: 64 MB more in one CI run)
            for n in range(count):
                name = f"{tag}-{n}-".ljust(60_000, "x")
                sockets[n % len(sockets)].send_multipart(
                    [packed({"type": "heartbeat", "sender": name})])
                if n % 100 == 99:
                    handled()
            handled()

        flood(200, "warm")  # the allocator's working set for messages of this size
        before = rss_mb(pid)
        flood(2000, "flood")
        after = rss_mb(pid)
        assert after - before < 30, (before, after)
        assert job.procs["scheduler"].poll() is None
        for w in range(2):
            job.start(f"worker{w}", "worker", [*job_args("sync", "--max-rounds", "10"),
                                               "--device-name", f"w{w}", "-ld", job.log_dir])
        assert_clean_end(job)


# --- (e) --------------------------------------------------------------------------------
def test_with_a_job_key_a_socket_without_it_gets_nothing_through(tmp_path):
    key = new_key()
    with Cluster(tmp_path, 1, 2, heartbeat_timeout=HEARTBEAT_TIMEOUT,
                 env={"ESYNC_JOB_KEY": key}) as job, \
            Attacker() as outsider, Attacker(key) as insider:
        job.start_all(job_args("async"))
        address = server_address(job)
        assert "job key required" in job.output("scheduler")
        weights, buffers = shard_sizes(job)  # training starts
        blind = [outsider.dealer(address), outsider.dealer(address, b"stranger/kv"),
                 outsider.dealer(scheduler_address(job))]
        garbage = [[b"\xc1"], [os.urandom(64)], nan_push(0, 1, 0, 0, weights),
                   nan_push(1, 2, 1, 0, buffers),
                   [packed({"type": "pull", "sender": 0, "shard": 0})],
                   [packed({"type": "register", "sender": "x", "role": {"a": 1}})],
                   [packed({"type": "heartbeat", "sender": "x" * 60_000})]]
        for sock in blind:
            for frames in garbage:
                try:
                    sock.send_multipart(frames, flags=zmq.NOBLOCK)
                except zmq.Again:  # not even queued: the handshake never completes
                    pass
        # an insider with the key but not registered is refused: the server is there
        keyed = insider.dealer(address)
        reply = ask(keyed, nan_push(0, 1, 0, 0, weights))
        assert reply.type == "error", reply.header
        reply = ask(keyed, [packed({"type": "pull", "sender": 0, "shard": 0})])
        assert reply.type == "error"
        # ...while the sockets without the key never hear anything
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            for sock in blind:
                assert answer(sock, 50) is None, "a socket without the job key got an answer"
        assert_clean_end(job)
        assert final_accuracy(job) >= 0.9
