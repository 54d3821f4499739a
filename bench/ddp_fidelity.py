"""Is esync's DDP baseline (`-m ddp`) as fast as the plain DistributedDataParallel script
a user would write, on the same simulated heterogeneous cluster?

    python bench/ddp_fidelity.py [--slowdown 1,1,4,4 --slowdown 1,1,1,16] [--repeats 3]
                                 [--seconds 15] [--skip 3]

For each --slowdown setting (one factor per rank; its length is the world size;
default two settings, 1,1,4,4 and 1,1,1,16), --repeats times, the two sides
interleaved (plain, ddp, plain, ddp, ...), each for --seconds of training:
(a) plain: one process per rank of bench/plain_ddp.py (see its docstring): a gloo group
    whose TCPStore rank 0 hosts on a free port it reports (esync.infra.ready),
    `DistributedDataParallel(build_network("lenet"))` with DDP's defaults,
    `torch.optim.SGD(lr=0.05, momentum=0.9)`, batches of 64 per rank from the same
    digits partitions and order as esync's (esync's BatchStream), cross-entropy. A rank
    with factor F sleeps after each step until its computing has lasted F times the
    median of its last 15 steps' computing (CPU time with one torch thread, as -m
    ddp), computing being the step's wall time less the time in collectives (DDP's buffer
    broadcast, timed between a forward pre-hook on the DDP module and one on the
    wrapped module; the gradient all-reduce, timed by a comm hook around torch's
    `allreduce_hook`). It stops by a key rank 0 sets in the TCPStore once --seconds
    have passed, `last = n + 1`, which every rank checks after each step (a store
    round trip, no collective).
(b) ddp: one process per rank of `python main.py -m ddp -n lenet --num-threads 1
    --slowdown F --time-limit SECONDS -e 0 --device-name r<k> -ld <tmp>/logs`, with
    RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1 and MASTER_PORT (rank 0: 0, and it reports
    the free port it bound through esync.infra.ready; the others: that port). Step end times
    are rank 0's per-round `total_time` in `<tmp>/logs/<host>/r0/iter-<n>.json`.

Both sides' step end times are taken after the slowdown's sleep, before the stop check
(plain: from DDP's construction; ddp: from the barrier that ends its setup). A run's
figure is rank 0's steps per second over the steady part (every rank steps together in
DDP): the steps ending after --skip seconds (default 3: start-up, warm-up, the
slowdown's first medians), (count - 1) / (last end - first end); ms per step is its
inverse. Printed per setting: plain and ddp steps/s and ms per step, and ddp/plain of
the steps/s, each median [min-max] over the repeats, the ratio taken within each repeat
(same moment of the machine). Target: `-m ddp` within 10% of plain, ddp/plain >= 0.90.
The progress lines (stderr) also give the median ms per step in computing and in
collectives over the steady part (ddp: its logged computing phases and `global
aggregate`; plain also the store check) of rank 0 and of the slowest rank (the first
with the largest factor), to see where a difference comes from. All ranks share this
machine's cores: run it on an otherwise idle machine.

Every process is a child started and stopped by launch.supervisor (bench/nodes.py's
NodeRun), OMP_NUM_THREADS=1 and one torch thread each; progress goes to stderr. A rank
that fails ends the measurement with its log's last line (and every other child is
stopped).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import socket
import statistics
import sys
import time
from typing import Dict, List, Sequence

from esync.launch.job import inherited
from esync.launch.supervisor import ChildFailed
from nodes import NodeRun, failure, spread

SCRIPT = os.path.abspath(__file__)
REPO = os.path.dirname(os.path.dirname(SCRIPT))
MAIN = os.path.join(REPO, "main.py")
PROG = "ddp_fidelity.py"
SLOWDOWNS = ("1,1,4,4", "1,1,1,16")
#: the computing phases of a `-m ddp` round (its collectives: `global aggregate`)
COMPUTING = ("get_batch", "forward and backward", "local update")
#: beyond the training time: start-up of the processes, and slack on a loaded machine
SLACK_S = 120.0


def steady_medians(rank: dict, skip: float) -> str:
    """A rank's median ms per step in computing and collectives (and, plain only, the
    stop check) over its steps ending after `skip`, for the progress lines."""
    steady = [i for i, t in enumerate(rank["ends"]) if t >= skip]
    return ", ".join(f"{key} {statistics.median(rank[key][i] for i in steady) * 1e3:.1f}"
                     for key in ("computing", "collectives", "check") if key in rank)


def steady_rate(ends: Sequence[float], skip: float) -> float:
    """Steps per second from step end times: those after `skip` seconds."""
    steady = [t for t in ends if t >= skip]
    if len(steady) < 2 or steady[-1] <= steady[0]:
        raise RuntimeError(f"only {len(steady)} steps ended after {skip:g} s of "
                           f"{len(ends)} (give more --seconds or less --skip)")
    return (len(steady) - 1) / (steady[-1] - steady[0])


# --- the two sides ------------------------------------------------------------------------
def rank0_port(run: NodeRun, rank0) -> int:
    """The port rank 0's store bound; RuntimeError with its log's last line if it died."""
    try:
        return run.port(rank0)
    except ChildFailed as e:
        raise RuntimeError(failure(rank0) if rank0.returncode is not None else str(e)) \
            from None


def plain_run(factors: List[float], seconds: float) -> List[dict]:
    """(a): each rank's step end times, collectives, computing and stop checks, from
    bench/plain_ddp.py."""
    world = len(factors)
    args = ["--world", str(world), "--seconds", f"{seconds:g}"]
    with NodeRun(SCRIPT, "esync-ddp-fidelity-", seconds + SLACK_S) as run:
        rank0 = run.start("rank0", "plain", [*args, "--rank", "0", "--factor",
                                             f"{factors[0]:g}"], ready_=True, result=True)
        port = rank0_port(run, rank0)
        for rank in range(1, world):
            run.start(f"rank{rank}", "plain", [*args, "--rank", str(rank), "--port",
                                               str(port), "--factor", f"{factors[rank]:g}"],
                      result=True)
        return run.results_after_wait()


def _iter_number(path: str) -> int:
    return int(re.search(r"iter-([0-9]+)\.json$", path).group(1))


def ddp_run(factors: List[float], seconds: float) -> List[dict]:
    """(b): each rank's step end times (`total_time` of its rounds), collectives and
    computing from the logs of `main.py -m ddp`."""
    world = len(factors)
    with NodeRun(SCRIPT, "esync-ddp-fidelity-", seconds + SLACK_S) as run:
        logs = os.path.join(run.tmp.name, "logs")
        env = inherited(os.environ, auth=True)  # no other job's cluster variables
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", MASTER_ADDR="127.0.0.1",
                   WORLD_SIZE=str(world))
        port = 0
        for rank, factor in enumerate(factors):
            argv = [sys.executable, MAIN, "-m", "ddp", "-n", "lenet", "--num-threads", "1",
                    "--slowdown", f"{factor:g}", "--time-limit", f"{seconds:g}", "-e", "0",
                    "--device-name", f"r{rank}", "-ld", logs]
            child = run.sup.start(f"ddp{rank}", argv, cwd=REPO, ready=rank == 0,
                                  env=dict(env, RANK=str(rank), MASTER_PORT=str(port)),
                                  log=os.path.join(run.tmp.name, f"ddp{rank}.log"))
            if rank == 0:
                port = rank0_port(run, child)
        run.results_after_wait()  # (no JSON results: it raises if a rank failed)
        ranks = []
        for rank in range(world):
            paths = glob.glob(os.path.join(logs, socket.gethostname(), f"r{rank}",
                                           "iter-*.json"))
            ranks.append({"ends": [], "collectives": [], "computing": []})
            for path in sorted(paths, key=_iter_number):
                with open(path) as f:
                    record = json.load(f)
                phases = record["time"]["0"]
                ranks[-1]["ends"].append(record["total_time"])
                ranks[-1]["collectives"].append(phases.get("global aggregate", 0.0))
                ranks[-1]["computing"].append(sum(phases.get(p, 0.0) for p in COMPUTING))
        return ranks


# --- a node (a rank of the plain script) -----------------------------------------------
def node_main(args) -> int:
    from plain_ddp import run

    run(args.rank, args.world, args.port, args.factor, args.seconds, args.result)
    return 0


# --- the command line -----------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """Bad input: one line, exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{PROG}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description=__doc__.split("\n\n")[0],
                     formatter_class=argparse.RawDescriptionHelpFormatter,
                     epilog="(a) is bench/plain_ddp.py, (b) is main.py -m ddp; see the "
                            "module\ndocstring for what is timed and how.")
    parser.add_argument("--slowdown", action="append", metavar="F,F,...",
                        help="one --slowdown factor (>= 1) per rank, comma-separated; "
                             "repeat the flag for more settings (default: "
                             f"{' and '.join(SLOWDOWNS)})")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of each side per setting, interleaved (default 3)")
    parser.add_argument("--seconds", type=float, default=15.0,
                        help="seconds of training per run (default 15)")
    parser.add_argument("--skip", type=float, default=3.0,
                        help="seconds at the start of a run not counted (default 3)")
    node = parser.add_argument_group("one rank of the plain script (started by the "
                                     "benchmark itself)")
    node.add_argument("--node", choices=("plain",), help=argparse.SUPPRESS)
    node.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    node.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    node.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    node.add_argument("--factor", type=float, default=1.0, help=argparse.SUPPRESS)
    node.add_argument("--result", help=argparse.SUPPRESS)
    return parser


