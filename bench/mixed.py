"""One fast device and N slow ones: is the job ever faster than its fast device alone?

    python bench/mixed.py --out runs/mixed             (the whole matrix: 5-9.5 h here)
    python bench/mixed.py --out runs/mixed --cells 2x3 --workloads charlm --seeds 1
                                                        (a first look: 25-35 min here)
    python bench/mixed.py --out runs/mixed --workloads quick --seeds 1
                                                        (the built-in LeNet: 6 min here)
    python bench/mixed.py --out runs/gpu \
        --devices gpu,cpu,cpu,cpu,cpu,cpu,cpu,cpu,cpu,cpu,cpu,cpu,cpu
                                                        (the GPU form: about 7 min)

The emulated matrix (issue 44). Each cell `RxN` is one fast device at `--slowdown 2`
and N slow ones at `--slowdown 2R`, so that every device is slower than a real core and
all the computing would fit in about one core; its nominal ideal speed-up is 1 + N/R.
The default cells are 2x3, 4x7, 8x15 and 16x7 (ideals 2.5, 2.75, 2.875, 1.4375); they ask
for 1.25, 1.375, 1.44 and 0.72 cores of computing. `--fast-slowdown F` puts the fast
device at F (the slow ones at FR; the baseline alone at F, in folders named x<F>): at F =
1 + N/R a cell's computing is one core's. Every
method (`--methods`: esync-experiment's log folders, or a VARIANTS name: `esync-paper`,
ESync with the paper's rule, ESync.PAPER, beside its defaults; default DEFAULT_METHODS)
runs once per cell and seed, on plain loopback. The baseline is the fast device alone (`-m local
--slowdown 2`), run at every learning rate of `--lr-grid` (multiples of the workload's
own, default 1,2,4); for each target the multiplier with the lowest median time is its
best, and the speed-ups are over that. The methods run at the workload's learning rate:
a method that needs it scaled must scale it itself. The baseline does not depend on the
cell, so one set of its runs serves every cell of a workload.

The GPU form (`--devices gpu,cpu,...`, esync-launch's --devices): one job per method
with those devices and no slowdown, the first device alone as the baseline. Its defaults
are the LM (charlm), 1 seed, a 45 s time limit and an evaluation every 2 s. On a
CPU-only machine `--devices cpu,cpu,cpu` runs the same path.

Workloads (`--workloads`): bench/evidence.py's `charlm` and `resnet` (their scripts,
targets, evaluation intervals and 300 s time limits), and `quick`, main.py's LeNet on
the embedded digits (esync-experiment's defaults; targets 0.97, 0.98; 25 s), for tests
and a first look. Their learning rate is set by LEARNING_RATES: the scripts' `--lr`, and
main.py's `-l` (the standalone mode's step) for `quick`.

Every job is an esync-experiment job (esync/launch/experiment.py, called in process,
its standard output in OUT/<workload>/<folder>/experiment.log, its progress on stderr):
OUT/<workload>/alone-<fast>/lr<m>/ holds the baseline's jobs, OUT/<workload>/<cell>/
the methods'. Every job gets `--num-threads 1`; any flag not listed here goes to every
job, after the workload's own (e.g. `--eval-interval 1`, `--targets`, `-b 64`), except
those the bench sets (SET_HERE). `--skip-done` reuses the jobs that already have a
summary, so an interrupted run goes on where it stopped.

The measure, per cell (printed, and written to OUT/mixed.md and OUT/mixed.json; see
esync/logs_tools/speedup.py; the jobs run seed by seed, the fast device alone first in
even seeds and last in odd ones, each method between, so that the machine's drifts in
speed favour neither; after each method's
last seed but the last method's the table of those done is printed, `mixed: so far`, so
that a run cut short or hung keeps what it measured): per method and target the median [min-max] time over the
seeds ("—": fewer than half of the seeds reached it; a seed that did not counts as
slower than every seed that did, never as the time limit); the speed-up over the fast
device alone at its best learning rate (ratio of medians); the ideal `sum(v_i)/v_max`
from each device's throughput measured in the same job (samples per second of
computing), beside the nominal 1 + N/R; the fraction of the ideal reached in time to
target (speed-up / ideal) and in throughput (the job's samples/s over the fast device
alone's, divided by the ideal); the devices' summed computing rate over the fast device
alone's (where it is well below the ideal, the devices slowed each other down: on 2
cores the quick workload's 2x3 cell computes only about 1.1x the fast device alone, its
ideal 2.7); and each device's computing rate. Beside it, the paired speed-ups: seed by seed,
the fast device alone's time over the method's of the same seed, from the first
evaluations at the target and from the times interpolated between evaluations (finer than
the evaluation interval: where a job is its fast device alone, the medians' ratio falls
either side of 1.0x by an interval's chance, the paired interpolated one near 1.0x).

How long it takes here (2 cores, measured): a job runs until the harder target has held
for a second or to its time limit, plus about 5-10 s of start and summary. In the LM's
cell 2x3 (one seed), the fast device alone at x2 reached 1.65 after 247 s (its job: 270
s) and ESync after 148 s (its job: 162 s); the two jobs took 7.3 min. The LM's and the
ResNet's jobs thus take 2.5-5 min each, and the whole matrix, 2 workloads x (3 learning
rates x 3 seeds alone + 4 cells x 4 methods x 3 seeds) = 114 jobs, 5-9.5 hours (each
method more: 24 jobs, up to 2 hours). A first look at one LM cell with one seed is 7
jobs, 25-35 min. The quick workload's cell 2x3, one seed, three methods and the grid
(6 jobs) took 48 s, its four cells (15 jobs) about 6 min; the GPU form's test (`--devices cpu,cpu`, one method, one learning
rate) about 15 s. On one H100 with 16 cores (2026-11-28) the GPU form's 3 jobs alone took
0.6, 0.9 and 1.0 min (each GPU job spends about 12 s before its first round) and each
job on the GPU and 12 CPU workers about 1.0 min: about 6 minutes with three methods
(7 with the paper's ESync, added since), plus the machine's start (that run's balanced
DDP hung at its start; fixed since, not measured there).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench import evidence  # noqa: E402
from bench.evidence import Workload  # noqa: E402
from esync import config, options, registry  # noqa: E402
from esync.algorithms.esync import ESync  # noqa: E402
from esync.algorithms.policy import flag_spellings  # noqa: E402
from esync.data import METRIC_RECORD  # noqa: E402
from esync.errors import UserError, command_main  # noqa: E402
from esync.flagtypes import slowdown as slowdown_factor  # noqa: E402
from esync.launch import experiment  # noqa: E402
from esync.logs_tools import compare, speedup, summary  # noqa: E402

PROG = "bench/mixed.py"
#: the methods compared with the fast device alone: log folders (esync-experiment's modes)
#: and VARIANTS
DEFAULT_METHODS = "esync,esync-paper,sync,ddp-balanced"
#: R x N: one fast device and N devices R times slower
DEFAULT_CELLS = "2x3,4x7,8x15,16x7"
#: the fast device's --slowdown in the emulated matrix (the slow ones: R times it)
FAST_SLOWDOWN = 2.0
#: the fast device alone: its log folder
ALONE = registry.ALGORITHMS[registry.STANDALONE].log_folder()
QUICK = "quick"
#: the GPU form's defaults: workload, seeds, time limit, seconds between evaluations
GPU_FORM = {"workloads": "charlm", "seeds": 1, "time_limit": 45.0, "eval_interval": 2.0}
#: esync-experiment's flags this bench sets for each job itself (a cell, the methods)
SET_HERE = ("--modes", "--workers", "--slowdown", "--configs")


@dataclass(frozen=True)
class Variant:
    """A method of this bench: an esync-experiment log folder as it is, or (one of
    VARIANTS, `own_folder`) with its settings changed, its jobs then in
    OUT/<workload>/<cell>/<its name>/."""
    folder: str            # esync-experiment's log folder (its mode)
    flags: Tuple[str, ...]  # its settings, after any flag of the bench's command line
    display: str
    own_folder: bool = True


#: the paper's ESync (ESync.PAPER) beside ESync's defaults
VARIANTS = {"esync-paper": Variant("esync", tuple(ESync.paper_flags()),
                                   "ESync (the paper's rule)")}


def variant(method: str) -> Variant:
    """A method of --methods: a VARIANTS name's, or a log folder's as it is."""
    if method in VARIANTS:
        return VARIANTS[method]
    algorithm, split = registry.from_folder(method)
    return Variant(method, (), algorithm.display_name(split), own_folder=False)


@dataclass(frozen=True)
class LearningRate:
    """How a workload sets its learning rate: a flag of its training script (given
    after the script) or of main.py (given with the experiment's flags)."""
    flag: str
    default: float
    in_script: bool

    def flags(self, multiplier: float) -> Tuple[List[str], List[str]]:
        """(main.py's flags, the script's flags) of the default times multiplier."""
        given = [self.flag, f"{self.default * multiplier:g}"]
        return ([], given) if self.in_script else (given, [])


#: the workloads' learning rates (the scripts' argparse defaults; main.py's -l)
LEARNING_RATES = {"charlm": LearningRate("--lr", 3e-3, True),
                  "resnet": LearningRate("--lr", 1e-3, True),
                  QUICK: LearningRate("-l", config.LEARNING_RATE, False)}


def workloads(out: str) -> Dict[str, Workload]:
    """bench/evidence.py's workloads and the quick built-in one."""
    return {**evidence.workloads(out),
            QUICK: Workload(["--targets", "0.97,0.98"], [], eval_interval=0.5,
                            time_limit=25.0)}


@dataclass(frozen=True)
class Cell:
    """One set of devices: the methods' jobs on all of them, the first one alone."""
    folder: str                     # OUT/<workload>/<folder>/: the methods' jobs
    title: str
    job_flags: List[str]            # the experiment's flags of the methods' jobs
    alone_flags: List[str]          # ... and of the fast device alone's
    alone_folder: str               # OUT/<workload>/<alone_folder>/lr<m>/: its jobs
    nominal_ideal: Optional[float]  # 1 + N/R in the emulated matrix


def emulated_cell(ratio: float, slow: int, fast: float = FAST_SLOWDOWN) -> Cell:
    """One fast device at slowdown `fast` and `slow` devices `ratio` times slower (the
    folder names `fast` where it is not FAST_SLOWDOWN)."""
    slowdowns = [fast] + [fast * ratio] * slow
    nominal = 1 + slow / ratio
    return Cell(f"R{ratio:g}-N{slow}" + ("" if fast == FAST_SLOWDOWN else f"-x{fast:g}"),
                f"R={ratio:g}: 1 fast device (slowdown {fast:g}) + {slow} slow "
                f"(slowdown {fast * ratio:g}), nominal ideal {nominal:.4g}",
                ["--workers", str(1 + slow), "--slowdown", ",".join(f"{s:g}" for s in slowdowns)],
                ["--workers", "1", "--slowdown", f"{fast:g}"],
                f"alone-x{fast:g}", nominal)


def devices_cell(devices: Sequence[str]) -> Cell:
    """The GPU form: one worker on each device, no slowdown; the first one alone."""
    return Cell("devices-" + "-".join(d.replace(":", "") for d in devices),
                f"devices {','.join(devices)} (the first alone as the baseline)",
                ["--workers", str(len(devices)), "--slowdown", "1",
                 "--devices", ",".join(devices)],
                ["--workers", "1", "--slowdown", "1", "--devices", devices[0]],
                "alone-" + devices[0].replace(":", ""), None)


def parse_cells(text: str, fast: float = FAST_SLOWDOWN) -> List[Cell]:
    """The cells of `--cells 2x3,4x7` (R x N, R >= 1, N >= 1) with the fast device at
    slowdown `fast`; UserError otherwise."""
    cells = []
    for item in (part.strip() for part in text.split(",")):
        ratio, _, slow = item.partition("x")
        try:
            r, n = float(ratio), int(slow)
        except ValueError:
            r, n = 0.0, 0
        if not (1 <= r < float("inf") and n >= 1):
            raise UserError(f"--cells {text!r}: expected RxN items such as 2x3 (R >= 1 "
                            f"times slower, N >= 1 slow devices), got {item!r}")
        cells.append(emulated_cell(r, n, fast))
    return cells


def parse_devices(text: str) -> Cell:
    """The GPU form's cell of `--devices gpu,cpu,cpu` (two devices at least)."""
    devices = [d.strip().lower() for d in text.split(",") if d.strip()]
    if len(devices) < 2:
        raise UserError(f"--devices {text!r}: a fast device and one slower at least "
                        f"(e.g. gpu,cpu,cpu)")
    return devices_cell(devices)


def parse_multipliers(text: str) -> List[float]:
    """The learning-rate multipliers of `--lr-grid 1,2,4`; UserError unless positive."""
    try:
        grid = sorted({float(part) for part in text.split(",")})
    except ValueError:
        grid = []
    if not grid or not all(0 < m < float("inf") for m in grid):
        raise UserError(f"--lr-grid {text!r}: expected positive multipliers such as 1,2,4")
    return grid


def parse_names(flag: str, text: str, known: Sequence[str]) -> List[str]:
    """The comma-separated names of a flag, each one of known; UserError otherwise."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise UserError(f"{flag}: unknown {', '.join(unknown) or 'none'} "
                        f"(choose from {', '.join(known)})")
    return names


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Any other flag goes to every job (after the workload's own).")
    parser.add_argument("--out", default=os.path.join("runs", "mixed"),
                        help="base folder (default runs/mixed)")
    parser.add_argument("--cells", default=None,
                        help=f"the emulated matrix's cells, RxN comma-separated (default "
                             f"{DEFAULT_CELLS}); not with --devices")
    parser.add_argument("--fast-slowdown", type=slowdown_factor, default=FAST_SLOWDOWN,
                        help=f"the emulated fast device's --slowdown, the slow ones' R "
                             f"times it (default {FAST_SLOWDOWN:g}; at 1 + N/R, a cell's "
                             f"computing is one core's)")
    parser.add_argument("--devices", default=None,
                        help="the GPU form: each worker's device (esync-launch's --devices, "
                             "e.g. gpu,cpu,cpu); the first alone is the baseline")
    parser.add_argument("--workloads", default=None,
                        help="comma-separated: charlm, resnet, quick (default charlm,resnet; "
                             "with --devices charlm)")
    parser.add_argument("--methods", default=DEFAULT_METHODS,
                        help=f"esync-experiment's log folders, or {', '.join(VARIANTS)} "
                             f"(default {DEFAULT_METHODS})")
    parser.add_argument("--seeds", type=int, default=None,
                        help="runs of each job, seeds 0..N-1 (default 3; with --devices 1)")
    parser.add_argument("--lr-grid", default="1,2,4",
                        help="the fast device alone's learning rates, multiples of the "
                             "workload's (default 1,2,4)")
    parser.add_argument("--time-limit", type=float, default=None,
                        help="most seconds of training per job (default: the workload's; "
                             f"with --devices {GPU_FORM['time_limit']:g})")
    parser.add_argument("--skip-done", action="store_true",
                        help="reuse the jobs that already have a summary in --out")
    return parser


@dataclass
class Plan:
    """What one run of the bench does, checked before any job starts."""
    out: str
    workloads: Dict[str, Workload]
    cells: List[Cell]
    methods: List[str]
    seeds: int
    grid: List[float]
    time_limit: Optional[float]
    eval_interval: Optional[float]  # None: the workload's
    skip_done: bool
    extra: List[str]


def plan(argv: Sequence[str], prog: str = PROG) -> Plan:
    """The run's plan from its command line; UserError (one line) on bad input."""
    args, extra = build_parser(prog).parse_known_args(argv)
    gpu = args.devices is not None
    if gpu and (args.cells is not None or args.fast_slowdown != FAST_SLOWDOWN):
        raise UserError("--cells and --fast-slowdown are the emulated matrix, --devices "
                        "the GPU form: give one")
    cells = [parse_devices(args.devices)] if gpu else parse_cells(args.cells or DEFAULT_CELLS,
                                                                  args.fast_slowdown)
    known = workloads(args.out)
    names = parse_names("--workloads", args.workloads or
                        (GPU_FORM["workloads"] if gpu else "charlm,resnet"), list(known))
    methods = parse_names("--methods", args.methods,
                          [f for f in experiment.jobs() if f != ALONE] + list(VARIANTS))
    seeds = args.seeds if args.seeds is not None else GPU_FORM["seeds"] if gpu else 3
    time_limit = args.time_limit if args.time_limit is not None else \
        GPU_FORM["time_limit"] if gpu else None
    if seeds < 1 or (time_limit is not None and not time_limit > 0):
        raise UserError("--seeds must be >= 1 and --time-limit > 0")
    taken = [a for a in extra if a.split("=")[0] in SET_HERE]
    if taken:
        raise UserError(f"{taken[0].split('=')[0]} is set by the bench (see --cells, "
                        f"--devices, --methods)")
    return Plan(args.out, {n: known[n] for n in names}, cells, methods, seeds,
                parse_multipliers(args.lr_grid), time_limit,
                GPU_FORM["eval_interval"] if gpu else None, args.skip_done, extra)


# --- the jobs ------------------------------------------------------------------------------

def experiment_argv(run: Plan, name: str, flags: Sequence[str], modes: Sequence[str],
                    out: str, multiplier: float = 1.0, skip_done: bool = False,
                    seed: Optional[int] = None, last: Sequence[str] = ()) -> List[str]:
    """esync-experiment's command line of one set of jobs of a workload (`skip_done`:
    reuse the done ones, whatever --skip-done says; `seed`: that seed's jobs only;
    `last`: flags after the command line's own, a variant's settings)."""
    work = run.workloads[name]
    main_lr, script_lr = LEARNING_RATES[name].flags(multiplier) if multiplier != 1 \
        else ([], [])
    time_limit = run.time_limit if run.time_limit is not None else work.time_limit
    eval_interval = run.eval_interval if run.eval_interval is not None else work.eval_interval
    return [*work.flags, "--out", out, "--configs", experiment.PLAIN,
            "--seeds", str(run.seeds), *([] if seed is None else ["--only-seed", str(seed)]),
            "--modes", ",".join(modes), *flags,
            "--time-limit", f"{time_limit:g}", "--eval-interval", f"{eval_interval:g}",
            "--num-threads", "1", *(["--skip-done"] if run.skip_done or skip_done else []),
            *main_lr, *taken_by(run.extra, modes), *last, *work.script, *script_lr]


def taken_by(extra: Sequence[str], modes: Sequence[str]) -> List[str]:
    """`extra` less the flags of an algorithm's own settings that one of `modes` (log
    folders) does not take, each with its value: `--global-batch fastest` goes to
    speed-balanced DDP's jobs, not to the fast device alone's, which refuse it."""
    algorithms = {a.log_folder(split): a for a, split in registry.all_folders()}
    owners: Dict[str, set] = {}  # a policy's flag spelling -> the algorithms taking it
    for algorithm in registry.ALGORITHMS.values():
        for spelling in flag_spellings(options.Options, algorithm):
            owners.setdefault(spelling, set()).add(algorithm.key)
    kept, skip = [], False
    for k, arg in enumerate(extra):
        if skip:
            skip = False
            continue
        flag = arg.split("=")[0]
        if flag in owners and any(algorithms[m].key not in owners[flag] for m in modes
                                  if m in algorithms):
            skip = "=" not in arg and k + 1 < len(extra)
            continue
        kept.append(arg)
    return kept


def run_experiment(argv: List[str], out: str) -> int:
    """One esync-experiment in process, its tables and summary lines into
    OUT/experiment.log (its progress stays on stderr); its exit status."""
    os.makedirs(out, exist_ok=True)
    print(f"mixed: esync-experiment {' '.join(argv)}", file=sys.stderr, flush=True)
    with open(os.path.join(out, "experiment.log"), "a", encoding="utf-8") as log, \
            contextlib.redirect_stdout(log):
        return experiment.main(argv, prog=PROG)


def alone_out(run: Plan, name: str, cell: Cell, multiplier: float) -> str:
    return os.path.join(run.out, name, cell.alone_folder, f"lr{multiplier:g}")


def cell_out(run: Plan, name: str, cell: Cell) -> str:
    return os.path.join(run.out, name, cell.folder)


def method_out(run: Plan, name: str, cell: Cell, method: str) -> str:
    """Where a method's jobs go: the cell's folder, a variant's own inside it."""
    out = cell_out(run, name, cell)
    return os.path.join(out, method) if variant(method).own_folder else out


def method_argv(run: Plan, name: str, cell: Cell, method: str,
                seed: Optional[int] = None) -> List[str]:
    """esync-experiment's command line of a method's jobs on the cell's devices."""
    its = variant(method)
    return experiment_argv(run, name, cell.job_flags, [its.folder],
                           method_out(run, name, cell, method), seed=seed, last=its.flags)


def seed_order(seed: int, grid: Sequence[float], methods: Sequence[str]) -> list:
    """One seed's jobs in the order they run: the fast device alone at each learning
    rate of grid (floats) first in even seeds and last in odd ones, the methods (names)
    between, so that a drift of the machine's speed in a seed's jobs favours neither."""
    alone = [float(m) for m in grid]
    return [*alone, *methods] if seed % 2 == 0 else [*methods, *alone]


def run_cell(run: Plan, name: str, cell: Cell, alone_done: set,
             so_far: Callable[[List[str]], None] = lambda done: None) -> List[int]:
    """Seed by seed (seed_order): the fast device alone at every learning rate (once per
    workload and fast device: alone_done) and the methods on all the cell's devices, one
    at a time, so that a drift in the machine's speed falls on the baseline and the
    methods alike (on this 2-core VM one alone job, deterministic, ran 15% faster in one
    run than in another 20 minutes later); `so_far` is called with the methods done after each
    method's last seed, so that a run cut short still leaves their table; then the
    experiment's own tables of them all (nothing run again); exit statuses."""
    codes = []
    alone = cell.alone_folder not in alone_done
    alone_done.add(cell.alone_folder)
    out = cell_out(run, name, cell)
    for seed in range(run.seeds):
        for job in seed_order(seed, run.grid if alone else [], run.methods):
            if isinstance(job, float):
                folder = alone_out(run, name, cell, job)
                codes.append(run_experiment(experiment_argv(
                    run, name, cell.alone_flags, [ALONE], folder, job, seed=seed), folder))
            else:
                codes.append(run_experiment(method_argv(run, name, cell, job, seed),
                                            method_out(run, name, cell, job)))
                k = run.methods.index(job)
                if seed + 1 == run.seeds and k + 1 < len(run.methods):
                    so_far(run.methods[:k + 1])
            if codes[-1] == 130:
                return codes
    together = [m for m in run.methods if not variant(m).own_folder]  # one folder's
    if len(together) > 1:
        run_experiment(experiment_argv(run, name, cell.job_flags, together, out,
                                       skip_done=True), out)
    return codes


# --- the measure ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Reading:
    """How a workload's jobs are read back: their folder name and what they measure."""
    network: str          # OUT/.../seed<k>/<network>/: the script's name or -n
    metric: str           # accuracy or val_loss
    targets: List[float]  # the easiest first


def reading(run: Plan, name: str) -> Reading:
    """The workload's folder name, metric and targets, as its jobs will see them."""
    work = run.workloads[name]
    args, _ = experiment.build_parser().parse_known_args([*work.flags, *run.extra])
    try:
        experiment.parse_targets(args)
    except ValueError as e:
        raise UserError(str(e)) from None
    network = os.path.splitext(os.path.basename(work.script[0]))[0] if work.script \
        else args.network
    return Reading(network, METRIC_RECORD[args.metric], args.targets)


def summaries(out: str, read: Reading, folder: str, seeds: int) -> Dict[str, dict]:
    """{seed<k>: summary} of one log folder's jobs in an experiment's OUT (seeds without
    a readable summary are left out)."""
    found = {}
    for k in range(seeds):
        path = summary.output_path(os.path.join(out, experiment.PLAIN, f"seed{k}"),
                                   read.network, folder)
        try:
            with open(path, encoding="utf-8") as f:
                found[f"seed{k}"] = json.load(f)
        except (OSError, ValueError):
            continue
    return found


def measure(run: Plan, name: str, cell: Cell, read: Reading,
            methods_done: Optional[Sequence[str]] = None) -> dict:
    """The cell's measure (speedup.alone and speedup.job) from its jobs' summaries (of
    `methods_done`, default every method)."""
    alone = speedup.alone({m: summaries(alone_out(run, name, cell, m), read, ALONE, run.seeds)
                           for m in run.grid}, read.targets, read.metric)
    methods = {method: speedup.job(summaries(method_out(run, name, cell, method), read,
                                             variant(method).folder, run.seeds),
                                   alone, read.targets, read.metric)
               for method in (run.methods if methods_done is None else methods_done)}
    return {"title": cell.title, "nominal_ideal": cell.nominal_ideal, "alone": alone,
            "methods": methods}


# --- tables --------------------------------------------------------------------------------

def time_cell(stats: Optional[dict]) -> str:
    """compare.py's median [min-max] cell, "—" where the median was not reached."""
    if stats is None or not stats["per_seed"]:
        return "—"
    if stats["median"] is None:
        return f"— ({stats['reached']}/{len(stats['per_seed'])})"
    return compare.time_cell(stats)


def number_cell(value: Optional[float], spec: str = ".2f", unit: str = "x") -> str:
    return "—" if value is None else f"{value:{spec}}{unit}"


def table(result: dict, targets: Sequence[float]) -> str:
    """The cell's table: the fast device alone, then one row per method."""
    labels = [compare.target_label(t) for t in targets]
    head = ["Run", *(f"{part} {label}" for label in labels
                     for part in ("Time to", "Speed-up at", "Of ideal at")),
            "Ideal (measured)", "Computing over alone", "Samples/s", "Throughput of ideal"]
    rows = [alone_row(result["alone"], labels),
            *(method_row(variant(folder).display, m, labels) for folder, m in result["methods"].items())]
    return "\n".join([markdown_row(head), "|---|" + "---:|" * (len(head) - 1),
                      *map(markdown_row, rows)])


def alone_row(alone: dict, labels: Sequence[str]) -> List[str]:
    """The fast device alone: per target its time at its best learning rate."""
    cells = []
    for label in labels:
        best = alone["targets"][label]
        lr = f" (lr x{best['lr']:g})" if best["lr"] is not None else ""
        cells += [time_cell(best["time"]) + lr, "1.00x" if best["time"] else "—", ""]
    return ["Fast device alone", *cells, "1", "1",
            number_cell(alone["samples_per_s"], ".0f", ""), ""]


def method_row(name: str, m: dict, labels: Sequence[str]) -> List[str]:
    """One method: per target its time, speed-up and fraction of the ideal; then its
    ideal, throughput and the fraction of the ideal in throughput."""
    cells = []
    for label in labels:
        at = m["targets"][label]
        cells += [time_cell(at["time"]), number_cell(at["speedup"]),
                  number_cell(at["fraction"], ".2f", "")]
    return [name, *cells, number_cell(m["ideal"]["median"], ".2f", ""),
            number_cell(m["computing_over_alone"]["median"], ".2f", ""),
            number_cell(m["samples_per_s"]["median"], ".0f", ""),
            number_cell(m["throughput_fraction"], ".2f", "")]


def seeds_cell(stats: dict) -> str:
    """A paired speed-up's median and its seeds: '0.85x (0.99, 0.73, 0.85)' ("—": the
    alone's seed did not reach the target; 0.00: the method's did not)."""
    seeds = ", ".join("—" if v is None else f"{v:.2f}" for v in stats["per_seed"])
    return f"{number_cell(stats['median'])} ({seeds})"


def paired_table(result: dict, targets: Sequence[float]) -> str:
    """Per method and target its paired speed-ups, from the evaluations and
    interpolated."""
    labels = [compare.target_label(t) for t in targets]
    head = ["Run", *(f"{part} {label}" for label in labels
                     for part in ("Paired at", "Interpolated at"))]
    rows = [[variant(folder).display,
             *(seeds_cell(m["targets"][label][key]) for label in labels
               for key in ("paired", "paired_crossing"))]
            for folder, m in result["methods"].items()]
    return "\n".join([markdown_row(head), "|---|" + "---:|" * (len(head) - 1),
                      *map(markdown_row, rows)])


PAIRED_LEGEND = ("Paired: per seed, the fast device alone's time (at its best learning "
                 "rate) over the method's of the same seed, the median and each seed's in "
                 "brackets; 0.00: the method's seed did not reach the target, —: the "
                 "alone's did not (left out). Interpolated: the same, each time taken "
                 "where the metric crossed the target, linear between the evaluation "
                 "short of it and the one at it.")


def learning_rate_line(alone: dict) -> str:
    """The fast device alone's median time to each target at each learning rate (a best
    at the grid's edge says the grid is too narrow)."""
    return "; ".join(
        f"{label}: " + ", ".join(f"x{lr} {number_cell(stats['median'], '.2f', ' s')}"
                                 for lr, stats in best["by_lr"].items())
        for label, best in alone["targets"].items())


def device_lines(result: dict) -> List[str]:
    """Per run, each device's samples per second of computing (median over its jobs)."""
    runs = [("Fast device alone", result["alone"]["device_rates"]),
            *((variant(folder).display, m["device_rates"])
              for folder, m in result["methods"].items())]
    return [f"- {name}: {device_rates(rates)}" for name, rates in runs]


def device_rates(jobs: Sequence[Dict[str, float]]) -> str:
    """'w0-x2 2427, w1-x4 1416, ...': each device's median over jobs, in worker order."""
    devices = sorted({d for rates in jobs for d in rates}, key=lambda d: (len(d), d))
    return ", ".join(f"{d} {speedup.median([r.get(d) for r in jobs]):.0f}"
                     for d in devices) or "no run"


def markdown_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


LEGEND = ("Times: median [min-max] seconds over the seeds; —: fewer than half of the "
          "seeds reached the target (a seed that did not counts as slower than every "
          "seed that did, never as the time limit; (k/n): k of n reached it). The fast "
          "device alone runs at each learning rate of the grid; per target its best "
          "(lowest median) is shown and is the baseline. Speed-up: the fast device "
          "alone's median time / the method's. Ideal: sum(v_i)/v_max of each device's "
          "samples per second of computing, measured in the method's own jobs (median "
          "over seeds). Of ideal: speed-up / ideal. Computing over alone: the devices' "
          "summed samples per second of computing in the job over the fast device's "
          "alone (below the ideal where they slow each other, e.g. sharing cores). "
          "Throughput of ideal: the job's samples/s / the fast device alone's, divided "
          "by the ideal.")


def section(name: str, result: dict, read: Reading, run: Plan) -> str:
    nominal = result["nominal_ideal"]
    return (f"## {name}: {result['title']}\n\n"
            f"{run.seeds} seed(s); targets {', '.join(map(compare.target_label, read.targets))}"
            f" ({read.metric}); learning-rate grid of the fast device alone: "
            f"{', '.join(f'x{m:g}' for m in run.grid)}"
            + (f"; nominal ideal 1 + N/R = {nominal:.4g}" if nominal else "") + ".\n\n"
            + table(result, read.targets) + "\n\n" + LEGEND + "\n\n"
            + "Paired, seed by seed:\n\n" + paired_table(result, read.targets) + "\n\n"
            + PAIRED_LEGEND + "\n\n"
            + "The fast device alone's median time by learning rate: "
            + learning_rate_line(result["alone"]) + ".\n\n"
            + "Each device's samples per second of computing (median over seeds):\n\n"
            + "\n".join(device_lines(result)) + "\n")


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    return command_main(_main, argv, prog, PROG)


def _main(argv: List[str], prog: str) -> int:
    run = plan(argv, prog)
    reads = {name: reading(run, name) for name in run.workloads}
    if "resnet" in run.workloads:
        write_digits(run.out)
    sections: List[str] = []
    doc, failed = {}, 0
    start = time.monotonic()
    for name in run.workloads:
        rate = LEARNING_RATES[name]
        doc[name] = {"metric": reads[name].metric, "targets": reads[name].targets,
                     "learning_rate": {"flag": rate.flag, "default": rate.default},
                     "cells": {}}
        codes = run_workload(run, name, reads[name], doc[name]["cells"], sections)
        if 130 in codes:
            return 130
        failed += sum(c != 0 for c in codes)
    summary.write_json(os.path.join(run.out, "mixed.json"),
                       {"lr_grid": run.grid, "seeds": run.seeds, "workloads": doc})
    sections.append(f"Took {(time.monotonic() - start) / 60:.1f} min in this run.\n")
    return evidence.gathered(run.out, "mixed", "One fast device and N slow ones", sections,
                             failed)


def run_workload(run: Plan, name: str, read: Reading, cells: dict,
                 sections: List[str]) -> List[int]:
    """Every cell of one workload: its jobs, then its measure into cells and its table
    printed and added to sections; the jobs' exit statuses (130: interrupted, stop)."""
    alone_done: set = set()
    codes: List[int] = []
    for cell in run.cells:
        def so_far(done: List[str], cell: Cell = cell) -> None:
            print(f"mixed: so far ({', '.join(done)} of {', '.join(run.methods)}):\n\n"
                  + section(name, measure(run, name, cell, read, done), read, run),
                  flush=True)

        codes += run_cell(run, name, cell, alone_done, so_far)
        if 130 in codes:
            break
        cells[cell.folder] = measure(run, name, cell, read)
        sections.append(section(name, cells[cell.folder], read, run))
        print(sections[-1], flush=True)
    return codes


def write_digits(out: str) -> None:
    """The ResNet workload's image folder (bench/evidence.py's), written once."""
    if not os.path.isdir(os.path.join(out, "digits32", "test")):
        from examples.resnet_bn import write_digits_folder

        write_digits_folder(os.path.join(out, "digits32"))


if __name__ == "__main__":
    sys.exit(main())
