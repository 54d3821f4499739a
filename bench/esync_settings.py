"""ESync's own settings, measured: which budget rule, local-step cap, weighting of the
deltas, normalised averaging and outer momentum to pick, on the evidence benchmark's two
workloads (bench/evidence.py), 3 seeds.

    python bench/esync_settings.py --out runs/settings     (about 2 hours on 2 cores)

Each variant is ESync with the flags below, run by esync-experiment (`--modes esync`,
plain loopback) into OUT/<workload>/<level>/<variant>/; at the end one table per
workload and level, variants as rows: time to each target (median [min-max] over the
seeds), the workers' samples until the harder target (the data a variant needs, apart
from its speed), samples per second, and its ratio to the paper's ESync (`mean`)
median time in the same run (below 1: faster than the paper's). Written to
OUT/settings.md. Every variant names its --average, so that the table does not change
with the default.

- mean: the paper's rule, the slowest living device's one iteration sets the round,
  the deltas' plain mean (--average mean), at most --max-local-steps 16 a round;
- steps: --average steps, the mean weighted by each delta's local steps;
- normalized: --average normalized, FedNova's normalised averaging;
- momentum: mean, --outer-momentum 0.9 -gl 0.1 (Nesterov, DiLoCo's outer optimiser, at
  the plain average's step size: the best of the options measured on digits);
- round-time: mean, --round-time T, every device fills T seconds (T: twice the
  paper's round on this machine, so that the slowest device runs about 2 local
  iterations);
- cap-64 (at 1,1,1,16, where the cap of 16 binds): mean, --max-local-steps 64, and
  cap-64-steps with --average steps.

Interrupted, it goes on where it stopped (jobs with a summary are not run again).
"""
from __future__ import annotations

import json
import os
import sys
from typing import Dict, List, Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.evidence import gathered, job_flags, level_folder, parse  # noqa: E402
from esync.launch import experiment  # noqa: E402
from esync.logs_tools.compare import target_label  # noqa: E402

#: the paper's round on this machine (seconds; measured at 1,1,4,4, seed 0: the LM's
#: ESync ran 259 rounds in 87 s, the ResNet's 103 in 201 s), so that --round-time asks
#: for about 2 of the slow device's iterations a round
ROUND_TIME = {"charlm": 0.35, "resnet": 2.0}


def variants(workload: str, level: str) -> Dict[str, List[str]]:
    """{variant: ESync's flags} measured at a heterogeneity level."""
    mean, steps = ["--average", "mean"], ["--average", "steps"]
    if level == "1,1,1,16":
        return {"mean": mean, "steps": steps,
                "cap-64": [*mean, "--max-local-steps", "64"],
                "cap-64-steps": [*steps, "--max-local-steps", "64"]}
    return {"mean": mean, "steps": steps, "normalized": ["--average", "normalized"],
            "momentum": [*mean, "--outer-momentum", "0.9", "-gl", "0.1"],
            "round-time": [*mean, "--round-time", f"{2 * ROUND_TIME[workload]:g}"]}


def _row(doc: dict, targets: Sequence[str]) -> Optional[dict]:
    entry = doc["configs"].get("plain", {}).get("algorithms", {}).get("ESync")
    if entry is None:
        return None
    return {"times": [entry["time_to_target"][t] for t in targets],
            "samples": entry.get("samples_to_target", {}).get(targets[-1], {}),
            "rate": entry["throughput_samples_per_s"]["median"]}


def _time(stats: dict) -> str:
    if stats["median"] is None:
        return f"not reached ({stats['reached']}/{len(stats['per_seed'])})"
    high = "n/r" if stats["max"] is None else f"{stats['max']:.1f}"
    return f"{stats['median']:.1f} [{stats['min']:.1f}-{high}]"


def table(name: str, level: str, rows: Dict[str, dict], targets: Sequence[str]) -> str:
    base = rows.get("mean")
    base_time = base["times"][-1]["median"] if base else None
    lines = [f"## {name} at {level}", "",
             "| variant | " + " | ".join(f"time to {t} (s)" for t in targets)
             + f" | vs mean at {targets[-1]} | samples to {targets[-1]} (k) | samples/s |",
             "|---|" + "---:|" * (len(targets) + 3)]
    for variant, row in rows.items():
        t = row["times"][-1]["median"]
        ratio = f"{t / base_time:.2f}x" if t is not None and base_time else "n/a"
        samples, rate = row["samples"].get("median"), row["rate"]
        lines.append(f"| {variant} | " + " | ".join(_time(s) for s in row["times"])
                     + f" | {ratio} | "
                     + ("n/a" if samples is None else f"{samples / 1000:.1f}")
                     + (" | n/a |" if rate is None else f" | {rate:.0f} |"))
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    args, extra, chosen, levels = parse(argv, "bench/esync_settings.py", __doc__,
                                        os.path.join("runs", "settings"))
    sections, failed = [], 0
    for name, work in chosen.items():
        for level in levels:
            rows, labels = {}, []
            for variant, flags in variants(name, level).items():
                out = os.path.join(args.out, name, level_folder(level), variant)
                argv_ = [*work.flags, "--modes", "esync", "--configs", "plain",
                         "--out", out, *job_flags(work, level), *flags, *extra,
                         *work.script]
                print(f"settings: {name} at {level}, {variant}", flush=True)
                code = experiment.main(argv_, prog="bench/esync_settings.py")
                if code == 130:  # interrupted (Ctrl-C, SIGTERM): stop here, not go on
                    return 130
                failed += code != 0
                results = os.path.join(out, "results.json")
                if os.path.isfile(results):
                    doc = json.load(open(results, encoding="utf-8"))
                    labels = [target_label(t) for t in doc["targets"]]
                    row = _row(doc, labels)
                    if row is not None:
                        rows[variant] = row
            if rows:
                sections.append(table(name, level, rows, labels))
    return gathered(args.out, "settings", "ESync's settings", sections, failed)


if __name__ == "__main__":
    sys.exit(main())
