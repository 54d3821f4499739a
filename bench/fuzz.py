"""Fuzzing a live job: malformed and hostile messages against the scheduler, the server
and the ESync state server while two workers train, next to the same job undisturbed.

    python bench/fuzz.py [--modes async,sync] [--length 20s] [--messages 10000]
                         [--http 2000] [--big-frames 4] [--seed 0] [--no-http] [-v]

For each mode, two runs of the same job (scheduler, one server, two workers; lenet on
digits, one thread each; a fresh CurveZMQ job key, ESYNC_JOB_KEY, and state server
token, ESYNC_STATE_TOKEN, given to every real process; the ESync state server beside
it): first undisturbed (the baseline), then fuzzed. Once worker 0 has initialised the
server's shard, this process sends, spread over the job's first ~80 % (by the clock, for a
`--length` in seconds), `--messages` ZeroMQ messages and a few 64 MB frames, and, from a
thread, `--http` requests to the state server (bench/fuzz_http.py's `fuzz_http`):

- to the scheduler and to the server, from *insiders* (CurveZMQ clients with the job
  key that never registered: random, empty and worker-like ZeroMQ identities, a fresh
  socket every few messages): random bytes, truncated msgpack, msgpack that is not a
  map, requests with fields of random types, registrations with a map or list role,
  heartbeats with 60 KB unique senders, headers over 64 KiB, hundreds of frames,
  pushes with wrong sections, offsets, lengths, dtypes and rounds, huge declared sizes,
  and *well-formed* pushes and inits of NaN with the shard's own chunk layout, pulls,
  joins and leaves; answers allowed: `error` (and the scheduler's `ack` of a
  heartbeat); anything else (weights, an ack from the server) is a *leak*;
- the same from *outsiders* (no key): they cannot complete the CurveZMQ handshake, so
  any answer at all is a leak;
- raw TCP connections that write garbage, fake ZMTP greetings and huge frame sizes;
- 64 MB frames (4 x `--big-frames` in all, to both targets from insiders and
  outsiders): libzmq cuts the peer off (MAXMSGSIZE).

It prints, per mode, the messages sent per target and sender, the answers and leaks,
crashes (a process of the job that exited non-zero or the job aborted, or the state
server died), hangs (the job not done within its length plus a minute, a node declared
dead for missed heartbeats or that lost the scheduler, a target that answered probes
and then went silent for 10 s, HTTP requests that hung), the HTTP statuses and 5xx
answers, the tracebacks the job's processes logged, and the final test accuracy of the
fuzzed run next to the baseline's. Exit status 0 when, in every mode: no crash, no
hang, no 5xx, no leak, every message sent, and the accuracy within --tolerance (0.02)
of the baseline; 1 otherwise. Every process it started is stopped when it ends.
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import random
import re
import socket
import struct
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import msgpack
import numpy as np
import zmq

from esync.transport.auth import Guard, JobKey, new_key
from esync.transport.message import CHUNK_VALUES, decode, encode
from esync.launch.job import new_token
from esync.launch.supervisor import Supervisor
from nodes import length_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAIN = os.path.join(REPO, "main.py")
WORKERS = 2
BIG_FRAME = 64 << 20
PROBE_TIMEOUT_S = 10.0
ANSWER_TYPES = ("error", "weights", "ack", "assign", "barrier_done", "member", "abort",
                "shutdown", "left", "servers")
ALLOWED = {"scheduler": {"error", "ack"}, "server": {"error"}}
SCHEDULER_REQUESTS = ("register", "heartbeat", "barrier", "finished", "abort", "bye", "who")
SERVER_REQUESTS = ("init", "pull", "push", "join", "leave")
SENDERS = ("insider", "outsider", "raw-tcp")


# --- the job ---------------------------------------------------------------------------------
@dataclass
class Run:
    """One run of the job: what the fuzzer did to it and how it ended."""

    mode: str
    fuzzed: bool
    accuracy: Optional[float] = None
    rounds: int = 0
    crashes: List[str] = field(default_factory=list)
    hangs: List[str] = field(default_factory=list)
    tracebacks: Dict[str, int] = field(default_factory=dict)
    fuzz: Optional["Fuzzer"] = None
    http: Optional[dict] = None
    http_problem: Optional[str] = None
    seconds: float = 0.0


def wait_for_log(sup: Supervisor, path: str, pattern: str, timeout: float = 120) -> re.Match:
    """The first match of `pattern` in the log at `path`, once it is written; RuntimeError
    if the job ends (or the time passes) first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(path, errors="replace") as f:
                found = re.search(pattern, f.read())
        except OSError:
            found = None
        if found:
            return found
        if sup.wait(timeout=0.05) is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{os.path.basename(path)} never logged {pattern!r}")


