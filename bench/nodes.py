"""What the benchmarks share (imported by the scripts beside it; `bench/` is on their
path when run as `python bench/NAME.py`).

- `NodeRun`: one measurement's child nodes (the benchmark script itself, run with
  `--node KIND`) under one supervisor, with their logs and JSON results in a temp dir;
  `NodeRun.start_job` starts a job's scheduler (and servers) on loopback, and
  `cluster_node` runs those nodes in the child;
- `parse_rounds` / `length_flags`: a job's length per mode, `N` rounds or `Ns` seconds.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from datetime import timedelta
from typing import Dict, List, Mapping, Optional, Sequence

from esync.launch.supervisor import Supervisor


def failure(child) -> str:
    """`NAME exited with status S: <its last log line>`."""
    with open(child.log, errors="replace") as f:
        lines = [line.rstrip() for line in f if line.strip()]
    return f"{child.name} exited with status {child.returncode}: {lines[-1] if lines else ''}"


class NodeRun:
    def __init__(self, script: str, prefix: str, timeout: float):
        self.script, self.timeout = script, timeout
        self.tmp = tempfile.TemporaryDirectory(prefix=prefix)
        self.sup = Supervisor()
        self.results: List[str] = []

    def start(self, name: str, kind: str, args: Sequence[str], env: Dict[str, str] = None,
              ready_: bool = False, result: bool = False):
        argv = [sys.executable, self.script, "--node", kind, *args]
        if result:
            path = os.path.join(self.tmp.name, f"{name}.json")
            self.results.append(path)
            argv += ["--result", path]
        return self.sup.start(name, argv, env=dict(os.environ, OMP_NUM_THREADS="1",
                                                   **(env or {})),
                              log=os.path.join(self.tmp.name, f"{name}.log"), ready=ready_)

    def port(self, child) -> int:
        return self.sup.wait_ready(child)

    def start_job(self, servers: int, workers: int) -> Dict[str, str]:
        """Start a job's scheduler (on a free loopback port) and its `servers` servers
        (`--node scheduler` and `--node server`: `cluster_node`); the DMLC_* variables
        for its workers."""
        cluster = {"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_NUM_SERVER": str(servers),
                   "DMLC_NUM_WORKER": str(workers), "PS_HEARTBEAT_TIMEOUT": "60"}
        scheduler = self.start("scheduler", "scheduler", [], ready_=True,
                               env={**cluster, "DMLC_ROLE": "scheduler",
                                    "DMLC_PS_ROOT_PORT": "0"})
        cluster["DMLC_PS_ROOT_PORT"] = str(self.port(scheduler))
        for s in range(servers):
            self.start(f"server{s}", "server", [], env={**cluster, "DMLC_ROLE": "server"})
        return {**cluster, "DMLC_ROLE": "worker"}

    def results_after_wait(self) -> List:
        """Wait for every node; the results they wrote, in the order they were started."""
        outcome = self.sup.wait(timeout=self.timeout)
        if outcome is None:
            raise RuntimeError(f"the nodes did not finish within {self.timeout:g} s")
        if outcome.failed is not None:
            raise RuntimeError(failure(outcome.failed))
        results = []
        for path in self.results:
            with open(path) as f:
                results.append(json.load(f))
        return results

    def __enter__(self) -> "NodeRun":
        return self

    def __exit__(self, *exc) -> None:
        self.sup.close()
        self.tmp.cleanup()


def cluster_node(kind: str) -> Optional[int]:
    """In a child started by `NodeRun.start_job`: run the scheduler or a server (the
    real runtime's) and return its exit status; None for any other kind of node."""
    from esync.transport.cluster import ClusterEnv

    if kind == "scheduler":
        from esync.transport.scheduler import Scheduler

        return Scheduler(ClusterEnv.from_environ()).run()
    if kind == "server":
        from esync.comm.server import run_server

        return run_server(ClusterEnv.from_environ())
    return None


def length_flags(length: str) -> List[str]:
    """`N`: --max-rounds N; `Ns`: --time-limit N (ValueError if neither)."""
    if length.endswith("s"):
        seconds = float(length[:-1])
        if not 0 < seconds < float("inf"):
            raise ValueError(length)
        return ["--time-limit", f"{seconds:g}"]
    if not length.isdigit() or int(length) < 2:
        raise ValueError(length)
    return ["--max-rounds", length]


def parse_rounds(text: str, modes: Sequence[str], defaults: Mapping[str, str],
                 fallback: str) -> Dict[str, str]:
    """Each mode's length, `N` (rounds) or `Ns` (seconds), from `LENGTH` (every mode) or
    `MODE=LENGTH,...` (the others keep `defaults`, else `fallback`)."""
    rounds = {mode: defaults.get(mode, fallback) for mode in modes}
    for item in filter(None, (i.strip() for i in text.split(","))):
        mode, _, length = item.rpartition("=")
        try:
            length_flags(length)
        except ValueError:
            length = ""
        if not length or (mode and mode not in rounds):
            raise ValueError("expected N (rounds >= 2), Ns (seconds > 0), or MODE=N or "
                             "MODE=Ns,... with MODE one of --modes")
        for m in ([mode] if mode else rounds):
            rounds[m] = length
    return rounds


def spread(values: Sequence[float], spec: str) -> str:
    """median [min-max] of `values`, each formatted with `spec` (e.g. ".2f")."""
    return (f"{statistics.median(values):{spec}} "
            f"[{min(values):{spec}}-{max(values):{spec}}]")


def gloo_group(rank: int, world: int, port: int, timeout_s: float):
    """A bare gloo process group, as a torch.distributed user starts one: rank 0 hosts
    the TCPStore on a free port and reports it (esync.infra.ready), the others join `port`.
    Returns the store."""
    import torch.distributed as dist

    from esync.infra import ready

    store = dist.TCPStore("127.0.0.1", port if rank else 0, world, is_master=rank == 0,
                          wait_for_workers=False, timeout=timedelta(seconds=timeout_s))
    if rank == 0:
        ready.announce(store.port)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    return store
