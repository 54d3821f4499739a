"""Train the byte-level LM of ``examples/charlm.py`` with esync: charlm_plain.py's loop.

Run from the repository root::

    esync-run --workers 2 -m esync examples/charlm_esync.py --seconds 60

Prints ``step N time Ts val_loss L ...`` every ``--eval-every`` steps (and at
the start and end; ``--eval-every 0``: at the end only), then the training
throughput in samples (windows) per second.  ``time`` is wall-clock (it includes
evaluation); ``cpu`` is this process's CPU time, which tells how much a busy
machine slowed the run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import esync
import torch
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from examples.charlm import build_data, build_model, loss_fn  # noqa: E402


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader: DataLoader, device: torch.device) -> float:
    """Mean validation loss over the whole (fixed) validation set."""
    model.eval()
    total, count = 0.0, 0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        total += loss_fn(model(x), y).item() * len(x)
        count += len(x)
    model.train()
    return total / count


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=60.0, help="wall-clock training budget")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    p.add_argument("--eval-every", type=int, default=200,
                   help="steps between validation passes (0: none, at the start neither)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    args = p.parse_args()
    esync.init()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = esync.get_device()
    train_set, val_set = build_data()
    model = esync.prepare_model(build_model())
    opt = esync.DistributedOptimizer(torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01))
    loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(args.seed))
    loader = esync.prepare_data_loader(loader)
    val_loader = DataLoader(val_set, batch_size=128)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"train windows {len(train_set)} val windows {len(val_set)} params {n_params}", flush=True)

    start, cpu_start = time.perf_counter(), time.process_time()
    eval_time, step, done = 0.0, 0, False
    if args.eval_every and esync.get_session().rank == 0:  # validate on one worker
        print(f"step 0 time 0.0s val_loss {evaluate(model, val_loader, device):.3f}", flush=True)
    eval_time += time.perf_counter() - start
    while not done and not esync.should_stop():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            esync.report(loss)
            opt.step()
            step += 1
            done = time.perf_counter() - start >= args.seconds
            if (done or (args.eval_every and step % args.eval_every == 0)) and esync.get_session().rank == 0:
                t0 = time.perf_counter()
                val = evaluate(model, val_loader, device)
                eval_time += time.perf_counter() - t0
                print(f"step {step} time {t0 - start:.1f}s val_loss {val:.3f} train_loss {loss.item():.3f} "
                      f"cpu {time.process_time() - cpu_start:.1f}s", flush=True)
            if done:
                break

    train_time = time.perf_counter() - start - eval_time
    print(f"done: {step} steps, {step * args.batch_size / train_time:.0f} samples/s "
          f"({step * args.batch_size * train_set.context / train_time:.0f} bytes/s) over {train_time:.1f}s "
          f"of training, {eval_time:.1f}s of evaluation", flush=True)


if __name__ == "__main__":
    main()
