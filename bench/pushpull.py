"""Push/pull cost of the parameter-server runtime against bare ZeroMQ, in one run.

    python bench/pushpull.py [--mb 44.7] [--rounds 10] [--workers 1,2,4] [--servers 1,2]

(a) One synchronous round (every worker pushes its gradient, the servers average and
    apply SGD, every worker receives the new weights) of a model of --mb megabytes
    (44.7 MB = ResNet-18 in fp32), through the real scheduler, servers and KVStore, for
    each number of workers and servers.
(b) The same bytes moved by bare ZeroMQ in the same topology, no header, validation,
    arithmetic or copies, two ways:
    echo:   each worker sends its shard to each server as one multipart message (frames
            of the framework's chunk size); the server waits for all workers' messages
            and sends each its shard back.
    stream: as the framework does, each worker streams its shard as one message per
            chunk; the server echoes chunk k to every worker once all of them sent it.
    The ratios (a)/(b) are what the framework costs on top of moving the bytes.
(c) ASGD push+pull latency per iteration for small models (LeNet's 62,610 values and
    1,000 values), one worker and one server.

Each worker process times its own rounds; a run's figure is the mean over workers of
their median round, and a configuration is run --repeats times (framework and baselines
interleaved) and shown as the median of its runs. Every process runs with one torch/OMP
thread.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time

import numpy as np
import zmq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from esync.transport.message import CHUNK_VALUES  # noqa: E402

WARMUP = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _timed(procs, out, workers: int) -> float:
    """Run the processes; the mean over workers of their median round. None outlives it."""
    for p in procs:
        p.start()
    try:
        medians = [statistics.median(out.get(timeout=600)) for _ in range(workers)]
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
    return statistics.mean(medians)


# --- (a) the framework ------------------------------------------------------------------
def _env(port: int, servers: int, workers: int, role: str) -> dict:
    return {"DMLC_ROLE": role, "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(port),
            "DMLC_NUM_SERVER": str(servers), "DMLC_NUM_WORKER": str(workers),
            "PS_HEARTBEAT_TIMEOUT": "60"}


def _framework_node(env: dict, values: int, rounds: int, rule: str, out) -> None:
    os.environ.update(env, OMP_NUM_THREADS="1")
    from esync.transport.cluster import ClusterEnv

    cluster = ClusterEnv.from_environ()
    quiet = lambda line: None  # noqa: E731
    if cluster.role == "scheduler":
        from esync.transport.scheduler import Scheduler

        Scheduler(cluster, log=quiet).run()
        return
    from esync.transport.node import Node

    node = Node(cluster, cluster.role, log=quiet)
    try:
        if cluster.role == "server":
            from esync.server import run_server

            run_server(node, log=quiet)
            return
        from esync.kvstore import KVStore

        assignment = node.register(mode=rule, network="bench")
        rank, workers = assignment["rank"], assignment["num_workers"]
        params = np.random.default_rng(rank).random(values, dtype=np.float32)
        buffers = np.zeros(0, np.float32)
        grads = np.full(values, 1e-6, np.float32)
        kv = KVStore(node, assignment["servers"], rank, values, 0)
        if rank == 0:
            kv.init({"name": rule, "num_workers": workers, "lr": 0.1, "momentum": 0.9},
                    params, buffers)
        else:
            kv.pull(params, buffers)
        node.barrier()
        times = []
        for r in range(1, rounds + WARMUP + 1):
            start = time.perf_counter()
            kv.push_pull(r, grads, buffers, params, buffers)
            times.append(time.perf_counter() - start)
        out.put(times[WARMUP:])
        kv.close()
        node.finish()
    finally:
        node.close()


def framework_round(values: int, workers: int, servers: int, rounds: int,
                    rule: str = "sync") -> float:
    ctx = mp.get_context("spawn")
    out, port = ctx.Queue(), free_port()
    roles = ["scheduler"] + ["server"] * servers + ["worker"] * workers
    procs = [ctx.Process(target=_framework_node,
                         args=(_env(port, servers, workers, role), values, rounds, rule, out))
             for role in roles]
    return _timed(procs, out, workers)


# --- (b) bare ZeroMQ ----------------------------------------------------------------------
def _chunks(array: np.ndarray):
    return [memoryview(array[i:i + CHUNK_VALUES]) for i in range(0, len(array), CHUNK_VALUES)]


def _bare_server(port: int, workers: int, chunks: int, rounds: int) -> None:
    """Echo chunk k to every worker once all of them have sent their k-th chunk: the same
    messages and the same pipelining as the framework, minus headers and arithmetic."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(f"tcp://127.0.0.1:{port}")
    for _ in range(rounds + WARMUP):
        received: dict = {}
        for _ in range(workers * chunks):
            ident, frame = sock.recv_multipart(copy=False)
            k = received.setdefault(ident.bytes, [])
            k.append(frame)
            index = len(k) - 1
            if all(len(v) > index for v in received.values()) and len(received) == workers:
                for peer, frames in received.items():
                    sock.send_multipart([peer, frames[index]], copy=False)
    sock.close(linger=1000)
    ctx.term()


