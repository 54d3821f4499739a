"""A user's script that gives its algorithm in code: `esync.DistributedOptimizer(opt,
algorithm=...)`, the optimizer wrapped before prepare_model (tests/test_algorithm_objects.py).

    esync-run [flags] tests/algorithm_script.py "esync.ESync(max_local_steps=2)" [late]

`late`: the optimizer wrapped after prepare_model, as a script without an algorithm
object does.
"""
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import esync


def main() -> None:
    algorithm = eval(sys.argv[1], {"esync": esync})  # the test's own expression
    esync.init()
    torch.manual_seed(0)
    x = torch.randn(512, 8)
    y = (x[:, 0] > 0).long()
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    late = sys.argv[2:] == ["late"]
    model = esync.prepare_model(net) if late else None
    opt = esync.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.05),
                                     algorithm=algorithm)
    if model is None:
        model = esync.prepare_model(net)
    loader = esync.prepare_data_loader(DataLoader(TensorDataset(x, y), batch_size=16,
                                                  shuffle=True))
    for _ in range(4):
        for xb, yb in loader:
            opt.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            opt.step()
    esync.finish()


if __name__ == "__main__":
    main()
