"""What the state server's CPU pays per request that every worker makes every round: a
budget (POST /jobs/<job>/budget/) and a live-page report (POST /jobs/<job>/report/).

    python bench/state_requests.py [--workers 16] [--rounds 100] [--repeats 3]

A real state server (`manage.py runserver`, its own SQLite file) and --workers clients,
one kept-alive connection each, as a job's workers have; a round is every client's
request at once (the workers ask together as a round begins). Per kind: the server's
CPU (user and system, /proc) per request and the time until a round's last answer.
The baseline, in the same run and server: a request refused with 400 by the budget view
(a body without its fields), which pays HTTP, the middleware and the JSON but no
database: what any request costs here. Printed: median [lowest-highest] of --repeats
runs, each on a fresh server, and each kind's CPU over the baseline's.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, List

from esync.launch.supervisor import Supervisor
from nodes import spread

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = "bench"
WARMUP_ROUNDS = 3
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _post(conn: http.client.HTTPConnection, path: str, body: Dict) -> int:
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    answer = conn.getresponse()
    answer.read()
    return answer.status


def _budget(rank: int, round_: int) -> Dict:
    return {"rank": rank, "round": round_, "coordination": 0.05,
            "time_per_iteration": 0.1 + 0.001 * rank if round_ > 1 else None}


def _report(rank: int, round_: int) -> Dict:
    return {"role": "worker", "rank": rank, "mode": "esync", "device": "cpu",
            "round": round_, "budget": 3, "samples": 96 * round_,
            "samples_per_second": 320.0, "loss": 1.25, "alive": True,
            "breakdown": {"compute": 0.3, "global update": 0.05, "state server": 0.0},
            "bytes_sent": 4_000_000 * round_, "bytes_received": 4_000_000 * round_}


KINDS: Dict[str, tuple] = {
    # what the request says, and the status it is answered with
    "refused (baseline)": (f"/jobs/{JOB}/budget/", lambda rank, round_: {"rank": rank}, 400),
    "budget": (f"/jobs/{JOB}/budget/", _budget, 200),
    "report": (f"/jobs/{JOB}/report/", _report, 202),
}


def run_once(workers: int, rounds: int) -> Dict[str, Dict[str, float]]:
    """One fresh server: each kind's CPU ms per request and ms to a round's last answer."""
    out: Dict[str, Dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="esync-state-bench-") as tmp, \
            Supervisor(grace=3.0, say=lambda line: None) as sup, \
            ThreadPoolExecutor(workers) as pool:
        env = dict(os.environ, ESYNC_STATE_DB=os.path.join(tmp, "state.sqlite3"))
        env.pop("ESYNC_STATE_TOKEN", None)
        server = sup.start("stateserver", [sys.executable, "manage.py", "runserver",
                                           "--noreload", "127.0.0.1:0"],
                           env=env, cwd=os.path.join(REPO, "stateserver"),
                           log=os.path.join(tmp, "stateserver.log"), ready=True)
        port = sup.wait_ready(server)
        conns = [http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                 for _ in range(workers)]
        assert _post(conns[0], f"/jobs/{JOB}/", {"workers": workers, "max_local_steps": 50,
                                                 "coordination_share": 0.1}) == 201
        round_ = 0
        for kind, (path, body, status) in KINDS.items():
            def one_round(t: int) -> None:
                answers = list(pool.map(lambda r: _post(conns[r], path, body(r, t)),
                                        range(workers)))
                if any(a != status for a in answers):
                    raise SystemExit(f"{kind}: answered {sorted(set(answers))}, not {status}")
            for _ in range(WARMUP_ROUNDS):
                round_ += 1
                one_round(round_)
            cpu, start = _cpu(server.pid), time.perf_counter()
            for _ in range(rounds):
                round_ += 1
                one_round(round_)
            out[kind] = {"cpu_ms": 1e3 * (_cpu(server.pid) - cpu) / (rounds * workers),
                         "round_ms": 1e3 * (time.perf_counter() - start) / rounds}
        for conn in conns:
            conn.close()
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=16,
                        help="clients, each one worker of the job (default 16)")
    parser.add_argument("--rounds", type=int, default=100,
                        help="rounds of requests measured per kind (default 100)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs, each on a fresh server (default 3)")
    args = parser.parse_args(argv)
    runs = []
    for rep in range(args.repeats):
        runs.append(run_once(args.workers, args.rounds))
        print(f"rep {rep}: " + ", ".join(f"{k} {v['cpu_ms']:.2f} ms CPU"
                                         for k, v in runs[-1].items()), flush=True)
    print(f"\n{args.workers} clients, {args.rounds} rounds per kind, {args.repeats} runs: "
          f"median [lowest-highest]")
    print("| request | server CPU ms per request | / baseline | ms to a round's last "
          "answer |")
    print("|---|---|---|---|")
    for kind in KINDS:
        cpu = [r[kind]["cpu_ms"] for r in runs]
        # a run too short for /proc's clock ticks (10 ms) may measure no CPU: no ratio
        ratio = [r[kind]["cpu_ms"] / r["refused (baseline)"]["cpu_ms"]
                 if r["refused (baseline)"]["cpu_ms"] else float("nan") for r in runs]
        print(f"| {kind} | {spread(cpu, '.2f')} | {spread(ratio, '.1f')} | "
              f"{spread([r[kind]['round_ms'] for r in runs], '.1f')} |")


if __name__ == "__main__":
    main()
