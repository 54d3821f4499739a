"""One synchronous round of `--backend allreduce` against bare torch.distributed
all_reduce of the same bytes, in one run.

    python bench/allreduce_round.py [--workers 2,4] [--values 11176512 | --mb 44.7]
                                    [--buffers 9600] [--rounds 10] [--repeats 3]
                                    [--compress none,fp16] [--bare-step]

Prints one row per world size and compression: esync's and the bare round in ms and
the ratio esync/bare, each median [min-max] over the repeats (progress on stderr).

(a) esync: W worker processes go through the real code path of `--backend allreduce`:
    each registers with a real scheduler (DMLC_* variables, DMLC_NUM_SERVER=0), builds
    `esync.comm.allreduce.AllReduce` (its Job from the scheduler's assignment, a FlatModel of
    a model whose trainable weights are one vector of --values float32 values, default
    11,176,512 = 44.7 MB, ResNet-18's fp32 size, plus --buffers floating buffers,
    default 9,600 = ResNet-18's BatchNorm statistics; RuleConfig("sync", W, lr=0.1)),
    calls `start(model)` (rendezvous through the scheduler, gloo process group, weights
    broadcast from worker 0), and times `push_pull(round, flat.grads)`: the all-reduce
    of the gradient (with --compress fp16: in float16), the small all-reduce of buffers,
    stop flags and steps, and the sync rule's SGD step on the weights.
(b) bare: W processes in a gloo group of the same size (a TCPStore hosted by rank 0)
    all-reduce a float32 tensor of the same --values, `dist.all_reduce(t)`, what a
    torch.distributed user writes. For fp16 the bare baseline is what DDP's fp16
    compression hook does: `h = t.to(float16).div_(W); dist.all_reduce(h);
    t.copy_(h)`. With --bare-step the bare round also takes the SGD step that esync's
    rule takes, `w.add_(t, alpha=-lr / W)` on a weights tensor of the same size (as
    optimizer.step() would after DDP's all-reduce); by default it does not.

Before each timed round every process of both sides passes a `dist.barrier()` (not
timed), and the gradient is refilled (not timed), so each round starts together from
the same values; the first 2 rounds warm up and are not counted. A run's figure is the
mean over the workers of their median round; each configuration is run --repeats
times, esync and bare interleaved, and shown as median [min-max] over the runs; the
ratio esync/bare is taken within each repeat (same moment of the machine) and shown
the same way (target: within 1.1x). With fp16 the ratio is against the bare fp16
round, and a last column gives esync's fp16 round against the bare fp32 one.

Every node is a child process, `python bench/allreduce_round.py --node KIND ...`,
started and stopped by launch.supervisor (bench/nodes.py's NodeRun) with one torch/OMP
thread each; the scheduler and rank 0 of the bare group bind free ports and report them
(esync.infra.ready); each worker writes its round times to a JSON file. A node that fails
ends the measurement with its log's last line.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Dict, List

from nodes import NodeRun, cluster_node, gloo_group, spread

WARMUP = 2
TIMEOUT_S = 600.0
SCRIPT = os.path.abspath(__file__)
PROG = "allreduce_round.py"
#: ResNet-18's trainable values in fp32 (44.7 MB) and its BatchNorm statistics
RESNET18_VALUES = 11_176_512
RESNET18_BUFFERS = 9_600
COMPRESSIONS = ("none", "fp16")
#: esync's rule's learning rate (and the bare step's, with --bare-step)
LR = 0.1


# --- the parent: start the nodes, collect their times ------------------------------------
def esync_round(values: int, buffers: int, workers: int, rounds: int, compress: str) -> float:
    """(a): the mean over workers of their median push_pull through AllReduce."""
    args = ["--values", str(values), "--buffers", str(buffers), "--rounds", str(rounds),
            "--compress", compress]
    with NodeRun(SCRIPT, "esync-allreduce-", TIMEOUT_S) as run:
        env = run.start_job(0, workers)
        for w in range(workers):
            run.start(f"worker{w}", "esync-worker", args, result=True, env=env)
        return statistics.mean(statistics.median(r) for r in run.results_after_wait())


def bare_round(values: int, workers: int, rounds: int, compress: str,
               step: bool = False) -> float:
    """(b): the same bytes through a bare gloo all_reduce (`step`: and an SGD step)."""
    args = ["--values", str(values), "--rounds", str(rounds), "--compress", compress,
            "--world", str(workers), *(["--bare-step"] if step else [])]
    with NodeRun(SCRIPT, "esync-allreduce-", TIMEOUT_S) as run:
        rank0 = run.start("rank0", "bare-worker", [*args, "--rank", "0"], ready_=True,
                          result=True)
        port = run.port(rank0)
        for rank in range(1, workers):
            run.start(f"rank{rank}", "bare-worker",
                      [*args, "--rank", str(rank), "--port", str(port)], result=True)
        return statistics.mean(statistics.median(r) for r in run.results_after_wait())


# --- the nodes ------------------------------------------------------------------------------
def _write_result(path: str, times: List[float]) -> None:
    with open(path, "w") as f:
        json.dump(times[WARMUP:], f)


def _esync_worker(values: int, buffers: int, rounds: int, compress: str,
                  result: str) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    from esync.algorithms.base import Job
    from esync.comm.allreduce import AllReduce
    from esync.comm.compress import Compression
    from esync.comm.flat import FlatModel
    from esync.rules import RuleConfig
    from esync.transport.cluster import ClusterEnv
    from esync.transport.node import Node

    class Model(nn.Module):
        """`values` trainable float32 weights and `buffers` floating buffers."""

        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(values))
            self.register_buffer("stats", torch.zeros(buffers))

    torch.set_num_threads(1)
    with Node(ClusterEnv.from_environ(), "worker") as node:
        assignment = node.register()
        job = Job.from_assignment(node, assignment)
        model = Model()
        flat = FlatModel(model, torch.device("cpu"))
        reducer = AllReduce(job, flat, RuleConfig("sync", job.num_workers, lr=LR),
                            Compression.parse(compress))
        try:
            reducer.start(model)
            node.barrier("workers")
            reducer.started()
            times = []
            for r in range(1, rounds + WARMUP + 1):
                flat.grads.fill_(1e-6)
                dist.barrier()
                start = time.perf_counter()
                reducer.push_pull(r, flat.grads)
                times.append(time.perf_counter() - start)
        finally:
            reducer.close()
        _write_result(result, times)
        node.finish()


def _bare_worker(rank: int, port: int, world: int, values: int, rounds: int,
                 compress: str, step: bool, result: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    gloo_group(rank, world, port, TIMEOUT_S)
    tensor = torch.empty(values, dtype=torch.float32)
    weights = torch.zeros(values, dtype=torch.float32) if step else None
    times = []
    try:
        for _ in range(rounds + WARMUP):
            tensor.fill_(1e-6)
            dist.barrier()
            start = time.perf_counter()
            if compress == "fp16":  # as DDP's fp16_compress_hook
                half = tensor.to(torch.float16).div_(world)
                dist.all_reduce(half)
                tensor.copy_(half)
            else:
                dist.all_reduce(tensor)
            if weights is not None:  # the sync rule's step: w -= lr * mean
                weights.add_(tensor, alpha=-LR / world)
            times.append(time.perf_counter() - start)
        _write_result(result, times)
    finally:
        dist.destroy_process_group()


def node_main(args) -> int:
    """One node of a measurement (`--node KIND`), started by the parent."""
    code = cluster_node(args.node)
    if code is not None:
        return code
    if args.node == "esync-worker":
        _esync_worker(args.values, args.buffers, args.rounds, args.compress, args.result)
    else:
        _bare_worker(args.rank, args.port, args.world, args.values, args.rounds,
                     args.compress, args.bare_step, args.result)
    return 0


NODES = ("scheduler", "esync-worker", "bare-worker")


# --- the command line -----------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """Bad input: one line, exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{PROG}: error: {message}\n")