def check(args) -> List[List[float]]:
    """The settings (one factor per rank each); ValueError (one line) on bad input."""
    settings = []
    for text in args.slowdown or SLOWDOWNS:
        try:
            factors = [float(v) for v in text.split(",") if v.strip()]
        except ValueError:
            factors = []
        if not factors or not all(1.0 <= f < float("inf") for f in factors):
            raise ValueError(f"--slowdown {text!r}: expected comma-separated factors >= 1, "
                             f"one per rank")
        settings.append(factors)
    if args.repeats < 1:
        raise ValueError(f"--repeats {args.repeats}: expected at least 1")
    if not 0 <= args.skip < float("inf"):
        raise ValueError(f"--skip {args.skip:g}: expected seconds >= 0")
    if not args.skip + 1 <= args.seconds < float("inf"):
        raise ValueError(f"--seconds {args.seconds:g}: expected at least --skip + 1 "
                         f"({args.skip + 1:g})")
    return settings


def main() -> int:
    args = build_parser().parse_args()
    if args.node:
        return node_main(args)
    try:
        settings = check(args)
    except ValueError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    print(f"lenet on digits, batch 64 per rank, one thread per rank; rank 0's steps per "
          f"second from {args.skip:g} s to the end of {args.seconds:g} s of training; "
          f"median [min-max] of {args.repeats} interleaved runs, ddp/plain within each")
    print(f"{'slowdown':>10} {'plain steps/s':>20} {'ddp steps/s':>20} {'ddp/plain':>20} "
          f"{'plain ms/step':>20} {'ddp ms/step':>20}")
    started = time.monotonic()
    ratios: Dict[str, float] = {}
    try:
        for factors in settings:
            name = ",".join(f"{f:g}" for f in factors)
            slowest = factors.index(max(factors))
            rates: Dict[str, List[float]] = {"plain": [], "ddp": []}
            for rep in range(args.repeats):
                for side, side_run in (("plain", plain_run), ("ddp", ddp_run)):
                    t0 = time.monotonic()
                    ranks = side_run(factors, args.seconds)
                    rates[side].append(steady_rate(ranks[0]["ends"], args.skip))
                    print(f"[{name}, repeat {rep + 1}] {side} {rates[side][-1]:.2f} steps/s "
                          f"({1e3 / rates[side][-1]:.1f} ms/step, {len(ranks[0]['ends'])} "
                          f"steps); median ms per step, rank 0: "
                          f"{steady_medians(ranks[0], args.skip)}; rank {slowest}: "
                          f"{steady_medians(ranks[slowest], args.skip)} "
                          f"({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
            ratio = [d / p for d, p in zip(rates["ddp"], rates["plain"])]
            ratios[name] = statistics.median(ratio)
            print(f"{name:>10} {spread(rates['plain'], '.2f'):>20} "
                  f"{spread(rates['ddp'], '.2f'):>20} {spread(ratio, '.3f'):>20} "
                  f"{spread([1e3 / r for r in rates['plain']], '.1f'):>20} "
                  f"{spread([1e3 / r for r in rates['ddp']], '.1f'):>20}", flush=True)
    except (RuntimeError, OSError) as e:
        print(f"{PROG}: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    below = [f"{name} ({r:.2f})" for name, r in ratios.items() if r < 0.9]
    print("target ddp/plain >= 0.90: "
          + (f"below it: {', '.join(below)}" if below else "all within")
          + f"; done in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
