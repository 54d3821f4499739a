"""ESync's server rule: SSGD's round (every living worker's delta of the round, then one
update), with the weights moved by the mean delta scaled by the global learning rate
`lr` (`-gl`): w <- w + lr * mean(delta).

How the mean is taken is `--average` (esync.registry.AVERAGES): `mean`, each delta the
same (the paper's); `steps` (`by_steps`, the default): workers push delta * steps with
their steps, and the sum is divided by the steps' sum, so that each delta weighs as its
share of the round's local iterations (of its samples, at one batch size); `normalized`
(`normalize`, FedNova's normalised averaging): workers push delta / steps with their
number of local steps, and the mean is scaled by the mean number of steps; `anchored`
(`by_steps` and `anchored`): the steps-weighted mean, scaled by max(s) sum(s) / sum(s^2)
so that the move is as long, in local steps, as the fastest device's own round (each
delta taken as its steps long): devices of one speed get the plain mean, and a fast
device among slow ones keeps its progress (its delta weighs s_max^2 / sum(s^2)) while
the slow ones' deltas add what they learnt, each weighing s_i s_max / sum(s^2). `momentum`
(`--outer-momentum M`): the mean delta is a pseudo-gradient g = -mean(delta) for SGD
with Nesterov momentum (DiLoCo's outer optimiser): v <- M v + g; w <- w - lr (g + M v).
The worker's half of `--average` is esync.algorithms.esync.worker's `push_scale`.
Averaged by steps (`steps`, `anchored`), BatchNorm's buffers are the steps-weighted mean
of the workers' (SyncRule.aggregate): a device that sat the round out does not pull the
statistics back towards the last round's.
"""
from __future__ import annotations

import numpy as np
import torch

from esync.algorithms.rules import SyncRule


class ESyncRule(SyncRule):
    def _update_weights(self, offset, total):
        """`total` is the sum of the N workers' deltas (with `normalize`, of delta / steps;
        with `by_steps`, of delta * steps): w += lr * mean (the steps-weighted mean), or
        the outer Nesterov step on g = -mean."""
        c = self.config
        if c.by_steps and not self.mean_steps:
            return  # every device sat the round out or left it before an iteration
        scale = (self.mean_steps if c.normalize else
                 1.0 / self.mean_steps if c.by_steps else 1.0) / c.num_workers
        if c.anchored:  # sum(s d) / sum(s) scaled by max(s) sum(s) / sum(s^2)
            steps = np.asarray(self.steps)
            scale *= steps.max() * steps.sum() / float((steps * steps).sum())
        w = self.sgd.w[offset:offset + len(total)]
        if not c.momentum:
            w.add_(total, alpha=c.lr * scale)
            return
        g = torch.mul(total, -scale)
        v = self.sgd.velocity[offset:offset + len(total)]
        v.mul_(c.momentum).add_(g)
        w.add_(g.add_(v, alpha=c.momentum), alpha=-c.lr)

