"""What a round costs beyond its computing, against the workers, and against bare ZeroMQ.

    python bench/scale.py [--workers 4,8,16] [--servers 1] [--modes esync,esync-paper,sync]
                          [--mb 4] [--step 0.1] [--repeats 3] [--time-limit 30]
                          [--no-auth] [--keep DIR] [--json FILE]
    python bench/scale.py --plot before=A.json after=B.json --figure scale.png

Each job runs through esync/launch/local.py (scheduler, servers, the state server for
ESync, N workers, no evaluator) and trains `ballast`, a plug-in network of --mb megabytes
whose computing is a fixed sleep of --step seconds (an accelerator's step, the CPU
free) and a linear layer on digits, beside a parameter vector that only pads the model to
its size: every round moves and adds the model's bytes while the cores are free for the
runtime. What is measured is the runtime, not two cores shared by N computing processes.

From the workers' per-round records (their `breakdown`, esync/logs/breakdown.py) it
prints, per mode and N, the median over workers of: seconds per round, of which
computing (the local iterations' sleep and step), waiting for the others, moving the
bytes (communication less the wait), the state server (ESync's wait for a budget) and
the rest; the *overhead* (a round's time beyond computing) in ms and as a share of the
round; and the bare-ZeroMQ cost of the same bytes in the same topology and run
(bench/pushpull.py's stream: each worker streams its shard to each server in chunks,
the server echoes each chunk to every worker once all sent it), in clear and, when the
jobs have a job key (the default), also encrypted by CurveZMQ as theirs are, and the
overhead over each. Modes are esync-launch's -m and `esync-paper`, ESync with
--coordination-share 0 (the paper's rule: the slowest device's one iteration sets the
round, so equal devices run one local iteration per round, as SSGD does).

Memory: the largest proportional set size (PSS: resident pages, each shared page split
among the processes that map it; torch's libraries are mapped by every process)
of any worker and of the whole job, sampled from /proc every half second. CPU: the
seconds of CPU (user and system, from /proc) that the workers together, the servers,
the state server (Django's runserver: ESync's budgets and every job's live page) and the
scheduler used per round over the rounds counted, so that what one mode adds to the
cores' work beside the others shows. The rounds of
a job's first --settle seconds of training (and at least its first WARMUP rounds) are
left out: its start-up, where ESync measures speeds and its budgets settle. Every
figure is the median of --repeats runs, with its spread (lowest-highest); jobs of one
repetition run in turn, modes and N interleaved. With SSGD (`sync`) among the modes,
"/ SSGD paired" is each run's overhead over that of the SSGD job of the same N and
repetition: the machine's load drifts between repetitions more than the modes differ.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

from esync.transport import auth

BENCH = os.path.dirname(os.path.abspath(__file__))
WARMUP = 5
# a mode of this benchmark that is not esync-launch's own -m: its flags
MODES = {"esync-paper": ["-m", "esync", "--coordination-share", "0"]}
MB_ENV = "ESYNC_SCALE_MB"
STEP_ENV = "ESYNC_SCALE_STEP"


class Ballast(nn.Module):
    """A linear layer on the input's first 64 values, beside `values` parameters that
    only make the model its size (their gradient is zero but for one value); its
    forward sleeps `step` seconds in training, an accelerator's step."""

    def __init__(self, values: int, num_classes: int = 10, step: float = 0.0):
        super().__init__()
        self.step = step
        self.head = nn.Linear(64, num_classes)
        self.ballast = nn.Parameter(torch.zeros(max(1, values)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.step:
            time.sleep(self.step)
        return self.head(x.flatten(1)[:, :64]) + self.ballast[:1]


def ballast(num_classes: int = 10) -> nn.Module:
    """The plug-in (`--network scale:ballast`): a model of $ESYNC_SCALE_MB megabytes whose
    step sleeps $ESYNC_SCALE_STEP seconds."""
    values = int(float(os.environ.get(MB_ENV, "4")) * 1e6 / 4) - 64 * num_classes - num_classes
    return Ballast(values, num_classes, float(os.environ.get(STEP_ENV, "0")))


def values_of(mb: float) -> int:
    return int(mb * 1e6 / 4)


# --- memory and CPU ----------------------------------------------------------------------
def _processes() -> Dict[int, Tuple[int, float]]:
    """Every process: pid -> (its parent's pid, the CPU seconds it used so far, user and
    system), in one pass over /proc."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            found[int(entry)] = (int(fields[1]),
                                 (int(fields[11]) + int(fields[12])) / CLOCK_TICKS)
    return found


def _descendants(pid: int, processes: Dict[int, Tuple[int, float]]) -> List[int]:
    children: Dict[int, List[int]] = {}
    for child, (parent, _) in processes.items():
        children.setdefault(parent, []).append(child)
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            out.append(child)
            todo.append(child)
    return out


def _role(pid: int) -> str:
    """A job's process by its DMLC_ROLE (worker, server, scheduler), the state server by
    its command (Django's manage.py), anything else `other`."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        if b"manage.py" in f.read():
            return "state"
    with open(f"/proc/{pid}/environ", "rb") as f:
        env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
    return env.get(b"DMLC_ROLE", b"other").decode()


def _pss(pid: int) -> Optional[float]:
    """Its proportional set size (MiB), or None where it has gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:  # proportional: shared pages split
            return next(int(line.split()[1]) for line in f if line.startswith("Pss:")) / 1024.0
    except (OSError, StopIteration):
        return None


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
CPU_ROLES = ("worker", "server", "state", "scheduler")
CPU_NAMES = ("workers", "servers", "state server", "scheduler")  # the table's, per round


class ProcessWatch:
    """Every half second, from /proc: the largest PSS (MiB) of any worker, any server,
    and of the whole job; and the CPU seconds each role's processes used so far
    (`cpu_between`)."""

    def __init__(self):
        self.peak = {"worker": 0.0, "server": 0.0, "job": 0.0}
        self.samples: List[tuple] = []  # (time.time(), {role: CPU seconds so far})
        self._cpu: Dict[int, tuple] = {}  # pid -> (role, CPU seconds when last seen)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            total = 0.0
            processes = _processes()
            for pid in _descendants(os.getpid(), processes):
                pss = _pss(pid)
                if pss is None:
                    continue
                try:  # read each time: forked but not yet exec'd, it has its parent's
                    role = _role(pid)
                except OSError:
                    continue
                self._cpu[pid] = (role, processes[pid][1])  # one gone keeps its last
                total += pss
                if role in self.peak:
                    self.peak[role] = max(self.peak[role], pss)
            self.peak["job"] = max(self.peak["job"], total)
            used: Dict[str, float] = {}
            for role, cpu in self._cpu.values():
                used[role] = used.get(role, 0.0) + cpu
            self.samples.append((time.time(), used))

    def cpu_between(self, start: float, end: float) -> Dict[str, float]:
        """CPU seconds each role used between the samples nearest to `start` and `end`
        (wall-clock times)."""
        if not self.samples:
            return {}
        near = lambda t: min(self.samples, key=lambda s: abs(s[0] - t))[1]  # noqa: E731
        first, last = near(start), near(end)
        return {role: last.get(role, 0.0) - first.get(role, 0.0) for role in last}

    def __enter__(self) -> "ProcessWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


# --- one job -------------------------------------------------------------------------------
PARTS = ("compute", "wait", "bytes", "state_server", "other")


def round_parts(folder: Path, settle: float) -> Dict[str, float]:
    """The median over workers of their mean round, by part, in seconds (rounds that
    ended in the first `settle` seconds of training left out)."""
    per_worker = []
    for worker in sorted(p for p in folder.glob("*/*/*/*") if p.is_dir()):
        records = sorted(worker.glob("iter-*.json"), key=lambda p: int(p.stem.split("-")[1]))
        loaded = [(json.loads(p.read_text()), p.stat().st_mtime) for p in records]
        counted = [(r["breakdown"], at) for r, at in loaded[WARMUP:] if r["total_time"] > settle]
        if not counted:
            continue
        rounds = [r for r, _ in counted]
        mean = {part: statistics.fmean(r.get(key, 0.0) for r in rounds)
                for part, key in zip(PARTS, ("compute", "wait", "communication",
                                             "state_server", "other"))}
        mean["other"] += statistics.fmean(r["fetch"] + r["prep"] for r in rounds)
        mean["round"] = sum(mean[p] for p in PARTS)
        mean["rounds"] = len(rounds)
        # the wall-clock span of the counted rounds (records are written as rounds end)
        mean["started"], mean["ended"] = counted[0][1], counted[-1][1]
        per_worker.append(mean)
    if not per_worker:
        raise RuntimeError(f"no worker ran rounds after its first {settle:g} s and "
                           f"{WARMUP} rounds; see {folder}")
    return {k: statistics.median(w[k] for w in per_worker) for k in per_worker[0]}


def run_job(mode: str, workers: int, servers: int, args, base: str) -> Dict[str, float]:
    from esync.launch import local
    argv = [*MODES.get(mode, ["-m", mode]), "--workers", str(workers), "--servers", str(servers),
            "--no-evaluator", "--no-progress",
            "--out", base, "--time-limit", str(args.time_limit), "--num-threads", "1",
            "-n", "scale:ballast", "-b", "16", *(["--no-auth"] if args.no_auth else [])]
    with ProcessWatch() as watch:
        started = time.perf_counter()
        if local.run(argv, progress=False) != 0:
            raise RuntimeError(f"the {mode} job of {workers} workers failed; see {base}")
        wall = time.perf_counter() - started
    parts = round_parts(Path(base), args.settle)
    parts["overhead"] = parts["round"] - parts["compute"]
    parts.update({f"rss_{k}": v for k, v in watch.peak.items()})
    # CPU seconds per round of each role's processes together, over the counted rounds
    spanned = parts["rounds"] - 1  # the first counted round ended as the span began
    if spanned >= 1:
        used = watch.cpu_between(parts["started"], parts["ended"])
        parts.update({f"cpu_{role}": used.get(role, 0.0) / spanned for role in CPU_ROLES})
    parts["job_seconds"] = wall
    return parts


def bare_cost(workers: int, servers: int, values: int, key: str = "") -> float:
    """bench/pushpull.py's bare-ZeroMQ round (stream) of the same bytes and topology;
    with a job `key`, encrypted as a job's bytes are."""
    sys.path.insert(0, BENCH)
    import pushpull
    return pushpull.bare_round(values, workers, servers, rounds=12, streamed=True, key=key)


# --- the table -------------------------------------------------------------------------------
def spread(values: List[float], scale: float = 1.0, digits: int = 0) -> str:
    mid = statistics.median(values) * scale
    low, high = min(values) * scale, max(values) * scale
    return f"{mid:.{digits}f} [{low:.{digits}f}-{high:.{digits}f}]"


def paired(runs: List[Dict[str, float]], baseline: Optional[List[Dict[str, float]]]) -> str:
    """Each run's overhead over that of the baseline's run of the same repetition (run
    beside it, on the machine as loaded then), median [lowest-highest]; '—' without
    the baseline's runs."""
    if not baseline or len(baseline) != len(runs):
        return "—"
    return spread([r["overhead"] / b["overhead"] for r, b in zip(runs, baseline)], 1, 2)


def table(results: Dict[tuple, List[Dict[str, float]]]) -> List[str]:
    """The table's lines; with SSGD (`sync`) among the modes, each mode's overhead over
    SSGD's of the same N and repetition ("/ SSGD paired": the machine's load drifts
    between repetitions more than ESync's overhead differs from SSGD's)."""
    keyed = all("bare_key" in r for runs in results.values() for r in runs)
    with_sync = any(mode == "sync" for mode, _, _ in results)
    columns = ["mode", "workers", "servers", "s/round", "computing", "wait", "bytes",
               "state server", "other", "overhead ms", *(["/ SSGD paired"] * with_sync),
               "overhead share", "bare ZeroMQ ms",
               "overhead / bare", *(["bare CurveZMQ ms", "overhead / bare CurveZMQ"] * keyed),
               *(f"CPU {name} ms" for name in CPU_NAMES), "worker PSS MiB", "job PSS MiB"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for (mode, workers, servers), runs in sorted(results.items(), key=lambda kv: kv[0][1:]):
        ms = lambda part: spread([r[part] for r in runs], 1e3)  # noqa: E731
        cpu = "".join(f"{ms(f'cpu_{role}') if all(f'cpu_{role}' in r for r in runs) else '—'} | "
                      for role in CPU_ROLES)
        encrypted = (f"{spread([r['bare_key'] for r in runs], 1e3, 1)} | "
                     f"{spread([r['overhead'] / r['bare_key'] for r in runs], 1, 1)} | "
                     if keyed else "")
        lines.append(
            f"| {mode} | {workers} | {servers} | {spread([r['round'] for r in runs], 1, 3)} | "
            f"{ms('compute')} | {ms('wait')} | {ms('bytes')} | {ms('state_server')} | "
            f"{ms('other')} | {ms('overhead')} | "
            f"{paired(runs, results.get(('sync', workers, servers))) + ' | ' if with_sync else ''}"
            f"{spread([r['overhead'] / r['round'] for r in runs], 100, 1)}% | "
            f"{spread([r['bare'] for r in runs], 1e3, 1)} | "
            f"{spread([r['overhead'] / r['bare'] for r in runs], 1, 1)} | "
            f"{encrypted}{cpu}{spread([r['rss_worker'] for r in runs])} | "
            f"{spread([r['rss_job'] for r in runs])} |")
    return lines


def _errorbar(ax, points, figure, scale: float, style: str, label: str) -> None:
    """One line: each point's median of `figure(run)`, its lowest-highest as the bar."""
    values = [[figure(r) * scale for r in runs] for _, runs in points]
    mids = [statistics.median(v) for v in values]
    ax.errorbar([n for n, _ in points], mids,
                yerr=[[m - min(v) for m, v in zip(mids, values)],
                      [max(v) - m for m, v in zip(mids, values)]],
                marker="o", capsize=3, linestyle=style, label=label)


def plot(files: List[str], path: str) -> None:
    """Against workers, one line per file (`label=file.json`, written by --json) and
    mode (median, lowest-highest): the overhead per round beside the bare-ZeroMQ cost
    of its bytes (left), and its share of the round (right)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, share) = plt.subplots(1, 2, figsize=(11, 4.2))
    bare: Dict[int, List[float]] = {}
    encrypted: Dict[int, List[float]] = {}
    for index, item in enumerate(files):
        label, _, name = item.rpartition("=")
        style = ("-" if index == len(files) - 1 else ":")
        cells = json.loads(Path(name).read_text())
        for mode in sorted({key.split()[0] for key in cells}):
            points = sorted((int(key.split()[1].split("x")[0]), runs)
                            for key, runs in cells.items() if key.split()[0] == mode and runs)
            line = f"{mode} {label}".strip()
            _errorbar(ax, points, lambda r: r["overhead"], 1e3, style, line)
            _errorbar(share, points, lambda r: r["overhead"] / r["round"], 100, style, line)
            for n, runs in points:
                bare.setdefault(n, []).extend(r["bare"] for r in runs)
                encrypted.setdefault(n, []).extend(r["bare_key"] for r in runs if "bare_key" in r)
    xs = sorted(bare)
    ax.plot(xs, [statistics.median(bare[n]) * 1e3 for n in xs], "k--", label="bare ZeroMQ")
    keyed = [n for n in xs if encrypted[n]]
    if keyed:
        ax.plot(keyed, [statistics.median(encrypted[n]) * 1e3 for n in keyed], "k-.",
                label="bare ZeroMQ, CurveZMQ")
    ax.set_ylabel("ms per round beyond computing")
    share.set_ylabel("share of the round beyond computing, %")
    for a in (ax, share):
        a.set_xscale("log", base=2)
        a.set_xticks(xs, [str(n) for n in xs])
        a.set_xlabel("workers (one server)")
        a.set_ylim(bottom=0)
        a.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="4,8,16", help="numbers of workers (default: 4,8,16)")
    parser.add_argument("--servers", default="1", help="numbers of servers (default: 1)")
    parser.add_argument("--modes", default="esync,esync-paper,sync",
                        help="modes, as esync-launch's -m, and esync-paper: esync with "
                             "--coordination-share 0, the paper's rule (default: "
                             "esync,esync-paper,sync)")
    parser.add_argument("--mb", type=float, default=4.0, help="model size in MB (default: 4)")
    parser.add_argument("--step", type=float, default=0.1,
                        help="seconds each local iteration sleeps (default: 0.1)")
    parser.add_argument("--repeats", type=int, default=3, help="(default: 3)")
    parser.add_argument("--time-limit", type=float, default=30.0,
                        help="seconds of training per job (default: 30)")
    parser.add_argument("--settle", type=float, default=10.0,
                        help="the rounds of a job's first seconds of training, its start-up "
                             "(ESync: speeds measured, budgets settling), are left out "
                             "(default: 10)")
    parser.add_argument("--no-auth", action="store_true",
                        help="jobs without a job key (esync-launch --no-auth): ZeroMQ in "
                             "clear, as bare ZeroMQ is; by default every byte is "
                             "encrypted (CurveZMQ)")
    parser.add_argument("--keep", help="keep the jobs' logs under this folder")
    parser.add_argument("--json", help="write every run's figures to this file")
    parser.add_argument("--plot", nargs="+", metavar="[LABEL=]FILE.json",
                        help="draw --figure from these --json files instead of running")
    parser.add_argument("--figure", default="scale.png", help="(default: scale.png)")
    args = parser.parse_args()
    if args.plot:
        plot(args.plot, args.figure)
        return 0
    os.environ[MB_ENV], os.environ[STEP_ENV] = str(args.mb), str(args.step)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [BENCH] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    base = args.keep or tempfile.mkdtemp(prefix="esync-scale-")
    values = values_of(args.mb)
    cells = [(mode, int(n), int(s)) for s in args.servers.split(",")
             for n in args.workers.split(",") for mode in args.modes.split(",")]
    results: Dict[tuple, List[Dict[str, float]]] = {c: [] for c in cells}
    bare: Dict[tuple, Dict[str, float]] = {}
    try:
        for rep in range(args.repeats):
            for mode, workers, servers in cells:
                if (workers, servers, rep) not in bare:
                    bare[workers, servers, rep] = {"bare": bare_cost(workers, servers, values)}
                    if not args.no_auth:
                        bare[workers, servers, rep]["bare_key"] = bare_cost(
                            workers, servers, values, auth.new_key())
                folder = os.path.join(base, f"{mode}-{workers}x{servers}-r{rep}")
                shutil.rmtree(folder, ignore_errors=True)
                figures = run_job(mode, workers, servers, args, folder)
                figures.update(bare[workers, servers, rep])
                results[mode, workers, servers].append(figures)
                print(f"rep {rep}: {mode} {workers}x{servers}: {figures['round']:.3f} s/round, "
                      f"overhead {figures['overhead'] * 1e3:.0f} ms, bare "
                      f"{figures['bare'] * 1e3:.1f} ms, worker {figures['rss_worker']:.0f} MiB, "
                      f"job {figures['job_seconds']:.0f} s" + "".join(
                          f", CPU {name} {figures[f'cpu_{role}'] * 1e3:.0f} ms/round"
                          for role, name in zip(CPU_ROLES, CPU_NAMES)
                          if f"cpu_{role}" in figures), flush=True)
    finally:
        if args.json:
            Path(args.json).write_text(json.dumps(
                {f"{m} {n}x{s}": runs for (m, n, s), runs in results.items()}, indent=1))
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    print(f"\nmodel {args.mb:g} MB ({values:,} values), a step of {args.step:g} s, "
          f"{'no job key' if args.no_auth else 'a job key (CurveZMQ)'}, "
          f"{args.repeats} runs each: "
          f"median [lowest-highest]; ms per round")
    print("\n".join(table({k: v for k, v in results.items() if v})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