def final_accuracy(log_dir: str) -> Tuple[Optional[float], int]:
    """The last test accuracy the evaluating worker logged, and its rounds."""
    for w in range(WORKERS):
        files = glob.glob(os.path.join(log_dir, "*", f"w{w}", "iter-*.json"))
        records = []
        for path in files:
            with open(path) as f:
                records.append((int(re.search(r"iter-(\d+)", path).group(1)), json.load(f)))
        records.sort(key=lambda r: r[0])
        accuracy = [r["accuracy"] for _, r in records if "accuracy" in r]
        if accuracy:
            return accuracy[-1], len(records)
    return None, 0


def run_job(mode: str, args, fuzzed: bool, seed: int) -> Run:
    run = Run(mode, fuzzed)
    key, token = new_key(), new_token()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="esync-fuzz-") as tmp, \
            Supervisor(grace=3.0, say=lambda line: print(f"  supervisor: {line}")) as sup:
        logs = {name: os.path.join(tmp, f"{name}.log")
                for name in ("stateserver", "scheduler", "server0", "worker0", "worker1")}
        base = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                    ESYNC_JOB_KEY=key, ESYNC_STATE_TOKEN=token)
        base.pop("ESYNC_JOB_KEY_FILE", None)
        state = sup.start("stateserver", [sys.executable, "manage.py", "runserver",
                                          "--noreload", "127.0.0.1:0"],
                          env=dict(base, ESYNC_STATE_DB=os.path.join(tmp, "state.sqlite3")),
                          cwd=os.path.join(REPO, "stateserver"), log=logs["stateserver"],
                          essential=False, ready=True)
        state_port = sup.wait_ready(state)
        cluster = dict(base, DMLC_PS_ROOT_URI="127.0.0.1", DMLC_NUM_SERVER="1",
                       DMLC_NUM_WORKER=str(WORKERS), PS_HEARTBEAT_INTERVAL="0.5",
                       PS_HEARTBEAT_TIMEOUT=f"{args.heartbeat_timeout:g}")
        scheduler = sup.start("scheduler", [sys.executable, MAIN, "-m", mode],
                              env=dict(cluster, DMLC_ROLE="scheduler", DMLC_PS_ROOT_PORT="0"),
                              log=logs["scheduler"], ready=True)
        cluster["DMLC_PS_ROOT_PORT"] = str(sup.wait_ready(scheduler))
        sup.start("server0", [sys.executable, MAIN, "-m", mode, "-c", "1"],
                  env=dict(cluster, DMLC_ROLE="server"), log=logs["server0"])
        log_dir = os.path.join(tmp, "iters")
        for w in range(WORKERS):
            sup.start(f"worker{w}", [
                sys.executable, MAIN, "-m", mode, "-n", "lenet", "--dataset", "digits",
                "--num-threads", "1", "-e", "5", "--seed", "0", *length_flags(args.length),
                "-ip", "127.0.0.1", "-port", str(state_port),
                "--device-name", f"w{w}", "-ld", log_dir],
                env=dict(cluster, DMLC_ROLE="worker"), log=logs[f"worker{w}"])
        scheduler_address = f"tcp://127.0.0.1:{cluster['DMLC_PS_ROOT_PORT']}"
        server_address = wait_for_log(sup, logs["scheduler"],
                                      r"serving at (tcp://\S+)").group(1)
        sizes = tuple(map(int, wait_for_log(
            sup, logs["server0"], r"shard of (\d+) weights and (\d+) buffer values").groups()))
        limit = float(args.length[:-1]) if args.length.endswith("s") else None
        if fuzzed:
            http_thread = None
            if not args.no_http:
                http_thread = threading.Thread(target=_http, name="fuzz-http", daemon=True,
                                               args=(run, f"http://127.0.0.1:{state_port}",
                                                     token, args.http, seed))
                http_thread.start()
            run.fuzz = Fuzzer(random.Random(seed), key, sizes,
                              [c.pid for c in sup.children if c.name.startswith("worker")],
                              {"scheduler": scheduler_address, "server": server_address})
            try:
                run.fuzz.run(args.messages, args.big_frames,
                             None if limit is None else 0.8 * limit,
                             job_ended=lambda: sup.wait(timeout=0) is not None)
            finally:
                run.fuzz.close()
            if http_thread is not None:
                http_thread.join(timeout=(limit or 60) + 120)
                if http_thread.is_alive():
                    run.hangs.append("the HTTP fuzz did not finish")
        outcome = sup.wait(timeout=(limit or 0) + 60 + (0 if limit else 600))
        if outcome is None:
            alive = [c.name for c in sup.children if c.running() and c.name != "stateserver"]
            run.hangs.append(f"the job did not finish in time ({', '.join(alive)} running)")
        elif outcome.failed is not None:
            run.crashes.append(f"{outcome.failed.name} {outcome.failed.how()}")
        for child in sup.children:
            if child.name != "stateserver" and child.returncode not in (None, 0) and \
                    not any(c.startswith(child.name + " ") for c in run.crashes):
                run.crashes.append(f"{child.name} {child.how()}")
        if not state.running():
            run.crashes.append(f"stateserver {state.how()} during the job")
        sup.stop()
        texts = {name: open(path, errors="replace").read() for name, path in logs.items()
                 if os.path.exists(path)}
        if "aborting the job" in texts.get("scheduler", ""):
            reason = re.search(r"aborting the job: (.*)", texts["scheduler"]).group(1)
            run.crashes.append(f"the job was aborted: {reason[:200]}")
        for line in re.findall(r".*sent no heartbeat for.*", texts.get("scheduler", "")):
            run.hangs.append(line.strip()[:200])
        for name, text in texts.items():
            if "lost the scheduler" in text:
                run.hangs.append(f"{name} lost the scheduler")
            count = text.count("Traceback (most recent call last)")
            if count:
                run.tracebacks[name] = count
        run.accuracy, run.rounds = final_accuracy(log_dir)
        if args.keep_logs:
            keep = os.path.join(args.keep_logs, f"{mode}-{'fuzzed' if fuzzed else 'baseline'}")
            os.makedirs(keep, exist_ok=True)
            for name, text in texts.items():
                with open(os.path.join(keep, f"{name}.log"), "w") as f:
                    f.write(text)
    run.seconds = time.monotonic() - started
    return run


