"""A worker process that runs a few rounds of the real aggregation path (esync's
PushPull with `--backend ps` or `allreduce`) on fixed, rank-dependent local steps and
buffers, and saves the weights and buffers it starts and ends with: the same weights and
gradients must give the same result with either backend (tests/test_allreduce.py).

    DMLC_ROLE=worker ... python -m tests.round_probe OUT.npy -m sync --backend ps ...

OUT may hold `{rank}`, which becomes the worker's rank. Every flag after OUT is main.py's (esync.options); with ESync's rule averaging by steps
(`--average steps` or `normalized`) worker k reports k+1 local steps (by steps, 0 in
the first round, as in a round that measures speeds).
"""
from __future__ import annotations

import sys

import numpy as np
import torch

from esync.algorithms.base import Job
from esync.algorithms.pushpull import PushPull
from esync.models import build_network
from esync.comm.compress import compression
from esync.options import parse_options
from esync.registry import AVERAGES
from esync.algorithms.rules import RuleConfig
from esync.transport.cluster import ClusterEnv
from esync.transport.node import Node

ROUNDS = 3


def bn_model():
    """A small network with BatchNorm (-n tests.round_probe:bn_model): buffers to average."""
    from torch import nn
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))


class Probe(PushPull):
    steps = None

    def pushed_steps(self, steps):
        return self.steps


def main(out: str, argv) -> int:
    torch.set_num_threads(1)
    opts = parse_options(argv)
    with Node(ClusterEnv.from_environ(), "worker") as node:
        assignment = node.register(device="probe")
        job = Job.from_assignment(node, assignment)
        if opts.mode == "esync":  # the servers' ESync rule, without the state server
            rule = RuleConfig("esync", job.num_workers, opts.global_lr, opts.outer_momentum,
                              **AVERAGES[opts.average])
        else:
            rule = RuleConfig(opts.mode, job.num_workers, opts.learning_rate, opts.momentum,
                              opts.weight_decay)
        algorithm = Probe(rule, job, 0, True, backend=opts.backend,
                          compression=compression(opts))
        if rule.normalize or rule.by_steps:
            algorithm.steps = job.rank + 1
        torch.manual_seed(0)
        model = build_network(opts.network)
        algorithm.setup(model, torch.device("cpu"))
        start = np.concatenate([algorithm.flat.params.numpy(), algorithm.flat.buffers.numpy()])
        for round_ in range(1, ROUNDS + 1):
            if rule.by_steps:  # round 1 as one that measures speeds: 0 steps everywhere
                algorithm.steps = 0 if round_ == 1 else job.rank + 1
            g = torch.Generator().manual_seed(1000 * job.rank + round_)
            algorithm.begin_round(round_)
            with torch.no_grad():  # the round's local step
                for p in model.parameters():
                    p.sub_(0.1 * torch.randn(p.shape, generator=g))
            algorithm.flat.buffers.copy_(torch.rand(algorithm.flat.buffers.shape, generator=g))
            algorithm.end_round(round_, model)
        np.save(out.format(rank=job.rank), np.stack([start, np.concatenate([algorithm.flat.params.numpy(),
                                                      algorithm.flat.buffers.numpy()])]))
        algorithm.finish()
        node.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
