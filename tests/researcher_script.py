"""tests/researcher_plain.py converted to esync by the tutorial
(docs/tutorials/your-own-script.md) alone: the lines it adds or changes are the
tutorial's (tests/test_user_script.py checks it). Run by esync-run in every mode.
"""

import argparse
import json
import os
from dataclasses import asdict, dataclass

import esync
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


@dataclass
class Config:
    epochs: int = 3
    steps: int = 60
    batch_size: int = 32
    lr: float = 3e-3
    val_every: int = 10
    loop: str = "epochs"
    schedule: str = "onecycle"
    raise_at: int = 0
    raise_rank: int = -1
    leave_at: int = 0  # this rank's loop ends after this step, whatever the others'
    leave_rank: int = -1


class Blobs(Dataset):
    """Eight noisy clusters in 16 dimensions, as dicts."""

    def __init__(self, n: int, seed: int):
        generator = torch.Generator().manual_seed(seed)
        centers = torch.randn(8, 16, generator=torch.Generator().manual_seed(0)) * 2
        self.label = torch.randint(0, 8, (n,), generator=generator)
        self.features = centers[self.label] + torch.randn(n, 16, generator=generator) * 2.5

    def __len__(self):
        return len(self.label)

    def __getitem__(self, i):
        return {"features": self.features[i], "label": self.label[i]}


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 128), nn.BatchNorm1d(128), nn.ReLU(),
                                 nn.Linear(128, 128), nn.LayerNorm(128), nn.ReLU(),
                                 nn.Linear(128, 8))

    def forward(self, x):
        return self.net(x)


@torch.no_grad()
def validate(model, loader, device):
    model.eval()
    correct = total = 0
    for batch in loader:
        x, y = batch["features"].to(device), batch["label"].to(device)
        correct += (model(x).argmax(1) == y).sum().item()
        total += len(y)
    model.train()
    return correct / total


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    for name, value in asdict(Config()).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    cfg = Config(**{k: v for k, v in vars(parser.parse_args()).items() if k != "out"})
    out = parser.parse_args().out
    esync.init()
    rank = int(os.environ.get("DMLC_WORKER_ID") or os.environ.get("RANK") or 0)
    torch.manual_seed(0)
    device = esync.get_device()
    model = esync.prepare_model(MLP())
    decay = [p for n, p in model.named_parameters() if p.dim() > 1]
    rest = [p for n, p in model.named_parameters() if p.dim() <= 1]
    train = esync.prepare_data_loader(DataLoader(Blobs(1024, 1), batch_size=cfg.batch_size, shuffle=True, drop_last=True))
    val = DataLoader(Blobs(256, 2), batch_size=128)
    opt = esync.DistributedOptimizer(torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                                                        {"params": rest, "weight_decay": 0.0}], lr=cfg.lr))
    total = cfg.steps if cfg.loop == "steps" else cfg.epochs * len(train)
    if cfg.schedule == "epoch":  # stepped once an epoch
        sched = esync.prepare_scheduler(torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg.epochs))
    else:
        sched = esync.prepare_scheduler(torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=total))
    loss_fn = nn.CrossEntropyLoss()
    if cfg.raise_at == 0 and rank == cfg.raise_rank:
        raise ValueError("a bug at start")
    seen = {"lrs": [], "best": 0.0, "len": len(train),
            "total_steps": cfg.epochs if cfg.schedule == "epoch" else total}
    step, best = 0, 0.0

    def train_step(batch):
        nonlocal step, best
        x, y = batch["features"].to(device), batch["label"].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        esync.report(loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if cfg.schedule != "epoch":
            sched.step()
        step += 1
        seen["lrs"].append(sched.get_last_lr()[0])
        if step == cfg.raise_at and rank == cfg.raise_rank:
            raise ValueError(f"a bug at step {step}")
        if step % cfg.val_every == 0 and esync.get_session().rank == 0:
            accuracy = validate(model, val, device)
            esync.report(metric=accuracy)
            if accuracy > best:
                best = accuracy
                torch.save(model.state_dict(), os.path.join(out, "best.pt"))

    if cfg.loop == "epochs":
        for epoch in range(cfg.epochs):
            for batch in train:
                train_step(batch)
                if step == cfg.leave_at and rank == cfg.leave_rank:
                    break
            if step == cfg.leave_at and rank == cfg.leave_rank:
                break
            if cfg.schedule == "epoch":
                sched.step()
    elif cfg.loop == "steps":
        while step < total and not esync.should_stop():
            for batch in train:
                train_step(batch)
                if step >= total:
                    break
    else:
        while not esync.should_stop():
            for batch in train:
                train_step(batch)
    seen.update(best=best, steps=step, last_epoch=sched.last_epoch,
                final=validate(model, val, device),
                optimizer_steps=max((int(s["step"]) for s in opt.state.values()), default=0))
    with open(os.path.join(out, f"seen-{rank}.json"), "w") as f:
        json.dump(seen, f)


if __name__ == "__main__":
    main()