def _int_list(flag: str, text: str, low: int) -> List[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(v < low for v in values):
        raise ValueError(f"{flag} {text!r}: expected comma-separated integers >= {low}")
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description=__doc__.split("\n\n")[0],
                     formatter_class=argparse.RawDescriptionHelpFormatter,
                     epilog="(a) goes through esync.comm.allreduce.AllReduce with a real\n"
                            "scheduler; (b) is a bare gloo dist.all_reduce. See the\n"
                            "module docstring for the details.")
    parser.add_argument("--workers", default="2,4",
                        help="world sizes, comma-separated (default 2,4)")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--values", type=int, default=None,
                      help=f"float32 values all-reduced (default {RESNET18_VALUES:,}: "
                           f"ResNet-18, 44.7 MB)")
    size.add_argument("--mb", type=float, default=None,
                      help="model size in MB (fp32), instead of --values: MB x 1e6 / 4 "
                           "values, as bench/pushpull.py sizes its vectors")
    parser.add_argument("--buffers", type=int, default=RESNET18_BUFFERS,
                        help=f"floating buffers of esync's model, all-reduced with the "
                             f"stop flags each round (default {RESNET18_BUFFERS:,}: "
                             f"ResNet-18's BatchNorm statistics)")
    parser.add_argument("--rounds", type=int, default=10,
                        help=f"timed rounds per run, after {WARMUP} warm-up rounds "
                             f"(default 10)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of each configuration, interleaved (default 3)")
    parser.add_argument("--compress", default="none,fp16",
                        help="esync's --compress values to measure, comma-separated "
                             "(default none,fp16)")
    parser.add_argument("--bare-step", action="store_true",
                        help="the bare round also takes the SGD step esync's rule takes "
                             "(default: a bare all_reduce only)")
    node = parser.add_argument_group("one node (started by the benchmark itself)")
    node.add_argument("--node", choices=NODES, help=argparse.SUPPRESS)
    node.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    node.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    node.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    node.add_argument("--result", help=argparse.SUPPRESS)
    return parser


