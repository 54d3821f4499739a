"""Start a real job (scheduler, servers, workers as separate `main.py` processes on a free
loopback port, configured by DMLC_* variables as the original's README does) and make
sure none of its processes outlives the test."""
from __future__ import annotations

import glob
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

from esync.launch.supervisor import free_port
from tests.helpers import MAIN, REPO


class Cluster:
    def __init__(self, tmp_path, num_servers: int, num_workers: int,
                 heartbeat_timeout: float = 5.0, env: Optional[Dict[str, str]] = None):
        self.dir = str(tmp_path)
        self.log_dir = os.path.join(self.dir, "logs")
        self.env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                        DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(free_port()),
                        DMLC_NUM_SERVER=str(num_servers), DMLC_NUM_WORKER=str(num_workers),
                        PS_HEARTBEAT_INTERVAL="0.5", PS_HEARTBEAT_TIMEOUT=str(heartbeat_timeout),
                        PYTHONFAULTHANDLER="1",
                        **(env or {}))
        self.num_servers, self.num_workers = num_servers, num_workers
        self.procs: Dict[str, subprocess.Popen] = {}

    def start(self, name: str, role: str, args: Sequence[str] = (),
              program: Sequence[str] = (MAIN,)) -> subprocess.Popen:
        """Start `python main.py ARGS` (or `python PROGRAM ARGS`) as `role`."""
        out = open(os.path.join(self.dir, f"{name}.out"), "w")
        proc = subprocess.Popen([sys.executable, *program, *args], cwd=REPO, stdout=out,
                                stderr=subprocess.STDOUT, env=dict(self.env, DMLC_ROLE=role))
        self.procs[name] = proc
        return proc

    def start_all(self, worker_args: Sequence[str], server_args: Sequence[str] = ("-c", "1"),
                  program: Sequence[str] = (MAIN,)):
        """The original's order: scheduler, servers, workers (any order works); the
        workers run `program` (main.py, or a probe of the tests taking its flags)."""
        self.start("scheduler", "scheduler", server_args)
        for s in range(self.num_servers):
            self.start(f"server{s}", "server", server_args)
        for w in range(self.num_workers):
            self.start(f"worker{w}", "worker",
                       [*worker_args, "--device-name", f"w{w}", "-ld", self.log_dir],
                       program=program)
        return self

    def wait(self, timeout: float = 180) -> Dict[str, int]:
        deadline = time.monotonic() + timeout
        codes = {}
        for name, proc in self.procs.items():
            try:
                codes[name] = proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[name] = None
        return codes

    def wait_for_output(self, name: str, *texts: str, timeout: float = 60) -> None:
        """Until each of `texts` is in `name`'s output; fails at once if a process ended."""
        deadline = time.monotonic() + timeout
        while not all(text in self.output(name) for text in texts):
            ended = {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}
            assert not ended, f"processes ended while waiting for {texts}: {ended}"
            assert time.monotonic() < deadline, f"{name} did not log {texts}"
            time.sleep(0.05)

    def node(self, role: str):
        """A node of this job in this process (esync.transport.node.Node), with the job's
        DMLC_* and PS_* variables; the caller closes it."""
        from esync.transport.cluster import ClusterEnv
        from esync.transport.node import Node

        env = {k: v for k, v in self.env.items() if k.startswith(("DMLC_", "PS_"))}
        return Node(ClusterEnv.from_environ({**env, "DMLC_ROLE": role}), role)

    def output(self, name: str) -> str:
        with open(os.path.join(self.dir, f"{name}.out")) as f:
            return f.read()

    def outputs(self) -> Dict[str, str]:
        """Every process's output, by name."""
        return {name: self.output(name) for name in self.procs}

    def rounds(self, worker: int) -> List[dict]:
        folder = os.path.join(self.log_dir, socket.gethostname(), f"w{worker}")
        count = len(glob.glob(os.path.join(folder, "iter-*.json")))
        return [json.load(open(os.path.join(folder, f"iter-{n}.json")))
                for n in range(1, count + 1)]

    def close(self) -> None:
        """Kill what is left; a process still running first dumps its threads' stacks into
        its output (SIGABRT with PYTHONFAULTHANDLER), to show where it was stuck."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGABRT)
                try:
                    proc.wait(2)
                except subprocess.TimeoutExpired:
                    proc.send_signal(signal.SIGKILL)
            proc.wait()

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
