"""Emulated links (esync/comm/link.py): how close the model's times are, and what slow links
do to each mode's jobs.

    python bench/links.py [--repeats 3] [--mb 10] [--mbit 100] [--modes esync,sync,...]
                          [--rounds N|Ns|MODE=N|Ns,...] [--no-evaluator] [--out DIR]
                          [--keep] [--skip-model] [--skip-jobs]

(i) The model's accuracy, on loopback:
  - kvstore: a worker (a real KVStore, registered at a real scheduler) pushes a gradient
    of --mb megabytes to a real server process and receives the new weights
    (push_pull, `sync` rule, one worker), --repeats times paced at --mbit Mbit/s and as
    many unpaced, alternately. The push is the time until the last chunk was handed to
    the socket (a paced send returns once the message would have left); the model says
    the paced push takes 8 x MB / Mbit s more (0.8 s for 10 MB at 100 Mbit/s). The whole
    push_pull is compared with the model as the kvstore applies it: the upload, then the
    download of the answer, each 0.8 s.
  - all-reduce: two torch.distributed gloo processes all-reduce --mb megabytes,
    alternately with and without `Link.before_allreduce` on both ranks; the model says a
    ring all-reduce among 2 moves 2(W-1)/W x n = n bytes each way: 0.8 s.
  Printed: the paced-minus-unpaced times (median [min-max] over the pairs) and their
  ratio to the model's.
(ii) Per mode (esync, sync, async, dcasgd, ddp), the job of 4 workers, `--slowdown
  1,1,4,4`, lenet on digits, `--max-rounds N` (async and dcasgd: `--time-limit S`; see
  ROUNDS), run through esync/launch/local.py plain and with the two slow workers on
  `--bandwidth none,none,100,100 --latency 0,0,5,5`, interleaved (plain, links, plain,
  links, ...). From the summaries (esync/logs_tools/summary.py; the evaluator's folder left
  out): each worker's median round time (the differences of `total_time` from round 1
  on), averaged over the fast and over the slow workers; the slow workers' median
  computing time per round (slowdown included: F times their recent computing's CPU
  time in all) and communication time per round (`global
  aggregate` / `global update`, where the link's waits are counted), from round 2 on;
  bytes per sample (the workers' bytes_list over their num_samples_list); the seconds of
  training. It prints plain, links and links/plain (median [min-max] over repeats,
  ratios within each repeat), and the slow workers' extra time per round (and extra
  communication time) against the link model's: (bytes sent + received in a plain
  round) x 8 / bandwidth + 2 x latency for the parameter-server modes (upload, then
  download, then one round trip), and a ring all-reduce's time for ddp.

Every node of (i) is a child process, `python bench/links.py --node KIND ...`, started
and stopped by launch.supervisor, each writing its times to a JSON file.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Dict, List, Sequence

from esync import registry
from esync.launch import local  # the jobs run through the launcher
from nodes import NodeRun, cluster_node, length_flags, parse_rounds
from esync.logs_tools.summary import summarize  # and are read by summary.py

SCRIPT = os.path.abspath(__file__)
TIMEOUT_S = 300.0
SLOWDOWNS = "1,1,4,4"
BANDWIDTHS = "none,none,100,100"
LATENCIES = "0,0,5,5"
#: each mode's default length (--rounds): N rounds (--max-rounds N), or Ns seconds
#: (--time-limit N), 2 to 4 s of training on the 2-core machine. The asynchronous
#: modes run for a time: with --max-rounds a job ends when rank 0 has done N rounds (it
#: tells the others), and the scheduler gives ranks in order of registration, so rank 0
#: is a fast worker (~15 ms a round) in some runs and a slow one (~90 ms) in others.
ROUNDS = {"esync": "15", "sync": "20", "async": "3s", "dcasgd": "3s", "ddp": "20"}


# --- (i) the model's accuracy: the parent ---------------------------------------------
def kvstore_times(values: int, mbit: float, repeats: int) -> dict:
    """push_pull times, paced and not, alternately, from one worker of a real job."""
    with NodeRun(SCRIPT, "esync-links-", TIMEOUT_S) as run:
        env = run.start_job(1, 1)
        run.start("worker0", "kv-worker", ["--values", str(values), "--mbit", f"{mbit:g}",
                                           "--repeats", str(repeats)], result=True, env=env)
        return run.results_after_wait()[0]


def allreduce_times(values: int, mbit: float, repeats: int) -> List[dict]:
    """All-reduce times of each of 2 gloo ranks, with and without the link, alternately."""
    args = ["--values", str(values), "--mbit", f"{mbit:g}", "--repeats", str(repeats)]
    with NodeRun(SCRIPT, "esync-links-", TIMEOUT_S) as run:
        rank0 = run.start("rank0", "allreduce", [*args, "--rank", "0"], ready_=True,
                          result=True)
        port = run.sup.wait_ready(rank0)
        run.start("rank1", "allreduce", [*args, "--rank", "1", "--port", str(port)],
                  result=True)
        return run.results_after_wait()


# --- (i): the nodes -------------------------------------------------------------------
class _TimedLink:
    """A Link that notes when its last send returned (the paced push has left)."""

    def __init__(self, link):
        self.link = link
        self.sent_at = 0.0

    def sending(self, nbytes: int) -> None:
        self.link.sending(nbytes)
        self.sent_at = time.perf_counter()

    def received(self, nbytes: int) -> None:
        self.link.received(nbytes)


def _kv_worker(values: int, mbit: float, repeats: int, result: str) -> None:
    import numpy as np

    from esync.comm.kvstore import KVStore
    from esync.comm.link import Link
    from esync.transport.cluster import ClusterEnv
    from esync.transport.node import Node

    with Node(ClusterEnv.from_environ(), "worker") as node:
        assignment = node.register()
        params = np.random.default_rng(0).random(values, dtype=np.float32)
        buffers = np.zeros(0, np.float32)
        grads = np.full(values, 1e-6, np.float32)
        kv = KVStore(node, assignment["servers"], assignment["rank"], values, 0)
        kv.init({"name": "sync", "num_workers": 1, "lr": 0.1, "momentum": 0.9},
                params, buffers)
        node.barrier()
        times: Dict[str, Dict[str, List[float]]] = {
            kind: {"push": [], "push_pull": [], "bytes_sent": [], "bytes_received": []}
            for kind in ("paced", "unpaced")}
        round_ = 0
        for r in range(repeats + 1):  # the first pair warms up
            for kind in (("unpaced", "paced") if r % 2 else ("paced", "unpaced")):
                kv.link = _TimedLink(Link(mbit if kind == "paced" else None))
                round_ += 1
                sent0, received0 = kv.bytes_sent, kv.bytes_received
                start = time.perf_counter()
                kv.push_pull(round_, grads, buffers, params, buffers)
                end = time.perf_counter()
                if r == 0:
                    continue
                times[kind]["push"].append(kv.link.sent_at - start)
                times[kind]["push_pull"].append(end - start)
                times[kind]["bytes_sent"].append(kv.bytes_sent - sent0)
                times[kind]["bytes_received"].append(kv.bytes_received - received0)
        with open(result, "w") as f:
            json.dump(times, f)
        kv.close()
        node.finish()


def _allreduce_node(rank: int, port: int, values: int, mbit: float, repeats: int,
                    result: str) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from esync.infra import ready
    from esync.comm.link import Link

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port if rank else 0, 2, is_master=rank == 0,
                          wait_for_workers=False, timeout=timedelta(seconds=120))
    if rank == 0:
        ready.announce(store.port)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    tensor = torch.ones(values, dtype=torch.float32)
    nbytes = tensor.numel() * tensor.element_size()
    link = Link(mbit)
    times: Dict[str, List[float]] = {"paced": [], "unpaced": []}
    try:
        for r in range(repeats + 1):  # the first pair warms up
            for kind in (("unpaced", "paced") if r % 2 else ("paced", "unpaced")):
                dist.barrier()
                start = time.perf_counter()
                if kind == "paced":
                    link.before_allreduce(nbytes, 2)
                dist.all_reduce(tensor)
                if r:
                    times[kind].append(time.perf_counter() - start)
        with open(result, "w") as f:
            json.dump(times, f)
    finally:
        dist.destroy_process_group()


def node_main(args) -> int:
    code = cluster_node(args.node)
    if code is not None:
        return code
    if args.node == "kv-worker":
        _kv_worker(args.values, args.mbit, args.repeats, args.result)
    else:
        _allreduce_node(args.rank, args.port, args.values, args.mbit, args.repeats,
                        args.result)
    return 0


# --- (ii) the jobs --------------------------------------------------------------------
def job_args(mode: str, links: bool, length: str, out: str, evaluator: bool) -> List[str]:
    return [*registry.ALGORITHMS[mode].flags, "--workers", "4", "--servers", "1",
            "--slowdown", SLOWDOWNS, "-n", "lenet", *length_flags(length),
            "--out", out, "--no-progress",
            *(["--bandwidth", BANDWIDTHS, "--latency", LATENCIES] if links else []),
            *([] if evaluator else ["--no-evaluator"])]


def run_job(argv: Sequence[str]) -> Dict[str, dict]:
    """One job through esync/launch/local.py; {worker label: summary record}."""
    said = io.StringIO()
    code = local.run(argv, progress=False, out=said)
    if code == 130:
        raise KeyboardInterrupt
    if code != 0:
        raise RuntimeError(f"job failed ({' '.join(argv)}):\n{said.getvalue().strip()}")
    plan = local.plan(argv)
    records = summarize(os.path.dirname(os.path.dirname(plan.folder)), plan.network,
                        os.path.basename(plan.folder))
    return {device: record for devices in records.values()
            for device, record in devices.items() if device != registry.EVALUATOR}


def median_round(record: dict) -> float:
    t = record["elapsed_time_list"]
    rounds = [b - a for a, b in zip(t, t[1:])]
    return statistics.median(rounds) if rounds else t[-1]


def link_model_s(mode: str, bytes_per_round: float) -> float:
    """The link model's extra seconds per round of a slow worker (--bandwidth 100,
    --latency 5) that moves `bytes_per_round` (sent + received) a round unpaced."""
    bandwidth = float(BANDWIDTHS.split(",")[-1])
    latency = float(LATENCIES.split(",")[-1]) / 1000
    if registry.ALGORITHMS[mode].parameter_server:
        # the kvstore paces the upload, then the answer, held one round trip
        return bytes_per_round * 8 / (bandwidth * 1e6) + 2 * latency
    # ddp logs a ring all-reduce's bytes each way as sent and as received
    workers = len(SLOWDOWNS.split(","))
    return (bytes_per_round / 2) * 8 / (bandwidth * 1e6) + 2 * (workers - 1) * latency


def measure(result: Dict[str, dict], plan) -> Dict[str, float]:
    slow = [plan.label(k) for k, f in enumerate(plan.slowdowns) if f > 1]
    fast = [plan.label(k) for k, f in enumerate(plan.slowdowns) if f == 1]
    workers = fast + slow
    samples = sum(sum(result[w]["num_samples_list"]) for w in workers)
    moved = sum(sum(result[w]["bytes_list"]) for w in workers)
    slow_rounds = sum(len(result[w]["bytes_list"]) for w in slow)
    def slow_median(field: str) -> float:
        return 1e3 * statistics.mean(statistics.median(result[w][field][1:] or
                                                       result[w][field]) for w in slow)

    return {
        "fast ms/round": 1e3 * statistics.mean(median_round(result[w]) for w in fast),
        "slow ms/round": 1e3 * statistics.mean(median_round(result[w]) for w in slow),
        "slow compute ms": slow_median("compute_time_list"),
        "slow comm ms": slow_median("aggregate_time_list"),
        "bytes/sample": moved / samples,
        "training s": max(result[w]["elapsed_time_list"][-1] for w in workers),
        "_slow bytes/round": sum(sum(result[w]["bytes_list"]) for w in slow) / slow_rounds,
    }


# --- printing -------------------------------------------------------------------------
def spread(values: Sequence[float], digits: int) -> str:
    if not values:
        return "-"
    return (f"{statistics.median(values):.{digits}f} "
            f"[{min(values):.{digits}f}-{max(values):.{digits}f}]")


def report_model(mb: float, mbit: float, kv: dict, ranks: List[dict]) -> None:
    model = mb * 8 / mbit
    print(f"(i) the link model at {mbit:g} Mbit/s, {mb:g} MB; paced minus unpaced, "
          f"median [min-max] over {len(kv['paced']['push'])} alternating pairs")
    print(f"{'':<34}{'paced s':>20}{'unpaced s':>20}{'difference s':>20}{'model s':>9}"
          f"{'ratio':>20}")

    def row(name: str, paced: List[float], unpaced: List[float], expected: float) -> None:
        diff = [p - u for p, u in zip(paced, unpaced)]
        print(f"{name:<34}{spread(paced, 3):>20}{spread(unpaced, 3):>20}"
              f"{spread(diff, 3):>20}{expected:>9.3f}"
              f"{spread([d / expected for d in diff], 3):>20}")

    row("kvstore push (up)", kv["paced"]["push"], kv["unpaced"]["push"], model)
    row("kvstore push_pull (up, then down)", kv["paced"]["push_pull"],
        kv["unpaced"]["push_pull"], 2 * model)
    for rank, times in enumerate(ranks):
        row(f"ring all-reduce, 2 ranks: rank {rank}", times["paced"], times["unpaced"],
            model)
    up = statistics.median(kv["paced"]["bytes_sent"]) / 1e6
    down = statistics.median(kv["paced"]["bytes_received"]) / 1e6
    print(f"  bytes of a push_pull: {up:.3f} MB sent, {down:.3f} MB received")


def report_jobs(mode: str, runs: Dict[str, List[Dict]], length: str, repeats: int) -> None:
    span = f"{length[:-1]} s" if length.endswith("s") else f"{length} rounds"
    print(f"\n{mode}: 4 workers, slowdown {SLOWDOWNS}, {span}; links: bandwidth "
          f"{BANDWIDTHS} Mbit/s, latency {LATENCIES} ms; median [min-max] of {repeats} "
          f"interleaved runs")
    width = 24
    print(f"{'':<16}{'plain':>{width}}{'links':>{width}}{'links/plain':>{width}}")
    for row in ("fast ms/round", "slow ms/round", "slow compute ms", "slow comm ms",
                "bytes/sample", "training s"):
        digits = 0 if row == "bytes/sample" else 2 if row == "training s" else 1
        cells = [spread([run[row] for run in runs[c]], digits) for c in ("plain", "links")]
        cells.append(spread([b[row] / a[row] for a, b in zip(runs["plain"], runs["links"])],
                            3))
        print(f"{row:<16}" + "".join(f"{c:>{width}}" for c in cells))
    model = [1e3 * link_model_s(mode, a["_slow bytes/round"]) for a in runs["plain"]]
    for row, name in (("slow ms/round", "slow +ms/round"),
                      ("slow comm ms", "slow +comm ms")):
        extra = [b[row] - a[row] for a, b in zip(runs["plain"], runs["links"])]
        print(f"{name:<16}{'':>{width}}{spread(extra, 1):>{width}}"
              f"{'model ' + spread(model, 1):>{width}}")


# --- the command line -----------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3,
                        help="paced/unpaced pairs in (i), and runs of each (mode, plain or "
                             "links) in (ii), interleaved (default 3)")
    parser.add_argument("--mb", type=float, default=10.0,
                        help="(i): megabytes pushed and all-reduced (default 10)")
    parser.add_argument("--mbit", type=float, default=100.0,
                        help="(i): the link's Mbit/s (default 100)")
    parser.add_argument("--modes", default="esync,sync,async,dcasgd,ddp",
                        help="(ii): comma-separated registry keys (default "
                             "esync,sync,async,dcasgd,ddp)")
    parser.add_argument("--rounds", default="",
                        help="(ii): each job's length, N rounds (--max-rounds N) or Ns "
                             "seconds (--time-limit N), for every mode or MODE=...,... "
                             f"(default {','.join(f'{m}={n}' for m, n in ROUNDS.items())})")
    parser.add_argument("--no-evaluator", action="store_true",
                        help="(ii): start the jobs without the evaluator process")
    parser.add_argument("--out", help="(ii): base folder of the jobs' logs "
                                      "(default: a temp folder)")
    parser.add_argument("--keep", action="store_true",
                        help="(ii): keep the jobs' logs (default: removed at the end)")
    parser.add_argument("--skip-model", action="store_true", help="leave out (i)")
    parser.add_argument("--skip-jobs", action="store_true", help="leave out (ii)")
    node = parser.add_argument_group("one node (started by the benchmark itself)")
    node.add_argument("--node", choices=("scheduler", "server", "kv-worker", "allreduce"),
                      help=argparse.SUPPRESS)
    node.add_argument("--values", type=int, help=argparse.SUPPRESS)
    node.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    node.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    node.add_argument("--result", help=argparse.SUPPRESS)
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    if args.node:
        return node_main(args)
    if args.repeats < 1 or not args.mb > 0 or not args.mbit > 0:
        parser.error("--repeats must be >= 1, --mb and --mbit > 0")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for mode in modes:
        algorithm = registry.ALGORITHMS.get(mode)
        if algorithm is None or not algorithm.distributed:
            parser.error(f"--modes: {mode!r} is not a distributed mode")
    try:
        rounds = parse_rounds(args.rounds, modes, ROUNDS, "20")
    except ValueError as e:
        parser.error(f"--rounds {args.rounds!r}: {e}")
    started = time.monotonic()
    if not args.skip_model:
        values = int(args.mb * 1e6 / 4)
        t0 = time.monotonic()
        kv = kvstore_times(values, args.mbit, args.repeats)
        print(f"[i] kvstore: {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        ranks = allreduce_times(values, args.mbit, args.repeats)
        print(f"[i] all-reduce: {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
        report_model(args.mb, args.mbit, kv, ranks)
    if not args.skip_jobs:
        made_base = args.out is None
        base = tempfile.mkdtemp(prefix="esync-links-") if made_base else args.out
        job_dirs: List[str] = []
        runs = {mode: {"plain": [], "links": []} for mode in modes}
        total = 2 * args.repeats * len(modes)
        try:
            for rep in range(args.repeats):
                for mode in modes:
                    for kind in ("plain", "links"):
                        out = os.path.join(base, f"{mode}-{kind}-{rep + 1}")
                        job_dirs.append(out)
                        argv = job_args(mode, kind == "links", rounds[mode], out,
                                        not args.no_evaluator)
                        t0 = time.monotonic()
                        figures = measure(run_job(argv), local.plan(argv))
                        runs[mode][kind].append(figures)
                        print(f"[{len(job_dirs)}/{total}] {mode} {kind} repeat {rep + 1}: "
                              f"{time.monotonic() - t0:.1f} s, training "
                              f"{figures['training s']:.2f} s", file=sys.stderr, flush=True)
        finally:
            if not args.keep:
                for folder in job_dirs:
                    shutil.rmtree(folder, ignore_errors=True)
                if made_base:
                    shutil.rmtree(base, ignore_errors=True)
        print("\n(ii) plain vs emulated links for the two slow workers"
              + ("" if args.no_evaluator else " (with the evaluator)"))
        for mode in modes:
            report_jobs(mode, runs[mode], rounds[mode], args.repeats)
        if args.keep:
            print(f"\nlogs kept in {base}")
    print(f"\ndone in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