def check(args) -> tuple:
    """(world sizes, values, compressions) of the command line; ValueError (one line)."""
    workers = _int_list("--workers", args.workers, 1)
    if args.mb is not None:
        if not 0 < args.mb < float("inf"):
            raise ValueError(f"--mb {args.mb:g}: expected a size > 0")
        values = int(args.mb * 1e6 / 4)
    else:
        values = RESNET18_VALUES if args.values is None else args.values
    if values < 1:
        raise ValueError(f"the model must have at least one value, got {values}")
    if args.buffers < 0:
        raise ValueError(f"--buffers {args.buffers}: expected >= 0")
    if args.rounds < 1 or args.repeats < 1:
        raise ValueError("--rounds and --repeats must be at least 1")
    compress = [c.strip() for c in args.compress.split(",") if c.strip()]
    if not compress or any(c not in COMPRESSIONS for c in compress):
        raise ValueError(f"--compress {args.compress!r}: choose from "
                         f"{', '.join(COMPRESSIONS)} (the all-reduce takes no topk)")
    return workers, values, list(dict.fromkeys(compress))


def main() -> int:
    args = build_parser().parse_args()
    if args.node:
        return node_main(args)
    try:
        worlds, values, compressions = check(args)
    except ValueError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    mb = values * 4 / 1e6
    print(f"one synchronous round of {values:,} float32 values ({mb:.3g} MB; esync's model "
          f"also has {args.buffers:,} buffer values), {args.rounds} rounds after {WARMUP} "
          f"warm-up, mean over workers of their median; median [min-max] of "
          f"{args.repeats} interleaved runs"
          + ("; the bare rounds include the SGD step" if args.bare_step else ""))
    print(f"{'workers':>7} {'compress':>8} {'esync ms':>22} {'bare ms':>22} "
          f"{'esync/bare':>20} {'esync/bare fp32':>20}")
    started = time.monotonic()
    ratios: Dict[tuple, float] = {}
    try:
        for world in worlds:
            runs: Dict[str, Dict[str, List[float]]] = {
                c: {"esync": [], "bare": []} for c in ["none", *compressions]}
            for rep in range(args.repeats):
                for c in runs:
                    t0 = time.monotonic()
                    if c in compressions:  # else: only the bare fp32 baseline
                        runs[c]["esync"].append(esync_round(values, args.buffers, world,
                                                            args.rounds, c))
                    runs[c]["bare"].append(bare_round(values, world, args.rounds, c,
                                                      args.bare_step))
                    ours = (f"esync {runs[c]['esync'][-1] * 1e3:.2f} ms, "
                            if runs[c]["esync"] else "")
                    print(f"[{world} workers, {c}, repeat {rep + 1}] {ours}bare "
                          f"{runs[c]['bare'][-1] * 1e3:.2f} ms ({time.monotonic() - t0:.0f} s)",
                          file=sys.stderr, flush=True)
            fp32 = runs["none"]["bare"]
            for c in compressions:
                ours, bare = runs[c]["esync"], runs[c]["bare"]
                ratio = [a / b for a, b in zip(ours, bare)]
                against_fp32 = [a / b for a, b in zip(ours, fp32)]
                ratios[(world, c)] = statistics.median(ratio)
                ms = ".1f" if min(ours + bare) >= 0.001 else ".3f"
                print(f"{world:>7} {c:>8} {spread([t * 1e3 for t in ours], ms):>22} "
                      f"{spread([t * 1e3 for t in bare], ms):>22} "
                      f"{spread(ratio, '.3f'):>20} {spread(against_fp32, '.3f'):>20}",
                      flush=True)
    except RuntimeError as e:
        print(f"{PROG}: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    over = [f"{w} workers {c} ({r:.2f}x)" for (w, c), r in ratios.items() if r > 1.1]
    print("target esync/bare <= 1.10x: "
          + (f"above it: {', '.join(over)}" if over else "all within")
          + f"; done in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