def _bare_echo_server(port: int, workers: int, chunks: int, rounds: int) -> None:
    """Wait for every worker's whole shard (one multipart message), echo it back."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(f"tcp://127.0.0.1:{port}")
    for _ in range(rounds + WARMUP):
        arrived = [sock.recv_multipart(copy=False) for _ in range(workers)]
        for ident, *frames in arrived:
            sock.send_multipart([ident, *frames], copy=False)
    sock.close(linger=1000)
    ctx.term()


def _bare_worker(ports, values: int, rounds: int, out, streamed: bool = True) -> None:
    ctx = zmq.Context()
    socks = []
    for port in ports:
        s = ctx.socket(zmq.DEALER)
        s.connect(f"tcp://127.0.0.1:{port}")
        socks.append(s)
    bounds = np.linspace(0, values, len(ports) + 1).astype(int)
    data = np.full(values, 1e-6, np.float32)
    shards = [_chunks(data[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    times = []
    for _ in range(rounds + WARMUP):
        start = time.perf_counter()
        for s, chunks in zip(socks, shards):
            if streamed:
                for chunk in chunks:
                    s.send(chunk, copy=False)
            else:
                s.send_multipart(chunks, copy=False)
        for s, chunks in zip(socks, shards):
            for _ in (chunks if streamed else chunks[:1]):
                s.recv_multipart(copy=False)
        times.append(time.perf_counter() - start)
    out.put(times[WARMUP:])
    for s in socks:
        s.close(linger=0)
    ctx.term()


def bare_round(values: int, workers: int, servers: int, rounds: int,
               streamed: bool = True) -> float:
    ctx = mp.get_context("spawn")
    out, ports = ctx.Queue(), [free_port() for _ in range(servers)]
    bounds = np.linspace(0, values, servers + 1).astype(int)
    chunks = [len(range(0, b - a, CHUNK_VALUES)) for a, b in zip(bounds[:-1], bounds[1:])]
    server = _bare_server if streamed else _bare_echo_server
    procs = [ctx.Process(target=server, args=(p, workers, n, rounds))
             for p, n in zip(ports, chunks)]
    procs += [ctx.Process(target=_bare_worker, args=(ports, values, rounds, out, streamed))
              for _ in range(workers)]
    return _timed(procs, out, workers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=44.7, help="model size in MB (fp32)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--servers", default="1,2")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of each configuration, interleaved; the median is shown")
    args = parser.parse_args()
    values = int(args.mb * 1e6 / 4)
    print(f"(a)/(b) one synchronous round of a {args.mb} MB model, median of {args.rounds} "
          f"rounds, mean over workers")
    print(f"{'workers':>7} {'servers':>7} {'esync ms':>9} {'echo ms':>8} {'ratio':>6} "
          f"{'stream ms':>9} {'ratio':>6}")
    for w in map(int, args.workers.split(",")):
        for s in map(int, args.servers.split(",")):
            runs = [(framework_round(values, w, s, args.rounds),
                     bare_round(values, w, s, args.rounds, streamed=False),
                     bare_round(values, w, s, args.rounds, streamed=True))
                    for _ in range(args.repeats)]
            ours, echo, stream = (statistics.median(column) for column in zip(*runs))
            print(f"{w:>7} {s:>7} {ours * 1e3:>9.1f} {echo * 1e3:>8.1f} {ours / echo:>6.2f} "
                  f"{stream * 1e3:>9.1f} {ours / stream:>6.2f}", flush=True)
    print("(c) ASGD push+pull latency per iteration, 1 worker, 1 server")
    for small in (62610, 1000):
        ours = framework_round(small, 1, 1, 200, rule="async")
        bare = bare_round(small, 1, 1, 200, streamed=False)
        print(f"{small:>9} values ({small * 4 / 1e3:.0f} KB): esync {ours * 1e3:.3f} ms, "
              f"bare zmq echo {bare * 1e3:.3f} ms, ratio {ours / bare:.2f}", flush=True)


if __name__ == "__main__":
    main()
