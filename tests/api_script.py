"""A user's training script on esync's public API, for tests/test_api.py: its own model,
data, optimizer and loop, started by esync-run (or alone). What it saw goes to
OUT/<device name>.json: the learning rate at each round, the rounds and local
iterations it ran, its BatchNorm buffers and weights at the end, the optimizer's
state_dict's esync entry.

    esync-run --workers 2 -m esync tests/api_script.py OUT --model bn --scheduler
"""
import argparse
import json
import os
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import esync


class Branches(nn.Module):
    """Two heads; even ranks use only the first, odd ranks only the second, so their
    steps leave different parameters without a gradient."""

    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank
        self.body = nn.Linear(8, 16)
        self.heads = nn.ModuleList([nn.Linear(16, 2), nn.Linear(16, 2)])

    def forward(self, x):
        return self.heads[self.rank % 2](torch.relu(self.body(x)))


class Labelled(TensorDataset):
    """A TensorDataset with `targets`, so that -s 1 splits it by class."""

    def __init__(self, x, y):
        super().__init__(x, y)
        self.targets = y.tolist()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--model", choices=["bn", "branches"], default="bn")
    parser.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--scheduler", action="store_true")
    parser.add_argument("--amp-skip", type=int, default=0,
                        help="make this local iteration's gradients infinite (AMP skips it)")
    parser.add_argument("--warm-up", type=float, default=0.0,
                        help="seconds rank 0's first local iteration takes longer (a GPU's "
                             "first, loading its kernels)")
    parser.add_argument("--leave-after", type=int, default=0,
                        help="the last rank's loop ends after this many iterations")
    parser.add_argument("--iterations", type=int, default=0,
                        help="every rank's loop ends after this many iterations")
    args = parser.parse_args()
    session = esync.init()
    torch.manual_seed(0)
    x = torch.randn(512, 8)
    y = (x[:, 0] > 0).long()
    x[:, 1] += 3.0 * y  # the classes' inputs differ: split by class, so do BatchNorm's statistics
    if args.model == "bn":
        net = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
    else:
        net = Branches(session.rank)
    model = esync.prepare_model(net)
    loader = esync.prepare_data_loader(DataLoader(Labelled(x, y), batch_size=32, shuffle=True))
    inner = (torch.optim.AdamW(model.parameters(), lr=1e-2) if args.optimizer == "adamw"
             else torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    opt = esync.DistributedOptimizer(inner)
    sched = esync.prepare_scheduler(torch.optim.lr_scheduler.StepLR(inner, 1, gamma=0.9)) \
        if args.scheduler else None
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0) if args.amp_skip else None
    lrs, skipped, iteration = {}, 0, 0
    leaves = args.leave_after and session.rank == session.num_workers - 1
    last = args.leave_after if leaves else args.iterations
    for epoch in range(args.epochs):
        if last and iteration >= last:
            break
        for xb, yb in loader:
            if last and iteration >= last:
                break
            iteration += 1
            if iteration == 1 and session.rank == 0:
                time.sleep(args.warm_up)
            opt.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            if scaler is not None:
                if iteration == args.amp_skip:
                    loss = loss * float("inf")
                    skipped += 1
                scaler.scale(loss).backward()
                esync.report(loss if torch.isfinite(loss) else None)  # before the step
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                esync.report(loss)
                opt.step()
            if sched is not None:
                sched.step()
                lrs[session.round] = sched.get_last_lr()[0]
    state = opt.state_dict()["esync"]
    esync.finish()
    buffers = {name: b.tolist() for name, b in net.named_buffers()}
    weights = torch.cat([p.detach().reshape(-1) for p in net.parameters()]).tolist()
    with open(os.path.join(args.out, os.path.basename(session.recorder.path) + ".json"),
              "w") as f:
        json.dump({"rank": session.rank, "rounds": session.round,
                   "iterations": session.iterations, "loop_iterations": iteration,
                   "skipped": skipped, "lrs": lrs, "buffers": buffers, "weights": weights,
                   "state": state, "stop": session.stop_reason}, f)


if __name__ == "__main__":
    main()
