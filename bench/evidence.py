"""Evidence on work that takes minutes: every mode against honest and speed-balanced
DDP on a language model and a vision model, two heterogeneity levels, plain loopback
and slow links, 3 seeds.

    python bench/evidence.py --out runs/evidence          (hours on 2 cores)
    python bench/evidence.py --out runs/evidence --workloads charlm --levels 1,1,4,4

Each (workload, heterogeneity) pair is one run of the comparison experiment
(esync/launch/experiment.py, i.e. `esync-experiment`) with the workload's training script
run through the library API (examples/*_esync.py under esync-run), its model and data
named as plug-ins for the evaluator. ESync, SSGD, ASGD, DC-ASGD, DDP, speed-balanced
DDP and standalone training each run --seeds times on plain loopback and with the slow
devices on emulated links (the `links` configuration; standalone has no link). Every
job ends once its evaluator has seen the workload's harder target held for --hold
seconds, or at the workload's time limit. The experiment writes its tables
(time to each target, median [min-max] over the seeds; final metric; bytes per sample;
samples per second), results.json and figures (metric against time, the seeds' range as
a band) into OUT/<workload>/<level>/; this script then writes OUT/evidence.md, every
table under one heading per workload and level, with the time each took.

The workloads, tuned on the 2-core development machine so that the slowest baseline at
1,1,4,4 reaches the harder target after tens of evaluations within about 5 minutes
(seed 0, plain loopback: the LM's SSGD reached 1.65 at 228 s, 45 evaluations; the
ResNet's SSGD first saw 0.96 at 230 s, 57 evaluations, and never held 0.98 in 300 s).
At 1,1,1,16 SSGD and DDP wait 16x a fast step every step (the LM's SSGD was at 2.08
after 340 s): they reach neither target within the time limit, which the tables show.
- charlm: the byte-level transformer of examples/charlm.py (0.12 M parameters, AdamW
  3e-3, batch 32 per worker) on the standard library's source; validation loss,
  targets 1.8 and 1.65 nats per byte.
- resnet: examples/resnet_bn.py's ResNet with BatchNorm at width 32 (0.31 M
  parameters, AdamW 1e-3, batch 32, random crops) on the embedded digits written as a
  32x32 image folder (write_digits_folder); test accuracy, targets 0.93 and 0.96 (359
  test images: one image is 0.0028).

Interrupted, it goes on where it stopped: jobs with a summary are not run again
(the experiment's --skip-done). Flags not listed here go to every experiment (and so
to every job's main.py flags), e.g. --seeds 1 for a quick look.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from esync.launch import experiment  # noqa: E402


@dataclass(frozen=True)
class Workload:
    flags: List[str]       # the experiment's and main.py's: metric, targets, plug-ins
    script: List[str]      # the training script and its arguments
    eval_interval: float   # seconds between evaluations
    time_limit: float      # most seconds of training per job


def workloads(out: str) -> Dict[str, Workload]:
    digits = os.path.join(out, "digits32")
    return {
        "charlm": Workload(
            ["--metric", "loss", "--targets", "1.8,1.65",
             "-n", "examples.charlm:build_model", "--dataset", "examples.charlm:build_data",
             "--loss", "examples.charlm:loss_fn"],
            # the script's own validation passes off: the evaluator measures
            ["examples/charlm_esync.py", "--seconds", "100000", "--eval-every", "0"],
            eval_interval=5.0, time_limit=300.0),
        "resnet": Workload(
            ["--targets", "0.93,0.96", "-n", "examples.resnet_bn:build_wide_model",
             "--dataset", "folder", "-dd", digits],
            # the script's own test passes off (each device's share of an epoch
            # ended in one): the evaluator measures
            ["examples/resnet_esync.py", "--data", digits, "--width", "32", "--augment",
             "--seconds", "100000", "--eval-every", "0"],
            eval_interval=4.0, time_limit=300.0),
    }


#: heterogeneity level -> the links configuration's (Mbit/s, ms) per worker: the slow
#: devices on 100 Mbit/s and 5 ms
LEVELS = {"1,1,4,4": ("none,none,100,100", "0,0,5,5"),
          "1,1,1,16": ("none,none,none,100", "0,0,0,5")}


def build_parser(prog: str = "bench/evidence.py", description: str = __doc__,
                 out: str = os.path.join("runs", "evidence")) -> argparse.ArgumentParser:
    """The flags of this script and of bench/esync_settings.py (their own prog, docstring
    and default --out); any other flag goes to every experiment."""
    parser = argparse.ArgumentParser(
        prog=prog, description=description.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=out, help=f"base folder (default {out})")
    parser.add_argument("--workloads", default="charlm,resnet",
                        help="which workloads, comma-separated (default charlm,resnet)")
    parser.add_argument("--levels", default=";".join(LEVELS),
                        help=f"heterogeneity levels, ';'-separated (default "
                             f"{';'.join(LEVELS)})")
    return parser


def parse(argv: Optional[Sequence[str]], prog: str = "bench/evidence.py",
          description: str = __doc__, out: str = os.path.join("runs", "evidence")):
    """(args, the experiments' extra flags, {chosen workload: Workload}, levels); an
    unknown workload or level: one line on stderr and SystemExit(2) (see choose)."""
    args, extra = build_parser(prog, description, out).parse_known_args(argv)
    try:
        names, levels = choose(args, prog)
    except ValueError as e:
        print(e, file=sys.stderr)
        raise SystemExit(2)
    chosen = workloads(args.out)
    return args, extra, {name: chosen[name] for name in names}, levels


def level_folder(level: str) -> str:
    return "x" + level.replace(",", "-")


def choose(args, prog: str) -> Tuple[List[str], List[str]]:
    """(workload names, levels) of --workloads and --levels, the ResNet's image folder
    written into --out if it is chosen and missing; ValueError (one line) if unknown."""
    chosen = workloads(args.out)
    names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    levels = [lv.strip() for lv in args.levels.split(";") if lv.strip()]
    bad = [w for w in names if w not in chosen] + [lv for lv in levels if lv not in LEVELS]
    if bad or not names or not levels:
        raise ValueError(f"{prog}: error: unknown {', '.join(bad) or 'nothing chosen'} "
                         f"(workloads: {', '.join(chosen)}; levels: {'; '.join(LEVELS)})")
    if "resnet" in names and not os.path.isdir(os.path.join(args.out, "digits32", "test")):
        from examples.resnet_bn import write_digits_folder

        write_digits_folder(os.path.join(args.out, "digits32"))
    return names, levels


def job_flags(work: Workload, level: str) -> List[str]:
    """The experiment's flags every run of a workload at a level shares."""
    return ["--slowdown", level, "--eval-interval", f"{work.eval_interval:g}",
            "--time-limit", f"{work.time_limit:g}", "--skip-done"]


def took(out: str, minutes: float) -> str:
    """How long an experiment's jobs took, over all its runs (the experiment's
    job_seconds.json: the jobs it timed), and this run's minutes."""
    try:
        with open(os.path.join(out, experiment.JOB_SECONDS), encoding="utf-8") as f:
            seconds = json.load(f)
    except (OSError, ValueError):
        seconds = {}
    return (f"{sum(seconds.values()) / 60:.1f} min over the {len(seconds)} jobs timed, "
            f"{minutes:.1f} min in this run (jobs done before are not run again).")


def gathered(out: str, name: str, title: str, sections: Sequence[str], failed: int) -> int:
    """Write a driver's tables to OUT/NAME.md under `title`; its exit status."""
    path = os.path.join(out, f"{name}.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"# {title}\n\n" + "\n".join(sections))
    print(f"{name}: tables in {path}", flush=True)
    return 1 if failed else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args, extra, chosen, levels = parse(argv)
    sections, failed = [], 0
    for name, work in chosen.items():
        for level in levels:
            bandwidth, latency = LEVELS[level]
            out = os.path.join(args.out, name, level_folder(level))
            argv_ = [*work.flags, "--out", out, *job_flags(work, level),
                     "--links-bandwidth", bandwidth, "--links-latency", latency,
                     *extra, *work.script]
            print(f"evidence: {name} at {level}: esync-experiment "
                  + " ".join(argv_), flush=True)
            start = time.monotonic()
            code = experiment.main(argv_, prog="bench/evidence.py")
            minutes = (time.monotonic() - start) / 60
            if code == 130:  # interrupted (Ctrl-C, SIGTERM): stop here, not go on
                return 130
            failed += code != 0
            results = os.path.join(out, "results.md")
            table = open(results, encoding="utf-8").read() if os.path.isfile(results) \
                else "(no results)\n"
            sections.append(f"## {name} at {level}\n\n{took(out, minutes)}\n\n"
                            + table.split("\n", 1)[1].replace("\n## ", "\n### "))
    return gathered(args.out, "evidence", "Evidence", sections, failed)


if __name__ == "__main__":
    sys.exit(main())
