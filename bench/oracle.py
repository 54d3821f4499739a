"""The large-batch oracle: the most any data-parallel method can gain over the fastest
device alone, on one workload.

    python bench/oracle.py                         (charlm, ideals 2.5 and 2.75; 40 min)
    python bench/oracle.py --ideals 2.75 --max-steps 2000   (20 min here, measured)
    python bench/oracle.py --ideals 2.75 --staleness 1,4 --lr-grid 1   (25 min here)
    python bench/oracle.py --ideals '' --skipped 1 --lr-grid 1 --seeds 6   (10 min here)

Devices whose summed throughput is `ideal` times the fastest's can at best train, in
each of the fastest device's steps, on `ideal` times its batch: every sample they
compute counts, nobody waits, nothing is stale. A synchronous method (SSGD, DDP, ESync's
averaging) is at best that; the time-optimal asynchronous method for devices of
different speeds (Rennala SGD, Tyurin and Richtarik 2023) is no better. So the oracle's
speed-up, the steps the fastest device alone needs to reach a target over the steps the
oracle needs, bounds what extra devices can buy. Where it is below 1.3 at an ideal of 2
or more, issue 44's "1.3x sooner" cannot be met by any method on that workload and
target (the batch is above the workload's critical batch size there).

It trains in one process, counting steps (no clock): the workload's model with its
optimizer, at batch `b` (the fast device alone) and at `round(b * ideal)` for each
ideal, each at every learning rate of the grid (multiples of the workload's), with
--seeds seeds; a validation pass every --eval-every steps. A run ends at the harder
target or at --max-steps. Printed (and written to --out as oracle.md and oracle.json):
per batch, the best learning rate's median steps [min-max] to each target, and the
speed-up bound (the fast device alone's best median over the oracle's best median).
The learning-rate grid is the same for both, so that no batch wins by a step size the
other was denied.

Workload: charlm (examples/charlm.py: 0.12 M parameters, AdamW 3e-3 with weight decay
0.01, batch 32; validation loss, targets 1.8 and 1.65), the evidence workload whose step
time is longest here. Measured (2026-11-27, 2 cores, one torch thread per run, two runs
at once): the second command above found the bound at ideal 2.75 to be 1.64x at 1.8 and
2.00x at 1.65 (batch 88 at 3e-3: 550 [500-1150] and 850 [800-1650] steps; batch 32:
900 [900-1450] and 1700 [1650-1700]). One seed's steps differ from another's by up to
2x: use 3 seeds or more.

--staleness S adds, for each ideal, a row whose extra samples (the slow devices' part of
the batch) have their gradient taken at the weights of S steps before, as a device that
computes while the fast one steps would hand it in (asynchronous methods; a local-SGD
round's start). Measured (2026-11-28, `--ideals 2.75 --staleness 1,4`, 3 seeds): at lr
x1, 1 step old: 1850 [1750-1950] steps to 1.8 (0.49x the fast device alone), 1.65 not
reached by 2500; 4 steps old: neither reached. At lr x0.5: the alone 1000 / 1850, fresh
650 / 1000, 1 step old 1200 / 1800 (0.75x / 0.94x the alone at its best, x1), 4 steps
old neither reached. On this workload the slow devices' samples help only at the
current weights, that is, synchronously.

--skipped K adds a row for the fast device alone with its first K steps computed but
not taken (ESync's measuring round; its training is otherwise the alone's, step for
step). Measured (2026-11-28, `--ideals '' --skipped 1 --lr-grid 1 --seeds 6`, 10 min
here): 1000 [900-1200] / 1700 [1650-2100] steps against the alone's 1050 [900-1450] /
1825 [1650-1900] (one seed did not reach 1.65 by 2500): no cost in expectation, but
each seed moves by up to 250 steps, either way.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Dict, List, NamedTuple, Optional, Sequence

import torch
from torch.utils.data import DataLoader

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from esync.errors import UserError, command_main  # noqa: E402
from esync.logs_tools import compare  # noqa: E402

PROG = "bench/oracle.py"
BATCH, LEARNING_RATE, WEIGHT_DECAY = 32, 3e-3, 0.01  # examples/charlm_esync.py's defaults


class Run(NamedTuple):
    """One training run: its batch, learning-rate multiple, seed, and its variant (the
    staleness of its extra gradients, the first steps computed but not taken)."""
    batch: int
    multiple: float
    seed: int
    staleness: int = 0
    skipped: int = 0


def steps_to_targets(batch: int, lr: float, seed: int, targets: Sequence[float],
                     max_steps: int, eval_every: int,
                     staleness: int = 0, skipped: int = 0) -> Dict[str, Optional[int]]:
    """Train charlm alone at `batch` and `lr`; the first step at which a validation pass
    saw each target (a loss at or below it), None where none did by `max_steps`. With
    `staleness` s > 0 the batch's part beyond BATCH (the slow devices' samples) has its
    gradient taken at the weights of s steps before, as a device that computes while
    the fast one steps would hand it in; the step's gradient is the mean over the whole
    batch. With `skipped` k, the first k steps compute their batch but are not taken
    (ESync's measuring round); they count as steps."""
    from examples import charlm

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    train, val = charlm.build_data()
    model = charlm.build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=WEIGHT_DECAY)
    order = torch.Generator().manual_seed(seed)
    own = batch if not staleness else BATCH
    loader = DataLoader(train, batch_size=own, shuffle=True, generator=order,
                        drop_last=True)
    stale = Stale(charlm, model, train, batch - own, staleness, seed) if staleness else None
    val_loader = DataLoader(val, batch_size=256)
    reached: Dict[str, Optional[int]] = {f"{t:g}": None for t in targets}
    hardest, step = f"{min(targets):g}", 0
    while step < max_steps and reached[hardest] is None:
        for inputs, outputs in loader:
            optimizer.zero_grad()
            charlm.loss_fn(model(inputs), outputs).backward()
            if stale is not None:
                stale.add_gradient(own)
            if step >= skipped:
                optimizer.step()
            step += 1
            if step % eval_every == 0:
                loss = validation_loss(model, val_loader, charlm.loss_fn)
                for t in targets:
                    if loss <= t and reached[f"{t:g}"] is None:
                        reached[f"{t:g}"] = step
            if step >= max_steps or reached[hardest] is not None:
                break
    return reached


