"""A worker process that runs local SGD (the registry's `-m localsgd` worker class, built
from main.py's flags) on a tiny model with rank-dependent batches, and saves, for every
round, its local iterations and its weights and buffers before and after the round's
averaging (and those it started with): tests/test_localsgd.py compares them with the
mean it computes itself.

    DMLC_ROLE=worker ... python -m tests.localsgd_probe OUT.npz -m localsgd --period 3 ...

OUT may hold `{rank}`, which becomes the worker's rank.
"""
from __future__ import annotations

import sys

import numpy as np
import torch
from torch import nn

from esync import registry
from esync.algorithms.base import Job
from esync.options import parse_options
from esync.transport.cluster import ClusterEnv
from esync.transport.node import Node

ROUNDS = 5


def main(out: str, argv) -> int:
    torch.set_num_threads(1)
    opts = parse_options(argv)
    with Node(ClusterEnv.from_environ(), "worker") as node:
        job = Job.from_assignment(node, node.register(device="probe"))
        algorithm = registry.of_options(opts).worker_class().from_options(opts, job)
        torch.manual_seed(0)  # every worker builds the same model; worker 0's is the job's
        model = nn.Sequential(nn.BatchNorm1d(4), nn.Linear(4, 3))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        algorithm.setup(model, torch.device("cpu"))
        data = torch.Generator().manual_seed(job.rank + 1)  # each worker its own batches

        def state() -> np.ndarray:
            return torch.cat([algorithm.flat.params, algorithm.flat.buffers]).numpy().copy()

        start, iterations, before, after = state(), [], [], []
        for round_ in range(1, ROUNDS + 1):
            count, _ = algorithm.begin_round(round_)
            for _ in range(count):
                x = torch.randn(8, 4, generator=data)
                y = torch.randint(0, 3, (8,), generator=data)
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                algorithm.local_update(model, optimizer.step)
            iterations.append(count)
            before.append(state())
            algorithm.end_round(round_, model)
            after.append(state())
        np.savez(out.format(rank=job.rank), start=start, iterations=np.array(iterations),
                 before=np.stack(before), after=np.stack(after),
                 params=np.array(algorithm.flat.params.numel()))
        algorithm.finish()
        node.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
