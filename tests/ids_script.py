"""A user's script whose samples carry their own index, for tests/test_data_split.py:
the indices each device drew, the passes its epoch loop made and the rounds it ran go to
OUT/<device name>.json.

    esync-run --workers 2 -m esync --data-split whole tests/ids_script.py OUT
"""
import argparse
import json
import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import esync

SAMPLES = 4800


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    session = esync.init()
    x = torch.randn(SAMPLES, 4, generator=torch.Generator().manual_seed(0))
    y = (x[:, 0] > 0).long()
    model = esync.prepare_model(nn.Linear(4, 2))
    loader = esync.prepare_data_loader(
        DataLoader(TensorDataset(x, y, torch.arange(SAMPLES)), batch_size=16, shuffle=True))
    opt = esync.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    drawn, passes = [], 0
    for _ in range(args.epochs):
        for xb, yb, ids in loader:
            opt.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            drawn.extend(ids.tolist())
        passes += 1
    rounds = session.round
    esync.finish()
    with open(os.path.join(args.out, os.path.basename(session.recorder.path) + ".json"),
              "w") as f:
        json.dump({"rank": session.rank, "drawn": drawn, "passes": passes,
                   "rounds": rounds}, f)


if __name__ == "__main__":
    main()