class Stale:
    """The slow devices' part of a stale batch: `extra` samples a step, their gradient
    taken at the weights `staleness` steps old (a second copy of the model holds them)."""

    def __init__(self, charlm, model: torch.nn.Module, train, extra: int, staleness: int,
                 seed: int):
        self.charlm, self.model, self.extra = charlm, model, extra
        self.view = charlm.build_model()
        self.params, self.view_params = list(model.parameters()), list(self.view.parameters())
        self.past: collections.deque = collections.deque(maxlen=staleness + 1)
        self.loader = DataLoader(train, batch_size=extra, shuffle=True, drop_last=True,
                                 generator=torch.Generator().manual_seed(seed + 1))
        self.batches = iter(self.loader)

    def add_gradient(self, own: int) -> None:
        """Make the model's gradient (of `own` samples, at the current weights) the mean
        over those and the extra samples at the weights `staleness` steps old."""
        self.past.append([p.detach().clone() for p in self.params])
        with torch.no_grad():
            for view, old in zip(self.view_params, self.past[0]):
                view.copy_(old)
        try:
            inputs, outputs = next(self.batches)
        except StopIteration:
            self.batches = iter(self.loader)
            inputs, outputs = next(self.batches)
        self.view.zero_grad()
        self.charlm.loss_fn(self.view(inputs), outputs).backward()
        total = own + self.extra
        for p, view in zip(self.params, self.view_params):
            p.grad.mul_(own / total).add_(view.grad, alpha=self.extra / total)


def validation_loss(model: torch.nn.Module, loader: DataLoader, loss_fn) -> float:
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for inputs, outputs in loader:
            total += loss_fn(model(inputs), outputs).item() * len(inputs)
            count += len(inputs)
    model.train()
    return total / count


def best(by_lr: Dict[str, List[Optional[int]]]) -> Optional[str]:
    """The learning rate whose median steps are fewest (None if none reached it); a
    run that never reached the target counts as slower than every run that did
    (compare.censored_median, as esync-compare's tables)."""
    medians = {lr: compare.censored_median(runs) for lr, runs in by_lr.items()}
    reached = {lr: m for lr, m in medians.items() if m is not None}
    return min(reached, key=reached.get) if reached else None


