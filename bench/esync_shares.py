"""How much of their time fast devices spend computing, under ESync and under SSGD.

Runs one job per mode on this machine, each with a scheduler, one server, the ESync state
server and four workers: two fast (`--slowdown 1`) and two four times slower
(`--slowdown 4`), all training lenet on digits for the same time. From the workers'
iteration logs it prints each device's computing-time share: the seconds spent in
local iterations (get_batch, forward and backward, local update, and the simulated
slowdown) over the wall-clock time of training. The rest is waiting: at the aggregation
(`global aggregate` / `global update`, which includes waiting for slower devices), for
the state server, and for worker 0's evaluations. It also prints each device's time per
local iteration under ESync (slowdown included) and the budgets ESync gave.

    python bench/esync_shares.py [--time-limit 60] [--slowdowns 1,1,4,4] [--keep DIR]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPUTING = ("get_batch", "forward and backward", "local update", "slowdown")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("the state server exited at start")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("the state server did not start listening")


def run_job(mode: str, slowdowns: List[float], args, folder: str) -> Dict[str, List[dict]]:
    """One job; returns each worker's round records, by its device label."""
    os.makedirs(folder)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(free_port()),
               DMLC_NUM_SERVER="1", DMLC_NUM_WORKER=str(len(slowdowns)),
               ESYNC_STATE_DB=os.path.join(folder, "state.sqlite3"))
    state_port = free_port()
    procs: List[subprocess.Popen] = []

    def start(name, command, cwd=REPO, **extra):
        out = open(os.path.join(folder, f"{name}.out"), "w")
        procs.append(subprocess.Popen(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                      env=dict(env, **extra)))
        return procs[-1]

    try:
        state = start("stateserver", [sys.executable, "manage.py", "runserver", "--noreload",
                                      f"127.0.0.1:{state_port}"],
                      cwd=os.path.join(REPO, "stateserver"))
        wait_for_port(state_port, state)
        main = [sys.executable, os.path.join(REPO, "main.py")]
        start("scheduler", main, DMLC_ROLE="scheduler")
        start("server", main, DMLC_ROLE="server")
        for rank, slowdown in enumerate(slowdowns):
            start(f"worker{rank}", [*main, "-m", mode, "--slowdown", str(slowdown),
                                    "--device-name", f"w{rank}-x{slowdown:g}",
                                    "-ld", os.path.join(folder, "logs"),
                                    "-port", str(state_port), "--time-limit",
                                    str(args.time_limit), "-e", str(args.eval_duration),
                                    "-b", str(args.batch_size), "--num-threads", "1"],
                  DMLC_ROLE="worker")
        for proc in procs[1:]:
            if proc.wait(args.time_limit + 120) != 0:
                raise RuntimeError(f"a process of the {mode} job failed; see {folder}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT if proc is procs[0] else signal.SIGKILL)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    records = {}
    for device in sorted(glob.glob(os.path.join(folder, "logs", "*", "*"))):
        files = glob.glob(os.path.join(device, "iter-*.json"))
        rounds = sorted((json.load(open(f)) for f in files), key=lambda r: r["num_iters"])
        records[os.path.basename(device)] = rounds
    return records


def computing_seconds(rounds: List[dict]) -> float:
    return sum(seconds for record in rounds for phases in record["time"].values()
               for phase, seconds in phases.items() if phase in COMPUTING)


def computing_share(rounds: List[dict]) -> float:
    return computing_seconds(rounds) / rounds[-1]["total_time"]


def time_per_iteration(rounds: List[dict]) -> float:
    return computing_seconds(rounds) / sum(len(record["time"]) for record in rounds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--time-limit", type=float, default=60.0,
                        help="seconds of training per job (default: 60)")
    parser.add_argument("--slowdowns", default="1,1,4,4",
                        help="one --slowdown per worker (default: 1,1,4,4)")
    parser.add_argument("--eval-duration", type=int, default=10,
                        help="worker 0 evaluates every N rounds (default: 10)")
    parser.add_argument("--batch-size", type=int, default=64, help="(default: 64)")
    parser.add_argument("--keep", help="keep the jobs' logs in this folder")
    args = parser.parse_args()
    slowdowns = [float(s) for s in args.slowdowns.split(",")]
    base = args.keep or tempfile.mkdtemp(prefix="esync-shares-")
    try:
        results = {mode: run_job(mode, slowdowns, args, os.path.join(base, mode))
                   for mode in ("sync", "esync")}
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    print(f"{len(slowdowns)} workers, slowdowns {args.slowdowns}, {args.time_limit:g} s each, "
          f"lenet on digits, batch {args.batch_size}")
    budgets_title = "esync budget (median from round 5)"
    print(f"{'device':<10} {'sync share':>11} {'esync share':>12} {'ms/iteration':>13} "
          f"{budgets_title:>36}")
    fast = min(slowdowns)
    summary = {"sync": [], "esync": []}
    for device in results["esync"]:
        shares = {mode: computing_share(results[mode][device]) for mode in results}
        budgets = [r["budget"] for r in results["esync"][device][4:]] or [1]
        print(f"{device:<10} {shares['sync']:>11.2f} {shares['esync']:>12.2f} "
              f"{1000 * time_per_iteration(results['esync'][device]):>13.1f} "
              f"{statistics.median(budgets):>36g}")
        if device.endswith(f"-x{fast:g}"):
            for mode in summary:
                summary[mode].append(shares[mode])
    print(f"fast devices' mean computing share: sync {statistics.mean(summary['sync']):.2f}, "
          f"esync {statistics.mean(summary['esync']):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