def _http(run: Run, url: str, token: str, count: int, seed: int) -> None:
    try:
        from fuzz_http import fuzz_http
    except ImportError as e:
        run.http_problem = f"bench/fuzz_http.py cannot be imported ({e})"
        return
    try:
        run.http = fuzz_http(url, token, count=count, seed=seed)
    except Exception as e:  # the fuzzer's own failure: said, not taken for the server's
        run.http_problem = f"fuzz_http raised {type(e).__name__}: {e}"


# --- the fuzzer ------------------------------------------------------------------------------
def packed(value) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


@dataclass
class Tally:
    sent: int = 0
    answers: int = 0
    leaks: int = 0
    unsent: int = 0  # refused by the socket (an outsider's: its handshake had failed)
    big: int = 0
    kinds: collections.Counter = field(default_factory=collections.Counter)
    leaked: List[str] = field(default_factory=list)


class Fuzzer:
    """Sends the hostile messages (see the module's docstring) and keeps the tally."""

    RECYCLE = {"insider": 25, "outsider": 4}  # messages per socket before a fresh one

    def __init__(self, rng: random.Random, key: str, sizes: Tuple[int, int],
                 worker_pids: List[int], targets: Dict[str, str]):
        self.rng, self.sizes, self.pids, self.targets = rng, sizes, worker_pids, targets
        self.context = zmq.Context()
        self.guards = {"insider": Guard(self.context, JobKey.parse(key, "the job key")),
                       "outsider": Guard(self.context, None)}
        self.tally: Dict[Tuple[str, str], Tally] = collections.defaultdict(Tally)
        self.sockets: Dict[Tuple[str, str], Tuple[zmq.Socket, int]] = {}
        self.old: List[Tuple[str, str, zmq.Socket]] = []
        self.probes: Dict[str, zmq.Socket] = {}
        self.probe_answered = {target: 0 for target in targets}
        self.probe_silent = {target: 0 for target in targets}
        self.probe_worst = {target: 0.0 for target in targets}
        self.hangs: List[str] = []
        self.ended_early: Optional[int] = None  # the job ended after this many messages
        values = [np.nan, np.inf, -np.inf, 1e38, -1e38, 0.0]
        self.nan = {n: np.full(n, self.rng.choice(values), np.float32).tobytes()
                    for n in set(self._chunk_lengths())}

    # --- sockets ---------------------------------------------------------------------------
    def _identity(self) -> Optional[bytes]:
        r = self.rng.random()
        if r < 0.3:
            return None  # libzmq draws one
        if r < 0.6:  # what a worker's socket looks like, but for its random part
            pid = self.rng.choice(self.pids)
            return f"worker-{socket.gethostname()}-{pid}-{self.rng.getrandbits(24):06x}/" \
                   f"{self.rng.choice(['kv', 'ctl', 'hb', 'raw'])}".encode()[:255]
        if r < 0.8:
            return self.rng.randbytes(self.rng.randint(1, 255)).replace(b"\0", b"\1")
        return self.rng.choice([b"evaluator/kv", b"scheduler", b"server0", b"/", b"//",
                                b"x" * 255, b"worker-/kv"])

    def _socket(self, target: str, sender: str) -> zmq.Socket:
        key = (target, sender)
        sock, used = self.sockets.get(key, (None, 0))
        if sock is None or used >= self.RECYCLE[sender]:
            if sock is not None:
                self._drain(target, sender, sock)
                self.old.append((target, sender, sock))
                if len(self.old) > 64:  # keep a few to hear late answers
                    _, _, oldest = self.old.pop(0)
                    oldest.close(linger=0)
            sock = self.guards[sender].connect(self.context.socket(zmq.DEALER))
            identity = self._identity()
            if identity:
                sock.setsockopt(zmq.IDENTITY, identity)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 1000)
            sock.connect(self.targets[target])
            used = 0
        self.sockets[key] = (sock, used + 1)
        return sock

    def _send(self, target: str, sender: str, kind: str, frames: List) -> None:
        tally = self.tally[(target, sender)]
        sock = self._socket(target, sender)
        try:
            sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            # an outsider's socket whose handshake failed has nowhere to queue: a fresh
            # one (a fresh handshake) next time; an insider's queue is full: wait a little
            if sender == "outsider" or not sock.poll(200, zmq.POLLOUT):
                tally.unsent += 1
                self.sockets[(target, sender)] = (sock, self.RECYCLE[sender])
                return
            try:
                sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                tally.unsent += 1
                return
        tally.sent += 1
        tally.kinds[kind] += 1
        self._drain(target, sender, sock)

    def _drain(self, target: str, sender: str, sock: zmq.Socket, wait_ms: int = 0) -> None:
        tally = self.tally[(target, sender)]
        while sock.poll(wait_ms):
            frames = sock.recv_multipart()
            tally.answers += 1
            try:
                kind = decode(frames, ANSWER_TYPES).type
            except Exception as e:
                kind = f"undecodable ({type(e).__name__})"
            if sender != "insider" or kind not in ALLOWED[target]:
                tally.leaks += 1
                if len(tally.leaked) < 5:
                    tally.leaked.append(kind)

    # --- messages --------------------------------------------------------------------------
    def _chunk_lengths(self) -> List[int]:
        weights, buffers = self.sizes
        return [min(CHUNK_VALUES, n - o) for n in (weights, buffers) if n
                for o in range(0, n, CHUNK_VALUES)]

    def _chunks(self) -> List[Tuple[int, int, int]]:
        out = []
        for section, n in enumerate(self.sizes):
            out += [(section, o, min(CHUNK_VALUES, n - o)) for o in range(0, n, CHUNK_VALUES)]
        return out

    def _junk(self, depth: int = 0):
        """A random msgpack value: what a field of the wrong type looks like."""
        r = self.rng
        choices = [None, True, False, r.random(), -r.random() * 1e300, float("nan"),
                   float("inf"), r.randint(-2**63, -1), r.randint(2**62, 2**64 - 1),
                   r.randint(0, 10), "", "x" * r.randint(1, 300), "1", "float32", "push",
                   "worker", [], {}]
        if depth < 2:
            choices += [[self._junk(depth + 1) for _ in range(r.randint(1, 3))],
                        {str(r.randint(0, 9)): self._junk(depth + 1)
                         for _ in range(r.randint(1, 3))}]
        return r.choice(choices)

    def _push(self, **change) -> Tuple[Dict, List]:
        section, offset, length = self.rng.choice(self._chunks())
        header = {"type": "push", "sender": self.rng.randint(0, WORKERS - 1), "shard": 0,
                  "round": self.rng.randint(0, 300), "section": section, "offset": offset,
                  "dtype": "float32", "lengths": [length], "frames": [1]}
        header.update(change)
        return header, [self.nan.get(length) or bytes(4 * length)]

    def server_message(self) -> Tuple[str, List]:
        r = self.rng
        kind = r.choice(["random-bytes", "truncated-msgpack", "not-a-map", "mutated",
                         "mutated", "bad-layout", "bad-dtype", "bad-round", "huge-sizes",
                         "oversized-header", "many-frames", "nan-push", "nan-push",
                         "nan-init", "pull", "join-leave", "random-request"])
        if kind == "random-bytes":
            return kind, [r.randbytes(r.randint(0, 2048)) for _ in range(r.randint(1, 3))]
        if kind == "truncated-msgpack":
            raw = packed(self._push()[0])
            return kind, [raw[:r.randint(0, len(raw) - 1)]]
        if kind == "not-a-map":
            return kind, [packed(r.choice([[1, 2], "push", 7, None, 1.5, [{"type": "push"}]]))]
        if kind == "mutated":
            header, payload = self._push()
            for name in r.sample(sorted(header), r.randint(1, 3)):
                if r.random() < 0.2:
                    header.pop(name)
                else:
                    header[name] = self._junk()
            return kind, [packed(header), *payload]
        if kind == "bad-layout":
            weights, buffers = self.sizes
            section = r.choice([0, 1, 1.0, 0.0, 2, -1, True, "0"])
            offset = r.choice([-1, 1, CHUNK_VALUES, weights, weights + CHUNK_VALUES, 2**63,
                               r.randint(1, max(1, weights - 1)), 0.0])
            length = r.choice([0, 1, buffers + 1, weights - 1, weights + 1])
            header, _ = self._push(section=section, offset=offset, lengths=[length])
            return kind, [packed(header), bytes(4 * length)]
        if kind == "bad-dtype":
            header, payload = self._push(dtype=r.choice(["float64", "int8", "", "FLOAT32",
                                                         None, 4, ["float32"]]))
            return kind, [packed(header), *payload]
        if kind == "bad-round":
            header, payload = self._push(round=r.choice([-1, 2**63, 2**64 - 1, 1.0, "1",
                                                         None, [1], True]))
            return kind, [packed(header), *payload]
        if kind == "huge-sizes":
            header, _ = self._push(lengths=[r.choice([2**31, 2**40, 2**63, 2**64 - 1])],
                                   frames=[r.choice([1, 2**20, 2**31])])
            return kind, [packed(header), r.randbytes(r.choice([0, 4, 64]))]
        if kind == "oversized-header":
            header, payload = self._push(pad="x" * (70 << 10))
            return kind, [packed(header), *payload]
        if kind == "many-frames":
            header, _ = self._push(frames=[500], lengths=[0])
            return kind, [packed(header)] + [b""] * 500
        if kind == "nan-push":  # well-formed, the shard's own layout
            header, payload = self._push()
            return kind, [packed(header), *payload]
        if kind == "nan-init":
            frames = encode({"type": "init", "sender": 0, "shard": 0,
                             "rule": {"name": r.choice(["sync", "async"]),
                                      "num_workers": WORKERS, "lr": r.choice([0.05, 1e30])}},
                            [np.full(n, np.nan, np.float32) for n in self.sizes])
            return kind, frames
        if kind == "pull":
            return kind, [packed({"type": "pull", "sender": r.choice([0, 1, "evaluator"]),
                                  "shard": 0, "round": r.randint(0, 300),
                                  **r.choice([{}, {"start": True}, {"stop": "fuzz"},
                                              {"at_round": r.randint(0, 300)}])})]
        if kind == "join-leave":
            return kind, [packed({"type": r.choice(["join", "leave"]),
                                  "sender": r.randint(0, 1), "shard": 0,
                                  "round": r.randint(0, 300)})]
        header = {"type": r.choice(SERVER_REQUESTS + ("", "ack", "weights")),
                  "sender": self._junk(), **{str(self._junk(2))[:20]: self._junk()
                                             for _ in range(r.randint(0, 5))}}
        return kind, [packed(header), *[r.randbytes(r.randint(0, 64))
                                        for _ in range(r.randint(0, 2))]]

    def scheduler_message(self, n: int) -> Tuple[str, List]:
        r = self.rng
        kind = r.choice(["random-bytes", "truncated-msgpack", "not-a-map", "mutated",
                         "mutated", "bad-register", "bad-register", "heartbeat-60k",
                         "heartbeat", "stranger-request", "oversized-header", "many-frames"])
        if kind == "random-bytes":
            return kind, [r.randbytes(r.randint(0, 2048)) for _ in range(r.randint(1, 2))]
        if kind == "truncated-msgpack":
            raw = packed({"type": "register", "sender": f"fuzz-{n}", "role": "worker",
                          "pid": 1, "hostname": "h"})
            return kind, [raw[:r.randint(0, len(raw) - 1)]]
        if kind == "not-a-map":
            return kind, [packed(r.choice([["register"], "heartbeat", 1, None, 2.5]))]
        if kind == "mutated":
            header = {"type": r.choice(SCHEDULER_REQUESTS), "sender": f"fuzz-{n}",
                      "role": "worker", "group": "workers", "uid": f"x-{n}",
                      "reason": "fuzz", "host": "127.0.0.1", "port": 1, "pid": 1}
            for name in r.sample(sorted(header), r.randint(1, 3)):
                header[name] = self._junk()
            if header.get("type") == "register" and header.get("role") in (
                    "worker", "server", "evaluator"):
                header["role"] = self._junk(2)  # never a well-formed registration
            return kind, [packed(header)]
        if kind == "bad-register":
            role = r.choice([{"worker": 1}, ["worker"], {}, [], [["server"]], "king", "",
                             "x" * 300, 1, 1.0, None, True])
            header = {"type": "register", "sender": f"fuzz-{n}", "role": role,
                      **r.choice([{}, {"pid": self._junk()}, {"hostname": self._junk()},
                                  {"host": self._junk(), "port": self._junk()},
                                  {"checkpoints": self._junk()}, {"mode": self._junk()}])}
            return kind, [packed(header)]
        if kind == "heartbeat-60k":  # unique sender names of 60 KB
            return kind, [packed({"type": "heartbeat",
                                  "sender": f"fuzz-{n}-{r.getrandbits(64):x}-".ljust(60_000,
                                                                                      "x")})]
        if kind == "heartbeat":
            return kind, [packed({"type": "heartbeat", "sender": f"fuzz-{n}"})]
        if kind == "stranger-request":  # well-formed, from no member
            header = r.choice([{"type": "barrier", "group": r.choice(["workers", "all"])},
                               {"type": "finished"}, {"type": "bye"},
                               {"type": "who", "uid": f"worker-{r.getrandbits(24):x}"},
                               {"type": "abort", "reason": "fuzz"}])
            return kind, [packed({"sender": f"fuzz-{n}", **header})]
        if kind == "oversized-header":
            return kind, [packed({"type": "heartbeat", "sender": "x" * (70 << 10)})]
        return kind, [packed({"type": "heartbeat", "sender": f"fuzz-{n}"})] + [b""] * 300

    # --- raw TCP -----------------------------------------------------------------------------
    def raw_tcp(self, target: str) -> str:
        host, port = self.targets[target][len("tcp://"):].rsplit(":", 1)
        r = self.rng
        kind = r.choice(["garbage", "null-greeting", "curve-greeting", "huge-frame"])
        greeting = b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00"
        if kind == "garbage":
            data = r.randbytes(r.randint(1, 4096))
        elif kind == "null-greeting":
            data = greeting + b"NULL".ljust(20, b"\0") + b"\0" + b"\0" * 31 + \
                r.randbytes(r.randint(0, 512))
        elif kind == "curve-greeting":
            data = greeting + b"CURVE".ljust(20, b"\0") + b"\0" + b"\0" * 31 + \
                b"\x04\xff" + r.randbytes(255)
        else:  # a long frame announcing 2**62 bytes
            data = greeting + b"NULL".ljust(20, b"\0") + b"\0" * 32 + b"\x02" + \
                struct.pack(">Q", 2**62)
        try:
            with socket.create_connection((host, int(port)), timeout=2) as s:
                s.sendall(data)
        except OSError:
            pass
        return kind

    # --- probes and the whole run ------------------------------------------------------------
    def probe(self) -> None:
        """A garbage request to each target from a socket with the key: how long the
        answer takes. A target that answered probes and then says nothing for
        PROBE_TIMEOUT_S is hung."""
        for target, address in self.targets.items():
            sock = self.probes.get(target)
            if sock is None:
                sock = self.guards["insider"].connect(self.context.socket(zmq.DEALER))
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(address)
                self.probes[target] = sock
            while sock.poll(0):
                sock.recv_multipart()
            start = time.monotonic()
            sock.send_multipart([b"\xc1 probe"])
            if sock.poll(int(PROBE_TIMEOUT_S * 1000)):
                sock.recv_multipart()
                self.probe_answered[target] += 1
                self.probe_worst[target] = max(self.probe_worst[target],
                                               time.monotonic() - start)
            else:
                self.probe_silent[target] += 1
                if self.probe_answered[target]:
                    self.hangs.append(f"{target} answered probes, then nothing for "
                                      f"{PROBE_TIMEOUT_S:g} s")
                self.probes.pop(target).close(linger=0)

    def run(self, messages: int, big_frames: int, spread: Optional[float],
            job_ended: Callable[[], bool]) -> None:
        start = time.monotonic()
        plan = (["scheduler"] * 2 + ["server"] * 3)
        big_at = set(self.rng.sample(range(messages), min(messages, 4 * big_frames)))
        big = bytes(BIG_FRAME)
        self.probe()
        for n in range(messages):
            if spread:  # pace the messages over the job's first part
                ahead = start + spread * n / messages - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
            if n % 100 == 0:
                if job_ended():
                    self.ended_early = n
                    return
                if n % 500 == 0:
                    self.probe()
            target = self.rng.choice(plan)
            if n in big_at:
                sender = self.rng.choice(["insider", "outsider"])
                header = packed({"type": "push" if target == "server" else "heartbeat",
                                 "sender": 0, "shard": 0, "round": 1, "section": 0,
                                 "offset": 0, "dtype": "float32", "lengths": [BIG_FRAME // 4],
                                 "frames": [1]})
                self._send(target, sender, "64MB-frame", [header, big] if target == "server"
                           else [big])
                self.tally[(target, sender)].big += 1
                continue
            r = self.rng.random()
            sender = "insider" if r < 0.65 else "outsider" if r < 0.92 else "raw-tcp"
            if sender == "raw-tcp":
                kind = self.raw_tcp(target)
                tally = self.tally[(target, sender)]
                tally.sent += 1
                tally.kinds[kind] += 1
                continue
            kind, frames = (self.server_message() if target == "server"
                            else self.scheduler_message(n))
            self._send(target, sender, kind, frames)
        self.probe()

    def close(self) -> None:
        """Hear what is still coming (half a second), then close every socket."""
        for (target, sender), (sock, _) in self.sockets.items():
            self._drain(target, sender, sock, wait_ms=250)
        for target, sender, sock in self.old:
            self._drain(target, sender, sock)
        for sock, _ in self.sockets.values():
            sock.close(linger=0)
        for _, _, sock in self.old:
            sock.close(linger=0)
        for sock in self.probes.values():
            sock.close(linger=0)
        self.context.term()


# --- the report ------------------------------------------------------------------------------
def report(baseline: Run, fuzzed: Run, args, verbose: bool) -> List[str]:
    """Print one mode's results; the reasons it fails (none: it passes)."""
    problems: List[str] = []
    f = fuzzed.fuzz
    print(f"\n== -m {fuzzed.mode}: baseline {baseline.seconds:.0f} s, fuzzed "
          f"{fuzzed.seconds:.0f} s ==")
    if f is not None:
        print(f"{'target':<10} {'sender':<9} {'sent':>7} {'refused':>7} {'64MB':>5} "
              f"{'answers':>7} {'leaks':>5}")
        total = 0
        for target in ("scheduler", "server"):
            for sender in SENDERS:
                t = f.tally.get((target, sender))
                if t is None:
                    continue
                total += t.sent
                print(f"{target:<10} {sender:<9} {t.sent:>7} {t.unsent:>7} {t.big:>5} "
                      f"{t.answers:>7} {t.leaks:>5}"
                      + (f"  leaked: {', '.join(t.leaked)}" if t.leaked else ""))
                if verbose:
                    print("    " + ", ".join(f"{k} {v}" for k, v in sorted(t.kinds.items())))
                if t.leaks:
                    problems.append(f"{t.leaks} answer(s) to {sender}s of the {target} that "
                                    f"should not have come ({', '.join(t.leaked)})")
        refused = sum(t.unsent for t in f.tally.values())
        print(f"{'total':<10} {'':<9} {total:>7} {refused:>7}   ({total + refused} messages, "
              f"raw TCP writes included)")
        for target in f.targets:
            print(f"probes of the {target}: {f.probe_answered[target]} answered (slowest "
                  f"{f.probe_worst[target] * 1e3:.0f} ms), {f.probe_silent[target]} unanswered")
        if f.ended_early is not None:
            problems.append(f"the job ended after {f.ended_early} of {args.messages} "
                            f"messages: give it a longer --length")
        fuzzed.hangs += f.hangs
    if fuzzed.http is not None:
        h = fuzzed.http
        print(f"stateserver HTTP: {h.get('requests')} requests, statuses "
              f"{dict(sorted((h.get('by_status') or {}).items(), key=lambda kv: str(kv[0])))},"
              f" 5xx {h.get('server_errors')}, hangs {h.get('hangs')}, connection errors "
              f"{h.get('connection_errors')}, not JSON {h.get('non_json_answers')}, "
              f"{h.get('seconds')} s")
        if verbose and h.get("problems"):
            for p in h["problems"]:
                print(f"    {p.get('kind')}: {p.get('problem')}: {p.get('request', '')[:80]!r}")
        if h.get("server_errors"):
            problems.append(f"{h['server_errors']} HTTP 5xx answer(s)")
        if h.get("hangs"):
            fuzzed.hangs.append(f"{h['hangs']} HTTP request(s) hung")
        if h.get("alive_after") is False:
            fuzzed.hangs.append("the state server did not answer GET /status/ afterwards")
    elif args.no_http:
        print("stateserver HTTP: not fuzzed (--no-http)")
    else:
        print(f"stateserver HTTP: not fuzzed: {fuzzed.http_problem}")
        problems.append(f"no HTTP fuzz: {fuzzed.http_problem}")
    for run in (baseline, fuzzed):
        label = "fuzzed" if run.fuzzed else "baseline"
        print(f"{label}: crashes {run.crashes or 'none'}; hangs {run.hangs or 'none'}; "
              f"tracebacks logged {run.tracebacks or 'none'}")
        problems += [f"{label}: crash: {c}" for c in run.crashes]
        problems += [f"{label}: hang: {h}" for h in run.hangs]
    print(f"accuracy: baseline {_acc(baseline)} after {baseline.rounds} rounds, fuzzed "
          f"{_acc(fuzzed)} after {fuzzed.rounds} rounds")
    if baseline.accuracy is None or fuzzed.accuracy is None:
        problems.append("no accuracy logged")
    elif abs(baseline.accuracy - fuzzed.accuracy) > args.tolerance:
        problems.append(f"accuracy {fuzzed.accuracy:.4f} is more than {args.tolerance} from "
                        f"the baseline's {baseline.accuracy:.4f}")
    return problems


def _acc(run: Run) -> str:
    return "none" if run.accuracy is None else f"{run.accuracy:.4f}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="async,sync",
                        help="the jobs' -m, comma-separated (async, sync, esync, ...)")
    parser.add_argument("--length", default="20s",
                        help="each job's length: N rounds or Ns seconds of training")
    parser.add_argument("--messages", type=int, default=10000,
                        help="ZeroMQ messages (and raw TCP writes) per fuzzed run")
    parser.add_argument("--big-frames", type=int, default=4,
                        help="4 x N 64 MB frames in all, to random targets and senders")
    parser.add_argument("--http", type=int, default=2000,
                        help="HTTP requests to the state server per fuzzed run")
    parser.add_argument("--no-http", action="store_true", help="leave the state server be")
    parser.add_argument("--tolerance", type=float, default=0.02,
                        help="largest accuracy difference from the baseline")
    parser.add_argument("--heartbeat-timeout", type=float, default=5.0,
                        help="PS_HEARTBEAT_TIMEOUT of the jobs (seconds)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep-logs", help="copy the job's logs into this folder")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also the messages sent per kind")
    return parser


def main() -> int:
    args = build_parser().parse_args()
    try:
        length_flags(args.length)
    except ValueError:
        print(f"--length {args.length}: expected N (rounds >= 2) or Ns (seconds)")
        return 2
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    print(f"fuzzing -m {', '.join(modes)}: scheduler, 1 server, {WORKERS} workers, lenet on "
          f"digits, {args.length}; {args.messages} messages ({4 * args.big_frames} of them "
          f"64 MB frames), {0 if args.no_http else args.http} HTTP requests; "
          f"CurveZMQ job key and state server token on")
    problems: List[str] = []
    for i, mode in enumerate(modes):
        baseline = run_job(mode, args, fuzzed=False, seed=args.seed + i)
        fuzzed = run_job(mode, args, fuzzed=True, seed=args.seed + i)
        problems += [f"-m {mode}: {p}" for p in report(baseline, fuzzed, args, args.verbose)]
    print()
    if problems:
        print("FAIL:\n  " + "\n  ".join(problems))
        return 1
    print("OK: no crash, no hang, no 5xx, no leak; accuracy within "
          f"{args.tolerance} of the undisturbed runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