def table(results: dict, targets: Sequence[float]) -> str:
    """The markdown table: per batch, each target's best median steps and the bound."""
    variants = any(variant(row) for row in results["batches"])
    head = ["Batch", "Ideal"] + (["Variant"] if variants else []) + [c for t in targets for c in (
        f"Steps to {t:g} (best lr)", f"Speed-up bound at {t:g}")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    alone = results["batches"][0]
    for row in results["batches"]:
        cells = [str(row["batch"]), f"{row['ideal']:g}"]
        if variants:
            cells.append(variant(row) or "—")
        for t in targets:
            mine, base = row["targets"][f"{t:g}"], alone["targets"][f"{t:g}"]
            if mine["median"] is None:
                cells += ["—", "—"]
                continue
            runs = [r for r in mine["runs"] if r is not None]
            cells.append(f"{mine['median']:g} [{min(runs)}-{max(runs)}] (lr x{mine['lr']})")
            cells.append(f"{base['median'] / mine['median']:.2f}x"
                         if base["median"] is not None else "—")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def variant(row: dict) -> str:
    """How a row's runs differ from plain training at its batch ("": they do not)."""
    stale, skipped = row.get("staleness", 0), row.get("skipped", 0)
    if stale:
        return f"stale by {stale} step{'s' if stale != 1 else ''}"
    return f"first {skipped} step{'s' if skipped != 1 else ''} not taken" if skipped else ""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--ideals", default="2.5,2.75",
                        help="the ideals (sum of the devices' throughputs over the "
                             "fastest's) to bound, comma-separated (default 2.5,2.75; "
                             "'': none)")
    parser.add_argument("--lr-grid", default="1,2,4",
                        help="learning rates, multiples of 3e-3 (default 1,2,4)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default 3)")
    parser.add_argument("--targets", default="1.8,1.65",
                        help="validation losses (default 1.8,1.65)")
    parser.add_argument("--max-steps", type=int, default=2500,
                        help="most steps of a run (default 2500)")
    parser.add_argument("--eval-every", type=int, default=50,
                        help="steps between validation passes (default 50)")
    parser.add_argument("--processes", type=int, default=2,
                        help="runs at once (default 2)")
    parser.add_argument("--staleness", default="",
                        help="steps by which the part of each large batch beyond the "
                             "fast device's is stale (its gradient taken at older "
                             "weights), comma-separated: a row for each (default: none)")
    parser.add_argument("--skipped", type=int, default=0,
                        help="adds a row: the fast device alone with its first N steps "
                             "computed but not taken, as ESync's measuring round "
                             "(default 0: none)")
    parser.add_argument("--out", default=None, help="folder for oracle.md and oracle.json")
    return parser


def numbers(flag: str, text: str, kind=float) -> list:
    try:
        values = [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or not all(v > 0 for v in values):
        raise UserError(f"{flag} {text!r}: expected positive numbers, comma-separated")
    return values


def _main(argv: List[str], prog: str) -> int:
    args = build_parser().parse_args(argv)
    ideals = numbers("--ideals", args.ideals) if args.ideals.strip() else []
    grid = numbers("--lr-grid", args.lr_grid)
    targets = sorted(numbers("--targets", args.targets), reverse=True)
    if args.seeds < 1 or args.max_steps < 1 or args.eval_every < 1 or args.processes < 1:
        raise UserError("--seeds, --max-steps, --eval-every and --processes must be >= 1")
    if args.skipped < 0:
        raise UserError(f"--skipped {args.skipped}: expected a number of steps >= 0")
    staleness = [0] + [int(s) for s in numbers("--staleness", args.staleness, int)] \
        if args.staleness else [0]
    batches = [(BATCH, 1.0, 0, 0)] + [(round(BATCH * i), i, s, 0)
                                      for i in ideals for s in staleness]
    if args.skipped:
        batches.insert(1, (BATCH, 1.0, 0, args.skipped))
    runs = [Run(b, m, s, stale, skip) for b, _, stale, skip in batches for m in grid
            for s in range(args.seeds)]
    with ProcessPoolExecutor(args.processes) as pool:
        futures = {run: pool.submit(steps_to_targets, run.batch,
                                    LEARNING_RATE * run.multiple, run.seed, targets,
                                    args.max_steps, args.eval_every, run.staleness,
                                    run.skipped)
                   for run in runs}
        done = {run: future.result() for run, future in futures.items()}
    results = {"lr": LEARNING_RATE, "grid": grid, "seeds": args.seeds, "batches": []}
    for batch, ideal, stale, skip in batches:
        row = {"batch": batch, "ideal": ideal, "staleness": stale, "skipped": skip,
               "targets": {}}
        for t in targets:
            key = f"{t:g}"
            by_lr = {f"{m:g}": [done[Run(batch, m, s, stale, skip)][key]
                                for s in range(args.seeds)]
                     for m in grid}
            lr = best(by_lr)
            row["targets"][key] = {"lr": lr, "by_lr": by_lr,
                                   "runs": by_lr[lr] if lr else [],
                                   "median": compare.censored_median(by_lr[lr]) if lr else None}
        results["batches"].append(row)
    text = table(results, targets)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "oracle.md"), "w") as f:
            f.write(text + "\n")
        with open(os.path.join(args.out, "oracle.json"), "w") as f:
            json.dump(results, f, indent=1)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    return command_main(_main, argv, PROG, PROG)


if __name__ == "__main__":
    sys.exit(main())
