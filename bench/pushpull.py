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

Every node is a child process, `python bench/pushpull.py --node KIND ...`, started and
stopped by launch.supervisor: the scheduler and the bare servers bind free ports and
report them (esync.infra.ready), and each worker writes its round times to a JSON file. A
node that fails ends the measurement with its log's last line.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import List, Sequence

import numpy as np
import zmq

from esync.infra import ready
from esync.transport.auth import Guard
from esync.transport.message import CHUNK_VALUES
from nodes import NodeRun, cluster_node

WARMUP = 2
TIMEOUT_S = 600.0
SCRIPT = os.path.abspath(__file__)


# --- the parent: start the nodes, collect their times ------------------------------------
def framework_round(values: int, workers: int, servers: int, rounds: int,
                    rule: str = "sync") -> float:
    """(a): the mean over workers of their median round through the real runtime."""
    args = ["--values", str(values), "--rounds", str(rounds), "--rule", rule]
    with NodeRun(SCRIPT, "esync-pushpull-", TIMEOUT_S) as run:
        env = run.start_job(servers, workers)
        for w in range(workers):
            run.start(f"worker{w}", "worker", args, result=True, env=env)
        return statistics.mean(statistics.median(r) for r in run.results_after_wait())


def bare_round(values: int, workers: int, servers: int, rounds: int,
               streamed: bool = True, key: str = "") -> float:
    """(b): the same bytes through bare ZeroMQ, echoed (one message) or streamed; with a
    job `key`, every byte encrypted (CurveZMQ) and every peer admitted as a job's are."""
    secrecy = {"ESYNC_JOB_KEY": key, "ESYNC_JOB_KEY_FILE": ""}
    bounds = np.linspace(0, values, servers + 1).astype(int)
    chunks = [len(range(0, b - a, CHUNK_VALUES)) for a, b in zip(bounds[:-1], bounds[1:])]
    kind = "bare-stream-server" if streamed else "bare-echo-server"
    with NodeRun(SCRIPT, "esync-pushpull-", TIMEOUT_S) as run:
        started = [run.start(f"server{s}", kind, ["--workers", str(workers), "--chunks",
                                                  str(n), "--rounds", str(rounds)],
                             env=secrecy, ready_=True)
                   for s, n in enumerate(chunks)]
        ports = ",".join(str(run.port(child)) for child in started)
        for w in range(workers):
            run.start(f"worker{w}", "bare-worker",
                      ["--ports", ports, "--values", str(values), "--rounds", str(rounds),
                       *([] if streamed else ["--echo"])], env=secrecy, result=True)
        return statistics.mean(statistics.median(r) for r in run.results_after_wait())


# --- the nodes ------------------------------------------------------------------------------
def _write_result(path: str, times: List[float]) -> None:
    with open(path, "w") as f:
        json.dump(times[WARMUP:], f)


def _framework_worker(values: int, rounds: int, rule: str, result: str) -> None:
    from esync.comm.kvstore import KVStore
    from esync.transport.cluster import ClusterEnv
    from esync.transport.node import Node

    with Node(ClusterEnv.from_environ(), "worker") as node:
        assignment = node.register()
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
        _write_result(result, times)
        kv.close()
        node.finish()


def _chunks(array: np.ndarray):
    return [memoryview(array[i:i + CHUNK_VALUES]) for i in range(0, len(array), CHUNK_VALUES)]


def _bound_router():
    """A ROUTER socket on a free loopback port, reported to the supervisor; a CURVE
    server of the job key, if ESYNC_JOB_KEY names one."""
    ctx = zmq.Context()
    guard = Guard.from_environ(ctx, warn=False)
    sock = guard.serve(ctx.socket(zmq.ROUTER))
    ready.announce(sock.bind_to_random_port("tcp://127.0.0.1"))
    return ctx, sock, guard


def _bare_stream_server(workers: int, chunks: int, rounds: int) -> None:
    """Echo chunk k to every worker once all of them have sent their k-th chunk: the same
    messages and the same pipelining as the framework, minus headers and arithmetic."""
    ctx, sock, guard = _bound_router()
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
    guard.close()
    ctx.term()


def _bare_echo_server(workers: int, chunks: int, rounds: int) -> None:
    """Wait for every worker's whole shard (one multipart message), echo it back."""
    ctx, sock, guard = _bound_router()
    for _ in range(rounds + WARMUP):
        arrived = [sock.recv_multipart(copy=False) for _ in range(workers)]
        for ident, *frames in arrived:
            sock.send_multipart([ident, *frames], copy=False)
    sock.close(linger=1000)
    guard.close()
    ctx.term()


def _bare_worker(ports: Sequence[int], values: int, rounds: int, result: str,
                 streamed: bool = True) -> None:
    ctx = zmq.Context()
    guard = Guard.from_environ(ctx, warn=False)
    socks = []
    for port in ports:
        s = guard.connect(ctx.socket(zmq.DEALER))
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
    _write_result(result, times)
    for s in socks:
        s.close(linger=0)
    ctx.term()


def node_main(args) -> int:
    """One node of a measurement (`--node KIND`), started by the parent."""
    kind = args.node
    code = cluster_node(kind)
    if code is not None:
        return code
    if kind == "worker":
        _framework_worker(args.values, args.rounds, args.rule, args.result)
    elif kind in ("bare-stream-server", "bare-echo-server"):
        serve = _bare_stream_server if kind == "bare-stream-server" else _bare_echo_server
        serve(args.workers, args.chunks, args.rounds)
    else:
        _bare_worker([int(p) for p in args.ports.split(",")], args.values, args.rounds,
                     args.result, streamed=not args.echo)
    return 0


NODES = ("scheduler", "server", "worker", "bare-stream-server", "bare-echo-server",
         "bare-worker")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=44.7, help="model size in MB (fp32)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--servers", default="1,2")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of each configuration, interleaved; the median is shown")
    node = parser.add_argument_group("one node (started by the benchmark itself)")
    node.add_argument("--node", choices=NODES, help=argparse.SUPPRESS)
    node.add_argument("--values", type=int, help=argparse.SUPPRESS)
    node.add_argument("--rule", default="sync", help=argparse.SUPPRESS)
    node.add_argument("--chunks", type=int, help=argparse.SUPPRESS)
    node.add_argument("--ports", help=argparse.SUPPRESS)
    node.add_argument("--echo", action="store_true", help=argparse.SUPPRESS)
    node.add_argument("--result", help=argparse.SUPPRESS)
    return parser


def main() -> int:
    args = build_parser().parse_args()
    if args.node:
        if args.node.startswith("bare-") and args.node.endswith("server"):
            args.workers = int(args.workers)
        return node_main(args)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
